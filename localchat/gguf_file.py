"""Reads and checks a GGUF file's header: metadata and tensor table, without touching tensor data.

`gguf.GGUFReader` builds numpy views of every metadata array (Gemma's 262k-token vocabulary) and
takes about 11 s for the default model; this reader skips arrays and takes a fraction of a second.
It refuses what llama.cpp's gguf.cpp refuses (truncation, absurd counts and lengths, unknown types,
bad shapes, tensor data out of place), and a vocabulary with a repeated entry, on which llama.cpp's
loader aborts the process: a damaged file is one ModelError naming the problem, never a crash.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gguf.constants import GGML_QUANT_SIZES, GGUFValueType

from localchat.errors import ModelError
from localchat.file_facts import remembered

if TYPE_CHECKING:
    import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# llama.cpp maps the file and asserts that every tensor's data is 32-byte aligned in memory.
MIN_ALIGNMENT = 32
# llama.cpp's limits (ggml.h, gguf.cpp).
MAX_DIMS = 4
MAX_NAME_BYTES = 63  # GGML_MAX_NAME, less the terminating NUL
MAX_STRING_BYTES = 1 << 30
MAX_ARRAY_ITEMS = 1 << 30
INT64_MAX = (1 << 63) - 1
# The smallest a metadata entry (key length, a 1-byte key, type, a 1-byte value) and a tensor
# info (name length, n_dims, type, offset) can be: a count the file cannot hold is refused
# before it is looped over.
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
# A mixture of experts' routed experts, stacked one tensor per layer and matrix: llama.cpp's own
# pattern for them (common.h's LLM_FFN_EXPS_REGEX, what llama-server's --cpu-moe keeps in RAM).
ROUTED_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
# Numeric arrays up to this length are kept (per-layer head counts); longer ones only counted.
MAX_KEPT_ARRAY = 1024
UINT32_MAX = (1 << 32) - 1
# llama.cpp maps each entry of the vocabulary to its id and asserts that none repeats.
VOCABULARY_KEY = "tokenizer.ggml.tokens"

# ggml type id -> (values per block, bytes per block).
_TYPE_SIZES: dict[int, tuple[int, int]] = {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}
# What a remembered header depends on besides the file and this module (file_facts.FORMAT): the ggml types
# gguf's table knows, and their sizes.
HEADER_FACTS = f"gguf header, ggml types {hashlib.sha256(repr(sorted(_TYPE_SIZES.items())).encode()).hexdigest()[:16]}"
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
# A tensor info after its name and n_dims: the shape (n_dims int64), the ggml type and the data offset.
_TENSOR_FIELDS = [struct.Struct(f"<{n}qIQ") for n in range(MAX_DIMS + 1)]
_SCALAR_FORMATS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: _U32,
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: _U64,
    GGUFValueType.INT64: _I64,
    GGUFValueType.FLOAT64: struct.Struct("<d"),
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
    # Numeric arrays: item type and where the values start in the file.
    numeric_arrays: dict[str, tuple[GGUFValueType, int]] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def numeric_array(self, key: str) -> np.ndarray | None:
        """The values of the numeric array `key`, read from the file (`metadata` keeps short ones)."""
        import numpy as np  # here alone: planning a model reads headers, and imports no numpy (localchat.cli)

        if key not in self.numeric_arrays:
            return None
        item_type, offset = self.numeric_arrays[key]
        dtype = np.dtype(_SCALAR_FORMATS[item_type].format)
        size = self.array_lengths[key] * dtype.itemsize
        try:
            with self.path.open("rb") as stream:
                stream.seek(offset)
                data = stream.read(size)
        except OSError as error:
            raise ModelError(f"{self.path} cannot be read: {error.strerror or error}") from None
        if len(data) != size:
            raise ModelError(f"{self.path} changed while it was being read; try again")
        return np.frombuffer(data, dtype=dtype)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, e.g. `block_count`."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def arch_int(self, key: str, default: int, low: int = 0, high: int = UINT32_MAX) -> int:
        """`arch_value` as an integer in [low, high], else the error of `invalid`."""
        value = self.arch_value(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.invalid(key, value)
        return value

    def per_layer(self, key: str, n_layers: int, default: int) -> list[int]:
        """An integer given once or for each of `n_layers` layers, as llama.cpp reads it (get_key_or_arr)."""
        value = self.arch_value(key, default)
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) != n_layers:
            raise self.invalid(key, f"{len(value)} values for {n_layers} layers")
        if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= UINT32_MAX for v in values):
            raise self.invalid(key, value)
        return values if isinstance(value, list) else values * n_layers

    def invalid(self, key: str, value: object) -> ModelError:
        """`{architecture}.{key}` holds `value`, which llama.cpp cannot load safely."""
        return ModelError(
            f"{self.path} has an invalid {f'{self.architecture}.{key}'[:80]!r} ({str(value)[:80]!r}); "
            "download or convert it again"
        )


def _quote(name: str) -> str:
    """A key or tensor name for a message: escaped, and cut if long (a damaged one may be neither)."""
    return repr(name[:60]) + ("..." if len(name) > 60 else "")


def _corrupt(path: Path, detail: str) -> ModelError:
    return ModelError(f"{path} is corrupt: {detail}; download or convert it again")


def _past_end(path: Path, detail: str) -> ModelError:
    return ModelError(
        f"{path} is truncated or corrupt: its GGUF header runs past the end of the file ({detail}); "
        "download or convert it again"
    )


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data = data
        self.path = path
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def skip(self, n: int, what: str) -> int:
        """Move past the `n` bytes of `what`; returns where they start."""
        start = self.pos
        if n > len(self.data) - start:
            raise _past_end(self.path, f"{what}, {n:,} bytes at byte {start:,}")
        self.pos = start + n
        return start

    def unpack(self, fmt: struct.Struct, what: str) -> Any:
        return fmt.unpack_from(self.data, self.skip(fmt.size, what))[0]

    def raw_string(self, what: str) -> bytes:
        n = self.unpack(_U64, f"the length of {what}")
        if n > MAX_STRING_BYTES:
            raise _corrupt(self.path, f"{what} claims to be {n:,} bytes long")
        start = self.skip(n, what)
        return self.data[start : start + n]

    def text(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _corrupt(self.path, f"{what} is not valid UTF-8 ({raw[:40]!r})") from None

    def skip_strings(self, count: int, key: str, *, unique: bool) -> None:
        """Move past an array of `count` strings; with `unique`, refuse a repeated entry."""
        if count * _U64.size > self.remaining():
            raise _past_end(self.path, f"{_quote(key)} claims {count:,} strings")
        data, pos, end = self.data, self.pos, len(self.data)
        unpack = _U64.unpack_from
        entries: list[bytes] = []
        index = 0
        try:
            for index in range(count):
                n = unpack(data, pos)[0]
                pos += 8
                if n > end - pos or n > MAX_STRING_BYTES:
                    raise _past_end(self.path, f"string {index} of {_quote(key)} claims {n:,} bytes")
                if unique:
                    entries.append(data[pos : pos + n])
                pos += n
        except struct.error:
            raise _past_end(self.path, f"{_quote(key)} ends in the middle of string {index}") from None
        self.pos = pos
        if unique and (repeat := _first_repeat(entries)) is not None:
            raise _corrupt(self.path, f"entry {repeat} of {_quote(key)} repeats an earlier one ({entries[repeat][:40]!r})")


def _first_repeat(entries: list[bytes]) -> int | None:
    """The first entry equal to an earlier one as llama.cpp maps them: up to the first NUL (it
    reads C strings), an empty one named "[EMPTY_<id>]"."""
    if b"" not in entries and b"\0" not in b"".join(entries) and len(set(entries)) == len(entries):
        return None  # the common case, at C speed
    seen: set[bytes] = set()
    for index, entry in enumerate(entries):
        entry = entry.split(b"\0", 1)[0] or b"[EMPTY_%d]" % index
        if entry in seen:
            return index
        seen.add(entry)
    return None


def _value_type(raw: int, path: Path, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise _corrupt(path, f"metadata {_quote(key)} has an unknown type {raw}") from None


_Metadata = tuple[dict[str, Any], dict[str, int], dict[str, tuple[GGUFValueType, int]], dict[str, GGUFValueType]]


def _read_metadata(cursor: _Cursor, n_kv: int) -> _Metadata:
    """Values, array lengths, numeric arrays' places and every key's type."""
    path = cursor.path
    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    numeric_arrays: dict[str, tuple[GGUFValueType, int]] = {}
    types: dict[str, GGUFValueType] = {}
    for index in range(n_kv):
        key = cursor.text(f"metadata key {index}")
        if not key or "\0" in key:
            raise _corrupt(path, f"metadata key {index} is empty or holds a NUL byte ({_quote(key)})")
        if key in types:
            raise _corrupt(path, f"metadata key {_quote(key)} appears twice")
        value_type = types[key] = _value_type(cursor.unpack(_U32, f"the type of {_quote(key)}"), path, key)
        if value_type == GGUFValueType.STRING:
            metadata[key] = cursor.text(f"the value of {_quote(key)}")
        elif value_type != GGUFValueType.ARRAY:
            metadata[key] = cursor.unpack(_SCALAR_FORMATS[value_type], f"the value of {_quote(key)}")
        else:
            item_type = _value_type(cursor.unpack(_U32, f"the item type of {_quote(key)}"), path, key)
            count = array_lengths[key] = cursor.unpack(_U64, f"the length of {_quote(key)}")
            if count > MAX_ARRAY_ITEMS:
                raise _corrupt(path, f"array {_quote(key)} claims {count:,} items")
            if item_type == GGUFValueType.STRING:
                cursor.skip_strings(count, key, unique=key == VOCABULARY_KEY)
            elif item_type == GGUFValueType.ARRAY:
                raise _corrupt(path, f"array {_quote(key)} holds arrays, which GGUF does not allow")
            else:
                item = _SCALAR_FORMATS[item_type]
                start = cursor.skip(count * item.size, f"the values of {_quote(key)}")
                numeric_arrays[key] = (item_type, start)
                if count <= MAX_KEPT_ARRAY:
                    metadata[key] = list(struct.unpack_from(f"<{count}{item.format[-1]}", cursor.data, start))
    return metadata, array_lengths, numeric_arrays, types


def _alignment(metadata: dict[str, Any], types: dict[str, GGUFValueType], path: Path) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    alignment = metadata["general.alignment"]
    if types["general.alignment"] != GGUFValueType.UINT32 or alignment <= 0 or alignment & (alignment - 1):
        raise _corrupt(path, f"general.alignment is {alignment!r}, not a power of 2 stored as uint32")
    if alignment < MIN_ALIGNMENT:
        raise _corrupt(path, f"general.alignment is {alignment}; llama.cpp needs tensor data aligned to {MIN_ALIGNMENT} bytes")
    return int(alignment)


def _read_tensor_info(cursor: _Cursor, index: int, names: set[str]) -> GgufTensor:
    path = cursor.path
    raw_name = cursor.raw_string(f"the name of tensor {index}")
    if len(raw_name) > MAX_NAME_BYTES:
        raise _corrupt(path, f"the name of tensor {index} is {len(raw_name):,} bytes long (llama.cpp allows {MAX_NAME_BYTES})")
    if b"\0" in raw_name:
        # llama.cpp keeps names as C strings: two could become one.
        raise _corrupt(path, f"the name of tensor {index} holds a NUL byte ({raw_name!r})")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        raise _corrupt(path, f"the name of tensor {index} is not valid UTF-8 ({raw_name!r})") from None
    quoted = _quote(name)
    if name in names:
        raise _corrupt(path, f"tensor {quoted} appears twice")
    names.add(name)
    n_dims = cursor.unpack(_U32, f"the dimension count of tensor {quoted}")
    if n_dims > MAX_DIMS:
        raise _corrupt(path, f"tensor {quoted} has {n_dims:,} dimensions (at most {MAX_DIMS})")
    fields = _TENSOR_FIELDS[n_dims]
    *shape, ggml_type, offset = fields.unpack_from(cursor.data, cursor.skip(fields.size, f"the shape of tensor {quoted}"))
    if any(dim <= 0 for dim in shape):
        raise _corrupt(path, f"tensor {quoted} has shape {shape}: every dimension must be positive")
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    if n_elements > INT64_MAX:
        raise _corrupt(path, f"tensor {quoted} has shape {shape}, too many elements")
    if ggml_type not in _TYPE_SIZES:
        raise _corrupt(path, f"tensor {quoted} has an unknown type {ggml_type}")
    block_size, type_size = _TYPE_SIZES[ggml_type]
    row = shape[0] if shape else 1
    if row % block_size:
        raise _corrupt(path, f"tensor {quoted} has rows of {row:,} values, not a multiple of its type's block of {block_size}")
    return GgufTensor(name, ggml_type, tuple(shape), offset, n_elements // block_size * type_size)


def _check_layout(tensors: list[GgufTensor], alignment: int, data_offset: int, size: int, path: Path) -> None:
    """Tensor data follows the header in table order, each tensor padded to the alignment (the
    only layout llama.cpp accepts), and lies within the file."""
    expected = 0
    for tensor in tensors:
        if tensor.offset != expected:
            raise _corrupt(
                path,
                f"tensor {_quote(tensor.name)} starts at data offset {tensor.offset:,}, expected {expected:,} "
                "(tensor data must follow one another without overlap or gaps)",
            )
        expected += -(-tensor.n_bytes // alignment) * alignment
    end = max((data_offset + t.offset + t.n_bytes for t in tensors), default=data_offset)
    if end > size:
        raise ModelError(
            f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}; "
            "download or convert it again"
        )


def _parse(data: mmap.mmap, path: Path) -> GgufHeader:
    cursor = _Cursor(data, path)
    if data[: len(GGUF_MAGIC)] != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it does not start with 'GGUF'); give a .gguf model file")
    cursor.skip(len(GGUF_MAGIC), "the magic")
    version = cursor.unpack(_U32, "the version")
    if version not in SUPPORTED_VERSIONS:
        raise ModelError(f"{path} is GGUF version {version}; localchat reads versions 2 and 3")
    n_tensors = cursor.unpack(_U64, "the tensor count")
    n_kv = cursor.unpack(_U64, "the metadata count")
    if n_kv * MIN_KV_BYTES > cursor.remaining():
        raise _past_end(path, f"it claims {n_kv:,} metadata entries")
    if n_tensors * MIN_TENSOR_INFO_BYTES > cursor.remaining():
        raise _past_end(path, f"it claims {n_tensors:,} tensors")
    metadata, array_lengths, numeric_arrays, types = _read_metadata(cursor, n_kv)
    alignment = _alignment(metadata, types, path)
    names: set[str] = set()
    tensors = [_read_tensor_info(cursor, index, names) for index in range(n_tensors)]
    data_offset = -(-cursor.pos // alignment) * alignment
    _check_layout(tensors, alignment, data_offset, len(data), path)
    return GgufHeader(path, version, metadata, array_lengths, tuple(tensors), data_offset, numeric_arrays)


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse and check `path`'s header (or read back what was found when this file was read before:
    see localchat.file_facts); raises ModelError naming what is wrong."""
    return _header_from_facts(path, remembered(path, HEADER_FACTS, lambda: _header_facts(_read_header(path))))


