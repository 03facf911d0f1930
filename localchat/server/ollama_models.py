"""Ollama's model routes over localchat's models: /api/tags, /api/show, /api/ps, /api/pull,
/api/create, /api/blobs, /api/delete, /api/copy and /api/version.

The models are those `localchat list` shows (the models folder and the Hugging Face cache) and any
the server was started with by path. /api/pull fetches GGUF models from the Hugging Face hub
through localchat.hub, its progress streamed as Ollama streams a pull's; it is on with
`localchat serve --allow-pull`. /api/delete and /api/copy change the models folder and the cache:
they are on with `--allow-model-changes`, as is /api/create, which makes a preset (localchat.presets): a
model under a new name with its own system prompt, messages and sampling defaults, of a model the server has
or of a GGUF file uploaded to /api/blobs (kept until no preset names it). /api/copy gives a
single-file GGUF model a second name in the models folder (a hard link where the file system allows), and
a preset a second name.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from localchat import hub
from localchat.chat_formats import detect_format
from localchat.errors import InvalidSettingError, LocalchatError, ModelError
from localchat.gguf_file import GgufHeader, read_gguf_header
from localchat.hardware import MIB
from localchat.models import (
    InstalledModel,
    describe_model,
    model_file_stamp,
    packaged_model,
    preset_model,
    prune_upload,
    remove_model,
    uploaded_files_dir,
)
from localchat.presets import (
    PRESET_NAME,
    PRESET_ROLES,
    ModelPreset,
    PresetMessage,
    is_preset_file,
    preset_runs,
    read_preset,
    write_preset,
)
from localchat.sampling_defaults import sampler_defaults
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.ollama import (
    NDJSON_STREAM,
    ndjson,
    ollama_error_responses,
    sampling_fields,
)
from localchat.server.ollama_schemas import (
    CopyRequest,
    CreateRequest,
    ListedModel,
    ModelDetails,
    ModelList,
    NamedModelRequest,
    Progress,
    PullRequest,
    RunningModel,
    RunningModels,
    ShowResponse,
    Version,
)
from localchat.server.routing import LATEST, ModelRouter, names_wanted
from localchat.server.schemas import SAMPLER_FIELDS
from localchat.settings import Settings
from localchat.templates import fallback_template

if TYPE_CHECKING:
    from localchat.server.served_models import EngineLoader
    from localchat.server.settings import ServerSettings

# The Ollama release whose API (api/types.go, server/routes.go) these routes follow.
OLLAMA_API_VERSION = "0.32.15"
# What Ollama answers at / (clients match the text, not only the status).
OLLAMA_RUNNING = "Ollama is running"
# A name /api/copy and /api/create may give: a file name in the models folder, without a path.
COPY_NAME = PRESET_NAME
# /api/create's fields that change how a model is made, with what to do instead.
CREATE_REFUSED = {
    "adapters": "LoRA adapters cannot be part of a model here: `localchat serve --lora FILE` applies one",
    "quantize": "quantizing is not supported here: `localchat convert SRC --to gguf --quant Q` quantizes a checkpoint",
    "modelfile": "a Modelfile's text is not read: send its lines as fields (from, system, messages, parameters), as "
                 "Ollama's clients do",
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An uploaded file's name in Ollama's /api/blobs/DIGEST (its CLI sends "sha256:", its store writes "sha256-").
BLOB_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
# An upload is hashed and written this much at a time, off the event loop.
BLOB_WRITE_BYTES = 4 * MIB
# What /api/ps says for a model kept as long as room allows (Ollama's "for ever" is far ahead too).
NEVER = datetime(9999, 1, 1, tzinfo=UTC)


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _human_count(count: int | None) -> str:
    """Parameters as Ollama writes them: 268.10M, 7.6B."""
    if not count:
        return ""
    for size, unit, digits in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)):
        if count >= size:
            return f"{count / size:.{digits}f}{unit}"
    return str(count)


def _digest(path: Path) -> str:
    """A hub file's sha256 (its blob's name in the Hugging Face cache), else an identity of the
    file (path, size, time) that changes when the file does: hashing gigabytes per listing is not."""
    resolved = path.resolve()
    if _SHA256.match(resolved.name):
        return resolved.name
    identity = f"{resolved}:{resolved.stat().st_size}:{resolved.stat().st_mtime_ns}" if resolved.exists() else str(resolved)
    return hashlib.sha256(identity.encode()).hexdigest()


def _modified(path: Path) -> str:
    """When the model's file changed (a packaged model not made yet: the time its file will have)."""
    stamp = model_file_stamp(path)
    return _time(stamp.mtime if stamp is not None else 0)


