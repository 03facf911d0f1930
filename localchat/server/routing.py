"""Which model answers a request and how a completion is queued for it: what the endpoints of both
APIs share (app.py's OpenAI routes, ollama.py's, embeddings.py's).

A request names a model (or none: the server's first); the router finds it, has the model pool load
it if need be, and holds a lease on it until the response has been sent (app.py's LeaseRelease). A
CompletionService turns a request's fields into generation settings over the model's defaults and
queues its replies (OpenAI's n choices for each prompt) on the model's scheduler.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from localchat.adapters import requested_scales
from localchat.chat import tokenize_continuation, tokenize_prompt
from localchat.constraints import tokenizer_for
from localchat.errors import InvalidSettingError, LocalchatError, ModelError
from localchat.infill import (
    RepositoryContext,
    RepositoryFile,
    infill_prompt,
    repository_room,
)
from localchat.model_pool import ModelBusyError, ModelPool, ModelState
from localchat.models import find_preset
from localchat.presets import ModelPreset, is_preset_file, preset_runs
from localchat.scheduler import TextDelta
from localchat.server.chat import ChatPlan, ChatReplyReader, plan_chat
from localchat.server.errors import APIError
from localchat.server.metrics import ServerMetrics
from localchat.server.replies import PendingReplies
from localchat.server.schemas import (
    SAMPLER_FIELDS,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    ModelCard,
    SamplingFields,
    unsupported_field,
)
from localchat.server.served_models import CatalogModel, EngineLoader, ServedModel
from localchat.server.settings import ServerSettings
from localchat.session import GenerationSettings

# Where a request's scope keeps the leases it took (released by app.py's LeaseRelease).
LEASES = "localchat_model_leases"
# Ollama writes a model without a tag as NAME:latest; localchat's names have no such tag.
LATEST = ":latest"


def names_wanted(requested: str) -> set[str]:
    """The names, casefolded, that `requested` matches: itself and, for Ollama's NAME:latest, NAME."""
    return {requested.casefold(), requested.removesuffix(LATEST).casefold()}


@dataclass(frozen=True)
class ChosenModel:
    """The model that answers a request: the pool's name for it, and the preset of it the request named (None: the
    model answers as itself)."""

    id: str
    preset: ModelPreset | None = None


@dataclass(frozen=True)
class LeasedModel:
    """A loaded model held for a request (until its response has been sent), and the preset it answers as."""

    served: ServedModel
    preset: ModelPreset | None = None


