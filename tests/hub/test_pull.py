"""Pulling from the stand-in hub with the real huggingface_hub client: every name form, split models,
the shared cache, resumed transfers (a dropped connection, a stall, a killed process), checksums,
the hub's errors, offline mode and a full disk."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import huggingface_hub.constants
import pytest
from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache
from stand_in_hub import Fault, StandInHub
from stand_in_repos import BIG, BIG_FILE, CHECKPOINT, GATED, MIB, TINY

from localchat.errors import ModelError
from localchat.hub import HubModelName, find_cached, pull
from localchat.models import inspect_gguf, resolve_model
from localchat.settings import Settings

CHUNK = huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE  # what huggingface_hub writes at a time


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pull(text: str, settings: Settings) -> tuple[Path, int]:
    name = HubModelName.parse(text)
    assert name is not None
    result = pull(name, settings)
    return result.model.path, result.fetched_bytes


def _leftovers(settings: Settings) -> list[str]:
    """Files in the cache's blob folders: partial downloads and blobs."""
    return sorted(p.name for p in settings.hf_cache_dir.glob("*/blobs/*"))


NAME_FORMS = [f"{TINY}:Q8_0", f"{TINY}:q8_0", f"hf.co/{TINY}:Q8_0", f"huggingface.co/{TINY}:Q8_0", f"https://huggingface.co/{TINY}:Q8_0"]


def test_every_name_form_pulls_the_same_file_once(hub: StandInHub, hub_settings: Settings) -> None:
    file = hub.repos[TINY].files["tiny-Q8_0.gguf"]
    pulls = [_pull(form, hub_settings) for form in NAME_FORMS]
    assert [fetched for _, fetched in pulls] == [file.size] + [0] * (len(NAME_FORMS) - 1)
    assert hub.served == {"tiny-Q8_0.gguf": file.size}  # a pull of a cached file fetches nothing
    path = pulls[0][0]
    assert all(p == path for p, _ in pulls)
    # Laid out as hf_hub_download lays it out: a snapshot link to a blob named by the sha256.
    repo = hub.repos[TINY]
    assert path == hub_settings.hf_cache_dir / "models--stand-in--tiny-GGUF" / "snapshots" / repo.commit / "tiny-Q8_0.gguf"
    assert path.is_symlink() and path.resolve().name == file.sha256 and _sha256(path) == file.sha256
    assert (path.parents[2] / "refs" / "main").read_text() == repo.commit
    assert try_to_load_from_cache(TINY, "tiny-Q8_0.gguf", cache_dir=hub_settings.hf_cache_dir) == str(path)


def test_without_a_tag_the_nearest_to_q4_k_m_and_a_split_model_whole(hub: StandInHub, hub_settings: Settings) -> None:
    path, _ = _pull(TINY, hub_settings)
    assert path.name == "tiny-Q4_K_S.gguf"  # the repo has no Q4_K_M
    path, fetched = _pull(f"{TINY}:Q6_K", hub_settings)
    parts = [f for name, f in hub.repos[TINY].files.items() if name.startswith("Q6_K/")]
    assert path.name == "tiny-Q6_K-00001-of-00002.gguf" and fetched == sum(f.size for f in parts)
    assert (path.parent / "tiny-Q6_K-00002-of-00002.gguf").is_file()
    # The planner counts the tensors of both parts: the facts of the file before it was split.
    header, facts = inspect_gguf(path)
    unsplit = parts[0].source.parent.parent / "tiny-Q6_K.gguf"
    assert header.get("split.count") == 2 and facts == inspect_gguf(unsplit)[1]


def test_a_file_another_tool_fetched_is_not_fetched_again(hub: StandInHub, hub_settings: Settings) -> None:
    file = hub.repos[TINY].files["tiny-Q8_0.gguf"]
    other = hf_hub_download(TINY, "tiny-Q8_0.gguf", cache_dir=hub_settings.hf_cache_dir, endpoint=hub.endpoint)
    path, fetched = _pull(f"{TINY}:Q8_0", hub_settings)
    assert str(path) == other and fetched == 0 and hub.served == {"tiny-Q8_0.gguf": file.size}


def test_a_dropped_connection_resumes_with_a_range_request(hub: StandInHub, hub_settings: Settings) -> None:
    file = hub.repos[BIG].files[BIG_FILE]
    hub.add_fault(file, Fault(drop_after=25 * MIB))
    path, _ = _pull(BIG, hub_settings)
    assert _sha256(path) == file.sha256
    first, second = hub.gets_of(BIG_FILE)
    assert first.range is None and second.range == f"bytes={2 * CHUNK}-"  # the two whole chunks written
    assert hub.served[BIG_FILE] == 25 * MIB + file.size - 2 * CHUNK


