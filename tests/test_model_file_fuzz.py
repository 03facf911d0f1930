"""Damaged and hostile copies of the real Gemma 3 270M GGUF: the header reader answers each with a parse or
one ModelError, and `localchat run` with one line on stderr: never a traceback, never a crash.

The fuzz cases mutate the real header with its vocabulary cut to its first entries (every other
key and all 236 tensor infos as they are), so each case parses in a few milliseconds; the tensor
data stays sparse (a file of the full size holding only the header).
"""

from __future__ import annotations

import math
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localchat.errors import ModelError
from localchat.gguf_file import GgufHeader, GgufTensor, read_gguf_header
from localchat.models import inspect_gguf

VOCABULARY_KEEP = 256
TOKENIZER_ARRAYS = {"tokenizer.ggml.tokens": None, "tokenizer.ggml.scores": 4, "tokenizer.ggml.token_type": 4}
SEED = 14
U64_VALUES = (0, 1, 0x7F, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
I64_DIMS = (0, -1, -(2**63), 1, 3, 17, 2**31, 2**62, 2**63 - 1)
U32_VALUES = (0, 1, 3, 4, 5, 8, 9, 12, 13, 36, 42, 43, 100, 2**31, 2**32 - 1)
BYTE_VALUES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
VALUE_TYPE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _u32(value: int) -> bytes:
    return struct.pack("<I", value)


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value % 2**64)


def _gguf_string(text: bytes) -> bytes:
    return _u64(len(text)) + text


def _entry(key: str, value_type: int, value: bytes) -> bytes:
    """A metadata entry: key, type and value as GGUF writes them."""
    return _gguf_string(key.encode()) + struct.pack("<I", value_type) + value


Case = tuple[str, bytes, int]  # what was done, the header, the file's size


@dataclass(frozen=True)
class Seed:
    """A GGUF header and where its parts are, for targeted mutations."""

    header: bytes  # up to the tensor data
    size: int  # the file's full size
    parsed: GgufHeader
    keys: dict[str, tuple[int, int]]  # metadata key -> start and end of its record
    tensors: tuple[tuple[int, int, GgufTensor], ...]  # start and end of each tensor info, in order
    tokens: tuple[int, ...]  # start of each vocabulary entry

    @classmethod
    def locate(cls, header: bytes, size: int) -> Seed:
        parsed = read_header_bytes(header, size)
        names = [*parsed.metadata, *(k for k in parsed.array_lengths if k not in parsed.metadata)]
        starts = sorted(header.index(_gguf_string(k.encode())) for k in names)
        tensor_starts = [header.rindex(_gguf_string(t.name.encode())) for t in parsed.tensors]
        ends = [*starts[1:], tensor_starts[0]]
        keys = {header[s + 8 : s + 8 + struct.unpack_from("<Q", header, s)[0]].decode(): (s, e) for s, e in zip(starts, ends)}
        last = parsed.tensors[-1]  # name length, name, n_dims, shape, type, offset
        tensor_ends = [*tensor_starts[1:], tensor_starts[-1] + 8 + len(last.name) + 4 + 8 * len(last.shape) + 4 + 8]
        tokens, at = [], keys["tokenizer.ggml.tokens"][0] + 8 + len("tokenizer.ggml.tokens") + 16
        for _ in range(parsed.array_lengths["tokenizer.ggml.tokens"]):
            tokens.append(at)
            at += 8 + struct.unpack_from("<Q", header, at)[0]
        return cls(header, size, parsed, keys, tuple(zip(tensor_starts, tensor_ends, parsed.tensors)), tuple(tokens))

    def value_at(self, key: str) -> int:
        """Where the value of a scalar `key` starts (after its type)."""
        return self.keys[key][0] + 8 + len(key) + 4

    def case(self, what: str, header: bytes) -> Case:
        """A mutated header, in a file as long as the seed's or, if the header grew, longer by as much."""
        grown = len(header) - len(self.header)
        return what, header, self.size + (grown + 32 if grown > 0 else 0)

    def replace(self, start: int, end: int, data: bytes) -> bytes:
        return self.header[:start] + data + self.header[end:]

    def put(self, at: int, fmt: str, *values: int) -> bytes:
        return self.replace(at, at + struct.calcsize(fmt), struct.pack(fmt, *values))

    def with_entry(self, record: bytes) -> bytes:
        """One more metadata entry, first."""
        n_kv = struct.unpack_from("<Q", self.header, 16)[0]
        return self.header[:16] + _u64(n_kv + 1) + record + self.header[24:]

    def without_key(self, key: str) -> bytes:
        start, end = self.keys[key]
        n_kv = struct.unpack_from("<Q", self.header, 16)[0]
        return self.header[:16] + _u64(n_kv - 1) + self.header[24:start] + self.header[end:]

    def tensor_index(self, name: str) -> int:
        return next(i for i, (_, _, t) in enumerate(self.tensors) if t.name == name)

    def rename_tensor(self, index: int, name: bytes) -> bytes:
        start, _, tensor = self.tensors[index]
        return self.replace(start, start + 8 + len(tensor.name.encode()), _gguf_string(name))

    def rename_key(self, key: str, name: bytes) -> bytes:
        return self.replace(self.keys[key][0], self.value_at(key) - 4, _gguf_string(name))

    def set_tensor(self, index: int, field: str, fmt: str, value: int) -> bytes:
        return self.put(self.tensor_field(index, field), fmt, value)

    def tensor_field(self, index: int, field: str) -> int:
        """Where `field` (n_dims, dims, type or offset) of tensor `index` starts."""
        start, _, tensor = self.tensors[index]
        n_dims_at = start + 8 + len(tensor.name.encode())
        return {"n_dims": n_dims_at, "dims": n_dims_at + 4, "type": n_dims_at + 4 + 8 * len(tensor.shape),
                "offset": n_dims_at + 8 + 8 * len(tensor.shape)}[field]


