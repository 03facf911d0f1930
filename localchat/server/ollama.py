"""Ollama's inference API on the same server and port as OpenAI's: /api/chat and /api/generate.

A chat request becomes the OpenAI chat request it means (its messages and tools, `format` as a
response_format, `think` as the template's switch, `options` as sampler fields) and takes the path
/v1/chat/completions takes: the same prompt, sampler and scheduler, so the same greedy reply. The
reply is written as Ollama writes it: newline-delimited JSON objects (or one object), content and
thinking apart, tool calls with their arguments as objects, and the counters Ollama clients show,
measured. /api/generate is a chat of one user message (its `system` before it), or with `raw` the
prompt as is.

Ollama's fields that localchat does not implement and that would change the answer (images,
suffix, template, context; Mirostat and other samplers in `options`) are refused by name. Options
that set how Ollama loads and runs a model (num_ctx, num_gpu, num_thread...) change no answer's
meaning: localchat's plan sets those, and the options are accepted and not applied, as Ollama
accepts options it does not know.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from localchat.constraints import tokenizer_for
from localchat.scheduler import TextDelta
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.logprobs import chat_logprobs, token_piece
from localchat.server.ollama_schemas import (
    CalledFunctionOut,
    ChatRequest,
    ChatResponse,
    DebugRender,
    DebugResponse,
    GenerateRequest,
    GenerateResponse,
    KeepAlive,
    Message,
    Metrics,
    OllamaError,
    ReplyMessage,
    ToolCallOut,
)
from localchat.server.replies import PendingReply, ReplyFailedError
from localchat.server.schemas import ChatCompletionRequest, CompletionRequest, ResponseFormat
from localchat.server.schemas import TokenLogprob as TokenLogprobEntry
from localchat.server.spliced_json import CONTENT_MARK, STAMP_MARK, SplicedJson
from localchat.session import GenerationStats

if TYPE_CHECKING:
    from localchat.server.routing import ChatRun, CompletionService, ModelRouter
    from localchat.server.served_models import ServedModel

NDJSON = "application/x-ndjson"
# Ollama's sampling options and the sampler fields they set (OpenAI's, with llama.cpp's extensions).
SAMPLING_OPTIONS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
    # localchat's own (llama.cpp's name): 0 turns DRY off, which is on by default (localchat.backends.base).
    "dry_multiplier": ("dry_multiplier", float),
}
# Options localchat does not implement that change the answer, with the value that leaves it
# unchanged (Ollama's default) and what they are.
UNSUPPORTED_OPTIONS: dict[str, tuple[object, str]] = {
    "typical_p": (1.0, "locally typical sampling"),
    "tfs_z": (1.0, "tail-free sampling"),
    "mirostat": (0, "Mirostat sampling"),
    "penalize_newline": (True, "sparing newlines from the repeat penalty"),
}
# Ollama's think efforts and the reasoning_effort a template reads ("max" is gpt-oss's "high").
THINK_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
OLLAMA_ROLES = frozenset({"system", "user", "assistant", "tool"})
# A keep_alive this long or longer is for ever (what /api/ps shows as the expiry stays a date).
KEEP_ALIVE_FOR_EVER_S = 100 * 365 * 24 * 3600.0
# Go's duration syntax (time.ParseDuration), as keep_alive takes it: "5m", "1h30m", "-1s", "0".
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
NDJSON_STREAM = {200: {"content": {NDJSON: {"schema": {"type": "string", "description": "one JSON object per line"}}}}}


def ollama_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": OllamaError, "description": description} for status, description in [
        (400, "Invalid request, or a field localchat does not implement"),
        (401, "Missing or wrong API key"),
        (403, "Changing the models on disk is off for this server"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (500, "The model could not be loaded"),
        (503, "Every slot is busy and the queue is full, or the model needs the room of busy models"),
    ] if status in statuses}


INFERENCE_ERRORS = ollama_error_responses(400, 401, 404, 413, 500, 503)


def keep_alive_seconds(value: KeepAlive | None) -> float | None:
    """Seconds to keep a model loaded once idle; None: as long as room allows (a negative value or one
    of a century or more, Ollama's "for ever", or no value: localchat's default)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        seconds = _go_duration(value)
    return None if seconds < 0 or not seconds < KEEP_ALIVE_FOR_EVER_S else seconds