def _header_facts(header: GgufHeader) -> dict[str, Any]:
    """`header` as JSON data."""
    return {
        "version": header.version, "metadata": header.metadata, "array_lengths": header.array_lengths,
        "tensors": [[t.name, t.ggml_type, t.shape, t.offset, t.n_bytes] for t in header.tensors],
        "data_offset": header.data_offset,
        "numeric_arrays": {key: [int(item_type), start] for key, (item_type, start) in header.numeric_arrays.items()},
    }


def _header_from_facts(path: Path, facts: dict[str, Any]) -> GgufHeader:
    return GgufHeader(
        path, facts["version"], facts["metadata"], facts["array_lengths"],
        tuple(GgufTensor(name, ggml_type, tuple(shape), offset, n_bytes) for name, ggml_type, shape, offset, n_bytes in facts["tensors"]),
        facts["data_offset"],
        {key: (GGUFValueType(item_type), start) for key, (item_type, start) in facts["numeric_arrays"].items()},
    )


def _read_header(path: Path) -> GgufHeader:
    try:
        with path.open("rb") as stream:
            if os.fstat(stream.fileno()).st_size == 0:
                raise ModelError(f"{path} is empty; download or convert it again")
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(data, path)
    except OSError as error:
        raise ModelError(f"{path} cannot be read: {error.strerror or error}") from None


# GGUF key -> (SamplerSettings field, its type), as llama.cpp's common_init reads them; the keys a
# localchat sampler has no use for (mirostat, XTC, the sampler sequence) are left out.
GGUF_SAMPLING_KEYS: dict[str, tuple[str, Callable[[str], float | int]]] = {
    "general.sampling.temp": ("temperature", float),
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.penalty_last_n": ("penalty_last_n", int),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
}
# generation_config.json key -> GGUF key, as llama.cpp's converter (gguf-py's Metadata.load) maps them.
GENERATION_CONFIG_KEYS: dict[str, str] = {
    "temperature": "general.sampling.temp",
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
    "penalty_last_n": "general.sampling.penalty_last_n",
    "repetition_penalty": "general.sampling.penalty_repeat",
}


def generation_config_sampling(config: Mapping[str, object]) -> dict[str, float | int]:
    """`general.sampling.*` GGUF keys and values from a checkpoint's generation_config.json, as
    llama.cpp's converter writes them (ints for top_k and penalty_last_n, floats otherwise)."""
    written: dict[str, float | int] = {}
    for name, key in GENERATION_CONFIG_KEYS.items():
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        written[key] = int(value) if GGUF_SAMPLING_KEYS[key][1] is int else float(value)
    return written
