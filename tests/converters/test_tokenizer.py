"""Released checkpoints' byte-level pre-tokenizers, as their tokenizer.json holds them, and the llama.cpp pre-tokenizer
each becomes."""

from __future__ import annotations

from typing import Any

import pytest
from localchat.converters.tokenizer import SEED_CODER_REGEX, bpe_pre_tokenizer


def _split_then_bytes(regex: str) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}


# (normalizer, pre-tokenizer, llama.cpp's name). Command R's and R7B's: digits one by one, then GPT-2's byte-level split, NFC
# first (transformers' CohereTokenizer builds the same). Seed-OSS's: Seed-Coder's regex, whose tokenizer.json holds carriage
# return and newline as the characters (llama.cpp's source quotes it so), and the same regex with them escaped.
RELEASED: dict[str, tuple[dict[str, Any] | None, dict[str, Any], str]] = {
    "gpt-2": (None, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, "gpt-2"),
    "command-r": ({"type": "NFC"}, {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]}, "command-r"),
    "seed-oss": (None, _split_then_bytes(SEED_CODER_REGEX.replace(r"\r", "\r").replace(r"\n", "\n")), "seed-coder"),
    "seed-coder-escaped": (None, _split_then_bytes(SEED_CODER_REGEX), "seed-coder"),
}


@pytest.mark.parametrize("name", RELEASED)
def test_released_pre_tokenizer_is_llama_cpps(name: str) -> None:
    normalizer, pre_tokenizer, expected = RELEASED[name]
    assert bpe_pre_tokenizer({"normalizer": normalizer, "pre_tokenizer": pre_tokenizer}) == expected