class ModelRouter:
    """Which model answers a request: the one it names, loaded first if need be, else the server's
    first model. The lease on it lasts until the response has been sent (see LeaseRelease)."""

    def __init__(self, first: ServedModel, pool: ModelPool[ServedModel], loader: EngineLoader | None,
                 settings: ServerSettings, metrics: ServerMetrics) -> None:
        self.first = first
        self.pool = pool
        self.loader = loader
        self.settings = settings
        self.metrics = metrics

    async def service_for(self, request: Request, body: SamplingFields, endpoint: str) -> CompletionService:
        """Checks the request's fields, then leases the model it names."""
        refused = unsupported_field(endpoint, body.model_extra)
        if refused is not None:
            raise APIError(400, refused[1], code="unsupported_parameter", param=refused[0])
        return self.service(await self.lease(request, body.model))

    def service(self, leased: LeasedModel) -> CompletionService:
        """The leased model answering as its preset (a preset of its model, named by the request), or as itself."""
        return CompletionService(leased.served, self.settings, self.metrics, leased.preset)

    async def _preset(self, requested: str | None) -> ModelPreset | None:
        """The preset `requested` names whose model is a local model by name: requests for it are answered by
        that model's engine, shared with the model itself and its other presets (a preset of a file by its path
        is loaded as a model of its own, whose engine applies it)."""
        if not requested or self.loader is None:
            return None
        try:
            preset = await run_in_threadpool(find_preset, names_wanted(requested), self.loader.settings)
        except ModelError as error:
            raise APIError(400, str(error), param="model") from None
        return preset if preset is not None and not Path(preset.model).is_absolute() else None

    async def lease(self, request: Request, requested: str | None) -> LeasedModel:
        """The model `requested` names (None: the first), loaded if need be and held until the
        response has been sent."""
        chosen = await self.choose(requested)
        try:
            lease = await self.pool.acquire(chosen.id)
        except ModelBusyError:
            raise
        except Exception as error:
            raise APIError(500, f"the model '{chosen.id}' could not be loaded: {error}", code="model_load_failed",
                           param="model") from error
        request.scope["state"][LEASES].append(lease)
        return LeasedModel(lease.model, chosen.preset)

    async def choose(self, requested: str | None) -> ChosenModel:
        """The model `requested` names (in any case; Ollama's NAME:latest names NAME too), a preset's by its model's
        name; APIError 404 when there is none."""
        if not requested:
            return ChosenModel(self.first.id)
        preset = await self._preset(requested)
        return ChosenModel(await self._model_id(preset.model if preset is not None else requested), preset)

    async def _model_id(self, requested: str) -> str:
        """The pool's name for the model `requested` names (a model's, not a preset's of a model by name)."""
        served = self._loaded(requested)
        if served is not None:
            return served.id
        hint = ""
        if self.loader is not None:
            try:
                found = await run_in_threadpool(self.loader.model_id, requested)
                if found is None and requested.endswith(LATEST):
                    found = await run_in_threadpool(self.loader.model_id, requested.removesuffix(LATEST))
            except LocalchatError as error:
                raise APIError(404, f"{error}; GET /v1/models lists the models this server has", code="model_not_found",
                               param="model") from None
            if found is not None:
                return found
            if not self.loader.allow_pull:
                hint = " (a Hugging Face model not in its cache is fetched on request only with `localchat serve --allow-pull`)"
        raise APIError(404, f"The model '{requested}' does not exist on this server: GET /v1/models lists the models "
                            f"it has, `localchat list` on its machine too{hint}", code="model_not_found", param="model")

    def _loaded(self, requested: str) -> ServedModel | None:
        """The loaded model `requested` names (in any case; NAME:latest names NAME too), if one is."""
        wanted = names_wanted(requested)
        return next((served for served in [self.first, *self.pool.loaded().values()]
                     if any(alias.casefold() in wanted for alias in served.aliases)), None)

    async def cards(self, catalog: Sequence[CatalogModel]) -> list[ModelCard]:
        """Every model a request may name, with its status (a preset of a model by name: its model's, whose engine
        answers it): those outside the catalog (a path the server started with) first, then the catalog's order."""
        runs = await run_in_threadpool(lambda: {model.id: preset_runs(model.path) for model in catalog if is_preset_file(model.path)})
        states = self.pool.states()

        def status(model_id: str) -> ModelState | Literal["unloaded"]:
            runs_model = runs.get(model_id)  # a preset's model; one by its path is loaded as a model of its own
            if model_id not in states and runs_model is not None and not Path(runs_model).is_absolute():
                served = self._loaded(runs_model)
                model_id = served.id if served is not None else runs_model
            return states.get(model_id, "unloaded")

        listed = {model.id for model in catalog}
        outside = {served.id: served for served in [self.first, *self.pool.loaded().values()] if served.id not in listed}
        return [ModelCard(id=model.id, created=model.created, status=status(model.id)) for model in [*outside.values(), *catalog]]


