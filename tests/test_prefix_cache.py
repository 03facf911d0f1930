"""The prefix cache's lookup, budgets and disk tier (pure logic over opaque state bytes)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from localchat import prefix_cache
from localchat.prefix_cache import INDEX_BLOCK, MIN_MATCH_TOKENS, PrefixCache, RestoreCosts, _read_entry_file, common_prefix_length

SYSTEM = list(range(1000, 1100))


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([7], [8]) == 0


def test_longest_match_picks_the_entry_sharing_the_most_tokens() -> None:
    cache = PrefixCache("model", ram_budget_bytes=1 << 20)
    cache.put(SYSTEM + [1, 2, 3], b"a")
    cache.put(SYSTEM[:50] + [9, 9], b"b")
    match = cache.longest_match(SYSTEM + [1, 2, 7])
    assert match is not None and match.length == len(SYSTEM) + 2
    assert cache.load(match.key) == b"a"
    assert cache.longest_match(list(range(MIN_MATCH_TOKENS - 1))) is None
    assert (cache.hits, cache.misses) == (1, 1)


def test_a_lookup_compares_the_most_recent_of_many_entries_sharing_its_blocks() -> None:
    """A fixed system prompt puts every chat's entry among those sharing a new prompt's blocks: the lookup
    compares the MAX_COMPARED most recently used (the oldest one here matches more tokens, inside the same
    last block), not all of them (each comparison costs the time to first token)."""
    cache = PrefixCache("model", ram_budget_bytes=1 << 30)
    cache.put(SYSTEM[:64] + [7] * (INDEX_BLOCK - 2), b"old and longest")
    for reply in range(200):
        cache.put(SYSTEM[:64] + [8, reply], f"chat {reply}".encode())
    cache.put(SYSTEM[:64] + [7] * 4, b"newest")
    match = cache.longest_match(SYSTEM[:64] + [7] * 40)
    assert match is not None and cache.load(match.key) == b"newest" and match.length == 68


def test_an_entry_extending_another_replaces_it() -> None:
    cache = PrefixCache("model", ram_budget_bytes=1 << 20)
    cache.put(SYSTEM, b"short")
    cache.put(SYSTEM + [5, 6], b"long")
    assert len(cache) == 1
    assert cache.covers(SYSTEM) and cache.covers(SYSTEM + [5]) and not cache.covers(SYSTEM + [7])


def test_a_recurrent_state_keeps_the_entries_it_extends() -> None:
    """A recurrent state cannot be cut back to serve a shorter prompt: each is kept, and covers its tokens alone."""
    cache = PrefixCache("model", ram_budget_bytes=1 << 20)
    cache.put(SYSTEM, b"short", supersede=False)
    cache.put(SYSTEM + [5, 6], b"long", supersede=False)
    cache.put(SYSTEM + [5, 6], b"again", supersede=False)
    assert len(cache) == 2
    assert cache.covers(SYSTEM, exactly=True) and cache.covers(SYSTEM + [5, 6], exactly=True)
    assert not cache.covers(SYSTEM + [5], exactly=True) and cache.covers(SYSTEM + [5])


def test_a_whole_match_is_held_by_the_prompt_short_of_its_last_token() -> None:
    """A longer entry sharing more of the prompt, and one the prompt equals, cannot serve a state that is not
    cut back: the longest entry the prompt holds whole before its last token does."""
    cache = PrefixCache("model", ram_budget_bytes=1 << 20)
    cache.put(SYSTEM, b"system", supersede=False)
    cache.put(SYSTEM + [1, 2, 3, 4], b"longer", supersede=False)
    cache.put(SYSTEM + [1, 2, 9], b"equal", supersede=False)
    prompt = SYSTEM + [1, 2, 9]
    assert len(cache.longest_match(prompt).tokens) == len(SYSTEM) + 3  # type: ignore[union-attr]
    match = cache.longest_match(prompt, whole=True)
    assert match is not None and list(match.tokens) == SYSTEM and match.length == len(SYSTEM)
    assert cache.longest_match(SYSTEM[:-1], whole=True) is None


def test_the_block_index_finds_what_comparing_every_entry_finds() -> None:
    """Lookups, `covers` and the entries a `put` replaces, through the prefix index, against comparing
    the tokens of every entry, over conversations that branch inside and at the edges of blocks (each one's
    hashes partly taken from the one before: PrefixCache._hashes)."""
    rng = np.random.default_rng(7)
    trunk = rng.integers(0, 50, 300).tolist()
    cache = PrefixCache("model", ram_budget_bytes=1 << 30)
    held: dict[tuple[str, tuple[int, ...]], None] = {}  # what a cache comparing everything would hold
    for _ in range(400):
        cut = int(rng.choice([0, 5, 31, 32, 33, 63, 64, 65, 100, 160, 300]))
        sequence = trunk[:cut] + rng.integers(0, 3, int(rng.integers(0, 70))).tolist()
        variant = str(rng.choice(["", "", "lora"]))
        if rng.random() < 0.5 and sequence:
            expected = max((common_prefix_length(tokens, sequence) for v, tokens in held if v == variant), default=0)
            match = cache.longest_match(sequence, variant)
            found = match.length if match else 0
            if expected < MIN_MATCH_TOKENS:
                assert found == 0
            else:  # as long, or (more than MAX_COMPARED entries sharing as many blocks) short of it inside its last block
                assert found <= expected and found // INDEX_BLOCK == expected // INDEX_BLOCK
            covered = any(v == variant and len(tokens) >= len(sequence) and common_prefix_length(tokens, sequence) == len(sequence)
                          for v, tokens in held)
            assert cache.covers(sequence, variant) == covered
        else:
            for v, tokens in list(held):
                if v == variant and len(tokens) <= len(sequence) and list(tokens) == sequence[: len(tokens)]:
                    del held[(v, tokens)]
            held[(variant, tuple(sequence))] = None
            cache.put(sequence, b"state", variant)
            assert len(cache) == len(held)


def test_ram_budget_evicts_least_recently_used() -> None:
    cache = PrefixCache("model", ram_budget_bytes=250)
    for first in (1, 2, 3):
        cache.put([first] + SYSTEM, bytes(100))
    assert len(cache) == 2 and cache.ram_bytes == 200
    assert cache.longest_match([1] + SYSTEM) is None  # the oldest went


def test_disk_tier_takes_evicted_entries_and_survives_a_restart(tmp_path: Path) -> None:
    cache = PrefixCache("model", ram_budget_bytes=150, disk_dir=tmp_path, disk_budget_bytes=10_000)
    cache.put([1] + SYSTEM, b"x" * 100)
    cache.put([2] + SYSTEM, b"y" * 100)
    assert cache.ram_bytes == 100 and cache.disk_bytes == 100
    assert not list(tmp_path.glob("*.incomplete"))
    restarted = PrefixCache("model", ram_budget_bytes=150, disk_dir=tmp_path, disk_budget_bytes=10_000)
    match = restarted.longest_match([1] + SYSTEM + [4])
    assert match is not None and restarted.load(match.key) == b"x" * 100
    # Another model's entries are not visible.
    assert PrefixCache("other", 150, tmp_path, 10_000).longest_match([1] + SYSTEM) is None


def _counting_entry_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The entry files read from now on (their headers at a start, their states at a restore)."""
    read: list[Path] = []

    def counted(path: Path, *, with_state: bool) -> tuple[np.ndarray, bytes | None]:
        read.append(path)
        return _read_entry_file(path, with_state=with_state)

    monkeypatch.setattr(prefix_cache, "_read_entry_file", counted)
    return read


