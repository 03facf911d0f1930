"""Reads a GGUF file's header: metadata and tensor table, without touching tensor data.

`gguf.GGUFReader` builds numpy views of every metadata array (Gemma's 262k-token vocabulary) and
takes about 11 s for the default model; this reader skips arrays and takes milliseconds. It also
checks the file is whole, so a truncated download is reported before llama.cpp sees it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from localchat.errors import ModelError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    """Scalar and string metadata (arrays become their length) and the tensor table."""

    path: Path
    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[GgufTensor, ...]
    data_offset: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, e.g. `block_count`."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


class _Reader:
    def __init__(self, stream: BinaryIO, path: Path, size: int) -> None:
        self._stream = stream
        self._path = path
        self._size = size

    def read(self, n: int) -> bytes:
        # A corrupt length must not turn into a huge allocation.
        if n > self._size - self._stream.tell():
            raise ModelError(f"{self._path} is truncated or corrupt: its GGUF header runs past the end of the file")
        data = self._stream.read(n)
        if len(data) != n:
            raise ModelError(f"{self._path} is truncated: its GGUF header ends early; download or convert it again")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("<Q")).decode("utf-8", errors="replace")

    def skip(self, n: int) -> None:
        self._stream.seek(n, 1)

    def value(self, value_type: GGUFValueType) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.string()
        return self.unpack(_SCALAR_FORMATS[value_type])


def _value_type(raw: int, path: Path) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise ModelError(f"{path} is not a valid GGUF file (unknown metadata type {raw})") from None


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse and validate `path`'s header; raises ModelError naming what is wrong."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        reader = _Reader(stream, path, size)
        if stream.read(4) != GGUF_MAGIC:
            raise ModelError(f"{path} is not a GGUF file (it does not start with 'GGUF'); give a .gguf model file")
        version = reader.unpack("<I")
        if version not in (2, 3):
            raise ModelError(f"{path} is GGUF version {version}; localchat reads versions 2 and 3")
        n_tensors = reader.unpack("<Q")
        n_kv = reader.unpack("<Q")
        metadata: dict[str, Any] = {}
        array_lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = reader.string()
            value_type = _value_type(reader.unpack("<I"), path)
            if value_type != GGUFValueType.ARRAY:
                metadata[key] = reader.value(value_type)
                continue
            item_type = _value_type(reader.unpack("<I"), path)
            count = reader.unpack("<Q")
            array_lengths[key] = count
            if item_type == GGUFValueType.STRING:
                for _ in range(count):
                    reader.skip(reader.unpack("<Q"))
            elif item_type in _SCALAR_FORMATS:
                values_size = count * struct.calcsize(_SCALAR_FORMATS[item_type])
                # Small numeric arrays (per-layer head counts) are worth keeping.
                if count <= 1024:
                    metadata[key] = list(struct.unpack(f"<{count}{_SCALAR_FORMATS[item_type][1]}", reader.read(values_size)))
                else:
                    reader.skip(values_size)
            else:
                raise ModelError(f"{path} is not a valid GGUF file (nested array in '{key}')")
        raw_tensors = []
        for _ in range(n_tensors):
            name = reader.string()
            n_dims = reader.unpack("<I")
            shape = tuple(reader.unpack("<Q") for _ in range(n_dims))
            ggml_type = reader.unpack("<I")
            offset = reader.unpack("<Q")
            raw_tensors.append((name, shape, ggml_type, offset))
        header_end = stream.tell()
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ModelError(f"{path} is not a valid GGUF file (general.alignment is {alignment!r})")
    data_offset = -(-header_end // alignment) * alignment
    tensors = []
    for name, shape, ggml_type, offset in raw_tensors:
        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise ModelError(f"{path}: tensor '{name}' has an unknown type {ggml_type}") from None
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        tensors.append(GgufTensor(name, ggml_type, shape, offset, n_elements // block_size * type_size))
    end = max((data_offset + t.offset + t.n_bytes for t in tensors), default=data_offset)
    if end > size:
        raise ModelError(
            f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}; "
            "download or convert it again"
        )
    return GgufHeader(path, version, metadata, array_lengths, tuple(tensors), data_offset)
