"""Models from the Hugging Face hub: names such as `user/repo:Q4_K_M`, the GGUF file (or split parts)
a name picks in a repo, and downloads into huggingface_hub's own cache, so a file another tool
fetched is not fetched again.

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
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

from localchat.errors import ModelError
from localchat.settings import Settings

if TYPE_CHECKING:
    from huggingface_hub import HFCacheInfo
    from huggingface_hub.file_download import HfFileMetadata

LIBRARY_NAME = "localchat"
REVISION = "main"
# Without a tag, Q4_K_M; if the repo lacks it, the type nearest in bits per weight (ties: the larger).
DEFAULT_QUANT = "Q4_K_M"
# Approximate bits per weight of llama.cpp's quantization types (and the _L/_XL variants that
# bartowski and unsloth publish, which keep some tensors at higher precision).
QUANT_BITS: dict[str, float] = {
    "IQ1_S": 1.56, "IQ1_M": 1.75, "TQ1_0": 1.69, "TQ2_0": 2.06, "IQ2_XXS": 2.06, "IQ2_XS": 2.31,
    "IQ2_S": 2.5, "IQ2_M": 2.7, "Q2_K": 2.96, "Q2_K_S": 2.96, "Q2_K_L": 3.2, "Q2_K_XL": 3.2,
    "IQ3_XXS": 3.06, "IQ3_XS": 3.3, "IQ3_S": 3.44, "Q3_K_S": 3.5, "IQ3_M": 3.66, "Q3_K_M": 3.9,
    "Q3_K_L": 4.3, "Q3_K_XL": 4.4, "IQ4_XS": 4.25, "MXFP4": 4.25, "MXFP4_MOE": 4.25, "IQ4_NL": 4.5,
    "Q4_0": 4.5, "Q4_K_S": 4.6, "Q4_K_M": 4.9, "Q4_1": 5.0, "Q4_K_XL": 5.0, "Q4_K_L": 5.1,
    "Q5_0": 5.5, "Q5_K_S": 5.5, "Q5_K_M": 5.7, "Q5_K_L": 5.9, "Q5_K_XL": 5.9, "Q5_1": 6.0,
    "Q6_K": 6.6, "Q6_K_L": 6.8, "Q6_K_XL": 6.8, "Q8_0": 8.5, "Q8_K_XL": 9.0,
    "BF16": 16.0, "F16": 16.0, "F32": 32.0,
}
# A quantization label in a file name: `model-Q4_K_M.gguf`, `llama-2-7b.Q8_0.gguf`,
# `Qwen3-UD-Q4_K_XL.gguf`, `qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf`, `gpt-oss-20b-MXFP4.gguf`.
_QUANT_LABEL = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:(?:[IT]?Q\d(?:_(?:\d+|K|S|M|L|XS|XXS|NL|XL))*)|MXFP4(?:_MOE)?|BF16|F16|F32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
# llama.cpp's split naming (llama_split_path): `<prefix>-00001-of-00003.gguf`; it loads the
# first part and finds the others beside it.
_SPLIT_PART = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# Vision projectors ship beside the language model as GGUF files but are not models of their own.
NOT_MODELS = ("mmproj*",)
_HUB_PREFIX = re.compile(r"^(?:https?://)?(?:www\.)?(?:hf\.co|huggingface\.co)/", re.IGNORECASE)
_REPO_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
_HUB_NAME = re.compile(rf"^(?P<repo>{_REPO_PART}/{_REPO_PART})(?::(?P<tag>[\w.+-]+))?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")
HASH_BLOCK = 1 << 20
RESUME_HINT = "; what was fetched is kept and the next pull resumes from there"


# Told the bytes of a model's files that are in the cache (done, total when the hub says) as they arrive.
PullProgress = Callable[[int, int | None], None]


class PullCancelled(ModelError):
    """A pull its caller stopped: what was fetched stays in `.incomplete` and the next pull resumes."""


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
class HubModelName:
    """`user/repo` or `user/repo:TAG`; the tag is a quantization type (any case) or another label
    in the file name, and without one the default pick applies."""

    repo_id: str
    tag: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubModelName | None:
        """The name in `text`, also written `hf.co/user/repo:TAG` or `huggingface.co/...` as Ollama
        does; None when text is not shaped like a hub name (a path, a local model's name)."""
        prefixed = _HUB_PREFIX.match(text)
        rest = text[prefixed.end() :] if prefixed else text
        match = _HUB_NAME.match(rest)
        if match is None or ".." in rest or "--" in match["repo"] or rest.lower().endswith(".gguf"):
            if prefixed:
                raise ModelError(f"{text!r} is not a Hugging Face model name: write hf.co/USER/REPO or hf.co/USER/REPO:QUANT")
            return None
        tag = match["tag"]
        return cls(match["repo"], None if tag is None or tag.lower() == "latest" else tag)

    def __str__(self) -> str:
        return f"{self.repo_id}:{self.tag}" if self.tag else self.repo_id


def quant_label(filename: str) -> str | None:
    """The quantization type named in a GGUF file name (the last one written), upper-cased."""
    found = _QUANT_LABEL.findall(PurePosixPath(filename).name.removesuffix(".gguf"))
    return found[-1].upper() if found else None


def _bits(label: str) -> float | None:
    return QUANT_BITS.get(label.upper().removeprefix("UD-"))


@dataclass(frozen=True)
class GgufModelFiles:
    """One model in a repo: a GGUF file, or every part of a split one, the first part first."""

    files: tuple[str, ...]

    @property
    def first(self) -> str:
        return self.files[0]

    @property
    def stem(self) -> str:
        """The file name without `.gguf` and without a split part's numbering."""
        name = PurePosixPath(self.first).name
        split = _SPLIT_PART.match(name)
        return split["prefix"] if split else name.removesuffix(".gguf")

    @property
    def label(self) -> str:
        """What follows `user/repo:` to name this model: its quantization type, else its stem."""
        return quant_label(self.stem) or self.stem


def gguf_models(paths: Iterable[str]) -> list[GgufModelFiles]:
    """The models among a repo's files: single GGUF files and complete sets of split parts."""
    singles: list[GgufModelFiles] = []
    splits: dict[tuple[str, int], dict[int, str]] = {}
    for path in paths:
        name = PurePosixPath(path).name
        if not name.lower().endswith(".gguf") or any(fnmatch(name.lower(), pattern) for pattern in NOT_MODELS):
            continue
        part = _SPLIT_PART.match(name)
        if part is None:
            singles.append(GgufModelFiles((path,)))
        else:
            prefix = str(PurePosixPath(path).parent / part["prefix"])
            splits.setdefault((prefix, int(part["count"])), {})[int(part["no"])] = path
    complete = [
        GgufModelFiles(tuple(parts[no] for no in range(1, count + 1)))
        for (_, count), parts in splits.items()
        if count >= 1 and all(no in parts for no in range(1, count + 1))
    ]
    return sorted(singles + complete, key=lambda model: model.first)


def _tag_matches(tag: str, model: GgufModelFiles) -> bool:
    """The tag names the model's quantization type, or stands whole in its file name (between `-`, `.`)."""
    if model.label.upper() == tag.upper():
        return True
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(tag)}(?![A-Za-z0-9_])", model.stem, re.IGNORECASE) is not None