def read_header_bytes(header: bytes, size: int) -> GgufHeader:
    """`header` written as a sparse file of `size` bytes, then read back."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "header.gguf"
        write_sparse(path, header, size)
        return read_gguf_header(path)


def write_sparse(path: Path, header: bytes, size: int) -> None:
    with path.open("wb") as stream:
        stream.write(header[:size])
        stream.truncate(size)


def shrink_vocabulary(header: bytes, keep: int) -> bytes:
    """`header` with the tokenizer's arrays cut to their first `keep` entries."""
    out = bytearray(header)
    for key, item_size in TOKENIZER_ARRAYS.items():
        count_at = out.index(_gguf_string(key.encode())) + 8 + len(key) + 8
        count = struct.unpack_from("<Q", out, count_at)[0]
        start = at = count_at + 8
        for index in range(count if item_size is None else 0):
            if index == keep:
                cut = at
            at += 8 + struct.unpack_from("<Q", out, at)[0]
        if item_size is not None:
            cut, at = start + keep * item_size, start + count * item_size
        out[count_at : count_at + 8] = _u64(keep)
        del out[cut:at]
    return bytes(out)


def real_seed(model: Path, keep: int | None) -> Seed:
    real = read_gguf_header(model)
    with model.open("rb") as stream:
        header = stream.read(real.data_offset)
    data_bytes = model.stat().st_size - real.data_offset
    if keep is None:
        return Seed.locate(header, real.data_offset + data_bytes)
    # The shrunk header's padding differs: read where its data starts, then cut or pad to it.
    header = shrink_vocabulary(header, keep)
    data_offset = read_header_bytes(header, len(header) + 64 + data_bytes).data_offset
    return Seed.locate(header[:data_offset].ljust(data_offset, b"\0"), data_offset + data_bytes)


@pytest.fixture(scope="module")
def seed(gemma_model: Path) -> Seed:
    return real_seed(gemma_model, VOCABULARY_KEEP)