def _details(row: InstalledModel) -> ModelDetails:
    family = row.architecture or ""
    return ModelDetails(format=row.format, family=family, families=[family] if family else None,
                        parameter_size=_human_count(row.parameters), quantization_level=row.quantization or "")


def _listed(row: InstalledModel) -> ListedModel:
    return ListedModel(name=row.name, model=row.name, modified_at=_modified(row.path), size=row.size,
                       digest=_digest(row.path), details=_details(row))


def _parameters(info: dict[str, Any], preset: ModelPreset | None) -> list[tuple[str, object]]:
    """The sampling defaults a request starts from (the model's: localchat.sampling_defaults, from its
    metadata `info`, under a preset's), as Ollama's Modelfile parameters, and localchat's dry_multiplier
    where DRY is on; a preset's stop strings, reply limit and context too."""
    defaults = sampler_defaults({key: str(value) for key, value in info.items() if key.startswith("general.")})
    settings = (preset.sampler(defaults) if preset is not None else defaults).settings
    rows: list[tuple[str, object]] = [
        ("temperature", settings.temperature), ("top_k", settings.top_k), ("top_p", settings.top_p), ("min_p", settings.min_p),
        ("repeat_penalty", settings.repeat_penalty), ("repeat_last_n", settings.penalty_last_n)]
    if settings.dry_multiplier:
        rows.append(("dry_multiplier", settings.dry_multiplier))
    if preset is not None:
        rows += [("stop", json.dumps(stop)) for stop in preset.stop]
        rows += [(name, value) for name, value in (("num_predict", preset.max_tokens), ("num_ctx", preset.context))
                 if value is not None]
    return rows


def _modelfile(source: str, template: str, parameters: list[tuple[str, object]], preset: ModelPreset | None) -> str:
    """What `ollama show --modelfile` prints: the model as a Modelfile's lines (its template is Jinja, not Go)."""
    def quoted(text: str) -> str:
        return f'"""{text}"""'

    lines = ["# Modelfile generated by localchat", f"FROM {source}", f"TEMPLATE {quoted(template)}"]
    if preset is not None and preset.system:
        lines.append(f"SYSTEM {quoted(preset.system)}")
    lines += [f"PARAMETER {name} {value}" for name, value in parameters]
    if preset is not None:
        lines += [f"MESSAGE {message.role} {quoted(message.content)}" for message in preset.messages]
        if preset.license:
            lines.append(f"LICENSE {quoted(preset.license)}")
    return "\n".join(lines) + "\n"


def _chat_template(header: GgufHeader) -> str:
    """The chat template requests to a GGUF model render (its engine's, templates.ChatTemplate.for_model): its file's,
    else localchat's fallback for its architecture."""
    return str(header.get("tokenizer.chat_template") or "") or fallback_template(header.architecture or "")


def _model_info(path: Path, verbose: bool) -> tuple[dict[str, Any], str, bool]:
    """A GGUF model's metadata (arrays as [] unless verbose), the chat template its requests render, and whether it
    names a pooling (an embedding model)."""
    header = read_gguf_header(path)
    info: dict[str, Any] = {}
    for key, value in header.metadata.items():
        if key == "tokenizer.chat_template":
            continue
        info[key] = value.tolist() if hasattr(value, "tolist") else value
    for key in header.array_lengths:
        values = header.numeric_array(key) if verbose else None
        info[key] = values.tolist() if values is not None else []
    return info, _chat_template(header), header.arch_value("pooling_type") is not None


