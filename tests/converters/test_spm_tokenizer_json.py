"""A Gemma 3 checkpoint as transformers 5 saves it (tokenizer.json only: a SentencePiece-style
BPE with byte fallback, no tokenizer.model) converts, and llama.cpp tokenizes like transformers."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from localchat.converters.gguf import convert_checkpoint
from localchat.converters.tokenizer import merge_scores
from localchat.backends.llamacpp_natives import ensure_initialized
from localchat.gguf_file import read_gguf_header

# Multilingual prose, code, whitespace runs, emojis, byte-fallback characters and special tokens.
VARIED_LINES = (
    "<start_of_turn>user\nTranslate: The quick brown fox jumps over the lazy dog.<end_of_turn>",
    "<start_of_turn>model\nLe renard brun rapide saute par-dessus le chien paresseux.<end_of_turn>",
    "Größenverhältnisse, façade, naïve café; Ελληνικά; Русский текст; 日本語のテキスト; 中文文本；한국어 텍스트",
    "हिन्दी पाठ, العربية، עברית, ภาษาไทย, Tiếng Việt, Türkçe, ქართული",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n\treturn fibonacci(n - 1) + fibonacci(n - 2)",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }  // C++ && <html><b>bold</b></html>",
    "spaces:  two,   three,      six;\ttab\t\ttabs\n\n\nthree newlines\r\nwindows line   ",
    "emojis: 🚀🦙 😶‍🌫️ 👩🏽‍💻 🇫🇷 ✅ and rare characters: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ \u200b zero-width, \U0010ffff private",
    "numbers 3 33 333 3333 3.14159 1e-10 0x1F 1,000,000 and '''quotes''' \"\"\"\"......!!!!!!??????",
    "<bos>literal special tokens <eos> in text <pad> and <mask>[multimodal]<start_of_image>",
)
VARIED_TEXT = "\n".join(VARIED_LINES)


@pytest.fixture(scope="module")
def tokenizer_json_checkpoint(gemma_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gemma fixture without tokenizer.model (weights linked, not copied)."""
    folder = tmp_path_factory.mktemp("gemma-tokenizer-json")
    for path in gemma_checkpoint.iterdir():
        if path.is_file() and path.name != "tokenizer.model":
            (folder / path.name).symlink_to(path)
    return folder


@pytest.fixture(scope="module")
def converted(tokenizer_json_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # bf16 is the checkpoint's own encoding: written without any arithmetic, the fastest.
    return convert_checkpoint(tokenizer_json_checkpoint, tmp_path_factory.mktemp("gguf") / "gemma.gguf", "bf16", threads=2).output


@pytest.fixture(scope="module")
def llama_vocab(converted: Path) -> llama_cpp.Llama:
    ensure_initialized()
    return llama_cpp.Llama(model_path=str(converted), vocab_only=True, verbose=False)


def test_carries_a_sentencepiece_vocabulary(converted: Path) -> None:
    header = read_gguf_header(converted)
    assert header.get("tokenizer.ggml.model") == "llama"
    assert header.get("tokenizer.ggml.add_space_prefix") is False
    assert header.get("tokenizer.ggml.add_bos_token") is True
    assert (header.get("tokenizer.ggml.bos_token_id"), header.get("tokenizer.ggml.eos_token_id")) == (2, 1)


@pytest.mark.parametrize("add_special", [False, True])
def test_llama_cpp_tokenizes_like_transformers(
    add_special: bool, llama_vocab: llama_cpp.Llama, tokenizer_json_checkpoint: Path
) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tokenizer_json_checkpoint)
    for text in [VARIED_TEXT, *VARIED_LINES, " leading space", "trailing space ", "   ", ""]:
        theirs = reference.encode(text, add_special_tokens=add_special)
        ours = llama_vocab.tokenize(text.encode(), add_bos=add_special, special=True)
        assert ours == theirs, text


def test_special_tokens_are_text_unless_asked_for(llama_vocab: llama_cpp.Llama) -> None:
    as_text = llama_vocab.tokenize(b"<start_of_turn>user", add_bos=False, special=False)
    assert 105 not in as_text and len(as_text) > 2
    assert llama_vocab.tokenize(b"<start_of_turn>user", add_bos=False, special=True)[0] == 105


def test_scores_follow_the_merge_order() -> None:
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "<0x41>": 6}
    scores = merge_scores([("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")], vocab)
    # llama.cpp merges the highest score first: "bc" (rank 0) before "ab" (rank 1); "abc" from its first merge.
    assert scores[4] > scores[3] > scores[5]
    assert scores[5] == -2.0
    assert max(scores[i] for i in (0, 1, 2, 6)) < min(scores[i] for i in (3, 4, 5))
