"""Released checkpoints' byte-level pre-tokenizers, as their tokenizer.json holds them, and the llama.cpp pre-tokenizer
each becomes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from localchat.converters.tokenizer import SEED_CODER_REGEX, bpe_pre_tokenizer


def _split_then_bytes(regex: str) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}


# DeepSeek V3's (and R1's), as its tokenizer.json spells it: an empty normalizer, three splits one after another.
DEEPSEEK_V3_JSON = r"""{
  "normalizer": {"type": "Sequence", "normalizers": []},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
  ]}
}"""
DEEPSEEK_V3 = json.loads(DEEPSEEK_V3_JSON)
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
    "deepseek-v3": (DEEPSEEK_V3["normalizer"], DEEPSEEK_V3["pre_tokenizer"], "deepseek-v3"),
}


@pytest.mark.parametrize("name", RELEASED)
def test_released_pre_tokenizer_is_llama_cpps(name: str) -> None:
    normalizer, pre_tokenizer, expected = RELEASED[name]
    assert bpe_pre_tokenizer({"normalizer": normalizer, "pre_tokenizer": pre_tokenizer}) == expected


def test_unknown_splits_one_after_another_are_refused_in_one_line() -> None:
    """DeepSeek V3's splits in another order match none of llama.cpp's pre-tokenizers; a normalizer that does something is refused."""
    from localchat.converters.tokenizer import TokenizerError

    pre_tokenizer = json.loads(DEEPSEEK_V3_JSON)["pre_tokenizer"]
    pre_tokenizer["pretokenizers"][:2] = pre_tokenizer["pretokenizers"][1::-1]
    with pytest.raises(TokenizerError, match=r"split regex \[.*\] matches none of llama.cpp's pre-tokenizers") as raised:
        bpe_pre_tokenizer({"normalizer": DEEPSEEK_V3["normalizer"], "pre_tokenizer": pre_tokenizer})
    assert "\n" not in str(raised.value)
    with pytest.raises(TokenizerError, match="a 'Sequence' normalizer"):
        bpe_pre_tokenizer({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
                           "pre_tokenizer": DEEPSEEK_V3["pre_tokenizer"]})