# -- mutations: each takes the seed and a seeded random source, returns (what, header, size) ----------

def _region(seed: Seed, rng: random.Random) -> tuple[int, int]:
    first_tensor = seed.tensors[0][0]
    return rng.choice([(0, 4096), (seed.tokens[0], seed.tokens[-1]), (first_tensor, len(seed.header)), (0, len(seed.header))])


def flip_bits(seed: Seed, rng: random.Random) -> Case:
    out = bytearray(seed.header)
    low, high = _region(seed, rng)
    spots = [(rng.randrange(low, high), rng.randrange(8)) for _ in range(rng.randint(1, 4))]
    for at, bit in spots:
        out[at] ^= 1 << bit
    return seed.case(f"bits flipped at {spots}", bytes(out))


def set_bytes(seed: Seed, rng: random.Random) -> Case:
    out = bytearray(seed.header)
    low, high = _region(seed, rng)
    at, value, n = rng.randrange(low, high), rng.choice(BYTE_VALUES), rng.randint(1, 8)
    out[at : at + n] = bytes([value]) * len(out[at : at + n])
    return seed.case(f"{n} bytes at {at} set to {value:#x}", bytes(out))


def huge_counts(seed: Seed, rng: random.Random) -> Case:
    """A count or length field set to an absurd or off-by-one value."""
    fields = {"tensor count": 8, "metadata count": 16}
    for key, (start, _) in seed.keys.items():
        fields[f"length of key '{key}'"] = start
        if key in seed.parsed.array_lengths:
            fields[f"length of array '{key}'"] = start + 8 + len(key) + 8
        elif isinstance(seed.parsed.metadata[key], str):
            fields[f"length of the value of '{key}'"] = seed.value_at(key)
    for start, _, tensor in seed.tensors:
        fields[f"name length of tensor '{tensor.name}'"] = start
    token = rng.randrange(len(seed.tokens))
    fields[f"length of vocabulary entry {token}"] = seed.tokens[token]
    what, at = rng.choice(sorted(fields.items()))
    original = struct.unpack_from("<Q", seed.header, at)[0]
    value = rng.choice([*U64_VALUES, original + 1, original - 1, original * 2, seed.size])
    return seed.case(f"{what} set to {value}", seed.put(at, "<Q", value % 2**64))


def broken_tensor_info(seed: Seed, rng: random.Random) -> Case:
    index = rng.randrange(len(seed.tensors))
    tensor = seed.tensors[index][2]
    field = rng.choice(["n_dims", "dims", "type", "offset", "name"])
    if field == "n_dims":
        value = rng.choice([0, 1, 2, 3, 4, 5, 64, 2**32 - 1])
        return seed.case(f"tensor {tensor.name} n_dims {value}", seed.set_tensor(index, "n_dims", "<I", value))
    if field == "dims":
        dim = rng.randrange(len(tensor.shape))
        value = rng.choice([*I64_DIMS, tensor.shape[dim] + 1, tensor.shape[dim] * 2])
        at = seed.tensor_field(index, "dims") + 8 * dim
        return seed.case(f"tensor {tensor.name} dim {dim} = {value}", seed.put(at, "<q", value))
    if field == "type":
        value = rng.choice(U32_VALUES)
        return seed.case(f"tensor {tensor.name} type {value}", seed.set_tensor(index, "type", "<I", value))
    if field == "offset":
        neighbours = [t.offset for _, _, t in seed.tensors[max(index - 1, 0) : index + 2]]
        value = rng.choice([0, tensor.offset + 1, tensor.offset + 32, tensor.offset - 32, 2**63, 2**64 - 1, seed.size, *neighbours])
        return seed.case(f"tensor {tensor.name} offset {value}", seed.set_tensor(index, "offset", "<Q", value % 2**64))
    other = seed.tensors[rng.randrange(len(seed.tensors))][2].name.encode()
    name = rng.choice([other, b"", b"x" * 63, b"x" * 64, b"y" * 300, b"blk.\xff\xfe.weight", tensor.name.encode()[:-1] + b"\x00"])
    return seed.case(f"tensor {index} named {name[:40]!r}", seed.rename_tensor(index, name))


