"""llama-server's own routes that apps, editor plugins and llama.cpp clients call: POST /completion (and
/completions: SillyTavern's llama.cpp source, llama.cpp's examples and scripts), /infill (llama.vim, llama.vscode),
/tokenize and /detokenize (llama.vscode counts its agent's prompts with /tokenize), GET /props (llama.cpp's web UI and
SillyTavern read the context size, default settings and chat template there) and GET /slots. Each answers for the
model its `model` names (a query parameter for the GETs), the server's first by default.

/completion continues its `prompt` raw, as llama-server reads it: a text (control tokens' text read as those tokens,
the model's BOS first where it wants one), token ids, or both mixed; a list with no token id at its top is a list of
prompts, answered with a list of results. /infill fills the gap between `input_prefix` + `prompt` (the cursor's line
before it) and `input_suffix`, with `input_extra` (chunks of other files) before it, laid out as llama-server lays
them out (localchat.infill). Both queue their replies on the model's scheduler as /v1/completions does, and honour
what clients send as llama-server reads it: `n_predict` (-1: no limit; 0: the prompt and one token, which the editor
plugins send to warm the cache), `n_cmpl` or `n` (that many completions of each prompt: a list answers), `stop`, the
sampler fields, `samplers` (the stages to run: those left out are off, temperature included, whose absence draws at
1), `n_indent`, `t_max_predict_ms`, `response_fields` and `stream` (events of {"content"}, then the result; no [DONE],
as llama-server ends). /completion also takes `n_probs` (completion_probabilities: log-probabilities of the raw
logits, as llama-server's default), `return_tokens` (the reply's token ids; a stream's events carry theirs) and
logit_bias as llama-server's [token id, bias] pairs. The result has llama-server's fields: `tokens_predicted`,
`tokens_evaluated`, `stop_type` and `stopping_word`, `truncated` (the context filled), `timings`,
`generation_settings`.

Differences: /infill reads `prompt` as text, as the prefix is (llama-server reads control tokens in it), and its
`infill` sampler stage (which merges candidates that begin alike and favours ending where an end is likely) is
accepted and not run. /completion accepts the stages localchat lacks in `samplers` (typ_p, top_n_sigma, xtc,
adaptive_p: SillyTavern names them all) and their settings while they leave them off (UNRUN_SETTINGS); a setting that
turns one on, a grammar or a JSON schema is refused in one line. `tokens` leave out the end-of-generation token that
llama-server counts in. `cache_prompt`, `id_slot` and `t_max_prompt_ms` are accepted: localchat always reuses the
cache, picks its own slot, and llama-server does not apply the last either. /slots is on, as llama-server's is by
default; localchat's scheduler tells how many slots are busy, not which, so the first that many show processing.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError

from localchat.backends.base import Backend, SamplerSettings, TokenLogprob
from localchat.errors import ContextOverflowError
from localchat.infill import UNNAMED_FILE, RepositoryFile
from localchat.scheduler import ReplyDone, TextDelta
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.logprobs import LOWEST_LOGPROB
from localchat.server.logprobs import TokenPiece as PieceBytes
from localchat.server.replies import PendingReplies, ReplyFailedError
from localchat.server.routing import choice_settings
from localchat.server.schemas import (
    MAX_CHOICES,
    MAX_LOGIT_BIAS,
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
                  "adaptive_p", "adaptive-p", "y", "x", "s", "a"}


class LlamaServerFields(SamplingFields):
    """What llama-server's completion routes (/completion, /infill) take besides the prompt (the module's docstring)."""

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


class RepositoryChunk(_Request):
    """A chunk of another file of the project."""

    text: str
    filename: str = UNNAMED_FILE


class InfillRequest(LlamaServerFields):
    """llama-server's /infill body, as llama.vim and llama.vscode send it (see the module's docstring)."""

    input_prefix: str = Field(description="the text before the cursor's line")
    input_suffix: str = Field(description="the text after the cursor")
    prompt: str = Field("", description="the cursor's line before the cursor: it ends the prefix")
    input_extra: list[RepositoryChunk] = Field(
        default_factory=list, description="chunks of the project's other files, laid out before the gap's file")


# A prompt's pieces as llama-server takes them: texts and token ids, in order.
PromptPiece = Annotated[int, Field(ge=0)] | str
MixedPrompt = Annotated[list[PromptPiece], Field(min_length=1)]


class PromptObject(_Request):
    """llama-server's prompt as an object, its form for prompts with images or sound (localchat's models read text)."""

    prompt_string: Annotated[str | MixedPrompt, one_of("a text, or texts and token ids (integers >= 0)")]
    multimodal_data: list[str] = Field(default_factory=list, description="base64 media: refused, localchat reads text")


class CompletionRequest(LlamaServerFields):
    """llama-server's /completion body, as SillyTavern and llama.cpp's examples send it (see the module's docstring)."""

    prompt: Annotated[str | list[PromptPiece | MixedPrompt | PromptObject], one_of(
        "a text, token ids (integers >= 0), texts and token ids mixed, or a list of such prompts")] = Field(
        description="a text, token ids, or both mixed (a text first gets the model's BOS); a list without a token id "
                    "at its top is a list of prompts, answered with a list")
    n_probs: int = Field(0, ge=0, description="each token's log-probability and this many likeliest alternatives' "
                                              "(completion_probabilities), from the raw logits")
    return_tokens: bool = Field(False, description="the reply's token ids in `tokens`")

    @field_validator("samplers", mode="before")
    @classmethod
    def _without_missing_stages(cls, samplers: Any) -> Any:
        """llama-server's stages localchat lacks, left out: SillyTavern sends its whole chain (typ_p, top_n_sigma, xtc
        and adaptive_p among them) with those stages off, and a setting that would turn one on is refused
        (UNRUN_SETTINGS)."""
        if isinstance(samplers, str):
            return "".join(letter for letter in samplers if letter not in MISSING_STAGES)
        if isinstance(samplers, list):
            return [name for name in samplers if name not in MISSING_STAGES]
        return samplers

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _pairs_as_token_keys(cls, biases: Any) -> Any:
        """llama-server's list of [token id, bias] pairs (false: a ban) as OpenAI's object, which SamplingFields then
        checks; SillyTavern sends an empty list. A pair naming a text is refused as the object's text keys are."""
        if not isinstance(biases, list):
            return biases
        keyed: dict[str, Any] = {}
        for pair in biases:
            if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int):
                raise PydanticCustomError("logit_bias_pair", "pairs must be [token id, bias], e.g. {example}, not {pair}",
                                          {"example": "[15043, -1] or [15043, false] for a ban", "pair": json.dumps(pair)})
            keyed[str(pair[0])] = -MAX_LOGIT_BIAS if pair[1] is False else pair[1]
        return keyed

    @property
    def prompts(self) -> list[list[int | str]]:
        """The prompts to answer as llama-server splits them, each a list of texts and token ids; APIError for a list
        of none, images, or more choices than a request may ask for."""
        if isinstance(self.prompt, str):
            prompts: list[list[int | str]] = [[self.prompt]]
        elif any(type(item) is int for item in self.prompt):
            if not all(isinstance(item, int | str) for item in self.prompt):
                raise APIError(400, "prompt: a prompt with token ids at its top holds texts and token ids only; send a "
                                    "list of prompts as a list of texts or lists", param="prompt")
            prompts = [list(self.prompt)]  # type: ignore[arg-type]
        else:
            prompts = [_prompt_pieces(item) for item in self.prompt]  # type: ignore[arg-type]
        if not prompts:
            raise APIError(400, "prompt: the list of prompts is empty", param="prompt")
        if len(prompts) * self.choices > MAX_CHOICES:
            raise APIError(400, f"prompt: {len(prompts)} prompts times n_cmpl={self.choices} ask for "
                                f"{len(prompts) * self.choices} completions; a request may ask for at most {MAX_CHOICES}",
                           param="prompt")
        return prompts


