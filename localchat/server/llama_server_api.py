"""llama-server's own routes that editor plugins and llama.cpp clients call: POST /infill (llama.vim, llama.vscode),
/tokenize and /detokenize (llama.vscode counts its agent's prompts with /tokenize; llama.cpp tokenizer clients
use both).

/infill fills the gap between `input_prefix` + `prompt` (the cursor's line before it) and `input_suffix`, with
`input_extra` (chunks of other files) before it, laid out as llama-server lays them out (localchat.infill), and
queues the reply on the model's scheduler as /v1/completions does. What the plugins send is honoured as
llama-server reads it: `n_predict` (-1: no limit; 0: the prompt and one token, which the plugins send to warm
the cache), `n_cmpl` (that many completions: a list answers), `stop`, the sampler fields, `samplers` (the stages
to run: those left out are off, temperature included, whose absence draws at 1), `n_indent`, `t_max_predict_ms`,
`response_fields` and `stream` (events of {"content"}, then the result; no [DONE], as llama-server ends). Two
differences: `prompt` is read as text, as the prefix is (llama-server reads control tokens in it), and its
`infill` sampler stage (which merges candidates that begin alike and favours ending where an end is likely) is
accepted and not run. `cache_prompt`, `id_slot` and `t_max_prompt_ms` are accepted: localchat always reuses the
cache, picks its own slot, and llama-server does not apply the last either.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError

from localchat.backends.base import Backend, SamplerSettings
from localchat.errors import ContextOverflowError
from localchat.infill import UNNAMED_FILE, RepositoryFile
from localchat.scheduler import ReplyDone, TextDelta
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.replies import PendingReplies, ReplyFailedError
from localchat.server.routing import choice_settings
from localchat.server.schemas import (
    MAX_CHOICES,
    SamplingFields,
    StopString,
    _Request,
    error_responses,
    one_of,
)
from localchat.session import GenerationSettings, GenerationStats

if TYPE_CHECKING:
    from localchat.server.routing import CompletionService, ModelRouter

ERRORS = error_responses(
    "Invalid request: malformed JSON, wrong types, a field localchat does not implement, a model without "
    "fill-in-the-middle tokens, a prompt longer than the context",
    "Every slot is busy and the queue is full, or the model named needs the room of models that are busy",
)
# llama-server's seed for "none" (LLAMA_DEFAULT_SEED), as its generation_settings show a random one.
RANDOM_SEED = 0xFFFFFFFF

# The sampler stages localchat runs, in its chain's order (llama-server's default order less the stages localchat
# lacks), with what leaving each out of `samplers` sets. `infill` is accepted and not run (see the module's doc).
SAMPLER_STAGES: dict[str, dict[str, float]] = {
    "penalties": {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
    "dry": {"dry_multiplier": 0.0},
    "top_k": {"top_k": 0},
    "top_p": {"top_p": 1.0},
    "min_p": {"min_p": 0.0},
    "temperature": {"temperature": 1.0},
}
UNRUN_STAGE = "infill"
# llama-server's other spellings of those stages, and its one-letter form ("samplers": "kpt").
STAGE_NAMES = {"top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "min-p": "min_p", "temp": "temperature"}
STAGE_LETTERS = {"e": "penalties", "d": "dry", "k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature",
                 "i": UNRUN_STAGE}
# llama-server's stages localchat does not have.
MISSING_STAGES = {"typ_p", "typical_p", "typ-p", "typical-p", "typical", "typ", "xtc", "top_n_sigma", "top-n-sigma",
                  "y", "x", "s"}


class RepositoryChunk(_Request):
    """A chunk of another file of the project."""

    text: str
    filename: str = UNNAMED_FILE


class InfillRequest(SamplingFields):
    """llama-server's /infill body, as llama.vim and llama.vscode send it (see the module's docstring)."""

    input_prefix: str = Field(description="the text before the cursor's line")
    input_suffix: str = Field(description="the text after the cursor")
    prompt: str = Field("", description="the cursor's line before the cursor: it ends the prefix")
    input_extra: list[RepositoryChunk] = Field(
        default_factory=list, description="chunks of the project's other files, laid out before the gap's file")
    n_predict: int = Field(-1, ge=-1, description="most tokens to generate; -1: no limit; 0: one, as llama-server")
    n_cmpl: int | None = Field(None, ge=1, le=MAX_CHOICES, description="completions to generate (n's other name); "
                                                                        "more than one answers with a list")
    stop: Annotated[StopString | list[StopString], one_of("a string or a list of strings, none empty")] | None = Field(
        None, description="the reply ends before any of these")
    samplers: Annotated[list[str] | str, one_of("a list of stage names or a string of their letters")] | None = Field(
        None, description=f"the sampler stages to run, those left out off (temperature's absence draws at 1): "
                          f"{', '.join(SAMPLER_STAGES)}, in that order; {UNRUN_STAGE} is accepted and not run")
    n_indent: int = Field(0, ge=0, description="a line after the first indented less than this ends the reply")
    t_max_predict_ms: int = Field(0, description="once this long has passed since the first token, the reply ends "
                                                 "at its next newline; 0 or less: never")
    response_fields: list[str] | None = Field(
        None, description="the result's fields to answer with (a/b: field b of a, under the key a/b); the others and "
                          "those missing are left out")

    @field_validator("samplers")
    @classmethod
    def _known_stages(cls, samplers: list[str] | str | None) -> list[str] | str | None:
        if samplers is not None:
            sampler_stages(samplers)
        return samplers

    @property
    def reply_limit(self) -> int | None:
        if "n_predict" not in self.model_fields_set:
            return self.max_tokens
        return None if self.n_predict < 0 else max(self.n_predict, 1)

    @property
    def reply_limit_field(self) -> str:
        return "n_predict" if "n_predict" in self.model_fields_set else "max_tokens"

    @property
    def choices(self) -> int:
        return self.n_cmpl if self.n_cmpl is not None else self.n


def sampler_stages(samplers: list[str] | str) -> list[str]:
    """The stages `samplers` names, as localchat names them; a validation error (a 400 naming the field) for one
    it does not run or an order its chain does not have."""
    if isinstance(samplers, str):
        unknown = [letter for letter in samplers if letter not in STAGE_LETTERS]
        if unknown:
            raise _refused(f"{unknown[0]!r} is not a stage localchat runs; it runs "
                           f"{', '.join(f'{k} ({v})' for k, v in STAGE_LETTERS.items())}")
        return [STAGE_LETTERS[letter] for letter in samplers]
    stages = []
    for name in samplers:
        stage = STAGE_NAMES.get(name, name)
        if stage in MISSING_STAGES:
            raise _refused(f"localchat has no {name} stage; leave it out")
        if stage not in SAMPLER_STAGES and stage != UNRUN_STAGE:
            raise _refused(f"{name!r} is not a stage localchat runs: {', '.join([*SAMPLER_STAGES, UNRUN_STAGE])}")
        stages.append(stage)
    run = [stage for stage in stages if stage != UNRUN_STAGE]
    order = list(SAMPLER_STAGES)
    if run != sorted(run, key=order.index):
        raise _refused(f"localchat runs its stages in the order {', '.join(order)}; {', '.join(run)} is another")
    return stages


def _refused(message: str) -> PydanticCustomError:
    # The message as it is: no braces are read as placeholders.
    return PydanticCustomError("samplers", "{message}", {"message": message})


def with_stages(sampler: SamplerSettings, stages: Sequence[str]) -> SamplerSettings:
    """`sampler` with the stages `stages` leaves out turned off, as llama-server builds its chain from the list."""
    off: dict[str, Any] = {}
    for stage, settings in SAMPLER_STAGES.items():
        if stage not in stages:
            off |= settings
    return dataclasses.replace(sampler, **off)


def run_stages(sampler: SamplerSettings) -> list[str]:
    """The stages a reply's sampler ran, as llama-server's generation_settings list them (greedy: temperature alone
    after the penalties)."""
    drawn = not sampler.greedy
    on = {"penalties": sampler.repeat_penalized, "dry": sampler.dry, "top_k": drawn and sampler.top_k > 0,
          "top_p": drawn and sampler.top_p < 1.0, "min_p": drawn and sampler.min_p > 0.0,
          "temperature": sampler.temperature != 1.0}
    return [stage for stage in SAMPLER_STAGES if on[stage]]


class EditorStops:
    """llama-server's two stops for editor completions, over one reply's text as it comes.

    `n_indent`: a line after the first whose text starts less indented (spaces and tabs) ends the reply before
    that text, its indentation kept; a blank line counts as unindented. A new line's indentation is held back
    until its first other character decides (llama-server streams it first and cuts the whole result only).
    `t_max_predict_s`: past that time since the first piece, the reply ends after its next newline."""

    def __init__(self, n_indent: int, t_max_predict_s: float | None) -> None:
        self.n_indent = n_indent
        self.t_max_predict_s = t_max_predict_s
        self.started: float | None = None
        self.ended = False
        self._held: str | None = None  # a new line's indentation so far; None: not at a line's start

    def feed(self, text: str, now: float) -> str:
        """The part of `text` the reply keeps; `ended` tells whether the reply ends there."""
        if self.started is None:
            self.started = now
        kept = []
        for char in text:
            if self._held is not None:
                if char in " \t":
                    self._held += char
                    continue
                kept.append(self._held)
                if len(self._held) < self.n_indent:
                    self.ended = True
                    break
                self._held = None
            kept.append(char)
            if char == "\n":
                if self.n_indent > 0:
                    self._held = ""
                if self.t_max_predict_s is not None and now - self.started > self.t_max_predict_s:
                    self.ended = True
                    break
        return "".join(kept)

    def finish(self) -> str:
        """The indentation still held when the reply ends (its last line had nothing else)."""
        held, self._held = self._held or "", None
        return held


def response_fields(result: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """The fields of `result` that `paths` names, as llama-server picks them: a/b is field b of a, kept under the
    key "a/b"; a path to nothing is left out."""
    picked: dict[str, Any] = {}
    for path in paths:
        value: Any = result
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


def _stop_type(stats: GenerationStats, cut: bool) -> Literal["eos", "word", "limit", "none"]:
    if cut or stats.finish_reason == "length":
        return "limit"
    if stats.finish_reason == "stop":
        return "word" if stats.text_tokens is not None else "eos"
    return "none"


def _timings(stats: GenerationStats, predicted_n: int) -> dict[str, float]:
    """llama-server's timings of a reply: prompt tokens evaluated (not cached) and the time they took, tokens
    generated and the time after the first."""
    prompt_n = stats.prompt_tokens - stats.cached_tokens
    prompt_ms = (stats.prefill_s - stats.queued_s) * 1e3
    predicted_ms = stats.decode_s * 1e3
    return {
        "cache_n": stats.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
    }


@dataclass
class InfillRun:
    """One /infill request's replies under way, each with its stops and the text it kept."""

    service: CompletionService
    body: InfillRequest
    generation: GenerationSettings
    replies: PendingReplies
    stops: list[EditorStops]
    texts: list[list[str]]

    def read(self, index: int, delta: TextDelta) -> str:
        """The text reply `index` keeps of `delta`; a reply that a stop ended is cancelled, its later text dropped."""
        stops = self.stops[index]
        if stops.ended:
            return ""
        kept = stops.feed(delta.text, time.monotonic())
        if stops.ended:
            self.replies.cancel(index)
        self.texts[index].append(kept)
        return kept

    def result(self, index: int, stats: GenerationStats, *, stream: bool) -> dict[str, Any]:
        """Reply `index`'s result as llama-server writes it (its text left out of a stream's: the events had it)."""
        stops = self.stops[index]
        if not stops.ended:
            self.texts[index].append(stops.finish())
        content = "".join(self.texts[index])
        sampler = stats.sampler or self.generation.sampler or SamplerSettings()
        limit = self.generation.max_tokens
        n_ctx = self.service.engine.backend.n_ctx
        settings = {"n_ctx": n_ctx, "n_predict": limit if limit is not None else -1,
                    "seed": sampler.seed if sampler.seed is not None else RANDOM_SEED,
                    "temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p,
                    "min_p": sampler.min_p, "repeat_penalty": sampler.repeat_penalty,
                    "repeat_last_n": sampler.penalty_last_n, "presence_penalty": sampler.presence_penalty,
                    "frequency_penalty": sampler.frequency_penalty, "dry_multiplier": sampler.dry_multiplier,
                    "stop": list(self.generation.stop), "stream": stream, "samplers": run_stages(sampler)}
        stop_type = _stop_type(stats, stops.ended)
        # llama-server counts the end-of-generation token among those it generated (localchat's reply leaves it out).
        generated = stats.completion_tokens + (stop_type == "eos")
        result = {
            "index": index, "content": "" if stream else content, "tokens": [], "id_slot": -1, "stop": True,
            "model": self.service.model_id, "tokens_predicted": generated,
            "tokens_evaluated": stats.prompt_tokens, "generation_settings": settings, "has_new_line": "\n" in content,
            "truncated": stats.finish_reason == "length" and (limit is None or stats.completion_tokens < limit),
            # The tokens in the reply's KV cache: the last one generated is never evaluated.
            "stop_type": stop_type, "tokens_cached": stats.prompt_tokens + max(generated - 1, 0),
            "timings": _timings(stats, generated),
        }
        fields = self.body.response_fields
        return result if fields is None else response_fields(result, fields)


