"""Ollama's inference API on the same server and port as OpenAI's: /api/chat and /api/generate.

A chat request becomes the OpenAI chat request it means (its messages and tools, `format` as a
response_format, `think` as the template's switch, `options` as sampler fields) and takes the path
/v1/chat/completions takes: the same prompt, sampler and scheduler, so the same greedy reply. The
reply is written as Ollama writes it: newline-delimited JSON objects (or one object), content and
thinking apart, tool calls with their arguments as objects, and the counters Ollama clients show,
measured. /api/generate is a chat of one user message (its `system` before it), with `raw` the prompt
as is, or with a `suffix` the fill-in-the-middle prompt of the text before and after a gap. Its
deprecated `context` (the token ids of an earlier exchange, which its reply's last line gives) goes
before that chat's prompt, as Ollama prepends it, so that the prompt goes on from it.

Ollama's fields that localchat does not implement and that would change the answer (images,
template; typical_p in `options`) are refused by name. Sampling options are read
as Ollama's llama.cpp reads them, not by OpenAI's bounds (a top_k of -1 cuts nothing). Options
that set how Ollama loads and runs a model (num_ctx, num_gpu, num_thread...) change no answer's
meaning: localchat's plan sets those, and the options are accepted and not applied, as Ollama
accepts options it does not know.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from localchat.chat import continuation_text
from localchat.constraints import tokenizer_for
from localchat.scheduler import TextDelta
from localchat.server.errors import APIError, validation_message
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
from localchat.server.replies import PendingReplies, ReplyFailedError
from localchat.server.schemas import ChatCompletionRequest, CompletionRequest, ResponseFormat
from localchat.server.schemas import TokenLogprob as TokenLogprobEntry
from localchat.server.spliced_json import CONTENT_MARK, STAMP_MARK, SplicedJson
from localchat.session import GenerationStats

if TYPE_CHECKING:
    from localchat.backends.base import Backend
    from localchat.server.routing import ChatRun, CompletionService, LeasedModel, ModelRouter
    from localchat.server.served_models import ServedModel

NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class SamplingOption:
    """An Ollama option the sampler honours: the sampler field it sets (OpenAI's name, with llama.cpp's
    extensions), its type as Ollama's Go decoder takes it, and how llama.cpp reads its value (Ollama hands
    options to llama.cpp as given): None is none (no seed, no reply limit), over a preset's too; a ValueError
    says what it must be."""

    field: str
    kind: type
    read: Callable[[Any], Any]


def _within(ok: Callable[[Any], bool], rule: str) -> Callable[[Any], Any]:
    """A reader that takes a value as is where `ok`, else says `rule`."""
    def read(value: Any) -> Any:
        if not ok(value):
            raise ValueError(rule)
        return value

    return read


SAMPLING_OPTIONS: dict[str, SamplingOption] = {
    # llama.cpp: a temperature of 0 or less is greedy; none is too high (the bound of 2 is OpenAI's API's).
    "temperature": SamplingOption("temperature", float, lambda t: max(t, 0.0)),
    # llama.cpp: a top_k of 0 or less cuts nothing (Ollama's clients send -1), as does one past any vocabulary.
    "top_k": SamplingOption("top_k", int, lambda k: k if 0 < k < 2**31 else 0),
    # llama.cpp: 1 or more cuts nothing; 0 or less keeps the likeliest token alone (greedy: sampling_fields).
    "top_p": SamplingOption("top_p", float, lambda p: min(p, 1.0)),
    # llama.cpp: 0 or less cuts nothing; 1 or more keeps the likeliest token alone (greedy: sampling_fields).
    "min_p": SamplingOption("min_p", float, lambda p: max(p, 0.0)),
    # llama.cpp divides the logits of tokens seen by it: 0 or less has no meaning.
    "repeat_penalty": SamplingOption("repeat_penalty", float, _within(lambda v: v > 0, "must be > 0 (1 turns it off)")),
    # llama-server refuses less than -1 itself.
    "repeat_last_n": SamplingOption("repeat_last_n", int,
                                    _within(lambda v: v >= -1, "must be >= -1 (-1: the whole context, 0: off)")),
    # localchat's sampler takes OpenAI's range.
    "presence_penalty": SamplingOption("presence_penalty", float, _within(lambda v: -2 <= v <= 2, "must be in [-2, 2]")),
    "frequency_penalty": SamplingOption("frequency_penalty", float, _within(lambda v: -2 <= v <= 2, "must be in [-2, 2]")),
    # Ollama's -1 (any negative) is a random seed, a preset's notwithstanding; llama.cpp's seeds are 32-bit: a
    # larger one is taken modulo 2**32, as OpenAI's seed is (localchat.server.schemas).
    "seed": SamplingOption("seed", int, lambda s: None if s < 0 else s % 2**32),
    # Ollama's -1 (any <= 0): no limit but the server's, a preset's notwithstanding (sampling_fields cuts a larger
    # one to the server's).
    "num_predict": SamplingOption("max_tokens", int, lambda n: n if n > 0 else None),
    # localchat's own (llama.cpp's name): 0 turns DRY off, which is on by default (localchat.backends.base).
    "dry_multiplier": SamplingOption("dry_multiplier", float, _within(lambda v: v >= 0, "must be >= 0 (0 turns DRY off)")),
}
# Options localchat does not implement that change the answer, with the value that leaves it
# unchanged (Ollama's default) and what they are. Those Ollama no longer knows (mirostat, tfs_z,
# penalize_newline) it ignores, logging them as invalid: so does localchat, as any unknown option.
UNSUPPORTED_OPTIONS: dict[str, tuple[object, str]] = {
    "typical_p": (1.0, "locally typical sampling"),
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
        (500, "The model could not be loaded, or pulled"),
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


def _option(name: str, value: object, kind: type, where: str = "options") -> Any:
    """An option's value as Ollama's Go decoder takes it: any JSON number for an integer (cut)
    or a float; a wrong type is an error naming it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise APIError(400, f'option "{name}" must be of type {"integer" if kind is int else "float"}', param=f"{where}.{name}")
    # json.loads reads NaN, Infinity and integers past any float, which Go's decoder refuses.
    if not math.isfinite(value) if isinstance(value, float) else abs(value) > sys.float_info.max:
        raise APIError(400, f'option "{name}" must be a finite number', param=f"{where}.{name}")
    return int(value) if kind is int else float(value)