def _prompt_pieces(prompt: str | list[int | str] | PromptObject) -> list[int | str]:
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data:
            raise APIError(400, "prompt: multimodal_data is not supported: localchat's models read text; send the "
                                "prompt_string alone", code="unsupported_parameter", param="prompt")
        prompt = prompt.prompt_string
    return [prompt] if isinstance(prompt, str) else list(prompt)


def prompt_tokens(backend: Backend, pieces: Sequence[int | str]) -> list[int]:
    """A prompt's tokens as llama-server reads it: its texts with control tokens' text read as those tokens, the BOS
    before a text that comes first where the model wants one; its token ids as they are."""
    tokens: list[int] = []
    for position, piece in enumerate(pieces):
        if isinstance(piece, str):
            tokens += backend.tokenize(piece, add_bos=position == 0 and backend.info.add_bos, special=True)
        else:
            tokens.append(piece)
    return tokens


@dataclass(frozen=True)
class UnrunSetting:
    """A llama-server setting of a stage or output localchat does not have, and the values that leave it off there."""

    off: Callable[[Any], bool]
    hint: str


def _number_where(test: Callable[[float], bool]) -> Callable[[Any], bool]:
    return lambda value: type(value) in (int, float) and test(value)


# /completion's settings of what localchat does not run: sent off (as SillyTavern sends them) they are accepted, as the
# stages they name in `samplers`; on, they are refused.
UNRUN_SETTINGS: dict[str, UnrunSetting] = {
    "typical_p": UnrunSetting(_number_where(lambda p: p >= 1), "leave it out or send 1"),
    "top_n_sigma": UnrunSetting(_number_where(lambda n: n <= 0), "leave it out or send 0 or less"),
    "xtc_probability": UnrunSetting(_number_where(lambda p: p <= 0), "leave it out or send 0"),
    "mirostat": UnrunSetting(_number_where(lambda mode: mode == 0), "leave it out or send 0"),
    "dynatemp_range": UnrunSetting(_number_where(lambda span: span <= 0), "leave it out or send 0"),
    "adaptive_target": UnrunSetting(_number_where(lambda target: target < 0), "leave it out or send a negative number"),
    "grammar": UnrunSetting(lambda grammar: grammar == "", 'leave it out or send ""'),
    "json_schema": UnrunSetting(lambda _: False, "leave it out (/v1/chat/completions' response_format holds a reply "
                                                 "to a JSON schema)"),
    "post_sampling_probs": UnrunSetting(lambda value: value is False, "leave it out: n_probs gives the raw logits' "
                                                                      "log-probabilities"),
}


