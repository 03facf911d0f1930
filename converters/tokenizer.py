"""A checkpoint's tokenizer as GGUF metadata: vocabulary, merges or scores, special tokens,
add-bos/eos flags, end-of-turn ids and the chat template.

Two kinds are read: byte-level BPE from tokenizer.json (llama.cpp's "gpt2" model) and
SentencePiece from tokenizer.model (llama.cpp's "llama" model). llama.cpp's own converter picks a
BPE pre-tokenizer by hashing the tokenization of a test string; here it is read from
tokenizer.json's pre-tokenizer regex, which must be one llama.cpp implements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf import GGUFWriter, SpecialVocab, TokenType

from converters.checkpoint import Checkpoint
from localchat.errors import ModelError

# tokenizer.json's Split regex -> the llama.cpp pre-tokenizer that implements it.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT4O_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_REGEXES: dict[str, str] = {
    LLAMA3_REGEX: "llama-bpe",
    QWEN2_REGEX: "qwen2",
    GPT4O_REGEX: "gpt-4o",
}
# ByteLevel with use_regex=True applies GPT-2's own split.
GPT2_PRE_TOKENIZER = "gpt-2"
# Normalizers that leave the text llama.cpp sees unchanged for practical purposes (Qwen2 uses NFC).
ACCEPTED_NORMALIZERS = (None, "NFC")


class TokenizerError(ModelError):
    """A tokenizer localchat cannot carry into GGUF."""


@dataclass(frozen=True)
class Vocabulary:
    """Tokens in id order, as llama.cpp wants them."""

    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    add_space_prefix: bool | None = None


def _split_regex(step: dict[str, Any]) -> str | None:
    pattern = step.get("pattern", {})
    return pattern.get("Regex")


def bpe_pre_tokenizer(tokenizer_json: dict[str, Any]) -> str:
    """The llama.cpp pre-tokenizer name equivalent to tokenizer.json's, or a TokenizerError saying why none is."""
    normalizer = tokenizer_json.get("normalizer")
    normalizer_type = normalizer.get("type") if normalizer else None
    if normalizer_type not in ACCEPTED_NORMALIZERS:
        raise TokenizerError(f"tokenizer.json has a '{normalizer_type}' normalizer, which llama.cpp's BPE tokenizer does not apply")
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    byte_level = [step for step in steps if step.get("type") == "ByteLevel"]
    if not byte_level:
        raise TokenizerError(f"tokenizer.json's pre-tokenizer ({', '.join(map(str, kinds))}) is not byte-level; llama.cpp's BPE needs a ByteLevel step")
    if byte_level[0].get("add_prefix_space"):
        raise TokenizerError("tokenizer.json's ByteLevel step adds a prefix space, which llama.cpp's BPE pre-tokenizers never do")
    if kinds == ["ByteLevel"] and byte_level[0].get("use_regex", True):
        return GPT2_PRE_TOKENIZER
    splits = [step for step in steps if step.get("type") == "Split"]
    if kinds != ["Split", "ByteLevel"] or byte_level[0].get("use_regex", True):
        raise TokenizerError(
            f"tokenizer.json's pre-tokenizer is {' + '.join(map(str, kinds))}; llama.cpp implements one regex "
            "split followed by a byte-level step (or GPT-2's byte-level split)"
        )
    split = splits[0]
    regex = _split_regex(split)
    if split.get("behavior") != "Isolated" or split.get("invert") or regex is None:
        raise TokenizerError(f"tokenizer.json splits with behavior '{split.get('behavior')}'; llama.cpp splits 'Isolated' by a regex")
    if regex not in PRE_TOKENIZER_REGEXES:
        known = ", ".join([GPT2_PRE_TOKENIZER, *PRE_TOKENIZER_REGEXES.values()])
        raise TokenizerError(
            f"tokenizer.json's split regex {regex!r} matches none of llama.cpp's pre-tokenizers that localchat knows ({known})"
        )
    return PRE_TOKENIZER_REGEXES[regex]


def _bpe_vocabulary(tokenizer_json: dict[str, Any], n_vocab: int) -> Vocabulary:
    model = tokenizer_json["model"]
    pre = bpe_pre_tokenizer(tokenizer_json)
    by_id: dict[int, tuple[str, int]] = {i: (text, TokenType.NORMAL) for text, i in model["vocab"].items()}
    for added in tokenizer_json.get("added_tokens", []):
        kind = TokenType.CONTROL if added.get("special") else TokenType.USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    return _in_id_order(by_id, n_vocab, model="gpt2", pre=pre)


