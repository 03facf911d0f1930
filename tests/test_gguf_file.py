"""The fast GGUF header reader against the real model and damaged copies of it."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from localchat.errors import ModelError
from localchat.gguf_file import read_gguf_header
from localchat.models import gguf_facts


def test_header_of_the_default_model(default_model: Path) -> None:
    header = read_gguf_header(default_model)
    assert header.architecture == "llama" and header.arch_value("block_count") == 30
    assert header.array_lengths["tokenizer.ggml.tokens"] == 49152 and len(header.tensors) == 272
    facts = gguf_facts(header)
    # SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) x f16.
    assert facts.kv_bytes_per_token == 30 * 3 * 128 * 2 and facts.kv_head_sizes == (64, 64)
    assert facts.n_ctx_train == 8192 and facts.n_vocab == 49152


def test_header_of_gemma(gemma_model: Path) -> None:
    header = read_gguf_header(gemma_model)
    assert header.architecture == "gemma3"
    assert header.arch_value("block_count") == 18
    assert header.array_lengths["tokenizer.ggml.tokens"] == 262144
    assert len(header.tensors) == 236
    facts = gguf_facts(header)
    # Gemma 3 270M: 18 layers x 1 KV head x (256 + 256) x f16.
    assert facts.kv_bytes_per_token == 18 * 1 * 512 * 2
    assert facts.n_ctx_train == 32768 and facts.n_vocab == 262144


def test_tensor_table_matches_the_gguf_library(default_model: Path) -> None:
    ours = read_gguf_header(default_model)
    reference = gguf.GGUFReader(default_model)
    assert [(t.name, t.n_bytes, t.offset) for t in ours.tensors] == [
        (t.name, int(t.n_bytes), int(t.data_offset) - ours.data_offset) for t in reference.tensors
    ]


def test_a_file_cut_inside_the_header_or_the_data_is_reported(tmp_path: Path, default_model: Path) -> None:
    data = default_model.read_bytes()
    for size, message in ((5_000, "header runs past the end"), (len(data) - 1, "tensors need")):
        cut = tmp_path / f"cut-{size}.gguf"
        cut.write_bytes(data[:size])
        with pytest.raises(ModelError, match=message):
            read_gguf_header(cut)


def test_a_corrupt_length_in_the_header_is_reported_not_allocated(tmp_path: Path, default_model: Path) -> None:
    data = bytearray(default_model.read_bytes()[:4096])
    data[24:32] = (2**62).to_bytes(8, "little")  # the first metadata key's length
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="truncated or corrupt"):
        read_gguf_header(corrupt)