def _go_duration(text: str) -> float:
    body = text.lstrip("+-")
    sign = -1.0 if text.startswith("-") else 1.0
    if body == "0":
        return 0.0
    parts = _DURATION_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise APIError(400, f'keep_alive: invalid duration "{text}": give seconds or a duration such as "5m" or "1h30m"',
                       param="keep_alive")
    return sign * sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def _option(name: str, value: object, kind: type) -> object:
    """An option's value as Ollama's Go decoder takes it: any JSON number for an integer (cut)
    or a float; a wrong type is an error naming it."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    raise APIError(400, f'option "{name}" must be of type {"integer" if kind is int else "float"}', param=f"options.{name}")


def sampling_fields(options: dict[str, Any] | None, reply_limit: int | None) -> tuple[dict[str, Any], tuple[str, ...] | None]:
    """The sampler fields `options` set, and its stop strings (None: none given). A num_predict over
    `reply_limit` (the server's, if it has one) is cut to it, as Ollama bounds it, where OpenAI's max_tokens is refused."""
    fields: dict[str, Any] = {}
    stop: tuple[str, ...] | None = None
    for name, value in (options or {}).items():
        if value is None:
            continue
        if name in UNSUPPORTED_OPTIONS:
            neutral, what = UNSUPPORTED_OPTIONS[name]
            if value != neutral or isinstance(value, bool) != isinstance(neutral, bool):
                raise APIError(400, f"options.{name}: {what} is not supported by localchat; leave it out",
                               code="unsupported_parameter", param=f"options.{name}")
        elif name == "stop":
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise APIError(400, 'option "stop" must be of an array of strings', param="options.stop")
            stop = tuple(item for item in value if item)
        elif name in SAMPLING_OPTIONS:
            field, kind = SAMPLING_OPTIONS[name]
            fields[field] = _option(name, value, kind)
    # Ollama's seed -1 is a random seed; num_predict -1 (or any <= 0) is no limit but the server's.
    if fields.get("seed", 0) < 0:
        del fields["seed"]
    if fields.get("max_tokens", 1) <= 0:
        del fields["max_tokens"]
    elif reply_limit is not None and fields.get("max_tokens", 0) > reply_limit:
        fields["max_tokens"] = reply_limit
    return fields, stop


# Where a field of the OpenAI body came from in the Ollama request, for error messages.
_FIELD_ORIGINS = {field: f"options.{name}" for name, (field, _) in SAMPLING_OPTIONS.items()} | {"response_format": "format"}


def _validated(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """`body` as `model`; a field it refuses is named as the Ollama request has it."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        location = [str(part) for part in first.get("loc", ())]
        if location:
            location[0] = _FIELD_ORIGINS.get(location[0], location[0])
        where = ".".join(location)
        raise APIError(400, f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg")), param=where) from None


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}


def _think(value: bool | str | None, thinks: bool, model: str) -> dict[str, Any]:
    """The OpenAI fields that ask the template for (no) thinking."""
    if value is None:
        return {}
    if value is False:
        return {"reasoning_effort": "none"}
    if not thinks:
        raise APIError(400, f'"{model}" does not support thinking', param="think")
    effort = {} if value is True else {"reasoning_effort": THINK_EFFORTS[str(value)]}
    return {**effort, "chat_template_kwargs": {"enable_thinking": True}}


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI's messages for Ollama's: call ids where Ollama has none (a tool result answers the
    latest unanswered call of its tool), arguments as JSON text."""
    converted: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (call id, function name), oldest first
    for index, message in enumerate(messages):
        role = message.role.lower()
        where = f"messages.{index}"
        if role not in OLLAMA_ROLES:
            raise APIError(400, f"{where}.role: '{message.role}' is not one of system, user, assistant, tool", param=f"{where}.role")
        if message.images:
            raise APIError(400, f"{where}.images: localchat serves text models, which cannot read images; send text only",
                           code="unsupported_parameter", param=f"{where}.images")
        entry: dict[str, Any] = {"role": role, "content": message.content}
        if role == "assistant" and message.thinking:
            entry["reasoning_content"] = message.thinking
        if message.tool_calls:
            calls = []
            for number, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{index}_{number}"
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": call.function.name, "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}})
                unanswered.append((call_id, call.function.name))
            entry["tool_calls"] = calls
        if role == "tool":
            entry["tool_call_id"] = message.tool_call_id or _answered(unanswered, message.tool_name, index)
        converted.append(entry)
    return converted


def _answered(unanswered: list[tuple[str, str]], tool_name: str | None, index: int) -> str:
    """The id of the call a tool message without one answers: the oldest unanswered call of its tool
    (of any tool, without a name); taken off the list."""
    for number, (call_id, name) in enumerate(unanswered):
        if tool_name is None or name == tool_name:
            del unanswered[number]
            return call_id
    return f"call_{index}_result"


@dataclass(frozen=True)
class _Timer:
    """When a request arrived and when its model was leased, for the counters."""

    started: float
    leased: float

    def metrics(self, stats: GenerationStats | None) -> Metrics:
        now = time.perf_counter()
        counters = Metrics(total_duration=_ns(now - self.started), load_duration=_ns(self.leased - self.started))
        if stats is None:
            return counters
        return counters.model_copy(update={
            "prompt_eval_count": stats.prompt_tokens,
            "prompt_eval_duration": _ns(stats.prefill_s - stats.queued_s),
            "eval_count": stats.completion_tokens,
            "eval_duration": _ns(stats.ttft_s + stats.decode_s - stats.prefill_s),
        })


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def created_at() -> str:
    """Now, as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def ndjson(lines: AsyncIterator[BaseModel | dict[str, Any] | str]) -> StreamingResponse:
    """`lines` as newline-delimited JSON; a str is a line's JSON already."""
    async def encoded() -> AsyncIterator[str]:
        async for line in lines:
            if isinstance(line, BaseModel):
                line = line.model_dump_json()
            yield (line if isinstance(line, str) else json.dumps(line)) + "\n"

    return StreamingResponse(encoded(), media_type=NDJSON)


@dataclass
class _Reply:
    """What a reply has said so far, as Ollama's fields: content, thinking, calls, log-probabilities."""

    content: list[str]
    thinking: list[str]
    logprobs: list[TokenLogprobEntry]

    @classmethod
    def empty(cls) -> _Reply:
        return cls([], [], [])


class OllamaRoutes:
    """/api/chat and /api/generate over the server's models (leased through `models`)."""

    def __init__(self, models: ModelRouter) -> None:
        self.models = models

    async def lease(self, request: Request, requested: str, keep_alive: KeepAlive | None) -> ServedModel:
        """The model named, loaded if need be; its keep_alive set from the request."""
        if not requested:
            raise APIError(400, "model is required", param="model")
        try:
            served = await self.models.lease(request, requested)
        except APIError as error:
            if error.code == "model_not_found":
                raise APIError(404, f"model '{requested}' not found", code=error.code, param="model") from None
            raise
        self.models.pool.keep_alive(served.id, keep_alive_seconds(keep_alive))
        return served


    async def unload(self, requested: str) -> None:
        """Ollama's unload request (no prompt, keep_alive 0): the model goes once idle; not loaded, nothing happens."""
        try:
            model_id = await self.models.model_id(requested)
        except APIError:
            raise APIError(404, f"model '{requested}' not found", code="model_not_found", param="model") from None
        self.models.pool.keep_alive(model_id, 0)

    # -- /api/chat ----------------------------------------------------------------------

    async def chat(self, body: ChatRequest, request: Request) -> Response:
        started = time.perf_counter()
        if not body.messages and body.keep_alive is not None and keep_alive_seconds(body.keep_alive) == 0:
            await self.unload(body.model)
            return JSONResponse(ChatResponse(model=body.model, created_at=created_at(), message=ReplyMessage(),
                                             done=True, done_reason="unload").model_dump())
        openai_messages = _messages(body.messages)
        served = await self.lease(request, body.model, body.keep_alive)
        timer = _Timer(started, time.perf_counter())
        if not body.messages:
            return JSONResponse(ChatResponse(model=body.model, created_at=created_at(), message=ReplyMessage(),
                                             done=True, done_reason="load", **timer.metrics(None).model_dump()).model_dump())
        service = self.models.service(served)
        openai_body, stop = self._chat_body(body.model, openai_messages, body, served,
                                            [tool.model_dump(exclude_none=True) for tool in body.tools or ()])
        return await self._answer(body, service, openai_body, stop, timer, request, chat=True)

    async def _answer(self, body: ChatRequest | GenerateRequest, service: CompletionService, openai_body: ChatCompletionRequest,
                      stop: tuple[str, ...] | None, timer: _Timer, request: Request, *, chat: bool) -> Response:
        """The reply to a chat or generate request, streamed or whole (or its rendered prompt alone)."""
        if body.debug_render_only:
            return await self._render(service, openai_body, body.model)
        # Ollama cuts a history too long for the context from its oldest turns unless truncate is false.
        run = await service.start_chat(openai_body, stop, fit_context=chat and body.truncate is not False)
        writer = _ReplyWriter(run, service, body.model, timer, chat=chat)
        if body.stream:
            return ndjson(writer.stream())
        return JSONResponse(await writer.whole(request))

    def _chat_body(self, model: str, messages: list[dict[str, Any]], body: ChatRequest | GenerateRequest,
                   served: ServedModel, tools: list[dict[str, Any]]) -> tuple[ChatCompletionRequest, tuple[str, ...] | None]:
        fields, stop = sampling_fields(body.options, self.models.settings.max_reply_tokens)
        openai = {
            "model": served.id, "messages": messages, **fields,
            "response_format": _response_format(body.format),
            "logprobs": body.logprobs, "top_logprobs": body.top_logprobs if body.logprobs else None,
            **_think(body.think, served.chat.format.reasons, model),
        }
        if tools:
            openai["tools"] = tools
        return _validated(ChatCompletionRequest, openai), stop

    async def _render(self, service: CompletionService, body: ChatCompletionRequest, model: str) -> Response:
        plan, _ = await service.chat_prompt(body)
        debug = DebugResponse(model=model, created_at=created_at(), debug_info=DebugRender(rendered_template=plan.prompt + plan.forced))
        return JSONResponse(debug.model_dump(by_alias=True))

    # -- /api/generate ------------------------------------------------------------------

    async def generate(self, body: GenerateRequest, request: Request) -> Response:
        started = time.perf_counter()
        _refuse_generate_fields(body)
        if not body.prompt and body.keep_alive is not None and keep_alive_seconds(body.keep_alive) == 0:
            await self.unload(body.model)
            return JSONResponse(GenerateResponse(model=body.model, created_at=created_at(), response="", done=True,
                                                 done_reason="unload").model_dump())
        served = await self.lease(request, body.model, body.keep_alive)
        timer = _Timer(started, time.perf_counter())
        if not body.prompt:
            return JSONResponse(GenerateResponse(model=body.model, created_at=created_at(), response="", done=True,
                                                 done_reason="load", **timer.metrics(None).model_dump()).model_dump())
        service = self.models.service(served)
        if body.raw:
            return await self._generate_raw(body, service, timer, request)
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [{"role": "user", "content": body.prompt}]
        openai_body, stop = self._chat_body(body.model, messages, body, served, [])
        return await self._answer(body, service, openai_body, stop, timer, request, chat=False)

    async def _generate_raw(self, body: GenerateRequest, service: CompletionService, timer: _Timer, request: Request) -> Response:
        fields, stop = sampling_fields(body.options, service.settings.max_reply_tokens)
        completion = _validated(CompletionRequest, {"model": service.model_id, "prompt": body.prompt, **fields,
                                                    "logprobs": body.top_logprobs if body.logprobs else None})
        if body.debug_render_only:
            debug = DebugResponse(model=body.model, created_at=created_at(), debug_info=DebugRender(rendered_template=body.prompt))
            return JSONResponse(debug.model_dump(by_alias=True))
        generation = service.generation_settings(completion, completion.reply_limit, logprobs=completion.logprobs)
        if stop is not None:
            generation = replace(generation, stop=stop)
        response_format = _response_format(body.format)
        if response_format is not None:
            constraint = _validated(ResponseFormat, response_format).constraint()
            generation = replace(generation, constraint=constraint)
            await run_in_threadpool(tokenizer_for, service.engine.backend)
        reply = service.submit(await service.text_prompt(completion), generation)
        writer = _ReplyWriter(None, service, body.model, timer, chat=False, raw_reply=reply)
        if body.stream:
            return ndjson(writer.stream())
        return JSONResponse(await writer.whole(request))


def _refuse_generate_fields(body: GenerateRequest) -> None:
    """Ollama's generate fields that localchat does not implement, refused by name when set."""
    refused = [
        ("images", bool(body.images), "localchat serves text models, which cannot read images"),
        ("suffix", bool(body.suffix), "localchat has no fill-in-the-middle; send the text before it as the prompt"),
        ("template", bool(body.template), "localchat renders the model's own chat template; use raw to send a prompt as is"),
        ("context", bool(body.context), "the context of an earlier reply is not supported (deprecated by Ollama); "
                                        "send the conversation to /api/chat"),
        ("width", body.width is not None, "localchat generates no images"),
        ("height", body.height is not None, "localchat generates no images"),
        ("steps", body.steps is not None, "localchat generates no images"),
    ]
    for name, given, why in refused:
        if given:
            raise APIError(400, f"{name}: {why}", code="unsupported_parameter", param=name)
    if body.raw and body.system:
        raise APIError(400, "raw mode does not support template, system, or context", param="raw")


class _ReplyWriter:
    """A reply as Ollama's chat (`chat`) or generate responses: streamed lines, or one body."""

    def __init__(self, run: ChatRun | None, service: CompletionService, model: str, timer: _Timer, *, chat: bool,
                 raw_reply: PendingReply | None = None) -> None:
        self.run = run
        self.reply: PendingReply = run.reply if run is not None else raw_reply  # type: ignore[assignment]
        self.service = service
        self.model = model
        self.timer = timer
        self.chat = chat
        shown = service.chat.shown_tokens if run is not None else frozenset()
        self.piece = token_piece(service.engine.backend, shown)

    def _parts(self, delta: TextDelta) -> _Reply:
        said = _Reply.empty()
        if delta.logprobs:
            said.logprobs.extend(chat_logprobs(delta.logprobs, self.piece).content or [])
        if self.run is None:
            said.content.append(delta.text)
            return said
        self._add(said, self.run.read(delta.text))
        return said

    @staticmethod
    def _add(said: _Reply, deltas: Sequence[Any]) -> None:
        for delta in deltas:
            if delta.content:
                said.content.append(delta.content)
            if delta.reasoning_content:
                said.thinking.append(delta.reasoning_content)

    def _line(self, said: _Reply, *, done: bool = False, stats: GenerationStats | None = None,
              calls: list[ToolCallOut] | None = None, stamp: str | None = None) -> BaseModel:
        """`stamp`: its created_at (default: now)."""
        content, thinking = "".join(said.content), "".join(said.thinking) or None
        logprobs = said.logprobs or None
        counters: dict[str, Any] = {}
        done_reason = None
        if done:
            counters = self.timer.metrics(stats).model_dump()
            done_reason = "length" if stats is not None and stats.finish_reason == "length" else "stop"
        if self.chat:
            message = ReplyMessage(content=content, thinking=thinking, tool_calls=calls)
            return ChatResponse(model=self.model, created_at=stamp or created_at(), message=message, done=done,
                                done_reason=done_reason, logprobs=logprobs, **counters)
        return GenerateResponse(model=self.model, created_at=stamp or created_at(), response=content, thinking=thinking, done=done,
                                done_reason=done_reason, logprobs=logprobs, **counters)

    def _finish(self, said: _Reply) -> list[ToolCallOut] | None:
        """The reply's end: what the reader held back, and its calls (a call whose arguments are cut
        short is no call: its text joins the content)."""
        if self.run is None:
            return None
        self._add(said, self.run.reader.finish())
        calls = []
        for number, call in enumerate(self.run.reader.message().tool_calls or ()):
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                said.content.append(call.function.arguments)
                continue
            calls.append(ToolCallOut(id=call.id, function=CalledFunctionOut(index=number, name=call.function.name,
                                                                            arguments=arguments)))
        return calls or None

    async def stream(self) -> AsyncIterator[BaseModel | dict[str, Any] | str]:
        # A line that carries content alone (most of them), written without its models.
        content_line = SplicedJson(self._line(_Reply([CONTENT_MARK], [], []), stamp=STAMP_MARK), [STAMP_MARK, CONTENT_MARK])
        if self.run is not None:
            said = _Reply.empty()
            self._add(said, self.run.reader.start())
            if said.content or said.thinking:
                yield self._line(said)
        try:
            async for delta in self.reply.deltas():
                said = self._parts(delta)
                if said.content and not said.thinking and not said.logprobs:
                    yield content_line(created_at(), "".join(said.content))
                elif said.content or said.thinking or said.logprobs:
                    yield self._line(said)
        except ReplyFailedError as error:
            yield {"error": f"generation failed: {error}"}
            return
        said = _Reply.empty()
        calls = self._finish(said)
        yield self._line(said, done=True, stats=self.reply.stats, calls=calls)

    async def whole(self, request: Request) -> dict[str, Any]:
        said = _Reply.empty()
        if self.run is not None:
            self._add(said, self.run.reader.start())

        def read(delta: TextDelta) -> None:
            part = self._parts(delta)
            said.content.extend(part.content)
            said.thinking.extend(part.thinking)
            said.logprobs.extend(part.logprobs)

        await self.service.read_whole(self.reply, request, read)
        calls = self._finish(said)
        return self._line(said, done=True, stats=self.reply.stats, calls=calls).model_dump()


def ollama_router(models: ModelRouter) -> APIRouter:
    """The routes of Ollama's inference API."""
    routes = OllamaRoutes(models)
    router = APIRouter(tags=["Ollama"], route_class=WellFormedRoute)
    router.add_api_route("/api/chat", routes.chat, methods=["POST"], response_model=ChatResponse,
                         responses={**INFERENCE_ERRORS, **NDJSON_STREAM}, summary="Ollama's chat")
    router.add_api_route("/api/generate", routes.generate, methods=["POST"], response_model=GenerateResponse,
                         responses={**INFERENCE_ERRORS, **NDJSON_STREAM}, summary="Ollama's generate")
    return router

