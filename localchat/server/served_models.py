"""The models a server can answer with: what `localchat list` shows, each loaded into its own engine
and scheduler when a request names it (the model pool decides when; this module does the loading)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localchat import hub
from localchat.engine import Engine
from localchat.hardware import Hardware
from localchat.model_loading import ModelPlan, plan_model
from localchat.model_pool import MemoryBudget, MemoryNeed, memory_need
from localchat.models import installed_model_names, model_file_stamp
from localchat.planner import PlanRequest
from localchat.scheduler import Scheduler
from localchat.server.chat import ModelChat
from localchat.settings import Settings


@dataclass(frozen=True)
class CatalogModel:
    """A model a request may name: its id (the name `localchat list` shows) and where it is."""

    id: str
    path: Path

    @property
    def created(self) -> int:
        """When its file was made; for a packaged model not made yet (Gemma is made on first use), the
        time its file will have (0 if that is unknown)."""
        stamp = model_file_stamp(self.path)
        return int(stamp.mtime) if stamp is not None else 0


@dataclass(eq=False)
class ServedModel:
    """A loaded model with its own scheduler thread."""

    id: str
    engine: Engine
    scheduler: Scheduler
    chat: ModelChat
    created: int

    @classmethod
    def of(cls, model_id: str, engine: Engine, queue_size: int) -> ServedModel:
        """Its scheduler is made here and started by `start()`."""
        chat = ModelChat.of(engine.backend, engine.template)
        created = int(engine.model_plan.model.path.stat().st_mtime)
        return cls(model_id, engine, Scheduler(engine, max_waiting=queue_size), chat, created)

    @property
    def aliases(self) -> frozenset[str]:
        """Names a request may give for it besides its id: its file's name and stem (not for a preset, whose file
        is its model's)."""
        ref = self.engine.model_plan.model
        if ref.preset is not None:
            return frozenset({self.id, ref.name})
        return frozenset({self.id, ref.name, ref.path.name, ref.path.stem})

    def start(self) -> ServedModel:
        self.scheduler.start()
        return self

    def close(self) -> None:
        """Replies in flight end as cancelled; then the model is freed (its prefix cache saved)."""
        self.scheduler.close()
        self.engine.close()


class EngineLoader:
    """Finds, plans and loads the models of this machine for the pool. Every model is planned on the
    machine as it was before the first one loaded: the pool adds their needs up against that."""

    def __init__(self, settings: Settings, request: PlanRequest, hardware: Hardware, *, queue_size: int,
                 allow_pull: bool = False) -> None:
        self.settings = settings
        self.request = request
        self.hardware = hardware
        self.queue_size = queue_size
        self.allow_pull = allow_pull
        # What plan_model takes for a model outside the catalog (started with -m PATH): its path.
        self._sources: dict[str, str] = {}
        self._plans: dict[str, ModelPlan] = {}

    @property
    def budget(self) -> MemoryBudget:
        return MemoryBudget.of(self.hardware)

    def first(self, engine: Engine) -> tuple[str, MemoryNeed]:
        """The id of the model the server started with (its catalog name when it is there) and its
        need; it is warmed up as the models loaded later are."""
        _warm_up(engine)
        model = engine.model_plan.model
        path = model.path.resolve()
        # A preset (`serve -m PRESET`) is its own name: its model's name asks for the model without it.
        model_id = model.name if model.preset is not None else next(
            (m.id for m in self.catalog() if m.path.resolve() == path), model.name)
        self._sources[model_id] = model.name if model.preset is not None else str(path)
        return model_id, memory_need(engine.model_plan.facts, engine.plan)

    def catalog(self) -> list[CatalogModel]:
        """The models `localchat list` shows: the models folder and the Hugging Face cache."""
        return [CatalogModel(name, path) for name, path in installed_model_names(self.settings)]

    def model_id(self, requested: str) -> str | None:
        """The id of the model `requested` names: an id, a file's name or stem (in any case), or a hub name already
        in the Hugging Face cache (pulled first only with allow_pull); None when there is none."""
        if requested in self._sources:
            return requested
        catalog = self.catalog()
        for model in catalog:
            if requested == model.id:
                return model.id
        for model in catalog:
            if requested in (model.path.name, model.path.stem):
                return model.id
        wanted = requested.casefold()
        for model in catalog:
            if wanted in (model.id.casefold(), model.path.name.casefold(), model.path.stem.casefold()):
                return model.id
        name = hub.HubModelName.parse(requested)
        if name is None:
            return None
        cached = hub.find_cached(name, self.settings)
        if cached is not None:
            return cached.name
        if self.allow_pull and not self.settings.hf_offline:
            return hub.pull(name, self.settings).model.name
        return None

    # -- the pool's loader ------------------------------------------------------------

    def estimate(self, name: str) -> MemoryNeed:
        model_plan = plan_model(self._sources.get(name, name), self.settings, self.request, self.hardware)
        self._plans[name] = model_plan
        return memory_need(model_plan.facts, model_plan.plan)

    def load(self, name: str) -> ServedModel:
        model_plan = self._plans.pop(name, None)
        if model_plan is None:
            model_plan = plan_model(self._sources.get(name, name), self.settings, self.request, self.hardware)
        engine = Engine.from_plan(model_plan, self.settings)
        try:
            _warm_up(engine)
            return ServedModel.of(name, engine, self.queue_size).start()
        except Exception:
            engine.close()
            raise

    def unload(self, model: ServedModel) -> None:
        model.close()



def _warm_up(engine: Engine) -> None:
    """One token through the model and out of its KV cache, as llama.cpp's loaders do: the first
    decode sets up what the backend reuses (measured here: ~2 s of a fresh model's first reply on a
    busy 2-core machine), so the load pays for it rather than the first request."""
    backend = engine.backend
    backend.evaluate(0, [backend.info.bos_id if backend.info.bos_id is not None else 0], 0)
    backend.truncate(0, 0)