def test_a_stalled_transfer_resumes_near_where_it_stalled(hub: StandInHub, hub_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ollama's downloads that stall at 99% and start over: here the read times out and the
    transfer continues from the last chunk written."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DOWNLOAD_TIMEOUT", 1)
    file = hub.repos[BIG].files[BIG_FILE]
    hub.add_fault(file, Fault(stall_after=file.size - MIB))
    path, _ = _pull(BIG, hub_settings)
    assert _sha256(path) == file.sha256
    stalled_at = (file.size - MIB) // CHUNK * CHUNK
    assert [r.range for r in hub.gets_of(BIG_FILE)] == [None, f"bytes={stalled_at}-"]
    assert hub.served[BIG_FILE] == file.size - MIB + file.size - stalled_at


def _killed_half_way(hub: StandInHub, settings: Settings, command: list[str], env: dict[str, str]) -> Path:
    """Run a download of the big file, kill it once 2 chunks are on disk; returns the blob folder."""
    hub.add_fault(hub.repos[BIG].files[BIG_FILE], Fault(stall_after=25 * MIB))
    blobs = settings.hf_cache_dir / "models--stand-in--big-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _when_partial_reaches(blobs, 2 * CHUNK, process.kill)
    assert process.wait(timeout=120) == -signal.SIGKILL
    return blobs


def test_a_killed_pull_resumes_from_its_partial_file(hub: StandInHub, hub_settings: Settings, cli_env: dict[str, str]) -> None:
    file = hub.repos[BIG].files[BIG_FILE]
    blobs = _killed_half_way(hub, hub_settings, [sys.executable, "-m", "localchat", "pull", BIG], cli_env)
    [partial] = blobs.glob("*.incomplete")
    kept = partial.stat().st_size
    served_before = hub.served[BIG_FILE]
    path, fetched = _pull(BIG, hub_settings)
    refetched = hub.served[BIG_FILE] - served_before
    print(f"\nkilled at {served_before / MIB:.1f} MiB served, {kept / MIB:.1f} MiB kept; the next pull fetched "
          f"{refetched / MIB:.1f} MiB of {file.size / MIB:.1f} MiB")
    assert kept == 2 * CHUNK and refetched == fetched == file.size - kept
    assert hub.gets_of(BIG_FILE)[-1].range == f"bytes={kept}-"
    assert _sha256(path) == file.sha256 and not partial.exists()


def test_what_a_killed_hf_hub_download_left_is_resumed(hub: StandInHub, hub_settings: Settings, cli_env: dict[str, str]) -> None:
    """hf_hub_download never reuses its own partial file (`<etag>.<random>.incomplete`); a pull does."""
    file = hub.repos[BIG].files[BIG_FILE]
    code = (f"from huggingface_hub import hf_hub_download; hf_hub_download({BIG!r}, {BIG_FILE!r}, "
            f"cache_dir={str(hub_settings.hf_cache_dir)!r}, endpoint={hub.endpoint!r})")
    blobs = _killed_half_way(hub, hub_settings, [sys.executable, "-c", code], cli_env)
    [orphan] = blobs.glob(f"{file.sha256}.*.incomplete")
    assert orphan.stat().st_size == 2 * CHUNK
    path, fetched = _pull(BIG, hub_settings)
    assert fetched == file.size - 2 * CHUNK and _sha256(path) == file.sha256
    assert list(blobs.glob("*.incomplete")) == []


def test_a_corrupt_download_is_deleted_and_says_so(hub: StandInHub, hub_settings: Settings) -> None:
    file = hub.repos[TINY].files["tiny-Q8_0.gguf"]
    hub.add_fault(file, Fault(corrupt=True))
    with pytest.raises(ModelError, match=r"^tiny-Q8_0.gguf failed its sha256 check .*: the download was corrupt and has been deleted from the cache; pull again$"):
        _pull(f"{TINY}:Q8_0", hub_settings)
    assert _leftovers(hub_settings) == [] and find_cached(HubModelName(TINY, "Q8_0"), hub_settings) is None
    path, _ = _pull(f"{TINY}:Q8_0", hub_settings)
    assert _sha256(path) == file.sha256


def test_a_gated_repo_is_one_line_with_or_without_a_token(hub: StandInHub, hub_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    line = r"^stand-in/gated-GGUF is gated: accept its conditions at https://huggingface.co/stand-in/gated-GGUF and log in"
    with pytest.raises(ModelError, match=line):
        _pull(GATED, hub_settings)
    monkeypatch.setenv("HF_TOKEN", "hf_standintoken")  # a token without access: 403
    with pytest.raises(ModelError, match=line):
        _pull(GATED, hub_settings)
    assert [r.status for r in hub.requests if "/resolve/" in r.path] == [401, 403]


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("stand-in/no-such-repo", r"^stand-in/no-such-repo was not found on the Hugging Face hub; check the name"),
        (f"{TINY}:Q5_K_M", r"^stand-in/tiny-GGUF has no Q5_K_M file; it has: Q6_K, Q4_K_S, Q8_0 \(for example `localchat pull stand-in/tiny-GGUF:Q6_K`\)$"),
        (CHECKPOINT, r"^stand-in/checkpoint-only has no GGUF model files; .* `localchat convert stand-in/checkpoint-only --to gguf`$"),
    ],
)
def test_what_the_hub_lacks_is_one_line(hub: StandInHub, hub_settings: Settings, name: str, line: str) -> None:
    with pytest.raises(ModelError, match=line):
        _pull(name, hub_settings)
    assert hub.served == {}


