"""Loading a model (or connecting to a server) in a worker thread, and the messages it posts to the app."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from textual.message import Message

from localchat.adapters import LoraSpec
from localchat.chat_engine import ChatEngine
from localchat.engine import Engine
from localchat.errors import LocalchatError
from localchat.model_loading import ModelLoading
from localchat.planner import PlanRequest
from localchat.remote_endpoint import RemoteEndpoint
from localchat.settings import Settings


@dataclass
class LoadProgress(Message):
    fraction: float


@dataclass
class ModelLoaded(Message):
    engine: ChatEngine
    label: str


@dataclass
class ModelFailed(Message):
    label: str
    error: str


def load_engine(model: str | None | ModelLoading, label: str, settings: Settings, request: PlanRequest, *,
                remote: RemoteEndpoint | None, draft_model: str | None, loras: Sequence[LoraSpec],
                post: Callable[[Message], object]) -> None:
    """The load's worker, in its thread: connects to `remote` when there is one, else loads `model`
    (or finishes the `ModelLoading` started before the app, its `settings` and `request` its own),
    with `draft_model` drafting for it and `loras` applied; posts the progress, then the engine or
    why there is none."""
    engine: ChatEngine
    try:
        if remote is not None:
            from localchat.remote import RemoteServer  # openai's client: imported for a remote only

            engine = RemoteServer(remote)
        else:
            engine = Engine.load(model, settings, request, on_progress=lambda f: post(LoadProgress(f)), draft_model=draft_model,
                                 loras=loras)
    except (LocalchatError, OSError) as error:
        post(ModelFailed(label, str(error)))
        return
    post(ModelLoaded(engine, label))