def sampling_fields(options: dict[str, Any] | None, reply_limit: int | None,
                    where: str = "options") -> tuple[dict[str, Any], tuple[str, ...] | None]:
    """The sampler fields `options` set, read as llama.cpp reads them (SAMPLING_OPTIONS: a seed or max_tokens of
    None is Ollama's -1), and its stop strings (None: none given). A num_predict over `reply_limit` (the
    server's, if it has one) is cut to it, as Ollama bounds it, where OpenAI's max_tokens is refused. `where`:
    the request's name for `options`, in error messages (/api/create's is `parameters`)."""
    fields: dict[str, Any] = {}
    stop: tuple[str, ...] | None = None
    for name, value in (options or {}).items():
        if value is None:
            continue
        if name in UNSUPPORTED_OPTIONS:
            neutral, what = UNSUPPORTED_OPTIONS[name]
            if value != neutral or isinstance(value, bool) != isinstance(neutral, bool):
                raise APIError(400, f"{where}.{name}: {what} is not supported by localchat; leave it out",
                               code="unsupported_parameter", param=f"{where}.{name}")
        elif name == "stop":
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise APIError(400, 'option "stop" must be of an array of strings', param=f"{where}.stop")
            stop = tuple(item for item in value if item)
        elif name in SAMPLING_OPTIONS:
            option = SAMPLING_OPTIONS[name]
            try:
                fields[option.field] = option.read(_option(name, value, option.kind, where))
            except ValueError as error:
                raise APIError(400, f"{where}.{name}: {value} {error}", param=f"{where}.{name}") from None
    if fields.get("top_p", 1.0) <= 0 or fields.get("min_p", 0.0) >= 1:
        # llama.cpp keeps the likeliest token alone: a greedy pick, its penalties still applied.
        fields = {field: value for field, value in fields.items() if field not in ("top_p", "min_p")} | {"temperature": 0.0}
    if reply_limit is not None and (fields.get("max_tokens") or 0) > reply_limit:
        fields["max_tokens"] = reply_limit
    return fields, stop