def broken_metadata(seed: Seed, rng: random.Random) -> Case:
    key = rng.choice(sorted(seed.keys))
    start, end = seed.keys[key]
    type_at = start + 8 + len(key)
    operation = rng.choice(["type", "item type", "rename", "drop", "value"])
    if operation == "type" or (operation == "item type" and key not in seed.parsed.array_lengths):
        value = rng.choice(U32_VALUES)
        return seed.case(f"'{key}' type {value}", seed.put(type_at, "<I", value))
    if operation == "item type":
        value = rng.choice(U32_VALUES)
        return seed.case(f"'{key}' item type {value}", seed.put(type_at + 4, "<I", value))
    if operation == "rename":
        other = rng.choice(sorted(seed.keys)).encode()
        name = rng.choice([other, b"", b"general.\xc3\x28", b"k" * 5000])
        return seed.case(f"'{key}' renamed {name[:40]!r}", seed.rename_key(key, name))
    if operation == "drop":
        return seed.case(f"'{key}' removed", seed.without_key(key))
    value = seed.parsed.metadata.get(key)
    if isinstance(value, str):
        text = rng.choice([b"", b"\xff\xfe\xfd", value.encode()[::-1], b"gemma9", b"llama", b"gpt2", b"t5", b"bert", b"rwkv", b"none"])
        return seed.case(f"'{key}' = {text!r}", seed.replace(type_at + 4, end, _gguf_string(text)))
    if isinstance(value, int) and not isinstance(value, bool):
        size = VALUE_TYPE_SIZES[struct.unpack_from("<I", seed.header, type_at)[0]]
        number = rng.choice([0, 1, value + 1, 2 ** (8 * size) - 1, 2 ** (8 * size - 1)])
        return seed.case(f"'{key}' = {number}", seed.replace(type_at + 4, end, number.to_bytes(size, "little")))
    return seed.case(f"'{key}' value bytes cleared", seed.replace(type_at + 4, end, bytes(end - type_at - 4)))


def alignment_entry(seed: Seed, rng: random.Random) -> Case:
    """A general.alignment entry of some value and type (the real file has none)."""
    value_type, fmt = rng.choice([(4, "<I"), (4, "<I"), (10, "<Q"), (5, "<i")])
    value = rng.choice([0, 1, 3, 16, 32, 64, 48, 2**31])
    record = _entry("general.alignment", value_type, struct.pack(fmt, -value if fmt == "<i" else value))
    return seed.case(f"general.alignment type {value_type} = {value}", seed.with_entry(record))


def broken_vocabulary(seed: Seed, rng: random.Random) -> Case:
    i, j = sorted(rng.sample(range(len(seed.tokens)), 2))
    entry_j = seed.header[seed.tokens[j] : seed.tokens[j + 1] if j + 1 < len(seed.tokens) else None]
    operation = rng.choice(["duplicate", "empty", "bad utf-8", "length"])
    start, end = seed.tokens[i], seed.tokens[i + 1]
    if operation == "duplicate":
        record = entry_j[: 8 + struct.unpack_from("<Q", entry_j)[0]]
    elif operation == "empty":
        record = _gguf_string(b"")
    elif operation == "bad utf-8":
        record = _gguf_string(b"\xff\xfe" + bytes([i % 256]))
    else:
        return seed.case(f"vocabulary entry {i} length 2**40", seed.put(start, "<Q", 2**40))
    return seed.case(f"vocabulary entry {i} {operation} (of {j})", seed.replace(start, end, record))


