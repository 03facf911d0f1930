"""A loaded model ready to chat: model file -> plan -> backend, chat template and prefix cache."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from localchat.adapters import LoadedLora, LoraSpec, default_scales, requested_scales
from localchat.backends.base import Backend
from localchat.chat import Chat
from localchat.chat_engine import LocalChat
from localchat.errors import ModelError
from localchat.model_loading import ModelLoading, ModelPlan, open_backend, plan_model, start_loading
from localchat.models import ModelRef
from localchat.planner import Plan, PlanRequest
from localchat.prefix_cache import PrefixCache
from localchat.sampling_defaults import sampler_defaults
from localchat.session import Session
from localchat.settings import Settings
from localchat.speculative import DraftModel, check_same_vocabulary
from localchat.templates import THINKING_SWITCH, ChatTemplate, Message

logger = logging.getLogger(__name__)


def _model_key(ref: ModelRef) -> str:
    """Identifies the model for saved KV states: path, size and modification time of its file, or
    of every file in an ONNX folder (the folder's own stat misses edits inside it)."""
    files = sorted(p for p in ref.path.iterdir() if p.is_file()) if ref.path.is_dir() else [ref.path]
    identity = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha1(identity.encode()).hexdigest()[:16]


def new_prefix_cache(model_plan: ModelPlan, settings: Settings) -> PrefixCache:
    """The model's prefix cache, with what its disk tier holds from earlier runs."""
    return PrefixCache(_model_key(model_plan.model), settings.prefix_cache_ram_bytes, settings.prefix_cache_dir,
                       settings.prefix_cache_disk_bytes)


class Engine:
    """A model loaded by its plan, with its chat template and prefix cache."""

    def __init__(self, model_plan: ModelPlan, backend: Backend, settings: Settings, prefix_cache: PrefixCache) -> None:
        """`prefix_cache`: the model's (`new_prefix_cache`)."""
        self.model_plan = model_plan
        self.backend = backend
        self.settings = settings
        info = backend.info
        bos = backend.token_text(info.bos_id) if info.bos_id is not None else ""
        eos = backend.token_text(info.eos_id) if info.eos_id is not None else ""
        self.template = ChatTemplate.for_model(info.chat_template, info.architecture, bos_token=bos, eos_token=eos)
        self.prefix_cache = prefix_cache
        # The sampler replies get unless asked otherwise: the model's own defaults, its family's, or llama.cpp's,
        # under a preset's settings when the model is run as one.
        self.preset = model_plan.model.preset
        defaults = sampler_defaults(info.metadata)
        self.sampler_defaults = self.preset.sampler(defaults) if self.preset is not None else defaults
        # One session per KV sequence: a session must know every token its sequence holds.
        self.sessions = tuple(Session(backend, seq=seq, prefix_cache=self.prefix_cache,
                                      sampler_defaults=self.sampler_defaults.settings) for seq in range(backend.n_seq))
        # LoRA adapters loaded on the backend (--lora), by id.
        self.loras: tuple[LoadedLora, ...] = ()
        self._draft_backend: Backend | None = None
        self._closed = False

    @classmethod
    def load(
        cls,
        model: str | None | ModelLoading = None,
        settings: Settings | None = None,
        request: PlanRequest = PlanRequest(),
        *,
        on_progress: Callable[[float], None] | None = None,
        draft_model: str | None = None,
        loras: Sequence[LoraSpec] = (),
    ) -> Engine:
        """`model` planned on this machine (or the `ModelLoading` already under way: `settings`,
        `request` and `on_progress` are then its own), with `draft_model` (if given) drafting for it
        and the LoRA adapters `loras` applied to every reply that does not ask for others."""
        if not isinstance(model, ModelLoading):
            with start_loading(model, settings or Settings(), request, on_progress=on_progress) as loading:
                return cls.load(loading, draft_model=draft_model, loras=loras)
        # The disk tier's index is read while the model loads (20 ms for 600 entries of the chat model).
        prefix_cache = new_prefix_cache(model.model_plan, model.settings)
        engine = cls._owning(model.model_plan, model.backend(), model.settings, prefix_cache)
        try:
            engine.add_loras(loras)
        except BaseException:
            engine.close()
            raise
        if draft_model is not None:
            try:
                engine.add_draft_model(draft_model, model.request)
            except ModelError as error:
                engine.close()
                raise ModelError(f"draft model: {error}") from None
            except BaseException:
                engine.close()
                raise
        return engine

    @classmethod
    def from_plan(cls, model_plan: ModelPlan, settings: Settings, *,
                  on_progress: Callable[[float], None] | None = None) -> Engine:
        return cls._owning(model_plan, open_backend(model_plan, on_progress), settings, new_prefix_cache(model_plan, settings))

    @classmethod
    def _owning(cls, model_plan: ModelPlan, backend: Backend, settings: Settings, prefix_cache: PrefixCache) -> Engine:
        """An engine on `backend`, which it owns from then on: closed here if the engine cannot be made."""
        try:
            return cls(model_plan, backend, settings, prefix_cache)
        except BaseException:
            backend.close()
            raise

    def add_draft_model(self, model: str, request: PlanRequest) -> None:
        """Speculative decoding by `model` (sharing this model's vocabulary) for every session, one
        KV sequence of its own each; planned on the machine with this model loaded."""
        # Drafting takes back the drafted tokens past the first the target refuses, which neither model can
        # do with a recurrent state (Backend.rewinds).
        if not self.backend.rewinds:
            raise ModelError(f"{self.model_plan.model.path.name} keeps a recurrent state, which cannot take back "
                             "drafted tokens; run it without a draft model")
        draft = open_backend(plan_model(model, self.settings, request), replies=False)
        try:
            check_same_vocabulary(self.backend, draft)
            if not draft.rewinds:
                raise ModelError(f"{model} keeps a recurrent state, which cannot take back the tokens it drafts; "
                                 "choose a draft model without one")
        except ModelError:
            draft.close()
            raise
        if self._draft_backend is not None:
            self._draft_backend.close()
        self._draft_backend = draft
        for session in self.sessions:
            session.draft_model = DraftModel(draft, session.seq)

    def add_loras(self, specs: Sequence[LoraSpec]) -> None:
        """Load adapters on the backend; each applies at its scale unless a reply asks otherwise."""
        for spec in specs:
            self.loras += (LoadedLora(self.backend.load_lora(spec.path), spec.path, spec.scale),)
        self.set_lora_scales({lora.id: lora.scale for lora in self.loras})

    def set_lora_scales(self, scales: dict[int, float]) -> None:
        """New default scales for the loaded adapters (llama-server's POST /lora-adapters): those
        given change, the others keep theirs. Replies started later use them."""
        requested_scales(self.loras, scales.items())  # an unknown id or a bad scale is refused whole
        self.loras = tuple(replace(lora, scale=float(scales.get(lora.id, lora.scale))) for lora in self.loras)
        for session in self.sessions:
            session.default_loras = default_scales(self.loras)

    @property
    def plan(self) -> Plan:
        return self.model_plan.plan

    def new_chat(self, system_prompt: str | None = None, *, seq: int = 0) -> Chat:
        """A conversation on sequence `seq`; chats on one sequence take turns with its KV cache."""
        messages = [Message("system", system_prompt)] if system_prompt else []
        return Chat(self.sessions[seq], self.template, self.opening(messages))

    def opening(self, messages: list[Message]) -> list[Message]:
        """`messages`, a chat's own, with what a preset starts every chat with (its system prompt, its messages)."""
        return self.preset.opening(messages) if self.preset is not None else messages

    # The chat interface (localchat.chat_engine.ChatEngine) that front ends use.

    @property
    def model_name(self) -> str:
        return self.model_plan.model.name

    @property
    def backend_label(self) -> str:
        return self.backend.name

    @property
    def context_size(self) -> int:
        return self.backend.n_ctx

    @property
    def uses_gpu(self) -> bool:
        return self.plan.uses_gpu

    @property
    def can_switch_thinking(self) -> bool:
        return bool(self.template.thinking_switches)

    thinking_switch_checked = True  # in the template it renders

    def open_chat(self, messages: list[Message], *, thinking: bool = True) -> LocalChat:
        """A conversation from `messages` on the first sequence (the prefix cache makes returning
        to an earlier one cheap)."""
        # Both ways: a template whose thinking is off unless asked (Granite 3.3's) is asked.
        return LocalChat(self.sessions[0], self.template, self.opening(messages), template_kwargs={THINKING_SWITCH: thinking},
                         preset=self.preset)

    def token_count(self, text: str) -> int:
        return len(self.backend.tokenize(text, add_bos=False, special=False))

    def close(self, *, process_ends: bool = False) -> None:
        """Free the model (or leave it to the process's end: `Backend.close`). What the sessions hold goes
        to the prefix cache first, and the cache to its disk tier, so that continuing a conversation after
        a restart skips its prompt."""
        if self._closed:
            return
        self._closed = True
        try:
            for session in self.sessions:
                session.save_live_state()
            self.prefix_cache.persist()
        except Exception as error:  # a lost speed-up must not stop the model being freed
            logger.warning("the prefix cache could not be saved at exit: %s", error)
        finally:
            self.backend.close(process_ends=process_ends)
            if self._draft_backend is not None:
                self._draft_backend.close(process_ends=process_ends)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