def _event(payload: dict[str, Any]) -> str:
    # Compact, as llama-server writes JSON: llama.vim looks for `"content":"` in the raw body.
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


class LlamaServerRoutes:
    def __init__(self, models: ModelRouter) -> None:
        self.models = models

    async def infill(self, body: InfillRequest, request: Request) -> Response:
        """llama-server's fill-in-the-middle for editors (the module's docstring)."""
        service = await self.models.service_for(request, body, "infill")
        if service.engine.backend.info.fim is None:
            raise APIError(400, f"/infill needs a model with fill-in-the-middle tokens, which {service.model_id} has "
                                "not (a code model such as Qwen2.5-Coder or CodeLlama has them)",
                           code="unsupported_parameter", param="model")
        generation = service.generation_settings(body, body.reply_limit)
        if body.samplers is not None and generation.sampler is not None:
            generation = dataclasses.replace(generation, sampler=with_stages(generation.sampler,
                                                                               sampler_stages(body.samplers)))
        repository = [RepositoryFile(chunk.text, chunk.filename) for chunk in body.input_extra]
        [prompt] = await service.infill_prompts([body.input_prefix], body.input_suffix, middle=body.prompt,
                                                repository=repository)
        try:
            replies = service.submit([(prompt, settings) for settings in choice_settings(generation, body.choices)])
        except ContextOverflowError as error:
            raise APIError(400, str(error), code="context_length_exceeded", param="input_extra") from None
        limit_s = body.t_max_predict_ms / 1e3 if body.t_max_predict_ms > 0 else None
        run = InfillRun(service, body, generation, replies, [EditorStops(body.n_indent, limit_s) for _ in range(body.choices)],
                        [[] for _ in range(body.choices)])
        if body.stream:
            return StreamingResponse(self._events(run), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        await service.read_whole(replies, request, run.read)
        results = [run.result(index, stats, stream=False) for index, stats in enumerate(replies.stats)]
        return JSONResponse(results[0] if len(results) == 1 else results)

    @staticmethod
    async def _events(run: InfillRun) -> AsyncIterator[str]:
        """Each piece of text as {"index", "content", "stop": false}, each reply's result as it ends."""
        try:
            async for index, item in run.replies.events():
                if isinstance(item, ReplyDone):
                    yield _event(run.result(index, item.stats, stream=True))
                elif text := run.read(index, item):
                    yield _event({"index": index, "content": text, "stop": False})
        except ReplyFailedError as error:
            yield _event({"error": {"code": 500, "message": str(error), "type": "server_error"}})

    async def tokenize(self, body: TokenizeRequest, request: Request) -> TokenizeResponse:
        """llama-server's tokenizer: control tokens' text read as those tokens unless parse_special is false."""
        backend = (await self.models.lease(request, body.model)).served.engine.backend

        def tokenize() -> TokenizeResponse:
            tokens = backend.tokenize(body.content, add_bos=body.add_special, special=body.parse_special)
            if not body.with_pieces:
                return TokenizeResponse(tokens=tokens)
            return TokenizeResponse(tokens=[TokenPiece(id=token, piece=_piece(_token_bytes(backend, token)))
                                            for token in tokens])

        return await run_in_threadpool(tokenize)

    async def detokenize(self, body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        """The text of token ids, control tokens spelled out (llama-server's)."""
        backend = (await self.models.lease(request, body.model)).served.engine.backend
        n_vocab = backend.info.n_vocab
        outside = next((token for token in body.tokens if token >= n_vocab), None)
        if outside is not None:
            raise APIError(400, f"tokens: {outside} is not in the model's vocabulary (ids 0 to {n_vocab - 1})",
                           param="tokens")
        data = b"".join(_token_bytes(backend, token) for token in body.tokens)
        return DetokenizeResponse(content=data.decode("utf-8", errors="replace"))


def _token_bytes(backend: Backend, token: int) -> bytes:
    """A token's bytes, a control token's text for its none."""
    return bytes(backend.token_bytes(token)) or backend.token_text(token).encode()


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not UTF-8 on their own (a piece of a character), as llama-server."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


class TokenizeRequest(_Request):
    model: str | None = Field(None, description="the served model's id (see /v1/models); omitted means the first")
    content: str
    add_special: bool = Field(False, description="add the BOS token where the model wants one")
    parse_special: bool = Field(True, description="read control tokens' text as those tokens")
    with_pieces: bool = Field(False, description="each token with its text (its bytes where they are no UTF-8)")


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]


class DetokenizeRequest(_Request):
    model: str | None = Field(None, description="the served model's id (see /v1/models); omitted means the first")
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(BaseModel):
    content: str


# /infill's answer: one result (a list of them for n_cmpl > 1), each with the fields response_fields names.
INFILL_RESULT = {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}
INFILL_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: {"content": {"application/json": {"schema": INFILL_RESULT},
                                "text/event-stream": {"schema": {"type": "string"}}}}}


def llama_server_router(models: ModelRouter) -> APIRouter:
    routes = LlamaServerRoutes(models)
    router = APIRouter(route_class=WellFormedRoute)
    router.add_api_route("/infill", routes.infill, methods=["POST"], response_class=Response, responses=INFILL_RESPONSES,
                         summary="llama-server's fill-in-the-middle for editors (llama.vim, llama.vscode)",
                         tags=["llama-server"])
    router.add_api_route("/tokenize", routes.tokenize, methods=["POST"], response_model=TokenizeResponse,
                         responses=ERRORS, summary="llama-server's tokenizer", tags=["llama-server"])
    router.add_api_route("/detokenize", routes.detokenize, methods=["POST"], response_model=DetokenizeResponse,
                         responses=ERRORS, summary="llama-server's detokenizer", tags=["llama-server"])
    return router
