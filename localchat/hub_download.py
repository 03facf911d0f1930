"""Files of the Hugging Face hub into huggingface_hub's own cache, so a file another tool fetched is
not fetched again; laid out as `hf_hub_download` lays them out.

Downloads resume. huggingface_hub 2.4's `hf_hub_download` writes to a temporary file with a random
name and deletes it on any failure (or leaves it behind, unused, when killed), so an interrupted
download starts again from zero. Here the partial file keeps one name, `blobs/<etag>.incomplete`
(one that hf_hub_download left is taken over), and the next attempt continues from its length with
a Range request (huggingface_hub's `http_get`, which also resumes a dropped or stalled connection
by itself). A finished file is checked against the hub's sha256 before it takes its place as
`blobs/<etag>`, linked from `snapshots/<commit>/<file>` as `hf_hub_download` lays it out; a file
that fails the check is deleted.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

from localchat.errors import ModelError
from localchat.settings import Settings

if TYPE_CHECKING:
    from huggingface_hub.file_download import HfFileMetadata

LIBRARY_NAME = "localchat"
REVISION = "main"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")
HASH_BLOCK = 1 << 20
RESUME_HINT = "; what was fetched is kept and the next pull resumes from there"


class _ByteCount:
    """What huggingface_hub's http_get takes as its progress bar class: the bytes of one file so
    far (the resumed part included) go to `report`, which may raise to stop the transfer."""

    def __init__(self, report: Callable[[int], None], *, initial: int = 0, **_: object) -> None:
        self.n = initial
        self.report = report
        report(self.n)

    def update(self, n: int) -> None:
        self.n += n
        self.report(self.n)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repo as the hub's API lists it (model_info with files_metadata)."""

    path: str
    size: int | None
    sha256: str | None  # LFS files
    blob_id: str | None  # the git object id: sha1 of "blob <size>\0<content>"


def repo_storage(repo_id: str, settings: Settings) -> Path:
    """The repo's folder in the Hugging Face cache (blobs/, snapshots/, refs/)."""
    from huggingface_hub.file_download import repo_folder_name

    return settings.hf_cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model")