# Where a field of the OpenAI body came from in the Ollama request, for error messages.
_FIELD_ORIGINS = {"response_format": "format"}


def _validated(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """`body` as `model`; a field it refuses is named as the Ollama request has it."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, where = validation_message(error.errors(), _FIELD_ORIGINS)
        raise APIError(400, message, param=where) from None


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

    async def lease(self, request: Request, requested: str, keep_alive: KeepAlive | None) -> LeasedModel:
        """The model named, loaded if need be; its keep_alive set from the request."""
        if not requested:
            raise APIError(400, "model is required", param="model")
        try:
            leased = await self.models.lease(request, requested)
        except APIError as error:
            if error.code == "model_not_found":
                raise APIError(404, f"model '{requested}' not found", code=error.code, param="model") from None
            raise
        self.models.pool.keep_alive(leased.served.id, keep_alive_seconds(keep_alive))
        return leased


    async def unload(self, requested: str) -> None:
        """Ollama's unload request (no prompt, keep_alive 0): the model goes once idle; not loaded, nothing happens."""
        try:
            chosen = await self.models.choose(requested)
        except APIError:
            raise APIError(404, f"model '{requested}' not found", code="model_not_found", param="model") from None
        self.models.pool.keep_alive(chosen.id, 0)

    # -- /api/chat ----------------------------------------------------------------------

    async def chat(self, body: ChatRequest, request: Request) -> Response:
        started = time.perf_counter()
        if not body.messages and body.keep_alive is not None and keep_alive_seconds(body.keep_alive) == 0:
            await self.unload(body.model)
            return JSONResponse(ChatResponse(model=body.model, created_at=created_at(), message=ReplyMessage(),
                                             done=True, done_reason="unload").model_dump())
        openai_messages = _messages(body.messages)
        leased = await self.lease(request, body.model, body.keep_alive)
        timer = _Timer(started, time.perf_counter())
        if not body.messages:
            return JSONResponse(ChatResponse(model=body.model, created_at=created_at(), message=ReplyMessage(),
                                             done=True, done_reason="load", **timer.metrics(None).model_dump()).model_dump())
        service = self.models.service(leased)
        openai_body, stop = self._chat_body(body.model, openai_messages, body, leased.served,
                                            [tool.model_dump(exclude_none=True) for tool in body.tools or ()])
        return await self._answer(body, service, openai_body, stop, timer, request, chat=True)

    async def _answer(self, body: ChatRequest | GenerateRequest, service: CompletionService, openai_body: ChatCompletionRequest,
                      stop: tuple[str, ...] | None, timer: _Timer, request: Request, *, chat: bool,
                      before: Sequence[int] = ()) -> Response:
        """The reply to a chat or generate request, streamed or whole (or its rendered prompt alone);
        `before`: the tokens of an earlier exchange its prompt goes on from (generate's context)."""
        if body.debug_render_only:
            return await self._render(service, openai_body, body.model, before)
        # Ollama cuts a history too long for the context from its oldest turns unless truncate is false.
        run = await service.start_chat(openai_body, stop, fit_context=chat and body.truncate is not False, before=before)
        writer = _ReplyWriter(run, service, body.model, timer, chat=chat)
        if body.stream:
            return ndjson(writer.stream())
        return JSONResponse(await writer.whole(request))

    def _chat_body(self, model: str, messages: list[dict[str, Any]], body: ChatRequest | GenerateRequest,
                   served: ServedModel, tools: list[dict[str, Any]]) -> tuple[ChatCompletionRequest, tuple[str, ...] | None]:
        fields, stop = sampling_fields(body.options, self.models.settings.max_reply_tokens)
        openai = {
            "model": served.id, "messages": messages,
            "response_format": _response_format(body.format),
            "logprobs": body.logprobs, "top_logprobs": body.top_logprobs if body.logprobs else None,
            **_think(body.think, served.chat.format.reasons, model),
        }
        if tools:
            openai["tools"] = tools
        # The sampler fields as Ollama reads them (sampling_fields), past OpenAI's bounds (a temperature of 3).
        return _validated(ChatCompletionRequest, openai).model_copy(update=fields), stop

    async def _render(self, service: CompletionService, body: ChatCompletionRequest, model: str, before: Sequence[int]) -> Response:
        plan, _ = await service.chat_prompt(body)
        prompt = plan.prompt + plan.forced
        rendered = _text_of(service.engine.backend, before) + continuation_text(service.engine.template, prompt) if before else prompt
        debug = DebugResponse(model=model, created_at=created_at(), debug_info=DebugRender(rendered_template=rendered))
        return JSONResponse(debug.model_dump(by_alias=True))

    # -- /api/generate ------------------------------------------------------------------

    async def generate(self, body: GenerateRequest, request: Request) -> Response:
        started = time.perf_counter()
        _refuse_generate_fields(body)
        if not body.prompt and body.keep_alive is not None and keep_alive_seconds(body.keep_alive) == 0:
            await self.unload(body.model)
            return JSONResponse(GenerateResponse(model=body.model, created_at=created_at(), response="", done=True,
                                                 done_reason="unload").model_dump())
        leased = await self.lease(request, body.model, body.keep_alive)
        timer = _Timer(started, time.perf_counter())
        if not body.prompt:
            return JSONResponse(GenerateResponse(model=body.model, created_at=created_at(), response="", done=True,
                                                 done_reason="load", **timer.metrics(None).model_dump()).model_dump())
        service = self.models.service(leased)
        if body.raw or body.suffix:
            return await self._generate_untemplated(body, service, timer, request)
        n_vocab = service.engine.backend.info.n_vocab
        if not all(0 <= token < n_vocab for token in body.context or ()):
            raise APIError(400, f"context: token ids must be in [0, {n_vocab}): send the context an earlier reply of "
                                f"this model gave", param="context")
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [{"role": "user", "content": body.prompt}]
        openai_body, stop = self._chat_body(body.model, messages, body, leased.served, [])
        return await self._answer(body, service, openai_body, stop, timer, request, chat=False, before=body.context or ())

    async def _generate_untemplated(self, body: GenerateRequest, service: CompletionService, timer: _Timer,
                                    request: Request) -> Response:
        """A reply to a prompt the chat template does not render: the raw prompt, or a fill-in-the-middle one."""
        fields, stop = sampling_fields(body.options, service.settings.max_reply_tokens)
        completion = _validated(CompletionRequest, {"model": service.model_id, "prompt": body.prompt,
                                                    "logprobs": body.top_logprobs if body.logprobs else None})
        completion = completion.model_copy(update=fields)  # as in _chat_body
        if body.suffix:
            [prompt] = await service.infill_prompts([body.prompt], body.suffix)
        else:
            [prompt] = await service.text_prompts(completion.prompts)
        if body.debug_render_only:
            rendered = _text_of(service.engine.backend, prompt) if body.suffix else body.prompt
            debug = DebugResponse(model=body.model, created_at=created_at(), debug_info=DebugRender(rendered_template=rendered))
            return JSONResponse(debug.model_dump(by_alias=True))
        generation = service.generation_settings(completion, completion.reply_limit, logprobs=completion.logprobs)
        if stop is not None:
            generation = replace(generation, stop=stop)
        response_format = _response_format(body.format)
        if response_format is not None:
            constraint = _validated(ResponseFormat, response_format).constraint()
            generation = replace(generation, constraint=constraint)
            await run_in_threadpool(tokenizer_for, service.engine.backend)
        writer = _ReplyWriter(None, service, body.model, timer, chat=False, raw_reply=service.submit([(prompt, generation)]))
        if body.stream:
            return ndjson(writer.stream())
        return JSONResponse(await writer.whole(request))


def _refuse_generate_fields(body: GenerateRequest) -> None:
    """Ollama's generate fields that localchat does not implement, refused by name when set."""
    refused = [
        ("images", bool(body.images), "localchat serves text models, which cannot read images"),
        ("template", bool(body.template), "localchat renders the model's own chat template; use raw to send a prompt as is"),
        ("width", body.width is not None, "localchat generates no images"),
        ("height", body.height is not None, "localchat generates no images"),
        ("steps", body.steps is not None, "localchat generates no images"),
    ]
    for name, given, why in refused:
        if given:
            raise APIError(400, f"{name}: {why}", code="unsupported_parameter", param=name)
    if body.raw and (body.system or body.context):
        raise APIError(400, "raw mode does not support template, system, or context", param="raw")
    if body.suffix and (body.system or body.context):
        raise APIError(400, "suffix: fill-in-the-middle takes the code before and after the gap alone, without "
                            "system or context", param="suffix")


def _text_of(backend: Backend, tokens: Sequence[int]) -> str:
    """Tokens as text, control tokens as the vocabulary spells them (what Ollama's detokenize gives)."""
    return b"".join(backend.token_bytes(token) or backend.token_text(token).encode() for token in tokens).decode(errors="replace")


class _ReplyWriter:
    """A reply as Ollama's chat (`chat`) or generate responses: streamed lines, or one body."""

    def __init__(self, run: ChatRun | None, service: CompletionService, model: str, timer: _Timer, *, chat: bool,
                 raw_reply: PendingReplies | None = None) -> None:
        self.run = run
        self.reply: PendingReplies = run.replies if run is not None else raw_reply  # type: ignore[assignment]
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
        self._add(said, self.run.read(0, delta.text))
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
        context = None
        if done:
            counters = self.timer.metrics(stats).model_dump()
            done_reason = "length" if stats is not None and stats.finish_reason == "length" else "stop"
            if self.run is not None and stats is not None:  # a raw prompt has none, as Ollama gives none
                context = [*self.run.prompt, *stats.text_ids]  # as Ollama's: the prompt and the text returned
        if self.chat:
            message = ReplyMessage(content=content, thinking=thinking, tool_calls=calls)
            return ChatResponse(model=self.model, created_at=stamp or created_at(), message=message, done=done,
                                done_reason=done_reason, logprobs=logprobs, **counters)
        return GenerateResponse(model=self.model, created_at=stamp or created_at(), response=content, thinking=thinking, done=done,
                                done_reason=done_reason, context=context, logprobs=logprobs, **counters)

    def _finish(self, said: _Reply) -> list[ToolCallOut] | None:
        """The reply's end: what the reader held back, and its calls (a call whose arguments are cut
        short is no call: its text joins the content)."""
        if self.run is None:
            return None
        reader = self.run.readers[0]
        self._add(said, reader.finish())
        calls = []
        for number, call in enumerate(reader.message().tool_calls or ()):
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
            self._add(said, self.run.readers[0].start())
            if said.content or said.thinking:
                yield self._line(said)
        try:
            async for _, delta in self.reply.deltas():
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
        yield self._line(said, done=True, stats=self.reply.stats[0], calls=calls)

    async def whole(self, request: Request) -> dict[str, Any]:
        said = _Reply.empty()
        if self.run is not None:
            self._add(said, self.run.readers[0].start())

        def read(_: int, delta: TextDelta) -> None:
            part = self._parts(delta)
            said.content.extend(part.content)
            said.thinking.extend(part.thinking)
            said.logprobs.extend(part.logprobs)

        await self.service.read_whole(self.reply, request, read)
        calls = self._finish(said)
        return self._line(said, done=True, stats=self.reply.stats[0], calls=calls).model_dump()


def ollama_router(models: ModelRouter) -> APIRouter:
    """The routes of Ollama's inference API."""
    routes = OllamaRoutes(models)
    router = APIRouter(tags=["Ollama"], route_class=WellFormedRoute)
    router.add_api_route("/api/chat", routes.chat, methods=["POST"], response_model=ChatResponse,
                         responses={**INFERENCE_ERRORS, **NDJSON_STREAM}, summary="Ollama's chat")
    router.add_api_route("/api/generate", routes.generate, methods=["POST"], response_model=GenerateResponse,
                         responses={**INFERENCE_ERRORS, **NDJSON_STREAM}, summary="Ollama's generate")
    return router

