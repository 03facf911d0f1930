"""Request and response bodies of the OpenAI-compatible API; they also make its OpenAPI schema.

Fields a request may send: the ones declared here are honoured. OpenAI's fields that localchat
does not implement and that change what the answer means (`UNSUPPORTED_FIELDS`: the legacy
functions, audio, echo...) get a 400 naming the
field when set, rather than an answer that ignored them. Any other field is accepted and ignored:
OpenAI's harmless ones (user, metadata, store, service_tier, prediction...) and other servers'
extensions, so that clients written for them work (`extra="allow"` keeps them for that check).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from localchat.constraints import JSON_OBJECT_SCHEMA, Constraint
from localchat.errors import InvalidSettingError
from localchat.server.errors import APIError

# OpenAI takes at most 4 stop sequences.
MAX_STOP_STRINGS = 4
# OpenAI's bounds on the alternatives listed per token: chat's top_logprobs, the legacy logprobs.
MAX_TOP_LOGPROBS = 20
MAX_LEGACY_LOGPROBS = 5
# OpenAI's bound on n; here on the choices one request asks for in all (prompts times n), each a reply
# the scheduler decodes (LangChain's OpenAI LLM sends 20 prompts at a time).
MAX_CHOICES = 128
StopString = Annotated[str, Field(min_length=1)]


def one_of(forms: str) -> WrapValidator:
    """A union's refusal as one error saying what the field takes (`forms`), not one per form the value is not,
    each named by pydantic's tag for it ("constrained-str", "list[int]")."""

    def validate(value: Any, validate_form: ValidatorFunctionWrapHandler) -> Any:
        try:
            return validate_form(value)
        except ValidationError:
            raise PydanticCustomError("one_of", "should be {forms}", {"forms": forms}) from None

    return WrapValidator(validate)


Stop = Annotated[StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)],
                 one_of(f"a string or a list of at most {MAX_STOP_STRINGS} strings, none empty")]
FinishReason = Literal["stop", "length", "tool_calls"]
# OpenAI's rule for function names: letters, digits, underscores and dashes, at most 64.
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
# logit_bias: a token id as OpenAI's keys write it, and the bounds of a bias.
TOKEN_ID_KEY = re.compile(r"^(0|[1-9][0-9]*)$")
MAX_LOGIT_BIAS = 100
TokenIdKey = Annotated[str, Field(pattern=TOKEN_ID_KEY.pattern)]


@dataclass(frozen=True)
class Unsupported:
    """A request field localchat does not implement: accepted only with one of `unused` (what
    the field is when it asks for nothing)."""

    unused: tuple[Any, ...]
    hint: str = ""


UNSUPPORTED_FIELDS: dict[str, dict[str, Unsupported]] = {
    "chat": {
        "functions": Unsupported((None, []), "use tools"),
        "function_call": Unsupported((None,), "use tool_choice"),
        "audio": Unsupported((None,), "text only"),
        "modalities": Unsupported((None, ["text"]), "text only"),
        "web_search_options": Unsupported((None,)),
    },
    "completion": {
        "echo": Unsupported((None, False)),
        "best_of": Unsupported((None, 1)),
    },
    # llama-server's /infill (localchat.server.llama_server_api): its other sampler stages and outputs.
    "infill": {
        "n_probs": Unsupported((None, 0), "/v1/completions gives log-probabilities"),
        "grammar": Unsupported((None, "")),
        "json_schema": Unsupported((None, {})),
        "mirostat": Unsupported((None, 0)),
        "typical_p": Unsupported((None, 1, 1.0)),
        "xtc_probability": Unsupported((None, 0, 0.0)),
        "top_n_sigma": Unsupported((None, -1, -1.0)),
        "dynatemp_range": Unsupported((None, 0, 0.0)),
        "return_tokens": Unsupported((None, False)),
    },
    # /v1/responses is stateless, as Ollama's is: nothing is stored, so nothing can be referred to later.
    "responses": {
        "previous_response_id": Unsupported((None,), "this server keeps no responses: send the whole conversation as input"),
        "conversation": Unsupported((None,), "this server keeps no conversations: send the whole conversation as input"),
        "prompt": Unsupported((None,), "stored prompts are OpenAI's: send instructions and input"),
        "background": Unsupported((None, False), "this server keeps no responses to poll: stream instead"),
        "top_logprobs": Unsupported((None, 0), "/v1/chat/completions gives log-probabilities"),
    },
    # Anthropic's Messages API: what runs on Anthropic's servers.
    "messages": {
        "container": Unsupported((None,), "code execution containers are Anthropic's: run code in your app"),
        "mcp_servers": Unsupported((None, []), "this server connects to no MCP servers: give their tools as custom tools "
                                               "and call them from your app"),
    },
}