def refuse_unrun_settings(extra: dict[str, Any] | None) -> None:
    """APIError for the first of a request's undeclared fields that turns on what localchat does not run."""
    for name, value in (extra or {}).items():
        setting = UNRUN_SETTINGS.get(name)
        if setting is not None and not setting.off(value):
            raise APIError(400, f"{name}: localchat does not run this; {setting.hint}",
                           code="unsupported_parameter", param=name)


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


def generation_settings_json(n_ctx: int, sampler: SamplerSettings, generation: GenerationSettings, *, stream: bool,
                             n_probs: int = 0) -> dict[str, Any]:
    """A reply's settings as llama-server's generation_settings show them (/props: the defaults')."""
    limit = generation.max_tokens
    return {"n_ctx": n_ctx, "n_predict": limit if limit is not None else -1,
            "seed": sampler.seed if sampler.seed is not None else RANDOM_SEED,
            "temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p, "min_p": sampler.min_p,
            "repeat_penalty": sampler.repeat_penalty, "repeat_last_n": sampler.penalty_last_n,
            "presence_penalty": sampler.presence_penalty, "frequency_penalty": sampler.frequency_penalty,
            "dry_multiplier": sampler.dry_multiplier, "dry_base": sampler.dry_base,
            "dry_allowed_length": sampler.dry_allowed_length, "dry_penalty_last_n": sampler.dry_penalty_last_n,
            "ignore_eos": generation.ignore_eos, "n_probs": n_probs, "stop": list(generation.stop), "stream": stream,
            "samplers": run_stages(sampler)}


def _probabilities(entries: Sequence[TokenLogprob], piece: PieceBytes) -> list[dict[str, Any]]:
    """Tokens' log-probabilities as llama-server's completion_probabilities: each token's, with its likeliest's."""
    def token(token_id: int, logprob: float) -> dict[str, Any]:
        data = piece(token_id)
        return {"id": token_id, "token": data.decode("utf-8", errors="ignore"), "bytes": list(data),
                "logprob": max(logprob, LOWEST_LOGPROB)}

    return [{**token(entry.token, entry.logprob), "top_logprobs": [token(t, lp) for t, lp in entry.top]}
            for entry in entries]