class OllamaModels:
    """The model routes; `models` resolves and leases, `loader` lists this machine's models."""

    def __init__(self, models: ModelRouter, loader: EngineLoader | None, settings: ServerSettings) -> None:
        self.models = models
        self.loader = loader
        self.settings = settings
        # The uploads (their paths) that creates in flight name: a failing create, a model made again or deleted
        # leaves them, or another client's create would name a file gone (`ollama create` uploads, then creates).
        self._creating: Counter[str] = Counter()

    # -- finding models ---------------------------------------------------------------

    def _paths(self) -> dict[str, Path]:
        """Every model by id: loaded ones started by path, then the catalog."""
        paths = {served.id: served.engine.model_plan.model.path
                 for served in [self.models.first, *self.models.pool.loaded().values()]}
        if self.loader is not None:
            paths.update({model.id: model.path for model in self.loader.catalog()})
        return paths

    def find(self, requested: str) -> tuple[str, Path]:
        """The id and path of the model `requested` names (`named`); 404 when none. Never loads nor pulls."""
        found = self.named(requested)
        if found is None:
            raise APIError(404, f"model '{requested}' not found", code="model_not_found", param="model")
        return found

    def named(self, requested: str) -> tuple[str, Path] | None:
        """The id and path of the model `requested` names, in any case (NAME:latest for NAME too): by its id, or a
        model's by its file's name or stem (a preset's file is its alone)."""
        wanted = names_wanted(requested)
        for model_id, path in self._paths().items():
            names = {model_id} if is_preset_file(path) else {model_id, path.name, path.stem}
            if wanted & {name.casefold() for name in names}:
                return model_id, path
        return None

    @property
    def _settings(self) -> Settings:
        """Where the models are: the loader's settings (a server of one model, started by path, has no catalog)."""
        return self.loader.settings if self.loader is not None else Settings()

    def rows(self) -> list[InstalledModel]:
        """Every model described from its file (describe_model: a packaged model not made yet as such)."""
        return [describe_model(model_id, path, self._settings) for model_id, path in self._paths().items()]

    def _checked(self, allowed: bool, what: str, flag: str) -> None:
        if not allowed:
            raise APIError(403, f"{what} is off on this server: start `localchat serve` with {flag}", code="forbidden")

    # -- routes -------------------------------------------------------------------------

    async def tags(self) -> ModelList:
        rows = await run_in_threadpool(self.rows)
        return ModelList(models=[_listed(row) for row in rows if row.problem is None])

    async def show(self, body: NamedModelRequest) -> ShowResponse:
        if not body.wanted:
            raise APIError(400, "model is required", param="model")
        model_id, path = self.find(body.wanted)
        modified = _modified(path)
        preset = None
        if is_preset_file(path):  # the model it runs, under its name
            try:
                preset = await run_in_threadpool(read_preset, path)
                path = (await run_in_threadpool(lambda: preset_model(preset, self._settings, fetch=False))).path
            except ModelError as error:
                raise APIError(400, str(error), param="model") from None
        packaged = packaged_model(path)
        if not path.exists() and packaged is not None and self.loader is not None:
            path = await run_in_threadpool(packaged.locate, self.loader.settings)  # made from its package now
        row = await run_in_threadpool(describe_model, model_id, path, self._settings)
        if row.problem is not None:
            raise APIError(400, row.problem, param="model")
        if row.format == "gguf":
            info, template, embeds = await run_in_threadpool(_model_info, path, body.verbose)
        else:
            info, template, embeds = {"general.architecture": row.architecture}, fallback_template(row.architecture or ""), False
        template = self._template(model_id) or template  # a loaded model's is what its requests render
        if embeds:
            capabilities = ["embedding"]
        else:
            capabilities = (["completion", "tools"] + (["insert"] if self._fills_in_middle(model_id, info) else [])
                            + (["thinking"] if detect_format(template).reasons else []))
        parameters = _parameters(info, preset)
        return ShowResponse(parameters="\n".join(f"{name:<31}{value}" for name, value in parameters), template=template,
                            modelfile=_modelfile(preset.model if preset is not None else str(path), template, parameters, preset),
                            details=_details(row), model_info=info, capabilities=capabilities, modified_at=modified,
                            system=preset.system if preset is not None else None,
                            license=preset.license if preset is not None else None,
                            messages=[{"role": m.role, "content": m.content} for m in preset.messages] if preset else None)

    def _fills_in_middle(self, model_id: str, info: dict[str, Any]) -> bool:
        """Whether the model takes a `suffix` (Ollama's "insert"): llama.cpp's word once it is loaded (it also
        knows FIM tokens by their text), else whether its file names its FIM tokens."""
        served = self.models.pool.loaded().get(model_id)
        if served is not None:
            return served.engine.backend.info.fim is not None
        return all(f"tokenizer.ggml.fim_{part}_token_id" in info for part in ("pre", "suf", "mid"))

    def _template(self, model_id: str) -> str:
        served = self.models.pool.loaded().get(model_id)
        return served.engine.template.source if served is not None else ""

    async def ps(self) -> RunningModels:
        pool = self.models.pool
        running = []
        now_wall, now = time.time(), time.monotonic()
        for model_id, served in pool.loaded().items():
            path = served.engine.model_plan.model.path
            row = await run_in_threadpool(describe_model, model_id, path, self._settings)
            need = pool.need(model_id)
            vram = sum(need.gpu_bytes.values()) if need is not None else 0
            expiry = pool.expiry(model_id)
            expires = _time(now_wall + expiry - now) if expiry is not None else NEVER.isoformat().replace("+00:00", "Z")
            running.append(RunningModel(
                name=model_id, model=model_id, size=(need.ram_bytes if need is not None and need.ram_bytes else row.size) + vram,
                digest=_digest(path), details=_details(row), expires_at=expires, size_vram=vram,
                context_length=served.engine.backend.n_ctx,
            ))
        return RunningModels(models=running)

    async def pull(self, body: PullRequest, request: Request) -> Response:
        if self.loader is None:
            raise APIError(400, "this server serves one model and pulls none", param="model")
        wanted = body.wanted
        if not wanted:
            raise APIError(400, "model is required", param="model")
        name = hub.HubModelName.parse(wanted.removesuffix(LATEST))
        if name is None:
            self.find(wanted)  # a model of this machine that is not from the hub: nothing to pull
            return JSONResponse(Progress(status="success").model_dump())
        # A model already here is there to use, as apps pull before they chat; fetching one is the server's choice.
        if not self.settings.allow_pull and await run_in_threadpool(hub.find_cached, name, self.loader.settings):
            return JSONResponse(Progress(status="success").model_dump())
        self._checked(self.settings.allow_pull, "pulling models", "--allow-pull")
        lines = self._pull(name, self.loader)
        if body.stream:
            return ndjson(lines)
        last: Progress | None = None
        async for line in lines:
            if isinstance(line, dict):  # {"error": ...}: Ollama answers any failed pull so (its waitForStream)
                raise APIError(500, str(line["error"]), param="model")
            last = line
        assert last is not None
        return JSONResponse(last.model_dump())

    async def _pull(self, name: hub.HubModelName, loader: EngineLoader) -> AsyncIterator[Progress | dict[str, str]]:
        """localchat.hub's pull in a worker thread, its progress as Ollama's lines; leaving early
        (the client went away) cancels it, and the next pull resumes what it fetched."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[Progress | BaseException | None] = asyncio.Queue()
        cancel = threading.Event()
        status = f"pulling {name}"

        def progress(done: int, total: int | None) -> None:
            loop.call_soon_threadsafe(updates.put_nowait, Progress(status=status, digest=str(name), total=total,
                                                                   completed=done))

        def work() -> None:
            try:
                hub.pull(name, loader.settings, progress=progress, cancel=cancel)
                loop.call_soon_threadsafe(updates.put_nowait, None)
            except BaseException as error:  # handed to the stream, which answers it
                loop.call_soon_threadsafe(updates.put_nowait, error)

        yield Progress(status="pulling manifest")
        worker = loop.run_in_executor(None, work)
        try:
            while (update := await updates.get()) is not None:
                if isinstance(update, LocalchatError):
                    yield {"error": str(update)}
                    return
                if isinstance(update, BaseException):
                    raise update
                yield update
            for step in ("verifying sha256 digest", "writing manifest", "success"):
                yield Progress(status=step)
        finally:
            cancel.set()
            await worker

    async def delete(self, body: NamedModelRequest) -> Response:
        self._checked(self.settings.allow_model_changes, "deleting models", "--allow-model-changes")
        if not body.wanted:
            raise APIError(400, "model is required", param="model")
        model_id, _ = self.find(body.wanted)
        if self.loader is None or all(model.id != model_id for model in await run_in_threadpool(self.loader.catalog)):
            raise APIError(400, f"'{model_id}' was given to the server by its path; it is not one of the models it may delete",
                           param="model")
        await self.models.pool.unload(model_id, "deleted by /api/delete")
        try:
            await run_in_threadpool(remove_model, model_id, self.loader.settings, self._uploads_in_use())
        except ModelError as error:
            raise APIError(404, str(error), code="model_not_found", param="model") from None
        return Response(status_code=200)

    async def copy(self, body: CopyRequest) -> Response:
        self._checked(self.settings.allow_model_changes, "copying models", "--allow-model-changes")
        if self.loader is None:
            raise APIError(400, "this server serves one model and copies none", param="source")
        _, source = self.find(body.source)
        destination = body.destination.removesuffix(LATEST)
        if not COPY_NAME.match(destination):
            raise APIError(400, f'destination "{body.destination}" is invalid: give a name of letters, digits, ".", "_" '
                                "and \"-\"", param="destination")
        models_dir = self.loader.settings.models_dir
        if self.named(destination) is not None:  # a second model of that name would answer in its place
            raise APIError(400, f"destination {destination} exists: delete it first or give another name", param="destination")
        if is_preset_file(source):
            try:
                preset = await run_in_threadpool(read_preset, source)
            except ModelError as error:
                raise APIError(400, str(error), param="source") from None
            await run_in_threadpool(write_preset, replace(preset, name=destination), models_dir)
        else:
            await run_in_threadpool(_copy_model, source, models_dir / f"{destination}.gguf")
        return Response(status_code=200)

    async def create(self, body: CreateRequest) -> Response:
        self._checked(self.settings.allow_model_changes, "creating models", "--allow-model-changes")
        own = Counter(str(self._blob(digest)) for digest in (body.files or {}).values() if BLOB_DIGEST.match(digest))
        self._creating.update(own)
        try:
            return await self._create(body, own)
        except Exception:
            # A model not made leaves no file uploaded for it that no model names (the client uploads it again).
            in_use = self._uploads_in_use(own)
            await run_in_threadpool(lambda: [prune_upload(path, self._settings, in_use) for path in own])
            raise
        finally:
            self._creating.subtract(own)

    def _uploads_in_use(self, own: Counter[str] | None = None) -> set[str]:
        """The uploads the creates in flight name, besides `own` (a create's own)."""
        return set(self._creating - (own or Counter()))

    async def _create(self, body: CreateRequest, own: Counter[str]) -> Response:
        if self.loader is None:
            raise APIError(400, "this server serves one model and creates none", param="model")
        name = body.wanted.removesuffix(LATEST)
        if not name:
            raise APIError(400, "model is required", param="model")
        if not COPY_NAME.match(name):
            raise APIError(400, f'model "{body.wanted}" is invalid: give a name of letters, digits, ".", "_" and "-"', param="model")
        for field, advice in CREATE_REFUSED.items():
            if getattr(body, field):
                raise APIError(400, f"{field}: {advice}", code="unsupported_parameter", param=field)
        if not body.from_ and not body.files:
            raise APIError(400, "neither 'from' or 'files' was specified: give the model to make it from as `from`", param="from")
        taken = self.named(name)
        replaced: str | None = None  # the model of the preset made again
        if taken is not None:
            if not is_preset_file(taken[1]):  # it would answer in the model's place
                raise APIError(400, f"a model named {taken[0]} exists and is not a preset: give another name", param="model")
            name = taken[0]  # made again under its name as it is (Ollama's getExistingName): a name is one in any case
            replaced = await run_in_threadpool(preset_runs, taken[1])
        catalog = await run_in_threadpool(self.loader.catalog)
        if body.from_:
            source_id, source = self.find(body.from_)
            # A model the server was started with by path, outside the models folder, is named by its path.
            model = source_id if any(model.id == source_id for model in catalog) else str(source.resolve())
        else:  # a GGUF file uploaded to /api/blobs: the preset names it
            source = await run_in_threadpool(self._uploaded_model, body.files or {})
            model = str(source)
        try:
            preset = await run_in_threadpool(self._preset, name, body, model, source)
        except ModelError as error:  # its source a damaged preset, or a preset whose model is gone
            raise APIError(400, str(error), param="from") from None
        await run_in_threadpool(write_preset, preset, self.loader.settings.models_dir)
        if replaced is not None:  # a file uploaded for the old one, if no model names it now
            await run_in_threadpool(prune_upload, replaced, self.loader.settings, self._uploads_in_use(own))
        await self.models.pool.unload(name, "made again by /api/create")  # its next request loads the new one
        lines = [Progress(status=f"using existing model {preset.model}"), Progress(status="writing preset"),
                 Progress(status="success")]
        if not body.stream:
            return JSONResponse(lines[-1].model_dump())

        async def stream() -> AsyncIterator[Progress]:
            for line in lines:
                yield line

        return ndjson(stream())

    def _preset(self, name: str, body: CreateRequest, model: str, source: Path) -> ModelPreset:
        """The preset /api/create makes of `model` (whose file or preset is `source`): `body`'s fields over those
        of its source when that is a preset."""
        base = read_preset(source) if is_preset_file(source) else ModelPreset(name, model)
        if body.template is not None and body.template.strip() != self._own_template(base).strip():
            raise APIError(400, "template: localchat renders the model's own chat template (Jinja, from its GGUF file); "
                                "a preset cannot replace it", code="unsupported_parameter", param="template")
        fields, stop = sampling_fields(body.parameters, None, "parameters")
        context = (body.parameters or {}).get("num_ctx")
        if context is not None and (not isinstance(context, int) or isinstance(context, bool)):
            raise APIError(400, 'option "num_ctx" must be of type integer', param="parameters.num_ctx")
        for index, message in enumerate(body.messages or ()):
            if message.role not in PRESET_ROLES:
                raise APIError(400, f"messages[{index}].role: '{message.role}' is not one of {', '.join(PRESET_ROLES)}",
                               param=f"messages[{index}].role")
        license_ = "\n\n".join(body.license) if isinstance(body.license, list) else body.license
        sampling = dict(base.sampling) | {SAMPLER_FIELDS[field]: value for field, value in fields.items() if field in SAMPLER_FIELDS}
        sampling = {field: value for field, value in sampling.items() if value is not None}  # a seed of -1: none
        try:
            return ModelPreset(
                name, base.model, body.system if body.system is not None else base.system,
                tuple(PresetMessage(m.role, m.content) for m in body.messages) if body.messages is not None else base.messages,
                tuple(sampling.items()), stop if stop is not None else base.stop, fields.get("max_tokens", base.max_tokens),
                context if context is not None else base.context, license_ if license_ is not None else base.license)
        except InvalidSettingError as error:
            raise APIError(400, str(error), param="parameters") from None

    def _blob(self, digest: str) -> Path:
        match = BLOB_DIGEST.match(digest)
        if match is None:
            raise APIError(400, f'invalid digest "{digest}": give sha256:<64 hex digits>', param="digest")
        return uploaded_files_dir(self._settings) / f"sha256-{match[1]}"

    def _uploaded_model(self, files: dict[str, str]) -> Path:
        """The one GGUF file of /api/create's `files`, uploaded to /api/blobs first."""
        if len(files) != 1 or not next(iter(files)).endswith(".gguf"):
            raise APIError(400, f"files: give one .gguf file, not {', '.join(files) or 'none'} (a checkpoint's files: "
                                "`localchat convert` makes a GGUF of it)", param="files")
        digest = next(iter(files.values()))
        path = self._blob(digest)
        if not path.is_file():
            raise APIError(400, f"files: {digest} was not uploaded: POST the file to /api/blobs/{digest} first", param="files")
        try:
            header = read_gguf_header(path)
        except ModelError as error:
            raise APIError(400, f"files: supplied file was not in GGUF format ({error})", param="files") from None
        if header.get("split.count", 1) != 1:
            raise APIError(400, "files: a GGUF model split into parts is not taken: merge it with llama.cpp's gguf-split",
                           param="files")
        return path

    async def blob_exists(self, digest: str) -> Response:
        """Ollama's HEAD /api/blobs/DIGEST: 200 when that file was uploaded, else 404."""
        return Response(status_code=200 if self._blob(digest).is_file() else 404)

    async def upload_blob(self, digest: str, request: Request) -> Response:
        """Ollama's POST /api/blobs/DIGEST: the body, checked against its sha256, kept for /api/create's `files`
        (201; 200 when it was there). A body cut short or of another digest leaves nothing."""
        self._checked(self.settings.allow_model_changes, "uploading model files", "--allow-model-changes")
        path = self._blob(digest)
        if path.is_file():
            return Response(status_code=200)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}-{id(request)}.incomplete")
        hasher = hashlib.sha256()
        try:
            with partial.open("wb") as out:
                def write(data: bytes) -> None:
                    hasher.update(data)
                    out.write(data)

                buffer = bytearray()
                async for chunk in request.stream():
                    buffer += chunk
                    if len(buffer) >= BLOB_WRITE_BYTES:
                        await run_in_threadpool(write, bytes(buffer))
                        buffer.clear()
                await run_in_threadpool(write, bytes(buffer))
            if hasher.hexdigest() != path.name.removeprefix("sha256-"):
                raise APIError(400, f"digest mismatch: the body's is sha256:{hasher.hexdigest()}", param="digest")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return Response(status_code=201)

    def _own_template(self, preset: ModelPreset) -> str:
        """The chat template requests to the model `preset` runs render: its file's, else localchat's fallback."""
        ref = preset_model(preset, self._settings, fetch=False)
        if not ref.path.exists() or ref.path.is_dir():
            return ""
        return _chat_template(read_gguf_header(ref.path))

    async def version(self) -> Version:
        return Version(version=OLLAMA_API_VERSION)

    async def running(self) -> PlainTextResponse:
        return PlainTextResponse(OLLAMA_RUNNING)