def unsupported_field(endpoint: str, extra: dict[str, Any] | None) -> tuple[str, str] | None:
    """The first field of `extra` (a request's undeclared fields) that asks for something
    `endpoint` does not implement, with the message to answer it."""
    for name, value in (extra or {}).items():
        field = UNSUPPORTED_FIELDS[endpoint].get(name)
        if field is not None and not any(value == unused and type(value) is type(unused) for unused in field.unused):
            hint = f" ({field.hint})" if field.hint else ""
            return name, f"{name} is not supported by localchat{hint}; leave it out"
    return None


class _Request(BaseModel):
    # Strict: "max_tokens": "100" or 5.5 is a wrong type (a 400), as it is for OpenAI.
    model_config = ConfigDict(extra="ignore", strict=True)


class _TopRequest(_Request):
    """A whole request body: its undeclared fields are kept for `unsupported_field`. A field sent as
    null takes its default, as OpenAI reads it (the openai client sends null for an argument given as None)."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, given: Any) -> Any:
        return {name: value for name, value in given.items() if value is not None} if isinstance(given, dict) else given


class StreamOptions(_Request):
    include_usage: bool = False


class LoraScale(_Request):
    """One loaded LoRA adapter and the scale to apply it with (llama-server's `lora` entries)."""

    id: int = Field(ge=0, description="the adapter's id in GET /lora-adapters")
    scale: float = Field(description="its weight; 0 turns it off")


# SamplingFields' fields that set the sampler (OpenAI's names, with llama.cpp's extensions; Ollama's options read as
# them), with the SamplerSettings field each sets: a request's over its model's defaults, /api/create's as a preset's.
SAMPLER_FIELDS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "penalty_last_n", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "dry_multiplier": "dry_multiplier", "seed": "seed",
}