def test_a_restart_reads_the_disk_tier_from_its_index_not_entry_by_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = PrefixCache("model", ram_budget_bytes=150, disk_dir=tmp_path, disk_budget_bytes=10_000)
    for first in (1, 2, 3):
        cache.put([first] + SYSTEM, bytes([first]) * 100)
    cache.persist()
    assert (tmp_path / "model.index").is_file() and not list(tmp_path.glob("*.incomplete"))
    read = _counting_entry_reads(monkeypatch)
    restarted = PrefixCache("model", ram_budget_bytes=150, disk_dir=tmp_path, disk_budget_bytes=10_000)
    assert len(restarted) == 3 and read == []
    for first in (1, 2, 3):
        match = restarted.longest_match([first] + SYSTEM + [4])
        assert match is not None and match.length == 1 + len(SYSTEM)
        assert restarted.load(match.key) == bytes([first]) * 100  # read whole, and checked, from its file
    assert len(read) == 3


def test_entries_the_index_does_not_list_are_read_from_their_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index lags the files: another process (or one that crashed) wrote entries after it, evicted
    others, or it was damaged. The files are what the disk tier holds."""
    cache = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
    cache.put([1] + SYSTEM, b"a" * 100)
    cache.put([2] + SYSTEM, b"b" * 100)
    cache.persist()
    cache.put([3] + SYSTEM, b"c" * 100)  # written after the index, which was not written again
    (gone,) = [path for path in tmp_path.glob("*.kv") if path.read_bytes().endswith(b"a" * 100)]
    gone.unlink()
    read = _counting_entry_reads(monkeypatch)
    restarted = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
    assert len(restarted) == 2 and len(read) == 1
    assert restarted.longest_match([1] + SYSTEM) is None
    for first, state in ((2, b"b"), (3, b"c")):
        match = restarted.longest_match([first] + SYSTEM)
        assert match is not None and restarted.load(match.key) == state * 100
    restarted.persist()  # the index is made current
    index = tmp_path / "model.index"
    intact = index.read_bytes()
    read.clear()
    assert len(PrefixCache("model", 0, tmp_path, 10_000)) == 2 and read == []
    for position in range(0, len(intact), 7):
        damaged = bytearray(intact)
        damaged[position] ^= 0x10
        index.write_bytes(bytes(damaged))
        read.clear()
        assert len(PrefixCache("model", 0, tmp_path, 10_000)) == 2 and len(read) == 2, f"a flip at byte {position}"


def test_an_indexed_entry_whose_file_changed_is_dropped_when_restored(tmp_path: Path) -> None:
    cache = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
    cache.put([1] + SYSTEM, b"a" * 100)
    cache.put([2] + SYSTEM, b"b" * 100)
    cache.persist()
    first, second = sorted(tmp_path.glob("*.kv"), key=lambda path: path.read_bytes()[-1])
    whole = first.read_bytes()
    first.write_bytes(whole[:-10])
    second.write_bytes(whole)  # another entry's file, intact
    restarted = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
    for tokens in ([1] + SYSTEM, [2] + SYSTEM):
        match = restarted.longest_match(tokens)
        assert match is not None and restarted.load(match.key) is None
    assert len(restarted) == 0 and not list(tmp_path.glob("*.kv"))


def test_a_damaged_disk_entry_is_a_miss_not_a_crash(tmp_path: Path) -> None:
    cache = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
    cache.put(SYSTEM, b"z" * 100)
    (entry_file,) = tmp_path.glob("*.kv")
    entry_file.write_bytes(entry_file.read_bytes()[:-10])
    match = cache.longest_match(SYSTEM)
    assert match is not None and cache.load(match.key) is None
    assert len(cache) == 0 and not entry_file.exists()


def test_a_disk_that_cannot_be_written_costs_the_entry_not_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    cache = PrefixCache("model", ram_budget_bytes=150, disk_dir=blocked, disk_budget_bytes=10_000)
    cache.put([1] + SYSTEM, b"x" * 100)
    cache.put([2] + SYSTEM, b"y" * 100)  # evicts the first; writing it to disk fails
    assert len(cache) == 1 and cache.longest_match([2] + SYSTEM) is not None


def test_persist_writes_ram_entries_most_recently_used_first_within_the_disk_budget(tmp_path: Path) -> None:
    cache = PrefixCache("model", ram_budget_bytes=10_000, disk_dir=tmp_path, disk_budget_bytes=250)
    for first in (1, 2, 3):
        cache.put([first] + SYSTEM, bytes([first]) * 100)
    assert cache.disk_bytes == 0  # nothing spilled: all fit in RAM
    cache.persist()
    assert len(list(tmp_path.glob("*.kv"))) == 2 and not list(tmp_path.glob("*.incomplete"))
    restarted = PrefixCache("model", ram_budget_bytes=10_000, disk_dir=tmp_path, disk_budget_bytes=250)
    assert restarted.longest_match([1] + SYSTEM) is None  # the least recently used did not fit
    match = restarted.longest_match([3] + SYSTEM)
    assert match is not None and restarted.load(match.key) == bytes([3]) * 100


def test_a_flipped_byte_anywhere_in_a_disk_entry_is_never_restored(tmp_path: Path) -> None:
    state = bytes(range(256)) * 2
    PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000).put(SYSTEM, state)
    (entry_file,) = tmp_path.glob("*.kv")
    intact = entry_file.read_bytes()
    for position in range(len(intact)):
        damaged = bytearray(intact)
        damaged[position] ^= 1 << (position % 8)
        entry_file.write_bytes(bytes(damaged))
        cache = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
        match = cache.longest_match(SYSTEM)
        restored = cache.load(match.key) if match is not None else None
        assert restored is None, f"a flip at byte {position} of {len(intact)} was restored"
        assert len(cache) == 0 and not entry_file.exists(), f"the entry damaged at byte {position} was kept"
    entry_file.write_bytes(intact)
    cache = PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)
    match = cache.longest_match(SYSTEM)
    assert match is not None and cache.load(match.key) == state  # the intact file still restores


def test_an_entry_of_the_earlier_file_format_is_dropped(tmp_path: Path) -> None:
    tokens = np.asarray(SYSTEM, dtype="<i4").tobytes()
    earlier = tmp_path / "model-0123.kv"  # version 1: magic, token and state counts, tokens, state; no checksums
    earlier.write_bytes(b"LCKV1\0" + struct.pack("<QQ", len(SYSTEM), 100) + tokens + b"s" * 100)
    with pytest.raises(ValueError, match="of this version"):
        _read_entry_file(earlier, with_state=True)
    assert len(PrefixCache("model", ram_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10_000)) == 0
    assert not earlier.exists()


def test_a_restore_is_chosen_only_while_measured_faster_than_computing() -> None:
    costs = RestoreCosts()
    assert costs.restore_pays(10_000_000, 10)  # nothing measured yet: try it, and measure
    costs.restored(1_000_000, 0.010)  # 10 ns a byte
    assert costs.restore_pays(10_000_000, 10)  # computing not measured yet
    costs.prefilled(32, 1.0)  # a short chunk is not timed: its batch is not full
    assert costs.prefill_s_per_token is None
    costs.prefilled(512, 0.512)  # 1 ms a token, as on 2 CPU cores
    assert costs.restore_pays(10_000_000, 200)  # 0.1 s restoring against 0.2 s computing
    assert not costs.restore_pays(10_000_000, 50)
    for _ in range(10):  # a GPU computes 40k tokens a second
        costs.prefilled(512, 0.0128)
    assert not costs.restore_pays(10_000_000, 300)


def test_a_kv_state_computed_with_adapters_is_found_only_with_the_same_adapters(tmp_path: Path) -> None:
    """The KV depends on the LoRA adapters as much as on the tokens: the variant is part of the key."""
    cache = PrefixCache("model", ram_budget_bytes=1 << 20)
    cache.put(SYSTEM, b"plain")
    cache.put(SYSTEM, b"tuned", "lora0x1.0")
    assert len(cache) == 2  # neither extends the other across variants
    assert cache.load(cache.longest_match(SYSTEM + [1]).key) == b"plain"
    assert cache.load(cache.longest_match(SYSTEM + [1], "lora0x1.0").key) == b"tuned"
    assert cache.longest_match(SYSTEM + [1], "lora0x0.5") is None and not cache.covers(SYSTEM, "lora1x1.0")


def test_adapter_kv_states_stay_in_ram(tmp_path: Path) -> None:
    """Adapter ids are one run's (another run may load other files under them): an adapter state
    evicted from RAM is dropped, not written to the disk tier, nor persisted at exit."""
    cache = PrefixCache("model", ram_budget_bytes=150, disk_dir=tmp_path, disk_budget_bytes=10_000)
    cache.put(SYSTEM, b"t" * 100, "lora0x1.0")
    cache.put([7] + SYSTEM, b"p" * 100)  # over the RAM budget: the oldest, the adapter's, goes
    assert cache.longest_match(SYSTEM, "lora0x1.0") is None and not list(tmp_path.glob("*.kv"))
    cache.put([8] + SYSTEM, b"u" * 40, "lora0x1.0")
    cache.persist()
    assert [path.read_bytes().endswith(b"p" * 100) for path in tmp_path.glob("*.kv")] == [True]
