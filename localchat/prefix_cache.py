"""Saved KV states keyed by the tokens they hold, found by longest common prefix.

A new conversation that shares a system prompt with an earlier one, or a return to an earlier
conversation, restores the saved state and evaluates only the tokens after the shared prefix.
Entries live in RAM up to a byte budget; the least recently used spill to a disk tier (one file
each, written atomically) up to its own budget. At exit the RAM entries are written there too, with
an index of the tier's token lists, and the disk tier survives restarts. Each disk entry carries CRC-32s
of its token list and of its state,
checked when it is read: a flipped bit would otherwise restore a wrong KV cache and give a silently
wrong reply, so a damaged entry is dropped and the prompt computed afresh.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

# A match shorter than this is not worth a state restore. A chat model's fixed head, its default system prompt
# and the user turn's opening, is often shorter than 32 tokens (SmolLM2-135M-Instruct's: 27), so with 32 no new
# chat reused it; 16 is vLLM's block size. On AMD EPYC (2 threads) SmolLM2 computes 16 tokens in 114 ms and
# restores a 31-token state (0.7 MB) in 0.18 ms: `localchat run -n 1` with a new question 0.92 -> 0.80 s.
MIN_MATCH_TOKENS = 16
# Entries are indexed by their prefixes of whole blocks of this many tokens (see `prefix_hashes`).
INDEX_BLOCK = MIN_MATCH_TOKENS
# A lookup compares the prompt with at most this many of the entries sharing its most blocks (`_compared`).
MAX_COMPARED = 8
_FILE_MAGIC = b"LCKV2\0"
# After the magic: token count, state size, CRC-32 of magic + counts + tokens, CRC-32 of the state.
_FILE_HEADER = struct.Struct("<QQII")
# The disk tier's index (`_write_disk_index`): the magic, then a record for each entry (this header, its key
# as its file names it, its tokens), then a CRC-32 of the records.
_INDEX_MAGIC = b"LCKI1\0"
_INDEX_RECORD = struct.Struct("<HQQ")  # key length, token count, state size


def common_prefix_length(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    left = np.asarray(a[:n], dtype=np.int64)
    right = np.asarray(b[:n], dtype=np.int64)
    differs = np.flatnonzero(left != right)
    return int(differs[0]) if differs.size else n


def prefix_hashes(tokens: np.ndarray, variant: str, known: Sequence[int] = ()) -> list[int]:
    """Chained hashes of `tokens`' prefixes of whole INDEX_BLOCKs under `variant`: the k-th stands for the
    variant and the first k blocks (the 0th for the variant alone). Two sequences share the first k blocks
    when their k-th hashes are equal (barring a 64-bit collision: what a lookup finds is compared exactly,
    variant and tokens). `known`: the first of them, already hashed (a prefix's)."""
    data = tokens.astype(np.int32, copy=False)
    hashes = list(known) or [hash(variant)]
    running = hashes[-1]
    for start in range((len(hashes) - 1) * INDEX_BLOCK, len(data) - INDEX_BLOCK + 1, INDEX_BLOCK):
        running = hash((running, data[start : start + INDEX_BLOCK].tobytes()))
        hashes.append(running)
    return hashes


Key = TypeVar("Key", bound=Hashable)


class BlockIndex(Generic[Key]):
    """Token sequences' keys by the hashes of their prefixes of whole blocks (`prefix_hashes`), as vLLM finds
    cached blocks: those sharing the most blocks with a prompt are found in a lookup a block, however many."""

    def __init__(self) -> None:
        self._keys: dict[int, set[Key]] = {}  # a prefix hash: the keys of the sequences holding that prefix

    def __bool__(self) -> bool:
        return bool(self._keys)

    def add(self, key: Key, hashes: Sequence[int]) -> None:
        """Index `key`, a sequence whose prefix hashes are `hashes`."""
        for prefix_hash in hashes:
            self._keys.setdefault(prefix_hash, set()).add(key)

    def remove(self, key: Key, hashes: Sequence[int]) -> None:
        """Forget `key`, added with `hashes`."""
        for prefix_hash in hashes:
            keys = self._keys[prefix_hash]
            keys.discard(key)
            if not keys:
                del self._keys[prefix_hash]

    def holding(self, prefix_hash: int) -> set[Key]:
        """The keys of the sequences holding the prefix of `prefix_hash` (not to be changed)."""
        return self._keys.get(prefix_hash, set())

    def sharing_most_blocks(self, hashes: Sequence[int]) -> tuple[int, set[Key]]:
        """The keys sharing the most whole blocks, at least one, with the sequence whose prefix hashes are
        `hashes` (not to be changed), and how many blocks they share; (0, none) where none shares one. The
        longest match is among them when it is a block or longer."""
        blocks, found = 0, set()
        for prefix_hash in hashes[1:]:
            keys = self._keys.get(prefix_hash)
            if not keys:
                break
            blocks, found = blocks + 1, keys
        return blocks, found


@dataclass
class _Entry:
    tokens: np.ndarray
    state: bytes | None  # None while it lives only on disk
    disk_path: Path | None
    size: int
    # What else the KV depends on: the LoRA adapters it was computed with ("" for none). Such
    # entries stay in RAM: adapter ids are the run's own, a restart may give them other files.
    variant: str = ""
    prefix_hashes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PrefixMatch:
    key: str
    tokens: np.ndarray
    length: int
    state_bytes: int


# The weight of the newest measurement in the moving averages of RestoreCosts.
COST_WEIGHT = 0.3


@dataclass
class RestoreCosts:
    """What restoring a saved state and computing a prompt cost on this machine, as measured so far.

    On a GPU, computing a 300-token prompt took less than restoring its saved state (34 ms against
    38 ms: the state crosses from host memory, the prompt is computed where the model is); on 2 CPU
    cores computing it takes 50 times longer. So a restore is chosen only while it is measured to be
    faster, each side by a moving average: per byte of state restored (reading a disk entry
    included) and per prompt token evaluated in chunks of at least MIN_TIMED_PREFILL."""

    restore_s_per_byte: float | None = None
    prefill_s_per_token: float | None = None

    def restore_pays(self, state_bytes: int, tokens_saved: int) -> bool:
        """Whether restoring `state_bytes` beats computing the `tokens_saved` it would spare (unmeasured: try it)."""
        if self.restore_s_per_byte is None or self.prefill_s_per_token is None:
            return True
        return state_bytes * self.restore_s_per_byte < tokens_saved * self.prefill_s_per_token

    def restored(self, state_bytes: int, seconds: float) -> None:
        self.restore_s_per_byte = _moving_average(self.restore_s_per_byte, seconds / max(state_bytes, 1))

    def prefilled(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_TIMED_PREFILL:
            self.prefill_s_per_token = _moving_average(self.prefill_s_per_token, seconds / tokens)


# A prompt chunk shorter than this is evaluated less efficiently per token (the batch is not full): not timed.
MIN_TIMED_PREFILL = 64


def _moving_average(average: float | None, sample: float) -> float:
    return sample if average is None else average + COST_WEIGHT * (sample - average)


class PrefixCache:
    """Longest-prefix lookup over saved KV states with a RAM budget and an optional disk tier.

    The entries are indexed by the hashes of their prefixes of whole blocks (as vLLM finds cached
    blocks), so a lookup compares the prompt with the entries sharing its longest indexed prefix
    alone. Comparing every entry took 3.5 ms a lookup with 366 entries of the default model (0.017 ms
    through the index), and a server's disk tier holds hundreds."""

    def __init__(self, model_key: str, ram_budget_bytes: int, disk_dir: Path | None = None, disk_budget_bytes: int = 0) -> None:
        self.model_key = model_key
        self.ram_budget_bytes = ram_budget_bytes
        self.disk_dir = disk_dir if disk_budget_bytes > 0 else None
        self.disk_budget_bytes = disk_budget_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._index: BlockIndex[str] = BlockIndex()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # Restoring is not always faster than computing: measured as the sessions go.
        self.costs = RestoreCosts()
        self.skipped = 0  # matches found but computed instead, being faster
        self._index_stale = False  # the disk tier's entries differ from what its index lists
        self._last_hashed: tuple[np.ndarray, str, list[int]] | None = None  # see `_hashes`
        if self.disk_dir is not None:
            self._load_disk_index()

    # -- lookup --------------------------------------------------------------------

    def longest_match(self, tokens: Sequence[int], variant: str = "", *, whole: bool = False) -> PrefixMatch | None:
        """The saved state of `variant` sharing the longest prefix with `tokens` (at least MIN_MATCH_TOKENS), or
        where many share as many whole blocks, the longest of the most recently used of them (`_compared`).
        `whole`: the longest that `tokens` short of their last one hold whole (a state that cannot be cut back,
        localchat.backends.base.Backend.saved_states_rewind)."""
        prompt = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            if whole:
                held = prompt[:-1]
                best = self._best_of(self._prefixes_of(held, variant, self._hashes(held, variant)), prompt, variant)
            else:
                best = self._sharing_most(prompt, variant)
            if best is None:
                self.misses += 1
            else:
                self.hits += 1
            return best

    def sharing_most(self, tokens: Sequence[int], variant: str = "") -> PrefixMatch | None:
        """The saved state of `variant` sharing the most with `tokens` (at least MIN_MATCH_TOKENS), whether or not
        it holds more: where a prompt parts from the earlier ones. Not a lookup (no hit or miss counted)."""
        with self._lock:
            return self._sharing_most(np.asarray(tokens, dtype=np.int32), variant)

    def _sharing_most(self, prompt: np.ndarray, variant: str) -> PrefixMatch | None:
        return self._best_of(self._compared(self._index.sharing_most_blocks(self._hashes(prompt, variant))[1]), prompt, variant)

    def _hashes(self, tokens: np.ndarray, variant: str) -> list[int]:
        """`prefix_hashes`, those of the blocks shared with the last sequence hashed taken from it (under the lock):
        a prefill looks its prompt up, then where it parts from the saved prompts, then saves prefixes of it, and
        the reply's save extends it (8k tokens take 0.37 ms to hash)."""
        last_tokens, last_variant, last_hashes = self._last_hashed or (tokens[:0], variant, [])
        shared = common_prefix_length(last_tokens, tokens)
        hashes = prefix_hashes(tokens, variant, last_hashes[: shared // INDEX_BLOCK + 1] if last_variant == variant else ())
        if len(tokens) > shared:  # not a prefix of the last: hashed next, what extends it is likelier
            self._last_hashed = (tokens.copy(), variant, hashes)
        return hashes

    def _best_of(self, keys: Iterable[str], prompt: np.ndarray, variant: str) -> PrefixMatch | None:
        """Of the entries `keys`, the one of `variant` sharing the longest prefix with `prompt`, at least MIN_MATCH_TOKENS."""
        best: PrefixMatch | None = None
        for key in keys:
            entry = self._entries[key]
            length = common_prefix_length(entry.tokens, prompt)
            if entry.variant == variant and length >= MIN_MATCH_TOKENS and (best is None or length > best.length):
                best = PrefixMatch(key, entry.tokens, length, entry.size)
        return best

    def _compared(self, keys: set[str]) -> Iterable[str]:
        """Of entries sharing the same whole blocks with a prompt, those compared with it: all, or the
        MAX_COMPARED most recently used where more do. Their matches differ by less than a block, and a
        fixed system prompt or an app's fixed instructions can put every entry of a model among them:
        comparing 935 such entries took 28 ms of each request's time to first token."""
        if len(keys) <= MAX_COMPARED:
            return keys
        return islice((key for key in reversed(self._entries) if key in keys), MAX_COMPARED)

    def load(self, key: str) -> bytes | None:
        """The saved state of a match, read back into RAM from disk if need be; None if it is gone."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            state = entry.state
            if state is None and entry.disk_path is not None:
                try:
                    tokens, state = _read_entry_file(entry.disk_path, with_state=True)
                except (OSError, ValueError):
                    tokens = None
                if tokens is None or not np.array_equal(tokens, entry.tokens):
                    self._remove(key)  # a damaged entry is only a lost speed-up
                    return None
                entry.state = state
                self._enforce_budgets()
            return state

    def covers(self, tokens: Sequence[int], variant: str = "", *, exactly: bool = False) -> bool:
        """Whether some entry of `variant` already holds all of `tokens` (saving them again is pointless);
        `exactly`: and no more (a state that cannot be cut back serves only prompts that hold it whole)."""
        array = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            # Such an entry shares all of `tokens`' whole blocks.
            prefix_hash = self._hashes(array, variant)[-1]
            return any(
                entry.variant == variant and (len(entry.tokens) == len(array) if exactly else len(entry.tokens) >= len(array))
                and common_prefix_length(entry.tokens, array) == len(array)
                for entry in (self._entries[key] for key in self._index.holding(prefix_hash))
            )

    # -- insertion -----------------------------------------------------------------

    def put(self, tokens: Sequence[int], state: bytes, variant: str = "", *, supersede: bool = True) -> None:
        """Save `state`, the KV cache holding exactly `tokens` computed as `variant`. With `supersede`, the
        entries of that variant it extends are dropped: cut back, it serves their prompts too, which a
        state that cannot be cut back does not (localchat.backends.base.Backend.saved_states_rewind)."""
        array = np.asarray(tokens, dtype=np.int32)
        key = hashlib.sha1(self.model_key.encode() + variant.encode() + array.tobytes()).hexdigest()
        with self._lock:
            hashes = self._hashes(array, variant)
            extended = self._prefixes_of(array, variant, hashes) if supersede else [key] if key in self._entries else []
            for other_key in extended:
                self._remove(other_key)
            self._add(key, _Entry(array, state, None, len(state), variant, hashes))
            self._enforce_budgets()

    def discard(self, key: str) -> None:
        """Forget an entry the backend could not restore."""
        with self._lock:
            if key in self._entries:
                self._remove(key)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self._remove(key)

    # -- budgets and the disk tier -------------------------------------------------

    @property
    def ram_bytes(self) -> int:
        return sum(e.size for e in self._entries.values() if e.state is not None)

    @property
    def disk_bytes(self) -> int:
        return sum(e.size for e in self._entries.values() if e.disk_path is not None)

    def __len__(self) -> int:
        return len(self._entries)

    def persist(self) -> None:
        """Copy the entries held only in RAM to the disk tier, so that the next run finds them:
        the most recently used first while the disk budget lasts; then the tier's index."""
        if self.disk_dir is None:
            return
        with self._lock:
            room = self.disk_budget_bytes - self.disk_bytes
            chosen = []
            for key, entry in reversed(self._entries.items()):
                if entry.disk_path is None and entry.state is not None and not entry.variant and entry.size <= room:
                    chosen.append((key, entry))
                    room -= entry.size
            for key, entry in reversed(chosen):
                try:
                    entry.disk_path = self._write_entry_file(key, entry)
                except OSError:  # a full or read-only disk: what was written stays
                    break
            if self._index_stale:
                self._write_disk_index()

    def _prefixes_of(self, array: np.ndarray, variant: str, hashes: list[int]) -> list[str]:
        """The entries of `variant` that `array` (whose prefix hashes are `hashes`) extends or equals: one
        with k whole blocks shares them all with `array`, so it is found under `array`'s k-th prefix hash."""
        found = []
        for blocks, prefix_hash in enumerate(hashes):
            for key in self._index.holding(prefix_hash):
                entry = self._entries[key]
                tokens = entry.tokens
                if (entry.variant == variant and len(tokens) // INDEX_BLOCK == blocks and len(tokens) <= len(array)
                        and common_prefix_length(tokens, array) == len(tokens)):
                    found.append(key)
        return found

    def _add(self, key: str, entry: _Entry) -> None:
        self._entries[key] = entry
        self._index.add(key, entry.prefix_hashes)

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._index.remove(key, entry.prefix_hashes)
        if entry.disk_path is not None:
            entry.disk_path.unlink(missing_ok=True)
            self._index_stale = True

    def _enforce_budgets(self) -> None:
        for key, entry in list(self._entries.items()):
            if self.ram_bytes <= self.ram_budget_bytes:
                break
            if entry.state is None:
                continue
            if self.disk_dir is not None and not entry.variant and entry.size <= self.disk_budget_bytes:
                if entry.disk_path is None:
                    try:
                        entry.disk_path = self._write_entry_file(key, entry)
                    except OSError:  # a full or read-only disk costs the entry, not the reply
                        self._remove(key)
                        continue
                entry.state = None
            else:
                self._remove(key)
        for key, entry in list(self._entries.items()):
            if self.disk_bytes <= self.disk_budget_bytes:
                break
            if entry.disk_path is not None and entry.state is None:
                self._remove(key)

    def _write_entry_file(self, key: str, entry: _Entry) -> Path:
        assert self.disk_dir is not None and entry.state is not None
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        path = self._entry_path(key)
        partial = path.with_name(path.name + ".incomplete")
        tokens = entry.tokens.astype("<i4").tobytes()
        counts = struct.pack("<QQ", len(entry.tokens), len(entry.state))
        tokens_crc = zlib.crc32(_FILE_MAGIC + counts + tokens)
        try:
            with partial.open("wb") as stream:
                stream.write(_FILE_MAGIC)
                stream.write(_FILE_HEADER.pack(len(entry.tokens), len(entry.state), tokens_crc, zlib.crc32(entry.state)))
                stream.write(tokens)
                stream.write(entry.state)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        self._index_stale = True
        return path

    def _entry_path(self, key: str) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"{self.model_key}-{key}.kv"

    @property
    def _index_path(self) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"{self.model_key}.index"

    def _write_disk_index(self) -> None:
        """List the disk entries' keys and tokens, least recently used first, in one file that the next
        start reads instead of each entry's header: 1,099 entries of the default model (its 4 GiB budget)
        took 35 ms of each start read one by one, 13 ms through their index. It only spares reads: an entry
        it does not list (written by another process, or after a crash) is read from its file, one it lists
        is checked against its file when its state is read, and one whose file is gone is left out."""
        records = [_INDEX_MAGIC]
        for key, entry in self._entries.items():
            if entry.disk_path is not None:
                name = os.fsencode(key)
                records += [_INDEX_RECORD.pack(len(name), len(entry.tokens), entry.size), name,
                            entry.tokens.astype("<i4").tobytes()]
        body = b"".join(records)
        partial = self._index_path.with_name(self._index_path.name + ".incomplete")
        try:
            partial.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
            os.replace(partial, self._index_path)
            self._index_stale = False
        except OSError:  # the next start reads the entries' own files
            partial.unlink(missing_ok=True)

    def _load_disk_index(self) -> None:
        """The disk tier's entries, least recently used first: those its index lists, in its order and with
        their tokens from it; then those it does not, from their files, oldest first."""
        assert self.disk_dir is not None
        prefix = f"{self.model_key}-"
        try:
            keys = {name[len(prefix) : -len(".kv")] for name in os.listdir(self.disk_dir)
                    if name.startswith(prefix) and name.endswith(".kv")}
        except OSError:  # no disk tier yet, or none that can be read
            return
        indexed = _read_disk_index(self._index_path)
        found = [(key, tokens, state_size) for key, (tokens, state_size) in indexed.items() if key in keys]
        unlisted = sorted(keys - indexed.keys(), key=lambda key: _modified(self._entry_path(key)))
        self._index_stale = bool(unlisted) or len(found) != len(indexed)
        for key in unlisted:
            path = self._entry_path(key)
            try:
                tokens, _ = _read_entry_file(path, with_state=False)
                found.append((key, tokens, path.stat().st_size - _header_size(len(tokens))))
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # a damaged entry is only a lost speed-up
        for key, tokens, state_size in found:
            self._add(key, _Entry(tokens, None, self._entry_path(key), state_size, prefix_hashes=prefix_hashes(tokens, "")))
        self._enforce_budgets()


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone meanwhile: its read fails
        return 0.0


def _header_size(n_tokens: int) -> int:
    return len(_FILE_MAGIC) + _FILE_HEADER.size + 4 * n_tokens


def _read_disk_index(path: Path) -> dict[str, tuple[np.ndarray, int]]:
    """An entry's key: its tokens and state size, as the index at `path` lists them; none if it is
    missing or damaged."""
    try:
        data = memoryview(path.read_bytes())
    except OSError:
        return {}
    body, crc = data[:-4], data[-4:]
    if len(crc) < 4 or body[: len(_INDEX_MAGIC)] != _INDEX_MAGIC or struct.unpack("<I", crc)[0] != zlib.crc32(body):
        return {}
    listed: dict[str, tuple[np.ndarray, int]] = {}
    offset = len(_INDEX_MAGIC)
    while offset < len(body):
        name_length, n_tokens, state_size = _INDEX_RECORD.unpack_from(body, offset)
        offset += _INDEX_RECORD.size
        key = os.fsdecode(bytes(body[offset : offset + name_length]))
        offset += name_length
        listed[key] = np.frombuffer(body, dtype="<i4", count=n_tokens, offset=offset).astype(np.int32), state_size
        offset += 4 * n_tokens
    return listed


def _read_entry_file(path: Path, *, with_state: bool) -> tuple[np.ndarray, bytes | None]:
    """The entry's tokens (and state); ValueError if the file is not whole and intact."""
    with path.open("rb") as stream:
        magic = stream.read(len(_FILE_MAGIC))
        header = stream.read(_FILE_HEADER.size)
        if magic != _FILE_MAGIC or len(header) != _FILE_HEADER.size:
            raise ValueError(f"{path} is not a prefix-cache file of this version")
        n_tokens, n_state, tokens_crc, state_crc = _FILE_HEADER.unpack(header)
        if _header_size(n_tokens) + n_state != path.stat().st_size:
            raise ValueError(f"{path} is truncated or has a damaged header")
        raw_tokens = stream.read(4 * n_tokens)
        if zlib.crc32(magic + header[:16] + raw_tokens) != tokens_crc:
            raise ValueError(f"{path} has a damaged token list")
        tokens = np.frombuffer(raw_tokens, dtype="<i4").astype(np.int32)
        if not with_state:
            return tokens, None
        state = stream.read(n_state)
        if len(state) != n_state or zlib.crc32(state) != state_crc:
            raise ValueError(f"{path} has a damaged KV state")
        return tokens, state