class SamplingFields(_TopRequest):
    """What both completion endpoints take besides the prompt."""

    model: str | None = Field(None, description="the served model's id (see /v1/models); omitted means that one")
    max_tokens: int | None = Field(None, ge=1, description="most tokens to generate; omitted means until the reply ends or "
                                                          "fills the context, or the server's limit (serve --max-reply-tokens)")
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, lt=2**31, description="llama.cpp's extension: sample from the k likeliest tokens (0: all)")
    min_p: float | None = Field(None, ge=0, lt=1,
                                description="llama.cpp's extension: drop tokens below this share of the likeliest's probability")
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=-1, lt=2**63, description="-1: a random one, as llama-server reads it (a preset's "
                                                                  "seed notwithstanding)")
    repeat_penalty: float | None = Field(None, gt=0, description="llama.cpp's extension: 1 turns the repeat penalty off")
    repeat_last_n: int | None = Field(None, ge=-1,
                                      description="llama.cpp's extension: the tokens the penalties look back on (-1: all, 0: off)")
    dry_multiplier: float | None = Field(None, ge=0, description="llama.cpp's extension: 0 turns DRY off")
    stop: Stop | None = None
    ignore_eos: bool = Field(False, description="llama.cpp's extension: go on past end-of-generation tokens")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description=(
        "choices to generate (for each prompt), decoded together; with a seed, choice j samples with seed + j "
        f"(as vLLM does); prompts times n at most {MAX_CHOICES}"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    lora: list[LoraScale] | None = Field(
        None, description="llama.cpp's extension: the loaded LoRA adapters to apply to this reply, with their scales; "
                          "adapters not listed are off; omitted means the server's --lora scales")
    logit_bias: dict[TokenIdKey, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = Field(
        None, description="the model's token ids (as keys, e.g. \"50256\") to a bias from -100 to 100 added to the "
                          "token's logit before sampling: -100 keeps the token out, 100 all but forces it (a grammar's "
                          "constraint still holds); logprobs stay those of the raw logits")

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _token_ids_as_keys(cls, biases: Any) -> Any:
        """OpenAI's form alone; llama-server's extensions are refused in one line: a list of [id, bias] pairs,
        false for a ban, and text keys, whose every token it biases (a key "123" would be an id or a text, and
        banning a word would ban the pieces it shares with others)."""
        if not isinstance(biases, dict):
            raise PydanticCustomError("logit_bias_form", "must be an object from token ids to biases, e.g. {example}",
                                      {"example": '{"50256": -100}'})
        for key in biases:
            if not isinstance(key, str) or not TOKEN_ID_KEY.fullmatch(key):
                raise PydanticCustomError("logit_bias_key", 'keys must be token ids, e.g. "50256", not {key}',
                                          {"key": json.dumps(key)})
        return biases

    @field_validator("seed")
    @classmethod
    def _seed_of_llama_cpp(cls, seed: int | None) -> int | None:
        """OpenAI's 64-bit seed as llama.cpp's 32-bit one (the same seed, the same reply); -1: none."""
        return None if seed is None or seed == -1 else seed % 2**32

    @property
    def token_biases(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as SamplerSettings takes it."""
        return tuple(sorted((int(token), bias) for token, bias in (self.logit_bias or {}).items()))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def reply_limit(self) -> int | None:
        return self.max_tokens

    @property
    def reply_limit_field(self) -> str:
        """The field `reply_limit` came from, for an error to name it."""
        return "max_tokens"

    @property
    def reply_limit_set(self) -> bool:
        """Whether the request sets its reply limit, if only to none (Ollama's num_predict -1): a preset's is not
        the reply's then."""
        return self.reply_limit_field in self.model_fields_set


class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str
    arguments: str = Field(description="a JSON object, as text")


class ToolCall(_Request):
    """A call an earlier assistant message made."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


# OpenAI's content parts that are not text, and what each holds.
OTHER_CONTENT_PARTS = {"image_url": "image", "input_image": "image", "input_audio": "audio", "file": "file",
                       "input_file": "file"}


def refuse_other_parts(content: Any) -> Any:
    """`content` as is, unless it is a list with an image (audio, file) part: that is refused saying so,
    not as a part that is no text part."""
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        kind = OTHER_CONTENT_PARTS.get(kind) if isinstance(kind, str) else None
        if kind is not None:
            raise PydanticCustomError("unsupported_content", f"{kind} parts are not supported: this server reads "
                                      "text only; send the message's content as text")
    return content


# The roles whose message may come without content (null or left out), and the field it then needs: OpenAI's rule.
CONTENT_OPTIONAL_WITH = {"assistant": "tool_calls"}


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Before content, which its check reads.
    tool_calls: list[ToolCall] | None = Field(None, description="on an assistant message: the calls it made")
    content: Annotated[str | list[TextPart], one_of('a string or a list of text parts ({"type": "text", "text": ...})')] | None = Field(
        None, validate_default=True, description="required, but on an assistant message with tool_calls")
    name: str | None = None
    tool_call_id: str | None = Field(None, description="on a tool message: the call whose result it is")
    reasoning_content: str | None = Field(None, description="on an assistant message: its reasoning")

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        return refuse_other_parts(content)

    @field_validator("content")
    @classmethod
    def _content_given(cls, content: str | list[TextPart] | None, info: ValidationInfo) -> str | list[TextPart] | None:
        role = info.data.get("role")
        if content is not None or role is None:  # no role: refused already
            return content
        instead = CONTENT_OPTIONAL_WITH.get(role)
        if instead is None:
            raise PydanticCustomError("content_required", "{role} messages need content (a string or a list of text parts)",
                                      {"role": role})
        if not info.data.get(instead):
            raise PydanticCustomError("content_required", "{role} messages need content or {instead}",
                                      {"role": role, "instead": instead})
        return content

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Request):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments")
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: FunctionName


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Request):
    name: str = Field(min_length=1, max_length=64, description="the schema's name")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema", description="a JSON schema; {} allows any JSON")
    strict: bool | None = Field(None, description="the reply always follows the schema (constrained decoding), whatever this says")


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> Constraint | None:
        """The grammar the reply must follow; raises APIError (400, naming response_format) when
        the schema is missing or llguidance cannot use it."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Constraint("json_schema", JSON_OBJECT_SCHEMA)
        if self.json_schema is None:
            raise APIError(400, "response_format of type json_schema needs a json_schema object", param="response_format")
        try:
            return Constraint.json_schema(self.json_schema.schema_)
        except InvalidSettingError as error:
            raise APIError(400, f"response_format: {error}", param="response_format") from None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="the newer name of max_tokens; wins over it")
    tools: list[Tool] | None = Field(None, description="functions the model may call")
    response_format: ResponseFormat | None = Field(
        None, description="json_object or json_schema: the reply is JSON (following the schema), by constrained decoding")
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedToolChoice,
                           one_of('"none", "auto", "required" or {"type": "function", "function": {"name": ...}}')] | None = Field(
        None, description="auto (the default with tools): the model decides; required or a named function: it must call")
    parallel_tool_calls: bool = Field(True, description="false: at most one call per reply")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="none turns thinking off (enable_thinking=false); the others reach the template as reasoning_effort")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="variables for the chat template (llama.cpp's and vLLM's extension), e.g. {\"enable_thinking\": false}")

    logprobs: bool = Field(False, description="each reply token's log-probability (raw logits, before logit_bias, penalties and "
                                              "temperature)")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                     description="with logprobs: also the this many most likely tokens at each position")

    @property
    def reply_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def reply_limit_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    @property
    def logprobs_wanted(self) -> int | None:
        """How many alternatives per token (None: no log-probabilities); raises APIError for
        top_logprobs without logprobs, as OpenAI does."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return self.top_logprobs or 0


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
# OpenAI's forms of a completion's prompt: one text, one prompt's token ids, or a list of either.
Prompts = Annotated[str | TokenIds | Annotated[list[str], Field(min_length=1)] | Annotated[list[TokenIds], Field(min_length=1)],
                    one_of("a text, token ids (integers >= 0), or a non-empty list of texts or of non-empty token-id lists")]


class CompletionRequest(SamplingFields):
    prompt: Prompts = Field(
        description="text, token ids, or a list of either: n choices for each prompt, choice i * n + j the j-th of prompt i "
                    "(LangChain's OpenAI LLM sends its prompts so)"
    )
    logprobs: int | None = Field(None, ge=0, le=MAX_LEGACY_LOGPROBS,
                                 description="each token's log-probability and the this many most likely alternatives")
    suffix: str | None = Field(None, description="the text after the gap: the reply fills the gap between the prompt "
                                                 "and it (fill-in-the-middle, for models with FIM tokens); empty or null: none")

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts to answer, in order; raises APIError when they ask for more than MAX_CHOICES choices."""
        prompts: list[str | list[int]]
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            prompts = [self.prompt]  # type: ignore[list-item]
        else:
            prompts = list(self.prompt)  # type: ignore[arg-type]
        if len(prompts) * self.n > MAX_CHOICES:
            field = "n" if self.n > 1 else "prompt"
            raise APIError(400, f"{field}: {len(prompts)} prompts times n={self.n} ask for {len(prompts) * self.n} choices; "
                                f"a request may ask for at most {MAX_CHOICES}", param=field)
        return prompts


