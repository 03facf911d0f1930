"""Before an Engine: find the model, plan how to run it on this machine, open its backend.

`start_loading` opens the backend on a thread of its own: llama.cpp holds no GIL while it reads the
weights and makes the context, so what the caller imports meanwhile costs little (the chat app imports
Textual beside it, the server its web stack, `localchat run` the chat engine). This module imports
nothing of the chat engine, and planning a GGUF model and starting its load import no numpy: the
llama.cpp backend's module (numpy, the samplers) is imported beside the load too, and the backend made
on the model loaded (llamacpp_natives.open_model). llama.cpp's log stays in C (localchat/backends/_llama_log.c):
through a Python callback, each of its 1,200 lines to load the default model took the GIL, and a load beside a
thread running Python took 2.0-3.3 s rather than 0.21 (AMD EPYC, 2 cores). Its progress, where a listener
asks for it, still reaches Python a tensor at a time (273 calls for the default model: 0.38 s rather than 0.21
there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from localchat.backends.base import Backend, SamplerSettings
from localchat.background import started
from localchat.errors import ModelError
from localchat.hardware import Hardware, detect_hardware
from localchat.models import ModelRef, inspect_gguf, resolve_model
from localchat.native import require_llama_cpp
from localchat.onnx_format import read_metadata
from localchat.planner import BuildFeatures, ModelFacts, Plan, PlanRequest, plan_offload
from localchat.sampling_defaults import sampler_defaults
from localchat.settings import Settings


@dataclass(frozen=True)
class ModelPlan:
    """What `localchat info` shows: the model, the machine, the build and the plan."""

    model: ModelRef
    facts: ModelFacts
    hardware: Hardware
    build: BuildFeatures
    plan: Plan


class ProgressRelay:
    """A load's progress for a listener that may come later (the chat app, started while the model
    loads): the latest fraction is handed to the listener when it is attached."""

    def __init__(self, listener: Callable[[float], object] | None = None) -> None:
        self._listener = listener
        self._latest = 0.0

    def __call__(self, fraction: float) -> None:
        self._latest = fraction
        if (listener := self._listener) is not None:
            listener(fraction)

    def attach(self, listener: Callable[[float], object]) -> None:
        self._listener = listener
        listener(self._latest)


class ModelLoading:
    """A model planned, its backend opening on a thread (see `start_loading`). As a context manager, it
    closes the backend on leaving unless it was taken: a caller that stops early (an error, Ctrl-C)
    waits for the load rather than exiting while llama.cpp still runs in it."""

    def __init__(self, model_plan: ModelPlan, settings: Settings, request: PlanRequest, opener: Opener) -> None:
        self.model_plan = model_plan
        self.settings = settings
        self.request = request
        self._opener = opener
        self._opening = started(opener.load, "localchat-model-load")
        self._lock = threading.Lock()
        self._state = "loading"  # then "taken" by `backend` or "closed" by `close`, whichever comes first

    def backend(self) -> Backend:
        """The backend once it is open, which the caller then owns; the load's error if it failed."""
        finish = self._opener.finisher()  # its imports, while the load goes on
        loaded = self._opening.result()
        with self._lock:
            if self._state == "taken":
                raise RuntimeError("this load's backend was taken already")
            if self._state == "closed":
                raise ModelError(f"the load of {self.model_plan.model.name} was given up")
            self._state = "taken"
        return finish(loaded)

    def close(self) -> None:
        """Wait for the load and close its backend, unless it was taken."""
        with self._lock:
            if self._state != "loading":
                return
            self._state = "closed"
        try:
            loaded = self._opening.result()
        except Exception:  # the load failed: it freed what it had opened
            return
        loaded.close()

    def __enter__(self) -> ModelLoading:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _build_features(model_format: str) -> BuildFeatures:
    if model_format == "gguf":
        require_llama_cpp()
        from localchat.backends.llamacpp_natives import build_features

        return build_features()
    if model_format == "onnx":
        from localchat.backends.onnx import build_features as onnx_build_features

        return onnx_build_features()
    raise ModelError(f"localchat cannot run {model_format} models; give a .gguf file or an ONNX model folder")


