"""OpenAI's and Ollama's HTTP APIs over an engine: `create_app(engine, settings, loader)`.

Endpoints: /v1/chat/completions and /v1/completions (streamed as server-sent events or whole),
/v1/models, /health, /metrics here; /v1/responses, Anthropic's /v1/messages, /v1/embeddings, Ollama's /api/... and
llama-server's /infill, /tokenize and /detokenize in responses.py, anthropic_messages.py, embeddings.py, ollama.py,
ollama_models.py and llama_server_api.py, on the same model router (routing.py). Replies come from a
Scheduler that decodes the engine's slots together; the handlers only translate between HTTP and
it. With a loader, a request may name any model of this machine: the model pool
(localchat/model_pool.py) loads it beside the others or in place of an idle one, and each loaded
model has its own engine and scheduler.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from localchat.backends.base import TokenLogprob
from localchat.engine import Engine
from localchat.errors import ContextOverflowError, InvalidSettingError, UnsupportedError
from localchat.interrupts import sigterm_interrupts
from localchat.model_pool import Lease, MemoryBudget, MemoryNeed, ModelBusyError, ModelPool, PoolEvent
from localchat.scheduler import QueueFullError, ReplyDone, TextDelta
from localchat.server.anthropic_messages import messages_router
from localchat.server.chat import text_finish_reason
from localchat.server.embeddings import embedding_router
from localchat.server.errors import APIError, error_response, validation_message
from localchat.server.json_bodies import BodiesAsJson, WellFormedRoute
from localchat.server.llama_server_api import llama_server_router
from localchat.server.logprobs import chat_logprobs, completion_logprobs, token_piece
from localchat.server.metrics import CONTENT_TYPE, RequestCounter, ServerMetrics
from localchat.server.ollama import ollama_router
from localchat.server.ollama_models import ollama_models_router
from localchat.server.replies import PendingReplies, ReplyFailedError
from localchat.server.responses import responses_router
from localchat.server.routing import LEASES, ModelRouter, choice_settings, names_wanted
from localchat.server.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    ErrorResponse,
    FinishReason,
    Health,
    LoraAdapterCard,
    LoraApplied,
    LoraScale,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
    error_responses,
)
from localchat.server.security import ApiKeyGuard, BodySizeLimit, OriginGuard, allowed_origins
from localchat.server.served_models import EngineLoader, ServedModel
from localchat.server.settings import ServerSettings
from localchat.server.spliced_json import CONTENT_MARK, SplicedJson
from localchat.session import GenerationStats
from localchat.templates import TemplateError

ERROR_RESPONSES = error_responses(
    "Invalid request: malformed JSON, wrong types, a prompt longer than the context",
    "Every slot is busy and the queue is full, or the model named needs the room of models that are busy; retry after "
    "Retry-After seconds",
)
# One line per model load and unload, with why (`localchat serve` shows this logger's INFO lines).
logger = logging.getLogger(__name__)
# With "stream": true the answer is server-sent events (the schema describes one event): each
# `data` is a JSON chunk, then `[DONE]`.
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
EVENT_STREAM = {200: {"content": {"text/event-stream": {"schema": SSE_EVENT}}}}


def _sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


def _content_alone(delta: ChatDelta) -> str | None:
    """The delta's content, if it carries that alone (most chunks of a stream)."""
    return delta.content if delta.role is None and delta.reasoning_content is None and delta.tool_calls is None else None


def _usage(stats: Sequence[GenerationStats], n: int) -> Usage:
    """The usage of a request's replies, `n` choices for each prompt in turn: as OpenAI and vLLM count it, each
    prompt once and every choice's completion. A prompt's cached tokens are those none of its choices
    evaluated (its other choices reuse what the first computed)."""
    prompts = [stats[first : first + n] for first in range(0, len(stats), n)]
    prompt_tokens = sum(choices[0].prompt_tokens for choices in prompts)
    completion_tokens = sum(choice.completion_tokens for choice in stats)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=sum(min(choice.cached_tokens for choice in choices) for choices in prompts)),
    )