class EmbeddingRequest(_TopRequest):
    input: Annotated[str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)],
                     one_of("a string, a list of strings, a list of token ids (integers >= 0) or a list of such lists, "
                            "none empty")] = Field(description="a text, a list of texts, token ids, or a list of token-id lists")
    model: str | None = Field(None, description="the served model's id (see /v1/models); omitted means the first")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: each vector's little-endian float32 bytes")
    dimensions: int | None = Field(None, ge=1, description="the model's own size only: localchat does not shorten vectors")


# -- responses -------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens whose KV cache was reused, not evaluated")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class WithoutNone(BaseModel):
    """Leaves out fields that are None: the openai SDK adds up streamed tool-call pieces key by
    key, and a null `type` would overwrite the "function" of an earlier piece; Ollama's bodies
    leave out what is not set (Go's omitempty)."""

    @model_serializer(mode="wrap")
    def _without_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class CalledFunction(BaseModel):
    name: str
    arguments: str = Field(description="a JSON object, as text")


class CalledTool(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="null when the reply is only tool calls")
    reasoning_content: str | None = Field(None, description="the model's thinking before its answer, when it has some")
    tool_calls: list[CalledTool] | None = None


class TopLogprob(BaseModel):
    token: str = Field(description="the token's bytes as UTF-8 text (invalid sequences replaced)")
    logprob: float
    bytes: list[int] = Field(description="the token's bytes (a character may be split across tokens)")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the most likely tokens at this position, best first")


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions' shape: one entry per token in each list."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = Field(description="where each token's text starts in the completion's text")


class ChatChoice(BaseModel):
    index: int = Field(description="which of the n choices")
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionDelta(WithoutNone):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(WithoutNone):
    """A piece of a streamed tool call: its id, type and name come first, then argument pieces."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = Field(description="the choice the chunk goes on")
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = Field(description="i * n + j for the j-th choice of prompt i")
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """A text completion, whole or (streamed) one event of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str = Field(description="the name a request gives as `model`")
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "localchat"
    # llama.cpp's router mode reports the same (as status.value); a request loads an unloaded model.
    status: Literal["loaded", "loading", "unloading", "unloaded"] = Field(
        "loaded", description="whether the model is in memory now")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoraAdapterCard(BaseModel):
    """A LoRA adapter the served model loaded (--lora), as llama-server's GET /lora-adapters lists it."""

    id: int
    path: str
    scale: float = Field(description="the scale a reply gets unless its request's `lora` says otherwise")


class LoraApplied(BaseModel):
    success: bool = True


class Health(BaseModel):
    status: Literal["ok", "error"]
    slots_idle: int
    slots_processing: int
    requests_waiting: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


def error_responses(invalid: str, unavailable: str, body: type[BaseModel] = ErrorResponse) -> dict[int | str, dict[str, Any]]:
    """The errors an OpenAI route documents (its OpenAPI `responses`), with what a 400 and a 503 mean on it; `body`:
    the error's shape (Anthropic's, on its Messages API)."""
    return {status: {"model": body, "description": description} for status, description in [
        (400, invalid),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (500, "The model named could not be loaded"),
        (503, unavailable),
    ]}


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="of length 1; base64 text with encoding_format base64")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
