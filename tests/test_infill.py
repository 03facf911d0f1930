"""The fill-in-the-middle layout (localchat.infill), over a tokenizer of one token a character."""

from __future__ import annotations

from localchat.backends.base import FillInMiddleTokens
from localchat.infill import PREFIX_SHARE, SUFFIX_SHARE, infill_prompt

FIM = FillInMiddleTokens(prefix=-1, suffix=-2, middle=-3)


def by_character(text: str) -> list[int]:
    return [ord(character) for character in text]


def test_prefix_suffix_middle_with_bos_first() -> None:
    assert infill_prompt(by_character, FIM, "ab", "c", bos=None) == [-1, 97, 98, -2, 99, -3]
    assert infill_prompt(by_character, FIM, "ab", "c", bos=-9) == [-9, -1, 97, 98, -2, 99, -3]
    assert infill_prompt(by_character, FIM, "", "", bos=None) == [-1, -2, -3]


def test_a_long_file_keeps_the_text_nearest_the_gap() -> None:
    """As llama.cpp's server: the prefix's end and the suffix's start, 3:1 in a 2048-token window."""
    prefix, suffix = "x" * (PREFIX_SHARE + 100) + "y", "z" + "w" * (SUFFIX_SHARE + 100)
    prompt = infill_prompt(by_character, FIM, prefix, suffix, bos=None)
    assert len(prompt) == PREFIX_SHARE + SUFFIX_SHARE + 3
    assert prompt[PREFIX_SHARE] == ord("y") and prompt[PREFIX_SHARE + 2] == ord("z")
    assert prompt.index(-2) == PREFIX_SHARE + 1 and prompt[-1] == -3