def select_model(name: HubModelName, models: list[GgufModelFiles]) -> GgufModelFiles | None:
    """The model a name picks among a repo's (or the cache's) GGUF models, or None.

    A tag picks the model whose label is the tag, else one whose file name holds it. Without a tag:
    Q4_K_M, else the type nearest to it in bits per weight, else the only model there is."""
    if name.tag is not None:
        exact = [m for m in models if m.label.upper() == name.tag.upper()]
        return (exact or [m for m in models if _tag_matches(name.tag, m)] or [None])[0]
    target = QUANT_BITS[DEFAULT_QUANT]
    ranked = sorted(
        ((abs(bits - target), -bits, model.first, model) for model in models if (bits := _bits(model.label)) is not None),
        key=lambda row: row[:3],
    )
    if ranked:
        return ranked[0][3]
    return models[0] if len(models) == 1 else None


def missing_model_error(name: HubModelName, models: list[GgufModelFiles]) -> ModelError:
    """What to say when `select_model` finds nothing: what the repo has instead."""
    if not models:
        return ModelError(
            f"{name.repo_id} has no GGUF model files; if it is a transformers checkpoint, "
            f"convert it with `localchat convert {name.repo_id} --to gguf`"
        )
    labels = ", ".join(dict.fromkeys(m.label for m in models))
    wanted = f"no {name.tag} file" if name.tag else "no file of a known quantization type"
    example = f"{name.repo_id}:{models[0].label}"
    return ModelError(f"{name.repo_id} has {wanted}; it has: {labels} (for example `localchat pull {example}`)")


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repo as the hub's API lists it (model_info with files_metadata)."""

    path: str
    size: int | None
    sha256: str | None  # LFS files
    blob_id: str | None  # the git object id: sha1 of "blob <size>\0<content>"