async def _event_stream(replies: PendingReplies, first: Sequence[str],
                        step: Callable[[int, TextDelta | ReplyDone], Sequence[str]],
                        last: Callable[[list[GenerationStats]], Sequence[str]]) -> AsyncIterator[str]:
    """Server-sent events: `first`, the `step` events of each reply's text pieces and of its end (with
    its index), `last` events once every reply has ended, then [DONE]."""
    for event in first:
        yield event
    try:
        async for index, item in replies.events():
            for event in step(index, item):
                yield event
    except ReplyFailedError as error:
        yield _sse(ErrorResponse.model_validate({"error": {"message": str(error), "type": "server_error"}}))
        yield _sse("[DONE]")
        return
    for event in last(replies.stats):
        yield event
    yield _sse("[DONE]")


class _FirstModelOnly:
    """The loader of an app made without one: the model it was made with is all it serves, so the
    pool only ever unloads that one."""

    def estimate(self, name: str) -> MemoryNeed:
        raise AssertionError(f"an app without a loader was asked to load {name}")

    def load(self, name: str) -> ServedModel:
        raise AssertionError(f"an app without a loader was asked to load {name}")

    def unload(self, model: ServedModel) -> None:
        model.close()


def _log_pool_event(event: PoolEvent) -> None:
    if event.kind == "loaded":
        logger.info("loaded %s in %.2f s (%s)", event.name, event.seconds, event.reason)
    elif event.kind == "load_failed":
        logger.warning("loading %s failed after %.2f s: %s", event.name, event.seconds, event.reason)
    elif event.kind == "busy":
        logger.warning("did not load %s: %s", event.name, event.reason)
    else:
        logger.info("unloaded %s in %.2f s (%s)", event.name, event.seconds, event.reason)


