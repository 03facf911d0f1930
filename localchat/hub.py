"""Models from the Hugging Face hub: names such as `user/repo:Q4_K_M`, the GGUF file (or split parts)
a name picks in a repo, what the Hugging Face cache holds, and pulls into it (each file downloaded,
resumably and checked, by localchat/hub_download.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from localchat.errors import ModelError
from localchat.hub_download import REVISION, RESUME_HINT, download_file, remote_files, repo_storage, write_ref
from localchat.settings import Settings

if TYPE_CHECKING:
    from huggingface_hub import HFCacheInfo

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


# Told the bytes of a model's files that are in the cache (done, total when the hub says) as they arrive.
PullProgress = Callable[[int, int | None], None]


class PullCancelled(ModelError):
    """A pull its caller stopped: what was fetched stays in `.incomplete` and the next pull resumes."""


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
    storage = repo_storage(name.repo_id, settings)
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
    except ValueError:  # a file where the cache's folder should be
        raise ModelError(f"the Hugging Face cache {settings.hf_cache_dir} is not a folder: point HF_HUB_CACHE "
                         "(or HF_HOME) at one") from None


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
    write_ref(repo_storage(name.repo_id, settings), commit)
    return PullResult(CachedModel(name.repo_id, commit, model, entries[0]), fetched, checked_hub=True)


def pull_files(repo_id: str, patterns: Iterable[str], settings: Settings) -> Path:
    """The files of a repo matching any of `patterns` (a transformers checkpoint for `convert`),
    downloaded as `pull` downloads models; returns the snapshot folder. Offline, the newest cached
    snapshot holding any of them."""
    patterns = tuple(patterns)
    storage = repo_storage(repo_id, settings)
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
    write_ref(storage, commit)
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