def test_no_network_is_one_line(hub_settings: Settings) -> None:
    unreachable = replace(hub_settings, hf_endpoint="http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(ModelError, match=r"^cannot reach the Hugging Face hub at http://127.0.0.1:9 \(.*\); check the connection, or set HF_HUB_OFFLINE=1"):
        _pull(f"{TINY}:Q8_0", unreachable)


def test_offline_what_is_cached_resolves_and_the_rest_is_one_line(hub: StandInHub, hub_settings: Settings) -> None:
    cached, _ = _pull(f"{TINY}:Q6_K", hub_settings)
    offline = replace(hub_settings, hf_offline=True, hf_endpoint="http://127.0.0.1:9")
    result = pull(HubModelName(TINY, "q6_k"), offline)
    assert result.model.path == cached and not result.checked_hub and result.fetched_bytes == 0
    ref = resolve_model(f"hf.co/{TINY}:Q6_K", offline)
    assert ref.path == cached and ref.name == f"{TINY}:Q6_K" and ref.from_hub
    # Without a tag offline: the nearest to Q4_K_M among what is cached.
    assert resolve_model(TINY, offline).path == cached
    with pytest.raises(ModelError, match=r"^stand-in/tiny-GGUF:Q8_0 is not in the Hugging Face cache \(.*\) and offline mode is on \(HF_HUB_OFFLINE\); pull it while online"):
        resolve_model(f"{TINY}:Q8_0", offline)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """A tmpfs of the given size (needs the right to mount; skipped without it)."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        folder = tmp_path / f"disk-{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=False, capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_disk_without_room_is_one_line_before_any_byte(hub: StandInHub, hub_settings: Settings, small_disk: Callable[[int], Path]) -> None:
    settings = replace(hub_settings, hf_cache_dir=small_disk(8 * MIB) / "hub")
    with pytest.raises(ModelError, match=r"^not enough disk space for big-Q4_K_M.gguf: it needs 40 MiB more, .* has 8 MiB free; free some space"):
        _pull(BIG, settings)
    assert hub.served == {}


def test_a_disk_that_fills_keeps_what_was_fetched_and_the_next_pull_resumes(
    hub: StandInHub, hub_settings: Settings, small_disk: Callable[[int], Path]
) -> None:
    disk = small_disk(48 * MIB)
    settings = replace(hub_settings, hf_cache_dir=disk / "hub")
    file = hub.repos[BIG].files[BIG_FILE]
    filler = disk / "filler"
    hub.add_fault(file, Fault(before=lambda: filler.write_bytes(b"\0" * 24 * MIB)))  # after the space check
    with pytest.raises(ModelError, match=r"^the disk filled up while downloading big-Q4_K_M.gguf: the .* MiB fetched are kept in .* and the next pull resumes there"):
        _pull(BIG, settings)
    [partial] = (disk / "hub").glob("*/blobs/*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < file.size
    filler.unlink()
    path, fetched = _pull(BIG, settings)
    assert fetched == file.size - kept and _sha256(path) == file.sha256
    assert hub.gets_of(BIG_FILE)[-1].range == f"bytes={kept}-"


def test_huggingface_hubs_own_scan_reads_what_localchat_pulled(hub: StandInHub, hub_settings: Settings) -> None:
    _pull(f"{TINY}:Q6_K", hub_settings)
    _pull(f"{TINY}:Q8_0", hub_settings)
    info = scan_cache_dir(hub_settings.hf_cache_dir)
    assert info.warnings == [] and [r.repo_id for r in info.repos] == [TINY]
    [revision] = next(iter(info.repos)).revisions
    assert revision.refs == {"main"} and len(revision.files) == 3
    assert info.incomplete_files == frozenset()


def _when_partial_reaches(folder: Path, size: int, action: Callable[[], None]) -> None:
    """From a watcher thread, run `action` once the partial files in `folder` hold `size` bytes."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while sum(p.stat().st_size for p in folder.glob("*.incomplete")) < size:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        action()

    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_keeps_the_partial_file_and_the_next_pull_resumes(hub: StandInHub, hub_settings: Settings) -> None:
    """hf_hub_download deletes what it fetched when interrupted; a pull keeps it."""
    file = hub.repos[BIG].files[BIG_FILE]
    hub.add_fault(file, Fault(stall_after=25 * MIB))
    blobs = hub_settings.hf_cache_dir / "models--stand-in--big-GGUF" / "blobs"
    _when_partial_reaches(blobs, 2 * CHUNK, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        _pull(BIG, hub_settings)
    [partial] = blobs.glob("*.incomplete")
    assert partial.stat().st_size == 2 * CHUNK
    path, fetched = _pull(BIG, hub_settings)
    assert fetched == file.size - 2 * CHUNK and _sha256(path) == file.sha256