def _in_id_order(by_id: dict[int, tuple[str, int]], n_vocab: int, **fields: Any) -> Vocabulary:
    if max(by_id) >= n_vocab:
        raise TokenizerError(f"the tokenizer has token id {max(by_id)} but the model's embeddings have {n_vocab} rows")
    # Embedding rows past the tokenizer (padding for matrix sizes) get placeholder tokens.
    entries = [by_id.get(i, (f"[PAD{i}]", TokenType.UNUSED)) for i in range(n_vocab)]
    return Vocabulary(tokens=[t for t, _ in entries], types=[int(k) for _, k in entries], **fields)


def _sentencepiece_vocabulary(checkpoint: Checkpoint, n_vocab: int) -> Vocabulary:
    from sentencepiece import SentencePieceProcessor
    from sentencepiece import sentencepiece_model_pb2

    path = checkpoint.folder / "tokenizer.model"
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
        processor = SentencePieceProcessor(model_proto=proto.SerializeToString())
    except Exception as error:  # protobuf and sentencepiece raise their own types for a bad file
        raise TokenizerError(f"{path} is not a valid SentencePiece model ({error}); download it again") from None
    kinds = {
        "is_unknown": TokenType.UNKNOWN,
        "is_control": TokenType.CONTROL,
        "is_unused": TokenType.UNUSED,
        "is_byte": TokenType.BYTE,
    }
    by_id: dict[int, tuple[str, int]] = {}
    scores: dict[int, float] = {}
    for i in range(processor.get_piece_size()):
        kind = next((k for test, k in kinds.items() if getattr(processor, test)(i)), TokenType.NORMAL)
        if proto.pieces[i].type == proto.SentencePiece.USER_DEFINED:
            kind = TokenType.USER_DEFINED
        by_id[i] = (processor.id_to_piece(i), kind)
        scores[i] = processor.get_score(i)
    # Tokens added by transformers on top of the SentencePiece model; `special` ones are control tokens.
    added = (checkpoint.json_file("tokenizer_config.json") or {}).get("added_tokens_decoder", {})
    for token_id, entry in added.items():
        kind = TokenType.CONTROL if entry.get("special") else TokenType.USER_DEFINED
        by_id[int(token_id)] = (entry["content"], kind)
        scores.setdefault(int(token_id), -1000.0)
    vocab = _in_id_order(by_id, n_vocab, model="llama", pre="default")
    return Vocabulary(
        model=vocab.model,
        pre=vocab.pre,
        tokens=vocab.tokens,
        types=vocab.types,
        scores=[scores.get(i, -1000.0) for i in range(n_vocab)],
        add_space_prefix=proto.normalizer_spec.add_dummy_prefix,
    )


def read_vocabulary(checkpoint: Checkpoint, n_vocab: int) -> Vocabulary:
    """The checkpoint's tokenizer: tokenizer.model if present (as llama.cpp prefers), else tokenizer.json."""
    folder = checkpoint.folder
    if (folder / "tokenizer.model").is_file():
        return _sentencepiece_vocabulary(checkpoint, n_vocab)
    tokenizer_json = checkpoint.json_file("tokenizer.json")
    if tokenizer_json is None:
        raise TokenizerError(f"{folder} has no tokenizer.json or tokenizer.model; download the model's tokenizer files")
    model = tokenizer_json.get("model", {})
    if model.get("type") != "BPE":
        raise TokenizerError(f"tokenizer.json holds a {model.get('type')} model; localchat converts BPE (tokenizer.json) and SentencePiece (tokenizer.model)")
    if model.get("byte_fallback"):
        raise TokenizerError(
            "tokenizer.json is a SentencePiece-style BPE (byte fallback) whose scores only tokenizer.model has; "
            f"put the model's tokenizer.model in {folder}"
        )
    return _bpe_vocabulary(tokenizer_json, n_vocab)


def _end_of_turn_ids(checkpoint: Checkpoint, eos_id: int | None) -> list[int]:
    """generation_config's other stop ids (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)."""
    generation = checkpoint.json_file("generation_config.json") or {}
    ids = generation.get("eos_token_id")
    ids = ids if isinstance(ids, list) else [ids] if isinstance(ids, int) else []
    return [i for i in ids if i != eos_id]


def add_tokenizer(writer: GGUFWriter, checkpoint: Checkpoint, n_vocab: int) -> Vocabulary:
    """Write the tokenizer keys; returns the vocabulary written."""
    vocab = read_vocabulary(checkpoint, n_vocab)
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    special = SpecialVocab(checkpoint.folder, load_merges=vocab.model == "gpt2", n_vocab=n_vocab)
    if vocab.model == "gpt2" and not special.merges:
        raise TokenizerError(f"{checkpoint.folder}/tokenizer.json has no BPE merges; download the model's tokenizer again")
    special.add_to_gguf(writer, quiet=True)
    eot = _end_of_turn_ids(checkpoint, special.special_token_ids.get("eos"))
    if eot and "eot" not in special.special_token_ids:
        writer.add_eot_token_id(eot[0])
    return vocab