@dataclass(frozen=True)
class CachedModel:
    """A GGUF model in the Hugging Face cache; `path` is its first part's snapshot entry."""

    repo_id: str
    commit: str
    model: GgufModelFiles
    path: Path

    @property
    def name(self) -> str:
        return f"{self.repo_id}:{self.model.label}"

    @property
    def paths(self) -> list[Path]:
        snapshot = self.path.parents[len(PurePosixPath(self.model.first).parts) - 1]
        return [snapshot / file for file in self.model.files]

    @property
    def size(self) -> int:
        return sum(path.stat().st_size for path in self.paths)


@dataclass(frozen=True)
class PullResult:
    model: CachedModel
    fetched_bytes: int
    checked_hub: bool  # False when offline: the cached copy was not compared with the hub


def _storage(repo_id: str, settings: Settings) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return settings.hf_cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model")


def _snapshot_commits(storage: Path) -> list[str]:
    """The repo's cached commits: the one `main` points at first, then the newest first."""
    snapshots = storage / "snapshots"
    if not snapshots.is_dir():
        return []
    by_age = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    commits = [p.name for p in by_age]
    ref = storage / "refs" / REVISION
    main = ref.read_text().strip() if ref.is_file() else None
    return sorted(commits, key=lambda commit: commit != main)


def _cached_files(snapshot: Path) -> list[str]:
    """Snapshot entries whose blob is present (a dangling link is a file another tool removed)."""
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf") if p.is_file())


def find_cached(name: HubModelName, settings: Settings) -> CachedModel | None:
    """The model a name picks among the files already in the cache, without the network."""
    storage = _storage(name.repo_id, settings)
    for commit in _snapshot_commits(storage):
        snapshot = storage / "snapshots" / commit
        model = select_model(name, gguf_models(_cached_files(snapshot)))
        if model is not None:
            return CachedModel(name.repo_id, commit, model, snapshot / model.first)
    return None


def _scan(settings: Settings) -> HFCacheInfo | None:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(settings.hf_cache_dir)
    except CacheNotFound:
        return None


def _models_in(info: HFCacheInfo, repo_id: str | None = None) -> list[CachedModel]:
    """The GGUF models of a cache scan, one per repo and label: the copy `main` points at, else the newest."""
    found: dict[tuple[str, str], CachedModel] = {}
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or repo_id not in (None, repo.repo_id):
            continue
        commits = _snapshot_commits(repo.repo_path)
        for revision in sorted(repo.revisions, key=lambda r: commits.index(r.commit_hash)):
            snapshot = revision.snapshot_path
            files = [f.file_path.relative_to(snapshot).as_posix() for f in revision.files]
            for model in gguf_models(files):
                cached = CachedModel(repo.repo_id, revision.commit_hash, model, snapshot / model.first)
                found.setdefault((repo.repo_id, model.label), cached)
    return list(found.values())


def cached_models(settings: Settings) -> list[CachedModel]:
    """Every GGUF model in the Hugging Face cache (huggingface_hub's scan; damaged repos are skipped)."""
    info = _scan(settings)
    return _models_in(info) if info else []


def offline_error(name: HubModelName, settings: Settings) -> ModelError:
    return ModelError(
        f"{name} is not in the Hugging Face cache ({settings.hf_cache_dir}) and offline mode is on "
        "(HF_HUB_OFFLINE); pull it while online, or run `localchat list` to see what is cached"
    )


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

    storage = _storage(repo_id, settings)
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


def _write_ref(storage: Path, commit: str) -> None:
    ref = storage / "refs" / REVISION
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    partial = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    partial.write_text(commit)
    os.replace(partial, ref)