def _hub_error_lines() -> tuple[tuple[type[BaseException], str], ...]:
    """Hub failures -> one line each, checked in order (GatedRepoError is a RepositoryNotFoundError;
    most are HfHubHTTPError)."""
    import httpx2
    from huggingface_hub.errors import (
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    return (
        (GatedRepoError, "{repo} is gated: accept its conditions at {url} and log in (`hf auth login`, or set HF_TOKEN)"),
        (RepositoryNotFoundError, "{repo} was not found on the Hugging Face hub; check the name (a private repo needs `hf auth login` or HF_TOKEN)"),
        (RevisionNotFoundError, "{repo} has no revision '{revision}' on the Hugging Face hub"),
        (RemoteEntryNotFoundError, "{what} is not in {repo} on the Hugging Face hub any more; pull the model again"),
        (OfflineModeIsEnabled, "offline mode is on (HF_HUB_OFFLINE): {what} cannot be fetched from the Hugging Face hub"),
        (httpx2.TransportError, "cannot reach the Hugging Face hub at {endpoint} ({error}); check the connection, or set HF_HUB_OFFLINE=1 to use only cached models"),
        (FileMetadataError, "{endpoint} does not answer like the Hugging Face hub ({error}); check HF_ENDPOINT and any proxy"),
        (HfHubHTTPError, "the Hugging Face hub answered '{status}' for {what}; try again later"),
    )


@contextmanager
def _hub_errors(repo_id: str, what: str, settings: Settings, hint: str = "") -> Iterator[None]:
    try:
        yield
    except Exception as error:
        for kind, line in _hub_error_lines():
            if isinstance(error, kind):
                response = getattr(error, "response", None)
                status = f"{response.status_code} {response.reason_phrase}" if response is not None else "an error"
                detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
                message = line.format(
                    repo=repo_id, url=f"https://huggingface.co/{repo_id}", revision=REVISION, what=what,
                    endpoint=settings.hf_endpoint, status=status, error=detail,
                )
                raise ModelError(message + hint) from None
        raise


def remote_files(repo_id: str, settings: Settings) -> tuple[str, dict[str, RemoteFile]]:
    """The repo's commit on `main` and its files with their sizes and hashes (one API call)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=settings.hf_endpoint, library_name=LIBRARY_NAME)
    with _hub_errors(repo_id, f"{repo_id}'s file list", settings):
        info = api.model_info(repo_id, revision=REVISION, files_metadata=True)
    if not info.sha or info.siblings is None:
        raise ModelError(f"{settings.hf_endpoint} listed {repo_id} without its commit or files; check HF_ENDPOINT")
    files = {
        s.rfilename: RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id) for s in info.siblings
    }
    return info.sha, files


def _file_digest(path: Path, kind: str) -> str:
    """sha256 of the content, or the git object id (sha1 over a `blob <size>` header, then the content)."""
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as stream:
        while block := stream.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _expected_digest(remote: RemoteFile, etag: str) -> tuple[str, str]:
    """The hash the hub gives for the file: the LFS sha256 from the API, or X-Linked-Etag (an LFS
    file's sha256); for a small file kept in git, its git object id."""
    if remote.sha256:
        return "sha256", remote.sha256.lower()
    if _SHA256.match(etag):
        return "sha256", etag
    if remote.blob_id or _GIT_SHA1.match(etag):
        return "git-sha1", (remote.blob_id or etag).lower()
    raise ModelError(f"the hub gave no checksum for {remote.path}; localchat does not use a file it cannot verify")


def _check_space(needed: int, folder: Path, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ModelError(
            f"not enough disk space for {what}: it needs {needed / 2**20:,.0f} MiB more, {folder} has "
            f"{free / 2**20:,.0f} MiB free; free some space (`localchat rm NAME`) and pull again"
        )


def _adopt_orphans(partial: Path, etag: str) -> None:
    """A killed hf_hub_download leaves `<etag>.<random>.incomplete`, which it never reuses. Under the
    blob's lock no download of it is running, so the longest becomes ours to resume; the rest go."""
    orphans = sorted(partial.parent.glob(f"{etag}.*.incomplete"), key=lambda p: p.stat().st_size)
    if orphans and (not partial.is_file() or partial.stat().st_size < orphans[-1].stat().st_size):
        os.replace(orphans.pop(), partial)
    for orphan in orphans:
        orphan.unlink(missing_ok=True)


def _fetch_blob(repo_id: str, url: str, meta: HfFileMetadata, remote: RemoteFile, blob: Path, settings: Settings,
                on_bytes: Callable[[int], None] | None = None) -> int:
    """Download into `<blob>.incomplete`, continuing what is there, check it, then move it into
    place. Returns the bytes fetched."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    kind, expected = _expected_digest(remote, blob.name)
    size, location = meta.size or remote.size, meta.location
    partial = blob.with_name(blob.name + ".incomplete")
    _adopt_orphans(partial, blob.name)
    resume = partial.stat().st_size if partial.is_file() else 0
    if size is not None and resume > size:  # not a prefix of this file: start afresh
        partial.unlink()
        resume = 0
    if size is not None:
        _check_space(size - resume, blob.parent, remote.path)
    headers = build_hf_headers(library_name=LIBRARY_NAME)
    if urlsplit(location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a signed CDN address: the token stays with the hub
    try:
        with _hub_errors(repo_id, remote.path, settings, hint=RESUME_HINT), partial.open("ab") as stream:
            bar = {"tqdm_class": functools.partial(_ByteCount, on_bytes)} if on_bytes is not None else {}
            http_get(location, stream, resume_size=resume, headers=headers, expected_size=size, displayed_filename=remote.path, **bar)
    except OSError as error:  # what the hub's errors do not cover: the disk, a wrong length
        kept = partial.stat().st_size
        if error.errno == errno.ENOSPC:
            raise ModelError(
                f"the disk filled up while downloading {remote.path}: the {kept / 2**20:,.1f} MiB fetched are "
                f"kept in {partial.parent} and the next pull resumes there once space is freed"
            ) from None
        if size is not None and kept > size:  # longer than the file: no use resuming it
            partial.unlink()
            raise ModelError(f"{remote.path} arrived longer than the hub said and was deleted from the cache; pull again") from None
        raise ModelError(f"downloading {remote.path} failed ({error}){RESUME_HINT}") from None
    actual = _file_digest(partial, kind)
    if actual != expected:
        partial.unlink()
        raise ModelError(
            f"{remote.path} failed its {kind} check (expected {expected[:12]}..., got {actual[:12]}...): "
            "the download was corrupt and has been deleted from the cache; pull again"
        )
    fetched = partial.stat().st_size - resume
    os.replace(partial, blob)
    return fetched


def _link(blob: Path, entry: Path) -> None:
    """The snapshot entry, a relative symlink to the blob as huggingface_hub makes it (a hard link
    where symlinks are not allowed)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    if entry.is_file():
        return
    entry.unlink(missing_ok=True)  # a dangling link left by a removed blob
    try:
        os.symlink(os.path.relpath(blob, entry.parent), entry)
    except OSError:
        os.link(blob, entry)


def download_file(repo_id: str, commit: str, remote: RemoteFile, settings: Settings,
                  on_bytes: Callable[[int], None] | None = None) -> tuple[Path, int]:
    """One file of a commit into the cache, unless it is there; returns its snapshot entry and the
    bytes fetched. A blob another tool downloaded is linked, not fetched again. `on_bytes` is told
    the file's bytes so far as they arrive (and replaces the terminal's progress bar)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import WeakFileLock

    storage = repo_storage(repo_id, settings)
    entry = storage / "snapshots" / commit / remote.path
    if entry.is_file():
        return entry, 0
    url = hf_hub_url(repo_id, remote.path, revision=commit, endpoint=settings.hf_endpoint)
    with _hub_errors(repo_id, remote.path, settings):
        meta = get_hf_file_metadata(url, endpoint=settings.hf_endpoint, library_name=LIBRARY_NAME)
        if not meta.etag:
            raise ModelError(f"the hub gave no ETag for {remote.path}; check HF_ENDPOINT")
        blob = storage / "blobs" / meta.etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        fetched = 0
        # The lock huggingface_hub takes for the same blob, so a concurrent hf_hub_download waits.
        with WeakFileLock(settings.hf_cache_dir / ".locks" / storage.name / f"{meta.etag}.lock"):
            if not blob.is_file():
                fetched = _fetch_blob(repo_id, url, meta, remote, blob, settings, on_bytes)
            _link(blob, entry)
    return entry, fetched


def write_ref(storage: Path, commit: str) -> None:
    ref = storage / "refs" / REVISION
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    partial = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    partial.write_text(commit)
    os.replace(partial, ref)