def _copy_model(source: Path, target: Path) -> None:
    """A second name for a single-file GGUF model: a hard link, else a copy written whole then renamed."""
    if source.is_dir() or source.suffix != ".gguf":
        raise APIError(400, "copy works on GGUF models; this one is an ONNX folder", param="source")
    if read_gguf_header(source).get("split.count", 1) != 1:
        raise APIError(400, "copy works on single-file GGUF models; this one is split into parts", param="source")
    if target.exists():
        raise APIError(400, f"destination {target.stem} exists: delete it first or give another name", param="destination")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".incomplete")
    try:
        os.link(source.resolve(), partial)
    except OSError:  # another file system
        shutil.copyfile(source, partial)
    os.replace(partial, target)


def ollama_models_router(models: ModelRouter, loader: EngineLoader | None, settings: ServerSettings) -> APIRouter:
    routes = OllamaModels(models, loader, settings)
    router = APIRouter(tags=["Ollama"], route_class=WellFormedRoute)
    # Ollama's command-line client and apps check the server is up with HEAD / (its Heartbeat) or GET /.
    router.add_api_route("/", routes.running, methods=["GET", "HEAD"], response_class=PlainTextResponse,
                         summary="Ollama's liveness check: `Ollama is running`")
    router.add_api_route("/api/tags", routes.tags, methods=["GET", "HEAD"], response_model=ModelList,
                         responses=ollama_error_responses(401), summary="the models this server has")
    router.add_api_route("/api/show", routes.show, methods=["POST"], response_model=ShowResponse,
                         responses=ollama_error_responses(400, 401, 404, 413), summary="a model's details")
    router.add_api_route("/api/ps", routes.ps, methods=["GET"], response_model=RunningModels,
                         responses=ollama_error_responses(401), summary="the models loaded")
    router.add_api_route("/api/pull", routes.pull, methods=["POST"], response_model=Progress,
                         responses={**ollama_error_responses(400, 401, 403, 404, 413, 500), **NDJSON_STREAM},
                         summary="fetch a GGUF model from the Hugging Face hub")
    router.add_api_route("/api/create", routes.create, methods=["POST"], response_model=Progress,
                         responses={**ollama_error_responses(400, 401, 403, 404, 413), **NDJSON_STREAM},
                         summary="a model made from another, with its own system prompt, messages and parameters")
    router.add_api_route("/api/blobs/{digest}", routes.blob_exists, methods=["HEAD"], response_class=Response,
                         responses={200: {"description": "Uploaded"}, 404: {"description": "Not uploaded"},
                                    **ollama_error_responses(400, 401)},
                         summary="whether a model file was uploaded")
    router.add_api_route("/api/blobs/{digest}", routes.upload_blob, methods=["POST"], response_class=Response,
                         responses={201: {"description": "Uploaded"}, **ollama_error_responses(400, 401, 403, 413)},
                         summary="upload a GGUF file for /api/create's `files` (its sha256 as DIGEST)")
    router.add_api_route("/api/delete", routes.delete, methods=["DELETE"], response_class=Response,
                         responses={200: {"description": "Deleted"}, **ollama_error_responses(400, 401, 403, 404, 413, 503)},
                         summary="delete a model")
    router.add_api_route("/api/copy", routes.copy, methods=["POST"], response_class=Response,
                         responses={200: {"description": "Copied"}, **ollama_error_responses(400, 401, 403, 404, 413)},
                         summary="give a GGUF model a second name")
    router.add_api_route("/api/version", routes.version, methods=["GET", "HEAD"], response_model=Version,
                         responses=ollama_error_responses(401), summary="the Ollama API version followed")
    return router
