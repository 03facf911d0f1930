"""Text that can be encoded as UTF-8, which llama.cpp and tokenizers take alone.

A lone surrogate reaches Python from half of a pair in JSON ("\\ud83d") or from a command-line byte that
is not UTF-8 (Python keeps it as U+DC80-U+DCFF); encoding it raises. Go's JSON decoder and terminals
show it as U+FFFD, the replacement character, and so does localchat.
"""

from __future__ import annotations

import re

SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD."""
    return SURROGATE.sub("\ufffd", text) if not text.isascii() else text