def truncation(seed: Seed, rng: random.Random) -> Case:
    data_offset = seed.parsed.data_offset
    cut = rng.choice([
        rng.randrange(0, 64),
        rng.randrange(0, len(seed.header)),
        rng.randrange(seed.tensors[0][0], len(seed.header)),
        data_offset,
        data_offset + rng.randrange(1, 4096),
        seed.size - rng.randrange(1, 4096),
        seed.size - 1,
    ])
    return f"cut at {cut}", seed.header[:cut], cut


def splice(seed: Seed, rng: random.Random) -> Case:
    low, high = _region(seed, rng)
    at, n = rng.randrange(low, high), rng.randint(1, 64)
    operation = rng.choice(["delete", "repeat", "insert"])
    if operation == "delete":
        return seed.case(f"{n} bytes deleted at {at}", seed.replace(at, at + n, b""))
    if operation == "repeat":
        return seed.case(f"{n} bytes repeated at {at}", seed.replace(at, at, seed.header[at : at + n]))
    return seed.case(f"{n} random bytes inserted at {at}", seed.replace(at, at, rng.randbytes(n)))


MUTATIONS: dict[Callable[[Seed, random.Random], Case], int] = {
    flip_bits: 150,
    set_bytes: 60,
    huge_counts: 100,
    broken_tensor_info: 120,
    broken_metadata: 100,
    alignment_entry: 16,
    broken_vocabulary: 30,
    truncation: 60,
    splice: 50,
}


def fuzz_cases(seed: Seed) -> Iterator[Case]:
    rng = random.Random(SEED)
    for mutation, count in MUTATIONS.items():
        for _ in range(count):
            yield mutation(seed, rng)


def outcome(path: Path) -> str:
    """'parsed', 'refused: <message>', or the unexpected exception with its traceback."""
    try:
        inspect_gguf(path)
    except ModelError as error:
        return f"refused: {error}"
    except Exception:  # what this test exists to find
        return "CRASH " + traceback.format_exc(limit=-3)
    return "parsed"


