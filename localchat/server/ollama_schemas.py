"""Request and response bodies of Ollama's API (its api/types.go); they also make its part of the
OpenAPI schema.

Ollama decodes requests with Go's encoding/json: unknown fields are ignored, null leaves a field
unset and a wrong type is an error, so these models ignore extra fields, read null as unset and are
strict about types. Fields Ollama knows that
localchat does not implement are declared, so that a request setting one to something that would
change the answer is refused by name (localchat/server/ollama.py) rather than answered as if unset.
Responses leave out what is not set, as Go's omitempty does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from localchat.server.schemas import TokenLogprob, WithoutNone, one_of

# A duration as Ollama takes it: seconds, or Go's duration text ("5m", "1h30m", "-1"); negative: for ever.
KeepAlive = Annotated[float | str, one_of('seconds or a duration such as "5m" or "1h30m"')]
# Ollama's think: on/off, or an effort for models that take one ("max" is read as "high").
Think = Annotated[bool | Literal["low", "medium", "high", "max"], one_of('true, false, "low", "medium", "high" or "max"')]
# "json", a JSON schema, or nothing ("" or null).
Format = Annotated[Literal["", "json"] | dict[str, Any], one_of('"json" or a JSON schema object')]
Texts = Annotated[str | list[str], one_of("a string or a list of strings")]
Options = Annotated[dict[str, Any], Field(description="sampling options (Modelfile parameters): temperature, top_k, "
                                                      "top_p, min_p, seed, num_predict, stop, repeat_penalty, "
                                                      "repeat_last_n, presence_penalty, frequency_penalty")]


class OllamaRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, given: Any) -> Any:
        """A field sent as null takes its default, as Go's decoder leaves it (`"content": null` on an
        assistant's tool calls, converted from OpenAI's messages; `"stream": null`)."""
        return {name: value for name, value in given.items() if value is not None} if isinstance(given, dict) else given


class CalledFunction(OllamaRequest):
    index: int | None = None
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(OllamaRequest):
    id: str | None = None
    function: CalledFunction


class Message(OllamaRequest):
    role: str = Field(description="system, user, assistant or tool (any case)")
    content: str = ""
    thinking: str | None = Field(None, description="an assistant message's reasoning")
    images: list[str] | None = Field(None, description="refused: localchat serves text models")
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = Field(None, description="on a tool message: the function whose result it is")
    tool_call_id: str | None = None


class FunctionDefinition(OllamaRequest):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(OllamaRequest):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class _Inference(OllamaRequest):
    """What /api/chat and /api/generate share."""

    model: str = ""
    stream: bool = Field(True, description="newline-delimited JSON objects, else one at the end")
    format: Format | None = Field(None, description='"json" or a JSON schema: the reply follows it (constrained decoding)')
    options: Options | None = None
    keep_alive: KeepAlive | None = Field(None, description="how long the model stays loaded after the request "
                                                           "(0: unloaded at once; negative: for ever; default: as memory allows)")
    think: Think | None = Field(None, description="whether a reasoning model thinks first (false asks its template not to)")
    truncate: bool | None = Field(None, description="a chat too long for the context loses its oldest turns (system "
                                                    "messages and the last one stay); false: refused instead")
    shift: bool | None = Field(None, description="accepted; a reply that fills the context ends with done_reason length")
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    debug_render_only: bool = Field(False, alias="_debug_render_only", description="answer the rendered prompt only")


class ChatRequest(_Inference):
    messages: list[Message] = Field(default_factory=list, description="none: only load the model")
    tools: list[Tool] | None = None


class GenerateRequest(_Inference):
    prompt: str = Field("", description="empty: only load the model")
    system: str = ""
    raw: bool = Field(False, description="the prompt as is, without the chat template")
    suffix: str = Field("", description="the text after the gap: the reply fills the gap between the prompt and it "
                                        "(fill-in-the-middle, for models with FIM tokens)")
    template: str = Field("", description="refused: localchat renders the model's own chat template")
    context: list[int] | None = Field(None, description="an earlier reply's context (deprecated in Ollama): the prompt "
                                                        "goes on from that exchange; /api/chat takes the history instead")
    images: list[str] | None = Field(None, description="refused: localchat serves text models")
    width: int | None = Field(None, description="refused: no image generation")
    height: int | None = Field(None, description="refused: no image generation")
    steps: int | None = Field(None, description="refused: no image generation")


class EmbedRequest(OllamaRequest):
    model: str = ""
    input: Texts = Field("", description="a text or a list of texts; empty: only load the model")
    truncate: bool = Field(True, description="cut an input longer than the model takes (else an error)")
    dimensions: int | None = Field(None, description="the model's own size only: localchat does not shorten vectors")
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class EmbeddingRequest(OllamaRequest):
    """The older /api/embeddings: one text, its vector not normalized."""

    model: str = ""
    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive | None = None


class NamedModelRequest(OllamaRequest):
    """/api/show, /api/delete: `model`, or the older `name`."""

    model: str = ""
    name: str = ""
    verbose: bool = False

    @property
    def wanted(self) -> str:
        return self.model or self.name


class PullRequest(NamedModelRequest):
    stream: bool = True
    insecure: bool = False


class CopyRequest(OllamaRequest):
    source: str
    destination: str


class CreateMessage(OllamaRequest):
    role: str
    content: str = ""


class CreateRequest(NamedModelRequest):
    """/api/create: a model made from another (`from`) with its own system prompt, messages and parameters
    (a Modelfile's SYSTEM, MESSAGE and PARAMETER lines, as Ollama's clients send them): a preset
    (localchat.presets). The fields that make a model from files, or change how it is made, are refused by name."""

    from_: str = Field("", alias="from", description="the model it runs: a name this server has")
    system: str | None = Field(None, description="its system prompt, for chats that bring none")
    messages: list[CreateMessage] | None = Field(None, description="messages every chat starts with")
    parameters: dict[str, Any] | None = Field(None, description="sampling defaults, as Ollama's options; num_ctx: its context")
    license: Texts | None = None
    template: str | None = Field(None, description="only the model's own chat template (the Jinja /api/show gives)")
    quantize: str = ""
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    modelfile: str = Field("", description="Ollama's old form, a Modelfile's text: not read (send its lines as fields)")
    stream: bool = True


# -- responses ---------------------------------------------------------------------------


class Metrics(WithoutNone):
    """Nanoseconds and token counts, measured."""

    total_duration: int | None = Field(None, description="from the request's arrival to its answer")
    load_duration: int | None = Field(None, description="waiting for the model: its load, when it was not loaded")
    prompt_eval_count: int | None = Field(None, description="prompt tokens (those reused from the KV cache included)")
    prompt_eval_duration: int | None = Field(None, description="evaluating the prompt, queueing for a slot excluded")
    eval_count: int | None = Field(None, description="tokens generated")
    eval_duration: int | None = Field(None, description="generating them, from the first")


class CalledFunctionOut(WithoutNone):
    index: int
    name: str
    arguments: dict[str, Any]


class ToolCallOut(WithoutNone):
    id: str
    function: CalledFunctionOut


class ReplyMessage(WithoutNone):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class _ChatLine(BaseModel):
    model: str
    created_at: str
    message: ReplyMessage
    done: bool
    done_reason: str | None = Field(None, description="stop, length, load or unload")
    logprobs: list[TokenLogprob] | None = None


class ChatResponse(Metrics, _ChatLine):
    """A whole reply, or (streamed) one line of it; the last has done true and the metrics."""


class _GenerateLine(BaseModel):
    model: str
    created_at: str
    response: str
    thinking: str | None = None
    done: bool
    done_reason: str | None = Field(None, description="stop, length, load or unload")
    context: list[int] | None = Field(None, description="on the last line (not raw): the exchange's tokens, prompt "
                                                        "and reply, for a later request's context")
    logprobs: list[TokenLogprob] | None = None


class GenerateResponse(Metrics, _GenerateLine):
    """A whole reply, or (streamed) one line of it; the last has done true and the metrics."""


class DebugRender(WithoutNone):
    rendered_template: str


class DebugResponse(WithoutNone):
    model: str
    created_at: str
    debug_info: DebugRender = Field(alias="_debug_info")

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class _Embeddings(BaseModel):
    model: str
    embeddings: list[list[float]] = Field(description="one per input, each of length 1")


class EmbedResponse(Metrics, _Embeddings):
    pass


class EmbeddingResponse(BaseModel):
    embedding: list[float] = Field(description="as the model gives it, not normalized")


class ModelDetails(BaseModel):
    parent_model: str = ""
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ListedModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str = Field(description="the file's sha256 for a hub model; otherwise an identity of its path, size and time")
    details: ModelDetails


class ModelList(BaseModel):
    models: list[ListedModel]


class ShowResponse(WithoutNone):
    parameters: str = Field(description="the sampling defaults a request starts from, one per line")
    template: str = Field(description="the model's chat template (Jinja)")
    modelfile: str = Field(description="the model as a Modelfile's lines (FROM, TEMPLATE, SYSTEM, PARAMETER, MESSAGE)")
    system: str | None = Field(None, description="a preset's system prompt")
    license: str | None = None
    messages: list[dict[str, str]] | None = Field(None, description="the messages a preset starts every chat with")
    details: ModelDetails
    model_info: dict[str, Any] = Field(description="the GGUF metadata; arrays as [] unless verbose")
    capabilities: list[str]
    modified_at: str


class RunningModel(BaseModel):
    name: str
    model: str
    size: int = Field(description="bytes it holds in RAM and VRAM, as planned")
    digest: str
    details: ModelDetails
    expires_at: str = Field(description="when it is unloaded if still idle (keep_alive); far ahead when never")
    size_vram: int
    context_length: int


class RunningModels(BaseModel):
    models: list[RunningModel]


class Progress(WithoutNone):
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


class Version(BaseModel):
    version: str = Field(description="the Ollama release whose API this follows")


class OllamaError(BaseModel):
    """Ollama's error body."""

    error: str