class CompletionService:
    """What the completion endpoints share for one loaded model: queueing a request, relaying the reply."""

    def __init__(self, served: ServedModel, settings: ServerSettings, metrics: ServerMetrics,
                 preset: ModelPreset | None = None) -> None:
        """`preset`: one the request named, of the served model (the engine's own preset, if it was loaded as
        one, is in its defaults already)."""
        self.engine = served.engine
        self.scheduler = served.scheduler
        self.settings = settings
        self.metrics = metrics
        self.model_id = preset.name if preset is not None else served.id
        self.chat = served.chat
        self.preset = preset or served.engine.preset
        self.sampler_defaults = preset.sampler(self.engine.sampler_defaults) if preset is not None else self.engine.sampler_defaults

    def generation_settings(self, body: SamplingFields, reply_limit: int | None,
                            shown_tokens: frozenset[int] = frozenset(), logprobs: int | None = None) -> GenerationSettings:
        limit = self.settings.max_reply_tokens
        if reply_limit is not None and limit is not None and reply_limit > limit:
            field = body.reply_limit_field
            raise APIError(400, f"{field} is {reply_limit} but this server allows at most {limit}", param=field)
        # The fields the request sets over the preset's and the model's defaults (localchat.sampling_defaults); those
        # it leaves out (or sends as null) are the defaults', and a seed it sets to none (-1) is a random one.
        given = {sampler_field: getattr(body, field) for field, sampler_field in SAMPLER_FIELDS.items()
                 if field in body.model_fields_set}
        sampler = dataclasses.replace(self.sampler_defaults.settings, logit_bias=body.token_biases, **given)
        try:
            sampler.check_vocabulary(self.engine.backend.info.n_vocab)
        except InvalidSettingError as error:
            raise APIError(400, str(error), param="logit_bias") from None
        loras = None if body.lora is None else requested_scales(self.engine.loras, ((a.id, a.scale) for a in body.lora))
        preset = self.preset  # its reply limit and stop strings where the request sets none
        if preset is not None and not body.reply_limit_set and preset.max_tokens is not None:
            reply_limit = min(preset.max_tokens, limit) if limit is not None else preset.max_tokens
        stop = body.stop_strings or (preset.stop if preset is not None else ())
        return GenerationSettings(max_tokens=reply_limit or limit, stop=stop, sampler=sampler,
                                  ignore_eos=body.ignore_eos, shown_tokens=shown_tokens, logprobs=logprobs,
                                  lookup_draft=self.settings.lookup_draft, loras=loras)

    async def chat_prompt(self, body: ChatCompletionRequest, *, fit_context: bool = False,
                          before: Sequence[int] = ()) -> tuple[ChatPlan, list[int]]:
        """How the request is answered, and the prompt's tokens (a forced call's opening included).
        `fit_context` (Ollama's way): a history too long for the context, with room for the reply as
        localchat.chat.Chat leaves it, loses its oldest turns (never a system message nor the last
        message); else it is refused whole (OpenAI's and llama-server's). `before`: tokens the prompt
        goes on from (Ollama's context: an earlier exchange's)."""
        n_ctx = self.engine.backend.n_ctx
        reply_room = min(body.reply_limit or n_ctx // 4, n_ctx // 2)

        # A preset's opening goes before the first exchange only: Ollama's context holds it already.
        opening = self.preset.opening if self.preset is not None and not before else list

        def prepare() -> tuple[ChatPlan, list[int]]:
            kept = body
            while True:
                plan = plan_chat(kept, self.chat, default_thinking=self.settings.enable_thinking, opening=opening)
                text = plan.prompt + plan.forced
                tokens = ([*before, *tokenize_continuation(self.engine.backend, self.engine.template, text)] if before
                          else tokenize_prompt(self.engine.backend, self.engine.template, text))
                shorter = _without_oldest_turn(kept.messages) if fit_context and len(tokens) + reply_room > n_ctx else None
                if shorter is None:
                    return plan, tokens
                kept = kept.model_copy(update={"messages": shorter})

        # Rendering and tokenizing take a while for long histories: off the event loop. Tokenizing
        # reads only the vocabulary, so it may run beside the scheduler's steps.
        return await run_in_threadpool(prepare)

    async def start_chat(self, body: ChatCompletionRequest, stop: tuple[str, ...] | None = None, *,
                         fit_context: bool = False, before: Sequence[int] = ()) -> ChatRun:
        """Plans, tokenizes and queues the `n` replies to `body` (`stop`: stop strings beyond OpenAI's
        four, from another API's request; else the body's; `fit_context`, `before`: see chat_prompt)."""
        generation = self.generation_settings(body, body.reply_limit, self.chat.shown_tokens, body.logprobs_wanted)
        if stop is not None:
            generation = replace(generation, stop=stop)
        plan, prompt = await self.chat_prompt(body, fit_context=fit_context, before=before)
        if plan.read_calls and plan.constraint is None:  # a grammar-held reply matches no stop string
            generation = replace(generation, stop_scope=plan.stop_scope)
        constraint = plan.constraint or (body.response_format.constraint() if body.response_format is not None else None)
        if constraint is not None:
            generation = replace(generation, constraint=constraint)
            # The vocabulary is read into llguidance once (seconds for a large one): off the event loop.
            await run_in_threadpool(tokenizer_for, self.engine.backend)
        replies = self.submit([(prompt, settings) for settings in choice_settings(generation, body.n)])
        return ChatRun(plan, [ChatReplyReader(plan) for _ in range(body.n)], replies, generation, prompt)

    async def text_prompts(self, prompts: Sequence[str | list[int]]) -> list[list[int]]:
        """The tokens of each prompt, given as text or as token ids."""
        backend = self.engine.backend
        n_vocab = backend.info.n_vocab
        if any(max(prompt) >= n_vocab for prompt in prompts if isinstance(prompt, list)):
            raise APIError(400, f"token ids must be below the vocabulary size {n_vocab}", param="prompt")

        def tokenize() -> list[list[int]]:
            add_bos = backend.info.add_bos
            return [list(prompt) if isinstance(prompt, list) else backend.tokenize(prompt, add_bos=add_bos, special=True)
                    for prompt in prompts]

        return await run_in_threadpool(tokenize)

    async def infill_prompts(self, prefixes: Sequence[str | list[int]], suffix: str, *, middle: str = "",
                             repository: Sequence[RepositoryFile] | None = None) -> list[list[int]]:
        """The fill-in-the-middle prompt of each prefix (then `middle`) before `suffix` (localchat.infill), with
        llama-server's repository context when given; 400 for a model without FIM tokens or a prefix of token ids."""
        info = self.engine.backend.info
        if info.fim is None:
            raise APIError(400, f"suffix: {self.model_id} has no fill-in-the-middle tokens (a code model such as "
                                f"Qwen2.5-Coder or CodeLlama has them); send the text before the gap alone as the prompt",
                           code="unsupported_parameter", param="suffix")
        texts = [prefix for prefix in prefixes if isinstance(prefix, str)]
        if len(texts) < len(prefixes):
            raise APIError(400, "suffix: fill-in-the-middle takes the prompt as text, not token ids", param="suffix")
        fim, bos, backend = info.fim, info.bos_id if info.add_bos else None, self.engine.backend

        context = None if repository is None else RepositoryContext(
            repository, repository_room(backend.n_ctx, self.settings.max_reply_tokens))

        def tokenize(text: str) -> list[int]:
            return backend.tokenize(text, add_bos=False, special=False)

        return await run_in_threadpool(lambda: [infill_prompt(tokenize, fim, text, suffix, bos, middle=middle,
                                                              repository=context) for text in texts])

    def submit(self, replies: Sequence[tuple[Sequence[int], GenerationSettings]]) -> PendingReplies:
        """Queues `replies` (each one's prompt and settings), all or none."""
        return PendingReplies(self.scheduler, replies, self.metrics.observe_reply)

    async def read_whole(self, replies: PendingReplies, request: Request, read: Callable[[int, TextDelta], None]) -> None:
        """Passes the replies' pieces to `read` with their index until every one ends; a client that
        disconnects meanwhile cancels them."""
        watcher = asyncio.create_task(_cancel_on_disconnect(request, replies))
        try:
            async for index, piece in replies.deltas():
                read(index, piece)
        finally:
            watcher.cancel()


def choice_settings(settings: GenerationSettings, n: int) -> list[GenerationSettings]:
    """The settings of a prompt's `n` choices. With a seed, choice j samples with seed + j, as vLLM seeds them:
    n samples, not n copies of one, and choice 0 is the reply the prompt gets alone with that seed."""
    sampler = settings.sampler
    if sampler is None or sampler.seed is None:
        return [settings] * n
    return [replace(settings, sampler=replace(sampler, seed=(sampler.seed + j) % 2**32)) for j in range(n)]


@dataclass(frozen=True)
class ChatRun:
    """A chat request's replies under way (its n choices, of one prompt): how they were planned, a reader
    for each, the scheduled replies, their settings (choice 0's seed), the prompt's tokens."""

    plan: ChatPlan
    readers: list[ChatReplyReader]
    replies: PendingReplies
    generation: GenerationSettings
    prompt: list[int]

    def read(self, index: int, text: str) -> list[ChatDelta]:
        """Reply `index`'s next text as deltas; once the calls wanted are made the rest is not needed."""
        reader = self.readers[index]
        deltas = reader.feed(text)
        if reader.complete:
            self.replies.cancel(index)
        return deltas


async def _cancel_on_disconnect(request: Request, replies: PendingReplies) -> None:
    # The body has been read, so the next message is the client's disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        continue
    replies.cancel()


def _without_oldest_turn(messages: Sequence[ChatMessage]) -> list[ChatMessage] | None:
    """`messages` without the oldest message but system ones, and the assistant's and tools' messages
    that followed it, so that what is kept starts with a user message as templates want; None when
    only the last message would be left."""
    turns = [index for index, message in enumerate(messages) if message.role not in ("system", "developer")]
    if len(turns) <= 1:
        return None
    dropped = 1
    while dropped < len(turns) - 1 and messages[turns[dropped]].role != "user":
        dropped += 1
    gone = set(turns[:dropped])
    return [message for index, message in enumerate(messages) if index not in gone]