@dataclass
class CompletionRun:
    """One /completion or /infill request's replies under way, each with its prompt, its stops, the text it kept and
    its tokens' log-probabilities (when asked for: n_probs, or streamed return_tokens)."""

    service: CompletionService
    body: LlamaServerFields
    generation: GenerationSettings
    replies: PendingReplies
    prompts: list[list[int]]
    stops: list[EditorStops]
    texts: list[list[str]]
    logprobs: list[list[TokenLogprob]]
    n_probs: int = 0
    return_tokens: bool = False

    @classmethod
    def start(cls, service: CompletionService, body: LlamaServerFields, generation: GenerationSettings,
              prompts: Sequence[list[int]], prompt_field: str, *, n_probs: int = 0,
              return_tokens: bool = False) -> CompletionRun:
        """Queues `body.choices` replies to each of `prompts`, in that order; a prompt longer than the context is a
        400 naming `prompt_field`."""
        choices = choice_settings(generation, body.choices)
        try:
            replies = service.submit([(prompt, settings) for prompt in prompts for settings in choices])
        except ContextOverflowError as error:
            raise APIError(400, str(error), code="context_length_exceeded", param=prompt_field) from None
        limit_s = body.t_max_predict_ms / 1e3 if body.t_max_predict_ms > 0 else None
        count = len(prompts) * len(choices)
        return cls(service, body, generation, replies, [prompt for prompt in prompts for _ in choices],
                   [EditorStops(body.n_indent, limit_s) for _ in range(count)], [[] for _ in range(count)],
                   [[] for _ in range(count)], n_probs, return_tokens)

    def read(self, index: int, delta: TextDelta) -> None:
        """Reads `delta` into reply `index` (CompletionService.read_whole's reader)."""
        self.keep(index, delta)

    def keep(self, index: int, delta: TextDelta) -> tuple[str, Sequence[TokenLogprob]]:
        """The text reply `index` keeps of `delta`, and its tokens' log-probabilities; a reply that a stop ended is
        cancelled, what comes after dropped."""
        stops = self.stops[index]
        if stops.ended:
            return "", ()
        kept = stops.feed(delta.text, time.monotonic())
        if stops.ended:
            self.replies.cancel(index)
        self.texts[index].append(kept)
        self.logprobs[index].extend(delta.logprobs)
        return kept, delta.logprobs

    @property
    def _piece(self) -> PieceBytes:
        """A token's bytes as the reply's text has them (a raw completion shows no control token spelled out)."""
        return self.service.engine.backend.token_bytes

    def partials(self, index: int, text: str, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """The streamed pieces of reply `index` for a piece of its text: one, or one per token where its tokens were
        asked for, as llama-server sends them (those whose text was held back, by a stop string's start or a part of a
        character, with none; the last with it all)."""
        pieces: list[tuple[str, Sequence[TokenLogprob]]] = [(text, ())] if not logprobs else [("", (entry,)) for entry in logprobs[:-1]] + [(text, logprobs[-1:])]
        events = []
        for content, entries in pieces:
            event = {"index": index, "content": content, "tokens": [entry.token for entry in entries], "stop": False,
                     "id_slot": -1}
            if self.n_probs:
                event["completion_probabilities"] = _probabilities(entries, self._piece)
            events.append(event)
        return events

    def result(self, index: int, stats: GenerationStats, *, stream: bool) -> dict[str, Any]:
        """Reply `index`'s result as llama-server writes it (its text and tokens left out of a stream's: the events
        had them)."""
        stops = self.stops[index]
        if not stops.ended:
            self.texts[index].append(stops.finish())
        content = "".join(self.texts[index])
        backend = self.service.engine.backend
        sampler = stats.sampler or self.generation.sampler or SamplerSettings()
        limit = self.generation.max_tokens
        stop_type = _stop_type(stats, stops.ended)
        # llama-server counts the end-of-generation token among those it generated (localchat's reply leaves it out).
        generated = stats.completion_tokens + (stop_type == "eos")
        prompt = self.prompts[index]
        result = {
            "index": index, "content": "" if stream else content,
            "tokens": list(stats.completion_ids) if self.return_tokens and not stream else [], "id_slot": -1,
            "stop": True, "model": self.service.model_id, "tokens_predicted": generated,
            "tokens_evaluated": stats.prompt_tokens,
            "generation_settings": generation_settings_json(backend.n_ctx, sampler, self.generation, stream=stream,
                                                            n_probs=self.n_probs),
            "prompt": b"".join(_token_bytes(backend, token) for token in prompt).decode("utf-8", errors="replace"),
            "has_new_line": "\n" in content,
            "truncated": stats.finish_reason == "length" and (limit is None or stats.completion_tokens < limit),
            "stop_type": stop_type,
            "stopping_word": _stopping_word(backend, stats, content, self.generation.stop) if stop_type == "word" else "",
            # The tokens in the reply's KV cache: the last one generated is never evaluated.
            "tokens_cached": stats.prompt_tokens + max(generated - 1, 0),
            "timings": _timings(stats, generated),
        }
        if self.n_probs and not stream:
            result["completion_probabilities"] = _probabilities(self.logprobs[index], self._piece)
        fields = self.body.response_fields
        return result if fields is None else response_fields(result, fields)


def _stopping_word(backend: Backend, stats: GenerationStats, content: str, stops: Sequence[str]) -> str:
    """The stop string that ended a reply: the first of `stops` whose text the reply's tokens hold after `content`."""
    said = b"".join(backend.token_bytes(token) for token in stats.completion_ids).decode("utf-8", errors="replace")
    return next((stop for stop in stops if said.startswith(stop, len(content))), "")


def _event(payload: dict[str, Any]) -> str:
    # Compact, as llama-server writes JSON: llama.vim looks for `"content":"` in the raw body.
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def _generation(service: CompletionService, body: LlamaServerFields, logprobs: int | None = None) -> GenerationSettings:
    """The request's generation settings, the sampler stages its `samplers` leaves out turned off."""
    generation = service.generation_settings(body, body.reply_limit, logprobs=logprobs)
    if body.samplers is not None and generation.sampler is not None:
        generation = dataclasses.replace(generation, sampler=with_stages(generation.sampler, sampler_stages(body.samplers)))
    return generation


class LlamaServerRoutes:
    def __init__(self, models: ModelRouter) -> None:
        self.models = models

    async def completion(self, body: CompletionRequest, request: Request) -> Response:
        """llama-server's text completion (the module's docstring)."""
        refuse_unrun_settings(body.model_extra)
        prompts = body.prompts
        service = self.models.service(await self.models.lease(request, body.model))
        backend = service.engine.backend
        n_vocab = backend.info.n_vocab
        outside = next((piece for prompt in prompts for piece in prompt if type(piece) is int and piece >= n_vocab), None)
        if outside is not None:
            raise APIError(400, f"prompt: token {outside} is not in the model's vocabulary (ids 0 to {n_vocab - 1})",
                           param="prompt")
        # A stream's events carry their tokens' ids, which only the log-probabilities record.
        logprobs = body.n_probs if body.n_probs else 0 if body.return_tokens and body.stream else None
        generation = _generation(service, body, logprobs)
        tokens = await run_in_threadpool(lambda: [prompt_tokens(backend, prompt) for prompt in prompts])
        run = CompletionRun.start(service, body, generation, tokens, "prompt", n_probs=body.n_probs,
                                  return_tokens=body.return_tokens)
        return await self._answer(run, request)

    async def infill(self, body: InfillRequest, request: Request) -> Response:
        """llama-server's fill-in-the-middle for editors (the module's docstring)."""
        service = await self.models.service_for(request, body, "infill")
        if service.engine.backend.info.fim is None:
            raise APIError(400, f"/infill needs a model with fill-in-the-middle tokens, which {service.model_id} has "
                                "not (a code model such as Qwen2.5-Coder or CodeLlama has them)",
                           code="unsupported_parameter", param="model")
        generation = _generation(service, body)
        repository = [RepositoryFile(chunk.text, chunk.filename) for chunk in body.input_extra]
        prompts = await service.infill_prompts([body.input_prefix], body.input_suffix, middle=body.prompt,
                                               repository=repository)
        return await self._answer(CompletionRun.start(service, body, generation, prompts, "input_extra"), request)

    async def _answer(self, run: CompletionRun, request: Request) -> Response:
        """The results (one alone, else a list), or their stream of events."""
        if run.body.stream:
            return StreamingResponse(self._events(run), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        await run.service.read_whole(run.replies, request, run.read)
        results = [run.result(index, stats, stream=False) for index, stats in enumerate(run.replies.stats)]
        return JSONResponse(results[0] if len(results) == 1 else results)

    @staticmethod
    async def _events(run: CompletionRun) -> AsyncIterator[str]:
        """Each piece of text as {"index", "content", "stop": false, ...}, each reply's result as it ends."""
        try:
            async for index, item in run.replies.events():
                if isinstance(item, ReplyDone):
                    yield _event(run.result(index, item.stats, stream=True))
                else:
                    text, logprobs = run.keep(index, item)
                    if text or logprobs:
                        for event in run.partials(index, text, logprobs):
                            yield _event(event)
        except ReplyFailedError as error:
            yield _event({"error": {"code": 500, "message": str(error), "type": "server_error"}})

    async def props(self, request: Request, model: str | None = None) -> dict[str, Any]:
        """llama-server's server properties for the model named (`model`; none: the first)."""
        service = self.models.service(await self.models.lease(request, model))
        engine = service.engine
        n_ctx = engine.backend.n_ctx
        defaults = GenerationSettings(max_tokens=self.models.settings.max_reply_tokens,
                                      sampler=service.sampler_defaults.settings)
        return {
            "default_generation_settings": {"n_ctx": n_ctx, "params": generation_settings_json(
                n_ctx, service.sampler_defaults.settings, defaults, stream=False)},
            "total_slots": service.scheduler.n_slots, "model_alias": service.model_id,
            "model_path": str(engine.model_plan.model.path),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
            "chat_template": engine.template.source, "bos_token": engine.template.bos_token,
            "eos_token": engine.template.eos_token, "build_info": f"localchat ({engine.backend_label})",
            "is_sleeping": False,
        }

    async def slots(self, request: Request, model: str | None = None,
                    fail_on_no_slot: str | None = None) -> list[dict[str, Any]]:
        """llama-server's slots of the model named (`model`; none: the first). localchat's scheduler tells how many
        are busy, not which: the first that many are shown processing."""
        service = self.models.service(await self.models.lease(request, model))
        scheduler = service.scheduler
        busy = scheduler.busy_slots
        if fail_on_no_slot and busy >= scheduler.n_slots:
            raise APIError(503, "no slot available", code="unavailable_error")
        n_ctx = service.engine.backend.n_ctx
        return [{"id": slot, "n_ctx": n_ctx, "speculative": self.models.settings.lookup_draft > 0,
                 "is_processing": slot < busy} for slot in range(scheduler.n_slots)]

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


# /completion's and /infill's answer: one result (a list of them for several), each with the fields response_fields names;
# streamed, server-sent events (the schema describes one), each `data` a JSON piece or result, no [DONE].
COMPLETION_RESULT = {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}
COMPLETION_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
COMPLETION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: {"content": {"application/json": {"schema": COMPLETION_RESULT},
                                "text/event-stream": {"schema": COMPLETION_EVENT}}}}


def llama_server_router(models: ModelRouter) -> APIRouter:
    routes = LlamaServerRoutes(models)
    router = APIRouter(route_class=WellFormedRoute)
    for path in ("/completion", "/completions"):
        router.add_api_route(path, routes.completion, methods=["POST"], response_class=Response,
                             responses=COMPLETION_RESPONSES, summary="llama-server's text completion (SillyTavern's "
                             "llama.cpp source, llama.cpp's examples)", tags=["llama-server"])
    router.add_api_route("/infill", routes.infill, methods=["POST"], response_class=Response, responses=COMPLETION_RESPONSES,
                         summary="llama-server's fill-in-the-middle for editors (llama.vim, llama.vscode)",
                         tags=["llama-server"])
    router.add_api_route("/props", routes.props, methods=["GET"], responses=ERRORS,
                         summary="llama-server's server properties: context size, default settings, chat template",
                         tags=["llama-server"])
    router.add_api_route("/slots", routes.slots, methods=["GET"], responses=ERRORS,
                         summary="llama-server's slots and whether each is processing", tags=["llama-server"])
    router.add_api_route("/tokenize", routes.tokenize, methods=["POST"], response_model=TokenizeResponse,
                         responses=ERRORS, summary="llama-server's tokenizer", tags=["llama-server"])
    router.add_api_route("/detokenize", routes.detokenize, methods=["POST"], response_model=DetokenizeResponse,
                         responses=ERRORS, summary="llama-server's detokenizer", tags=["llama-server"])
    return router