def pull(name: HubModelName, settings: Settings, *, progress: PullProgress | None = None,
         cancel: threading.Event | None = None) -> PullResult:
    """Bring the model a name picks into the cache (all its split parts), fetching only what is missing.

    Offline, a cached copy is the answer and anything else is a ModelError. `progress` follows the
    bytes; setting `cancel` stops the pull at its next chunk (10 MiB) with PullCancelled, and no
    file it did not finish and check is taken into the cache."""
    if settings.hf_offline:
        cached = find_cached(name, settings)
        if cached is None:
            raise offline_error(name, settings)
        return PullResult(cached, 0, checked_hub=False)
    commit, files = remote_files(name.repo_id, settings)
    models = gguf_models(files)
    model = select_model(name, models)
    if model is None:
        raise missing_model_error(name, models)
    total = sum(files[path].size or 0 for path in model.files) if all(files[path].size for path in model.files) else None
    done = 0

    def on_bytes(n_bytes: int) -> None:
        if cancel is not None and cancel.is_set():
            raise PullCancelled(f"the pull of {name} was cancelled{RESUME_HINT}")
        if progress is not None:
            progress(done + n_bytes, total)

    fetched = 0
    entries = []
    for path in model.files:
        on_bytes(0)
        watched = on_bytes if progress is not None or cancel is not None else None
        entry, n_bytes = download_file(name.repo_id, commit, files[path], settings, watched)
        entries.append(entry)
        fetched += n_bytes
        done += files[path].size or 0
    if progress is not None:
        progress(done, total)
    _write_ref(_storage(name.repo_id, settings), commit)
    return PullResult(CachedModel(name.repo_id, commit, model, entries[0]), fetched, checked_hub=True)


def pull_files(repo_id: str, patterns: Iterable[str], settings: Settings) -> Path:
    """The files of a repo matching any of `patterns` (a transformers checkpoint for `convert`),
    downloaded as `pull` downloads models; returns the snapshot folder. Offline, the newest cached
    snapshot holding any of them."""
    patterns = tuple(patterns)
    storage = _storage(repo_id, settings)
    if settings.hf_offline:
        for commit in _snapshot_commits(storage):
            snapshot = storage / "snapshots" / commit
            if any(fnmatch(p.name, pattern) for p in snapshot.iterdir() if p.is_file() for pattern in patterns):
                return snapshot
        raise ModelError(f"{repo_id} is not in the Hugging Face cache ({settings.hf_cache_dir}) and offline mode is on (HF_HUB_OFFLINE)")
    commit, files = remote_files(repo_id, settings)
    for remote in files.values():
        if any(fnmatch(remote.path, pattern) for pattern in patterns):
            download_file(repo_id, commit, remote, settings)
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    _write_ref(storage, commit)
    return snapshot


@dataclass(frozen=True)
class Removal:
    names: tuple[str, ...]
    freed_bytes: int


def remove(name: HubModelName, settings: Settings) -> Removal:
    """Delete a model's files from the Hugging Face cache in every cached revision (with no tag,
    every GGUF model of the repo) through huggingface_hub's delete strategies: a repo left with
    nothing goes whole, and a blob another file still uses stays."""
    info = _scan(settings)
    repo = next((r for r in info.repos if r.repo_id == name.repo_id and r.repo_type == "model"), None) if info else None
    models = _models_in(info, name.repo_id) if info else []
    if info is None or repo is None or not models:
        raise ModelError(f"{name} is not in the Hugging Face cache ({settings.hf_cache_dir}); `localchat list` shows what is")
    if name.tag is not None:
        chosen = select_model(name, [m.model for m in models])
        if chosen is None:
            labels = ", ".join(m.model.label for m in models)
            raise ModelError(f"{name} is not in the Hugging Face cache; of {name.repo_id} it holds: {labels}")
        models = [m for m in models if m.model.label == chosen.label]
    labels = {m.model.label for m in models}
    targets = set()
    for revision in repo.revisions:
        files = {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}
        for model in gguf_models(files):
            if model.label in labels:
                targets.update(files[path] for path in model.files)
    everything = {f for revision in repo.revisions for f in revision.files}
    if targets == everything:
        strategy = info.delete_revisions(*(revision.commit_hash for revision in repo.revisions))
    else:
        strategy = info.delete_files(*targets)
    strategy.execute()
    return Removal(tuple(m.name for m in models), strategy.expected_freed_size)