def test_mutated_headers_parse_or_raise_model_error(seed: Seed, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.gguf"
    outcomes: list[tuple[str, str]] = []
    started = time.perf_counter()
    for what, header, size in fuzz_cases(seed):
        write_sparse(path, header, size)
        outcomes.append((what, outcome(path)))
    elapsed = time.perf_counter() - started
    crashes = [(what, result) for what, result in outcomes if result.startswith("CRASH")]
    assert not crashes, f"{len(crashes)} of {len(outcomes)} cases raised something else than ModelError:\n" + "\n".join(
        f"{what}: {result}" for what, result in crashes[:5]
    )
    refused = [result for _, result in outcomes if result.startswith("refused")]
    # The mutations reach both outcomes, and every refusal is one line naming the file.
    assert len(outcomes) / 2 < len(refused) < len(outcomes), (len(refused), len(outcomes))
    assert all(str(path) in result and "\n" not in result for result in refused)
    # A guard against a reader that loops over a huge count (about 5 s here on 2 busy cores).
    assert elapsed < 60, f"{len(outcomes)} cases took {elapsed:.1f} s"


def _duplicate_token(seed: Seed) -> bytes:
    """Entry 101 spelled as entry 100 (llama.cpp asserts vocabulary entries are unique)."""
    first, second, third = seed.tokens[100:103]
    return seed.replace(second, third, seed.header[first:second])


def _duplicate_token_up_to_nul(seed: Seed) -> bytes:
    """Entry 101 spelled as entry 100 and a NUL, then more: llama.cpp reads it as a C string."""
    first, second, third = seed.tokens[100:103]
    spelled = seed.header[first + 8 : second]
    return seed.replace(second, third, _gguf_string(spelled + b"\0tail"))


# Targeted hostile headers: what llama.cpp's gguf.cpp refuses, and what would abort llama.cpp's
# loader if the reader let it through (a repeated vocabulary entry, an alignment under 32,
# block_count 0 or over 512, inconsistent expert counts, an unknown rope scaling).
EMBEDDING = "token_embd.weight"
UINT32, STRING, UINT64 = 4, 8, 10
RMS_EPSILON = "gemma3.attention.layer_norm_rms_epsilon"
HOSTILE: dict[str, tuple[Callable[[Seed], bytes], str]] = {
    "vocabulary entry repeated": (_duplicate_token, "repeats an earlier one"),
    "vocabulary entry repeated up to a NUL": (_duplicate_token_up_to_nul, "repeats an earlier one"),
    "tensor count 2**63": (lambda s: s.put(8, "<Q", 2**63), "claims 9,223,372,036,854,775,808 tensors"),
    "metadata count 2**64-1": (lambda s: s.put(16, "<Q", 2**64 - 1), "metadata entries"),
    "5 dimensions": (lambda s: s.set_tensor(0, "n_dims", "<I", 5), "5 dimensions"),
    "negative dimension": (lambda s: s.set_tensor(0, "dims", "<q", -640), "must be positive"),
    "zero dimension": (lambda s: s.set_tensor(0, "dims", "<q", 0), "must be positive"),
    "removed ggml type": (lambda s: s.set_tensor(0, "type", "<I", 4), "unknown type 4"),
    "row not a whole block": (lambda s: s.set_tensor(s.tensor_index(EMBEDDING), "dims", "<q", 641), "not a multiple"),
    "element count overflow": (
        lambda s: s.put(s.tensor_field(s.tensor_index(EMBEDDING), "dims") + 8, "<q", 2**62), "too many elements",
    ),
    "overlapping tensor data": (lambda s: s.set_tensor(2, "offset", "<Q", s.tensors[1][2].offset), "expected"),
    "misaligned tensor data": (lambda s: s.set_tensor(2, "offset", "<Q", s.tensors[2][2].offset + 1), "expected"),
    "tensor data past the end": (lambda s: s.set_tensor(len(s.tensors) - 1, "dims", "<q", 640 * 1024), "is truncated"),
    "duplicate tensor name": (lambda s: s.rename_tensor(1, s.tensors[0][2].name.encode()), "appears twice"),
    "tensor name of 64 bytes": (lambda s: s.rename_tensor(0, b"t" * 64), "64 bytes long"),
    "tensor name with a NUL": (lambda s: s.rename_tensor(0, b"output_norm\0.weight"), "NUL byte"),
    "key not UTF-8": (lambda s: s.rename_key("general.name", b"general.\xffame"), "not valid UTF-8"),
    "duplicate key": (lambda s: s.rename_key("general.basename", b"general.name"), "appears twice"),
    "nested array": (lambda s: s.put(s.value_at("general.tags"), "<I", 9), "holds arrays"),
    "string of 2**62 bytes": (lambda s: s.put(s.value_at("general.name"), "<Q", 2**62), "claims to be"),
    "alignment not a power of 2": (lambda s: s.with_entry(_entry("general.alignment", UINT32, _u32(48))), "not a power of 2"),
    "alignment 16": (lambda s: s.with_entry(_entry("general.alignment", UINT32, _u32(16))), "aligned to 32 bytes"),
    "alignment stored as uint64": (lambda s: s.with_entry(_entry("general.alignment", UINT64, _u64(32))), "stored as uint32"),
    "block_count 0": (lambda s: s.put(s.value_at("gemma3.block_count"), "<I", 0), "gemma3.block_count"),
    "block_count 513": (lambda s: s.put(s.value_at("gemma3.block_count"), "<I", 513), "gemma3.block_count"),
    "no block_count": (lambda s: s.without_key("gemma3.block_count"), "has no 'gemma3.block_count'"),
    "expert count without experts used": (lambda s: s.with_entry(_entry("gemma3.expert_count", UINT32, _u32(8))), "expert_count"),
    "unknown rope scaling": (
        lambda s: s.with_entry(_entry("gemma3.rope.scaling.type", STRING, _gguf_string(b"cubic"))), "rope.scaling.type",
    ),
    "byte tokens in a 'bert' vocabulary": (lambda s: _tokenizer_model(s, b"bert"), "byte tokens in a 'bert' vocabulary"),
    "rms epsilon NaN": (lambda s: s.put(s.value_at(RMS_EPSILON), "<f", math.nan), RMS_EPSILON),
    "rms epsilon negative": (lambda s: s.put(s.value_at(RMS_EPSILON), "<f", -1e-6), RMS_EPSILON),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_refused_with_a_clear_message(seed: Seed, tmp_path: Path, case: str) -> None:
    mutate, message = HOSTILE[case]
    path = tmp_path / "hostile.gguf"
    write_sparse(path, *seed.case(case, mutate(seed))[1:])
    with pytest.raises(ModelError, match=re.escape(message)):
        inspect_gguf(path)


# -- end to end: the real file, damaged, through `localchat run` ----------------------------------

# (mutation of the full real header, what stderr must say). The last ones pass the header reader
# and are refused by llama.cpp itself, which must become the same one line.
def _tokenizer_model(seed: Seed, name: bytes) -> bytes:
    return seed.replace(seed.value_at("tokenizer.ggml.model"), seed.keys["tokenizer.ggml.model"][1], _gguf_string(name))


def _unigram_without_bos(seed: Seed) -> bytes:
    """A unigram ("t5") vocabulary, which has no default BOS, with the BOS id removed: llama.cpp
    loads it, then asserts when asked to add BOS while tokenizing."""
    header = _tokenizer_model(seed, b"t5")
    start, end = seed.keys["tokenizer.ggml.bos_token_id"]
    start, end = start - len(seed.header) + len(header), end - len(seed.header) + len(header)
    return header[:16] + _u64(struct.unpack_from("<Q", header, 16)[0] - 1) + header[24:start] + header[end:]


# (mutation of the full real header, what stderr must say). Some would abort llama.cpp if they
# reached it; the last ones pass the header reader and are refused by llama.cpp itself, which
# must become the same one line.
CLI_CASES: dict[str, tuple[Callable[[Seed], bytes], str]] = {
    "huge key length": (lambda s: s.put(s.keys["general.name"][0], "<Q", 2**29), "is truncated or corrupt"),
    "vocabulary entry repeated up to a NUL": HOSTILE["vocabulary entry repeated up to a NUL"],
    "alignment 1": (lambda s: s.with_entry(_entry("general.alignment", UINT32, _u32(1))), "aligned to 32 bytes"),
    "block_count 0": HOSTILE["block_count 0"],
    "rms epsilon NaN (ggml asserts)": HOSTILE["rms epsilon NaN"],
    "byte tokens in a 'bert' vocabulary": (lambda s: _tokenizer_model(s, b"bert"), "byte tokens in a 'bert' vocabulary"),
    "unigram vocabulary without its BOS": (_unigram_without_bos, "adds a BOS token it does not have"),
    "tensor renamed (llama.cpp: not found)": (
        lambda s: s.rename_tensor(3, s.tensors[3][2].name.replace("weight", "wXight").encode()), "not found",
    ),
    "unknown tokenizer (llama.cpp refuses)": (lambda s: _tokenizer_model(s, b"lXama"), "unknown tokenizer"),
    "embedding transposed (llama.cpp: wrong shape)": (
        lambda s: s.put(s.tensor_field(s.tensor_index(EMBEDDING), "dims"), "<qq", 262144, 640), "wrong shape",
    ),
}


@pytest.fixture(scope="module")
def full_seed(gemma_model: Path) -> Seed:
    return real_seed(gemma_model, None)


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_a_damaged_model_ends_localchat_run_with_one_line(full_seed: Seed, tmp_path: Path, localchat_home: Path, case: str) -> None:
    mutate, message = CLI_CASES[case]
    path = tmp_path / "damaged.gguf"
    write_sparse(path, *full_seed.case(case, mutate(full_seed))[1:])
    env = {**os.environ, "LOCALCHAT_HOME": str(localchat_home)}
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "run", "-m", str(path), "-n", "4", "hi"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
