"""GGUF files for the stand-in hub: small ones written with gguf-py, and llama.cpp's split format
(`NAME-00001-of-0000N.gguf`: the first part carries the metadata, every part `split.no`,
`split.count` and `split.tensors.count` and its own tensors), made by copying bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np

from localchat.gguf_file import GgufTensor, read_gguf_header

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


def make_gguf(path: Path, file_type: gguf.LlamaFileType, n_embd: int = 64, n_vocab: int = 256, seed: int = 0) -> Path:
    """A small llama-shaped GGUF (f32 tensors of random values); its header says `file_type`, as
    the file names of the stand-in repos do. Only headers are read from these files."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(2 * n_embd)
    writer.add_head_count(4)
    writer.add_file_type(file_type)
    writer.add_token_list([f"<t{i}>" for i in range(n_vocab)])
    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd), dtype=np.float32))
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.attn_q.weight", rng.standard_normal((n_embd, n_embd), dtype=np.float32))
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", rng.standard_normal((2 * n_embd, n_embd), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensor_info(tensor: GgufTensor, offset: int) -> bytes:
    name = tensor.name.encode()
    dims = struct.pack(f"<{len(tensor.shape)}Q", *tensor.shape)
    return struct.pack("<Q", len(name)) + name + struct.pack("<I", len(tensor.shape)) + dims + struct.pack("<IQ", tensor.ggml_type, offset)


def _split_keys(no: int, count: int, n_tensors: int) -> bytes:
    """split.no (u16), split.count (u16), split.tensors.count (i32), as llama.cpp reads them."""
    entries = (("split.no", gguf.GGUFValueType.UINT16, "<H", no), ("split.count", gguf.GGUFValueType.UINT16, "<H", count),
               ("split.tensors.count", gguf.GGUFValueType.INT32, "<i", n_tensors))
    return b"".join(struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + struct.pack(fmt, value)
                    for key, kind, fmt, value in entries)


def _pad(data: bytes, alignment: int) -> bytes:
    return data + b"\0" * (-len(data) % alignment)


def split_gguf(source: Path, folder: Path, prefix: str, n_parts: int = 2) -> list[Path]:
    """`source` as `n_parts` files `prefix-0000K-of-0000N.gguf` in `folder`, tensors shared out in order."""
    header = read_gguf_header(source)
    raw = source.read_bytes()
    alignment = int(header.get("general.alignment", DEFAULT_ALIGNMENT))
    version, _, n_kv = struct.unpack_from("<IQQ", raw, 4)
    # The metadata ends where the tensor table starts; the table ends within one alignment step
    # before the data, so the one place the re-encoded table matches is where the metadata ends.
    table = b"".join(_tensor_info(t, t.offset) for t in header.tensors)
    table_start = next(
        start for start in range(header.data_offset - len(table) - alignment + 1, header.data_offset - len(table) + 1)
        if raw[start : start + len(table)] == table
    )
    metadata = raw[24:table_start]
    groups = np.array_split(np.arange(len(header.tensors)), n_parts)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for no, indices in enumerate(groups):
        tensors = [header.tensors[i] for i in indices]
        base = tensors[0].offset
        infos = b"".join(_tensor_info(t, t.offset - base) for t in tensors)
        kv = (metadata if no == 0 else b"") + _split_keys(no, n_parts, len(header.tensors))
        head = GGUF_MAGIC + struct.pack("<IQQ", version, len(tensors), (n_kv if no == 0 else 0) + 3) + kv + infos
        end = tensors[-1].offset + tensors[-1].n_bytes
        data = raw[header.data_offset + base : header.data_offset + end]
        path = folder / f"{prefix}-{no + 1:05d}-of-{n_parts:05d}.gguf"
        path.write_bytes(_pad(head, alignment) + data)
        paths.append(path)
    return paths