class LeaseRelease:
    """Releases the model leases a request took once its response has been sent, a stream's last
    event included, or the client has gone: only then may the pool unload the model."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        leases: list[Lease[ServedModel]] = []
        scope.setdefault("state", {})[LEASES] = leases
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()


def _install_error_handlers(app: FastAPI, settings: ServerSettings) -> None:
    async def api_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, APIError)
        return error_response(request.url.path, error.status, error.message, code=error.code, param=error.param)

    async def validation_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        message, param = validation_message(error.errors())
        return error_response(request.url.path, 400, message, param=param)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return error_response(request.url.path, error.status_code, str(error.detail), headers=error.headers)

    async def context_overflow(request: Request, error: Exception) -> Response:
        return error_response(request.url.path, 400, str(error), code="context_length_exceeded", param="messages")

    async def invalid_setting(request: Request, error: Exception) -> Response:
        return error_response(request.url.path, 400, str(error))

    async def queue_full(request: Request, error: Exception) -> Response:
        return error_response(request.url.path, 503, f"the server is busy: {error}; retry later", code="server_busy",
                              headers={"Retry-After": str(settings.retry_after_s)})

    async def reply_failed(request: Request, error: Exception) -> Response:
        return error_response(request.url.path, 500, f"generation failed: {error}")

    async def model_busy(request: Request, error: Exception) -> Response:
        return error_response(request.url.path, 503, str(error), code="model_busy", param="model",
                              headers={"Retry-After": str(settings.retry_after_s)})

    handlers: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
        APIError: api_error,
        RequestValidationError: validation_error,
        HTTPException: http_error,
        ContextOverflowError: context_overflow,
        InvalidSettingError: invalid_setting,
        TemplateError: invalid_setting,
        UnsupportedError: invalid_setting,
        QueueFullError: queue_full,
        ReplyFailedError: reply_failed,
        ModelBusyError: model_busy,
    }
    for error_class, handler in handlers.items():
        app.add_exception_handler(error_class, handler)


def _openapi_with_400(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI documents validation errors as 422; this API answers them with 400 (as OpenAI does)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for path in schema["paths"].values():
                for operation in path.values():
                    operation["responses"].pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def create_app(engine: Engine, settings: ServerSettings, loader: EngineLoader | None = None) -> FastAPI:
    """The API over `engine`, the first model, and with a loader every other model of this machine.
    Models' scheduler threads run while the app does (its lifespan); at its end every model is
    unloaded, `engine` included."""
    first_id, need = loader.first(engine) if loader is not None else (engine.model_plan.model.name, MemoryNeed(0))
    first = ServedModel.of(first_id, engine, settings.queue_size)
    routes = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/lora-adapters"})
    metrics = ServerMetrics(lambda: {name: (m.scheduler, m.engine.prefix_cache) for name, m in pool.loaded().items()},
                            routes)

    def pool_event(event: PoolEvent) -> None:
        metrics.observe_pool(event)
        _log_pool_event(event)

    pool: ModelPool[ServedModel] = ModelPool(
        loader or _FirstModelOnly(), loader.budget if loader is not None else MemoryBudget(0),
        max_models=settings.max_models, wait_s=settings.model_wait_s, on_event=pool_event,
    )
    router = ModelRouter(first, pool, loader, settings, metrics)
    # The Responses, Anthropic's Messages, embedding, Ollama and llama-server routes, each path counted apart in /metrics.
    api_routers = [responses_router(router), messages_router(router), embedding_router(router), ollama_router(router),
                   ollama_models_router(router, loader, settings), llama_server_router(router)]
    metrics.routes |= {route.path for api_router in api_routers for route in api_router.routes}  # type: ignore[attr-defined]

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        pool.add_loaded(first.id, first.start(), need)
        # AnyIO imports its event loop backend and starts a worker thread at the first call to a thread, which
        # every request makes: done here, not in the first request's time to first token.
        await run_in_threadpool(lambda: None)
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="localchat", summary="OpenAI's and Ollama's APIs for the models on this machine", version="1",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.router.route_class = WellFormedRoute
    app.state.pool = pool
    _install_error_handlers(app, settings)
    app.openapi = _openapi_with_400(app)  # type: ignore[method-assign]

    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses={**ERROR_RESPONSES, **EVENT_STREAM})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        service = await router.service_for(request, body, "chat")
        run = await service.start_chat(body)
        readers, replies = run.readers, run.replies
        reply_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        piece = token_piece(service.engine.backend, service.chat.shown_tokens)
        # Each choice's log-probabilities of tokens whose text no chunk has carried yet: they go with its next one.
        unsent: list[list[TokenLogprob]] = [[] for _ in readers]

        def chunk(index: int, delta: ChatDelta, finish: FinishReason | None = None) -> ChatCompletionChunk:
            logprobs = chat_logprobs(unsent[index], piece) if unsent[index] else None
            unsent[index].clear()
            return ChatCompletionChunk(id=reply_id, created=created, model=service.model_id, choices=[
                ChatChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)])

        def read_delta(index: int, delta: TextDelta) -> list[ChatDelta]:
            unsent[index].extend(delta.logprobs)
            return run.read(index, delta.text)

        if body.stream:
            content_chunks = [SplicedJson(chunk(index, ChatDelta(content=CONTENT_MARK)), [CONTENT_MARK])
                              for index in range(len(readers))]

            def events(index: int, item: TextDelta | ReplyDone) -> list[str]:
                if isinstance(item, ReplyDone):
                    reader, stats = readers[index], item.stats
                    ending = [_sse(chunk(index, d)) for d in reader.finish(cut_short=stats.finish_reason == "length")]
                    return [*ending, _sse(chunk(index, ChatDelta(), reader.chat_completions_finish_reason(stats)))]
                deltas = read_delta(index, item)
                if unsent[index]:  # log-probabilities to send: the chunk's model writes them
                    return [_sse(chunk(index, d)) for d in deltas]
                return [_sse(chunk(index, d)) if (text := _content_alone(d)) is None else _sse(content_chunks[index](text))
                        for d in deltas]

            def last(stats: list[GenerationStats]) -> list[str]:
                if not body.include_usage:
                    return []
                return [_sse(ChatCompletionChunk(id=reply_id, created=created, model=service.model_id, choices=[],
                                                 usage=_usage(stats, body.n)))]

            first = [_sse(chunk(index, delta)) for index, reader in enumerate(readers)
                     for delta in [ChatDelta(role="assistant", content=""), *reader.start()]]
            stream = _event_stream(replies, first, events, last)
            return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        for reader in readers:
            reader.start()
        await service.read_whole(replies, request, read_delta)
        choices = []
        for index, (reader, stats) in enumerate(zip(readers, replies.stats, strict=True)):
            reader.finish(cut_short=stats.finish_reason == "length")
            logprobs = chat_logprobs(unsent[index], piece) if run.generation.logprobs is not None else None
            choices.append(ChatChoice(index=index, message=reader.message(), finish_reason=reader.chat_completions_finish_reason(stats),
                                      logprobs=logprobs))
        completion = ChatCompletion(id=reply_id, created=created, model=service.model_id, choices=choices,
                                    usage=_usage(replies.stats, body.n))
        return JSONResponse(completion.model_dump())

    @app.post("/v1/completions", response_model=Completion, responses={**ERROR_RESPONSES, **EVENT_STREAM})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        service = await router.service_for(request, body, "completion")
        prompts = body.prompts
        generation = service.generation_settings(body, body.reply_limit, logprobs=body.logprobs)
        choices = choice_settings(generation, body.n)
        tokens = await (service.text_prompts(prompts) if not body.suffix else service.infill_prompts(prompts, body.suffix))
        try:
            replies = service.submit([(prompt, settings) for prompt in tokens for settings in choices])
        except ContextOverflowError as error:
            raise APIError(400, str(error), code="context_length_exceeded", param="prompt") from None
        reply_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        piece = token_piece(service.engine.backend, frozenset())
        # Where each choice's next text starts in its completion.
        text_offsets = [0] * (len(prompts) * body.n)

        def legacy(index: int, entries: Sequence[TokenLogprob]) -> CompletionLogprobs | None:
            if generation.logprobs is None:
                return None
            logprobs, text_offsets[index] = completion_logprobs(entries, piece, text_offsets[index])
            return logprobs

        def event(index: int, text: str, finish: FinishReason | None = None,
                  logprobs: CompletionLogprobs | None = None) -> Completion:
            return Completion(id=reply_id, created=created, model=service.model_id,
                              choices=[CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=logprobs)])

        if body.stream:
            def events(index: int, item: TextDelta | ReplyDone) -> list[str]:
                if isinstance(item, ReplyDone):
                    return [_sse(event(index, "", text_finish_reason(item.stats)))]
                return [_sse(event(index, item.text, logprobs=legacy(index, item.logprobs)))]

            def last(stats: list[GenerationStats]) -> list[str]:
                if not body.include_usage:
                    return []
                return [_sse(Completion(id=reply_id, created=created, model=service.model_id, choices=[],
                                        usage=_usage(stats, body.n)))]

            stream = _event_stream(replies, [], events, last)
            return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        pieces: list[list[TextDelta]] = [[] for _ in text_offsets]
        await service.read_whole(replies, request, lambda index, delta: pieces[index].append(delta))
        whole = [CompletionChoice(index=index, text="".join(p.text for p in said), finish_reason=text_finish_reason(stats),
                                  logprobs=legacy(index, [entry for p in said for entry in p.logprobs]))
                 for index, (said, stats) in enumerate(zip(pieces, replies.stats, strict=True))]
        completion = Completion(id=reply_id, created=created, model=service.model_id, choices=whole,
                                usage=_usage(replies.stats, body.n))
        return JSONResponse(completion.model_dump())

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def models() -> ModelList:
        catalog = await run_in_threadpool(loader.catalog) if loader is not None else []
        return ModelList(data=await router.cards(catalog))

    @app.get("/v1/models/{model:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def model_card(model: str) -> ModelCard:
        """One model of /v1/models, named as a request names it (never loaded nor pulled by asking)."""
        catalog = await run_in_threadpool(loader.catalog) if loader is not None else []
        wanted = names_wanted(model)
        for card in await router.cards(catalog):
            if card.id.casefold() in wanted:
                return card
        raise APIError(404, f"The model '{model}' does not exist on this server: GET /v1/models lists the models it has",
                       code="model_not_found", param="model")

    # llama-server's adapter routes, for the first model (the one --lora adapted).
    @app.get("/lora-adapters", response_model=list[LoraAdapterCard], responses=ERROR_RESPONSES)
    async def lora_adapters() -> list[LoraAdapterCard]:
        return [LoraAdapterCard(id=lora.id, path=str(lora.path), scale=lora.scale) for lora in first.engine.loras]

    @app.post("/lora-adapters", response_model=LoraApplied, responses=ERROR_RESPONSES)
    async def set_lora_adapters(body: list[LoraScale]) -> LoraApplied:
        """New default scales; those not listed keep theirs (a reply naming its own is unaffected)."""
        first.engine.set_lora_scales({adapter.id: adapter.scale for adapter in body})
        return LoraApplied()

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "The scheduler has stopped"}})
    async def health() -> Response:
        schedulers = [served.scheduler for served in pool.loaded().values()]
        running = all(scheduler.running for scheduler in schedulers)
        busy = sum(scheduler.busy_slots for scheduler in schedulers)
        state = Health(status="ok" if running else "error", slots_idle=sum(s.n_slots for s in schedulers) - busy,
                       slots_processing=busy, requests_waiting=sum(s.waiting for s in schedulers))
        return JSONResponse(state.model_dump(), status_code=200 if running else 503)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}})
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    for api_router in api_routers:
        app.include_router(api_router)

    # The last added is the outermost: count every answer; CORS before the key, since browsers
    # send preflight requests without it; then the origin, the key, the body bound, and bodies as JSON.
    origins = allowed_origins(settings.cors_origins)
    app.add_middleware(BodiesAsJson)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       unbounded="/api/blobs/" if settings.allow_model_changes else None)
    if settings.api_key is not None:
        app.add_middleware(ApiKeyGuard, api_key=settings.api_key)
    app.add_middleware(OriginGuard, origins=origins)
    app.add_middleware(CORSMiddleware, allow_origin_regex=origins.pattern, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(RequestCounter, metrics=metrics)
    app.add_middleware(LeaseRelease)
    return app


class _Server(uvicorn.Server):
    """Ends the replies in flight when shutdown starts, so that their streams close with [DONE]
    before uvicorn waits for the connections (else it cuts them after its grace period)."""

    def __init__(self, config: uvicorn.Config, pool: ModelPool[ServedModel]) -> None:
        super().__init__(config)
        self.pool = pool

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for served in self.pool.loaded().values():
            await run_in_threadpool(served.scheduler.close)
        await super().shutdown(sockets)


def serve(engine: Engine, settings: ServerSettings, loader: EngineLoader | None = None,
          listening: socket.socket | None = None) -> None:
    """Run the API until interrupted (Ctrl-C or SIGTERM: both raise KeyboardInterrupt after the
    shutdown, which unloads every model so that their prefix caches reach the disk). `listening`: a
    socket bound to the settings' host and port already (else uvicorn binds it)."""
    app = create_app(engine, settings, loader)
    pool: ModelPool[ServedModel] = app.state.pool
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=5)
    # uvicorn handles SIGTERM while it runs, then raises it again, which by default kills the
    # process on the spot.
    try:
        with sigterm_interrupts():
            _Server(config, pool).run(sockets=[listening] if listening is not None else None)
    finally:
        # A second Ctrl-C makes uvicorn skip its shutdown: the models it left loaded are freed here,
        # each scheduler's thread stopped before its engine is freed under it.
        for served in pool.loaded().values():
            served.close()
