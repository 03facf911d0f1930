"""A copy of the default model with fill-in-the-middle tokens, for the FIM tests (conftest.py's fim_model).

Neither real model has FIM tokens: the copy names SmolLM2's chat tokens as FIM_PRE (<|im_start|>), FIM_SUF
(<|im_end|>) and FIM_MID (<|im_start|>), and its <repo_name> and <file_sep> as FIM_REP and FIM_SEP (llama.cpp's
tokenizer.ggml.fim_*_token_id keys): a prefix "user\nQUESTION" and a suffix "\n" then lay out a chat turn the
model answers, a reply long and sure enough to compare. The prompt's layout and the reply's path are what is
tested, not a code model's skill.
"""

from __future__ import annotations

from pathlib import Path

import gguf
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from localchat.gguf_file import read_gguf_header

# The FIM tokens of the copy, by id and text.
FIM_IDS = {"pre": 1, "suf": 2, "mid": 1, "rep": 3, "sep": 5}
FIM_TEXT = {"pre": "<|im_start|>", "suf": "<|im_end|>", "mid": "<|im_start|>", "rep": "<repo_name>", "sep": "<file_sep>"}


def write_fim_copy(source: Path, target: Path) -> Path:
    """`source` (a GGUF file) copied to `target` with FIM_IDS in its metadata."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, arch=read_gguf_header(source).architecture, endianess=reader.endianess)
    keys = {f"tokenizer.ggml.fim_{part}_token_id": MetadataDetails(gguf.GGUFValueType.UINT32, token)
            for part, token in FIM_IDS.items()}
    copy_with_new_metadata(reader, writer, keys, [])
    return target