def _model_facts(model: ModelRef) -> ModelFacts:
    if model.format == "gguf":
        return inspect_gguf(model.path)[1]
    if model.format == "onnx":
        from localchat.backends.onnx import onnx_facts
        from localchat.templates import chat_overhead_bytes

        meta = read_metadata(model.path)
        return replace(onnx_facts(model.path), chat_overhead_bytes=chat_overhead_bytes(meta.chat_template, meta.architecture))
    raise ModelError(f"localchat cannot run {model.format} models; give a .gguf file or an ONNX model folder")


def plan_model(model: str | None, settings: Settings, request: PlanRequest = PlanRequest(),
               hardware: Hardware | None = None) -> ModelPlan:
    """Find the model and decide how to run it, without loading it; on `hardware` as given (a
    server plans every model on the machine as it was before the first loaded), else as it is now."""
    ref = resolve_model(model, settings)
    facts = _model_facts(ref)
    preset = ref.preset
    if preset is not None and preset.context is not None and request.n_ctx is None:
        request = replace(request, n_ctx=preset.context)  # a preset's context, where --ctx gives none
    if preset is not None and request.one_reply is not None:
        # Its text, and a template's own text around each of its messages, in the one reply's context; its reply
        # limit where the command gives none.
        one_reply = request.one_reply
        more = preset.text_bytes + len(preset.messages) * facts.chat_overhead_bytes
        limit = one_reply.max_tokens if one_reply.max_tokens is not None else preset.max_tokens
        request = replace(request, one_reply=replace(one_reply, text_bytes=one_reply.text_bytes + more, max_tokens=limit))
    hardware = hardware or detect_hardware()
    build = _build_features(ref.format)
    return ModelPlan(ref, facts, hardware, build, plan_offload(facts, hardware, build, request))


class Loaded(Protocol):
    """What a load's thread made: a backend, or what one is made on. Closed if no one takes it."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Opener:
    """How a plan's backend opens: `load` (the long part, on the load's thread, which imports nothing: two
    threads importing at once can see each other's modules half made), then what `finisher` returns, on
    the caller's thread with what `load` made. `finisher` imports what that needs: called before waiting
    for the load, its imports go on beside it."""

    load: Callable[[], Loaded]
    finisher: Callable[[], Callable[[Any], Backend]]


def _opener(model_plan: ModelPlan, on_progress: Callable[[float], None] | None, *, replies: bool = True) -> Opener:
    """`replies`: the backend samples replies (a draft model's drafts are its argmax), so the load begins
    what its default sampler takes long to make."""
    path, load = model_plan.model.path, model_plan.plan.load_params
    if model_plan.plan.backend == "onnxruntime":
        from localchat.backends.onnx import OnnxBackend

        return Opener(lambda: OnnxBackend(path, load, on_progress=on_progress), lambda: lambda backend: backend)
    require_llama_cpp()
    from localchat.backends.llamacpp_natives import open_model

    first_sampler = _first_sampler if replies else None
    return Opener(lambda: open_model(path, load, on_progress, first_sampler), _llamacpp_backend)


def _first_sampler(metadata: Mapping[str, str]) -> SamplerSettings:
    """The sampler a model's first replies use (Engine.sampler_defaults), for its load to begin its DRY."""
    return sampler_defaults(metadata).settings


def _llamacpp_backend() -> Callable[[Any], Backend]:
    from localchat.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend


def open_backend(model_plan: ModelPlan, on_progress: Callable[[float], None] | None = None, *,
                 replies: bool = True) -> Backend:
    """The plan's backend, opened on this thread (`replies`: see `_opener`)."""
    opener = _opener(model_plan, on_progress, replies=replies)
    finish = opener.finisher()
    return finish(opener.load())  # a backend that cannot be made frees what it was given


def start_loading(model: str | None, settings: Settings, request: PlanRequest = PlanRequest(), *,
                  on_progress: Callable[[float], None] | None = None) -> ModelLoading:
    """`model` planned here (a model that cannot be found or run is refused now), its backend
    opening on a thread of its own (its progress to `on_progress`, which a `ProgressRelay` can hand
    to a listener that comes later); `Engine.load` takes it from there."""
    model_plan = plan_model(model, settings, request)
    return ModelLoading(model_plan, settings, request, _opener(model_plan, on_progress))
