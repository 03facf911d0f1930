"""Request and response bodies of OpenAI's Responses API (POST /v1/responses), the stateless part that
Ollama and vLLM serve; they also make its part of the OpenAPI schema.

A request's `input` is a text (one user message) or a list of items: messages, the function calls an
earlier reply made, their results, and reasoning. Forms OpenAI accepts in several shapes (a text for
a list of parts, "auto" for {"type": "auto"}) are read into one shape before validation, so that a
wrong field gets one error naming it, not one per shape it is not. Items and tools OpenAI runs on its
own servers (item references, web search, file search...) are refused naming them. The stream's events
carry what the openai package's types/responses/ say they carry.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from localchat.server.schemas import FunctionName, _Request, _TopRequest, refuse_other_parts

# The input items a request may hold; others are refused, saying why.
INPUT_ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")
REFUSED_ITEM_KINDS = {"item_reference": "refers to a stored item: this server keeps none; send the item itself"}
OTHER_ITEM = "localchat does not read: input items are messages, function_call, function_call_output and reasoning items"
# Effort as /v1/chat/completions takes it (reasoning_effort): none turns a template's thinking off.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _text_as_parts(content: Any) -> Any:
    """A text given for a list of parts, as that list; other parts than text refused by name."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise PydanticCustomError("text_parts", "should be a text or a list of input_text and output_text parts")
    return refuse_other_parts(content)


class TextContent(_Request):
    """A message's text: the user's (input_text) or an earlier reply's (output_text), read alike."""

    type: Literal["input_text", "output_text"]
    text: str


# Text, or a list of text parts: a text is read as one input_text part.
TextParts = Annotated[list[TextContent], BeforeValidator(_text_as_parts, json_schema_input_type=str | list[TextContent])]


class InputMessage(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: TextParts

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)


class FunctionCallInput(_Request):
    """A call an earlier reply made."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: FunctionName
    arguments: str = Field(description="a JSON object, as text")


class FunctionCallOutputInput(_Request):
    """The result of a call, which the model reads as a tool message."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, description="the call_id of the function_call it answers")
    output: TextParts

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.output)


class ReasoningPart(_Request):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningInput(_Request):
    """An earlier reply's reasoning: it goes with the assistant message that follows it."""

    type: Literal["reasoning"]
    content: list[ReasoningPart] | None = None
    summary: list[ReasoningPart] = Field(default_factory=list)
    encrypted_content: str | None = Field(None, description="ignored: localchat writes reasoning as content")

    @property
    def text(self) -> str:
        """Its reasoning, else its summary."""
        return "".join(part.text for part in self.content or self.summary)


def _input_kind(item: Any) -> str | None:
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if kind in INPUT_ITEM_KINDS else None


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")] | Annotated[ReasoningInput, Tag("reasoning")],
    Discriminator(_input_kind, custom_error_type="input_item",
                  custom_error_message="should be a message, function_call, function_call_output or reasoning item"),
]


class FunctionTool(_Request):
    """A function the model may call (the Responses API's flat form: no nested `function`)."""

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments")
    strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, tool: Any) -> Any:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise PydanticCustomError("unsupported_tool", "{kind} tools are not supported: localchat runs no tools itself "
                                      "and takes function tools only (define it as a function and run it in your app)",
                                      {"kind": kind})
        return tool


class ToolChoice(_Request):
    """none, auto, required, or one function by name ("auto" is read as {"type": "auto"})."""

    type: Literal["none", "auto", "required", "function"]
    name: FunctionName | None = Field(None, description="with type function: the function to call")

    @model_validator(mode="before")
    @classmethod
    def _known_kind(cls, choice: Any) -> Any:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if isinstance(kind, str) and kind not in ("none", "auto", "required", "function"):
            raise PydanticCustomError("tool_choice", "{kind} is not a choice localchat takes (it takes function tools "
                                      "only): give none, auto, required or {example}",
                                      {"kind": kind, "example": '{"type": "function", "name": ...}'})
        return choice

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "function") != (self.name is not None):
            raise PydanticCustomError("tool_choice", "a name goes with type function, and only with it")
        return self

    @property
    def echo(self) -> str | dict[str, str]:
        """As OpenAI writes it back."""
        return {"type": "function", "name": self.name} if self.name is not None else self.type


class TextFormat(_Request):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True, serialize_by_alias=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64, description="json_schema: the schema's name")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="json_schema: a JSON schema; {} allows any JSON")
    description: str | None = None
    strict: bool | None = Field(None, description="the reply always follows the schema (constrained decoding), "
                                                  "whatever this says")

    @model_validator(mode="after")
    def _schema_named(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise PydanticCustomError("text_format", "a json_schema format needs its name and schema")
        return self


class TextConfig(_Request):
    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted and ignored")


class ReasoningConfig(_Request):
    effort: ReasoningEffort | None = Field(
        None, description="none turns thinking off where the template can; the others reach the template as "
                          "reasoning_effort (a model that does not think ignores it)")
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        None, description="accepted: the reasoning comes back whole, as reasoning_text, never summarized")


class ResponsesRequest(_TopRequest):
    """What /v1/responses takes. Fields that need stored state (previous_response_id, conversation,
    background, prompt) are refused by name (schemas.UNSUPPORTED_FIELDS); store is accepted and
    nothing is stored, as Ollama and vLLM do."""

    model: str | None = Field(None, description="the served model's id (see /v1/models); omitted means the first")
    input: list[InputItem] = Field(description="a text (one user message) or a list of items")
    instructions: str | None = Field(None, description="a system message before the input")
    max_output_tokens: int | None = Field(None, ge=1, description="most tokens to generate (reasoning included)")
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy; omitted means the model's default")
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[FunctionTool] | None = Field(None, description="functions the model may call")
    tool_choice: ToolChoice | None = Field(None, description="auto (the default with tools), none, required or a function")
    parallel_tool_calls: bool = Field(True, description="false: at most one call per reply")
    text: TextConfig | None = Field(None, description="format: text, json_object or json_schema (constrained decoding)")
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    truncation: Literal["auto", "disabled"] = Field(
        "disabled", description="auto: an input too long for the context loses its oldest turns; disabled: it is a 400")
    include: list[str] | None = Field(None, description="message.output_text.logprobs is refused; the rest add nothing here")
    store: bool | None = Field(None, description="accepted; nothing is stored (the reply says store: false)")
    metadata: dict[str, str] | None = Field(None, description="echoed")
    user: str | None = Field(None, description="echoed")

    @field_validator("input", mode="before", json_schema_input_type=str | list[InputItem])
    @classmethod
    def _items(cls, given: Any) -> Any:
        if isinstance(given, str):
            return [{"type": "message", "role": "user", "content": given}]
        for index, item in enumerate(given if isinstance(given, list) else ()):
            kind = item.get("type") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind not in INPUT_ITEM_KINDS:
                why = REFUSED_ITEM_KINDS.get(kind, OTHER_ITEM)
                raise PydanticCustomError("input_item", "item {index} is of type {kind}, which {why}",
                                          {"index": index, "kind": kind, "why": why})
        return given

    @field_validator("tool_choice", mode="before", json_schema_input_type=Literal["none", "auto", "required"] | ToolChoice)
    @classmethod
    def _choice_shape(cls, choice: Any) -> Any:
        return {"type": choice} if isinstance(choice, str) else choice


# -- responses -------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class OutputReasoning(BaseModel):
    """The model's thinking, whole (as vLLM returns an open model's), never summarized."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    status: ItemStatus
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]


class OutputFunctionCall(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str = Field(description="what the function_call_output answering it names")
    name: str
    arguments: str = Field(description="a JSON object, as text (cut short when the reply was)")


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="input tokens whose KV cache was reused, not evaluated")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="not counted apart: 0")


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: Literal["server_error"] = "server_error"
    message: str


class ResponseObject(BaseModel):
    """A response, whole or (in a stream's lifecycle events) as it stands."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[FunctionTool]
    tool_choice: str | dict[str, str]
    parallel_tool_calls: bool
    temperature: float | None = Field(description="what the reply was sampled with")
    top_p: float | None
    max_output_tokens: int | None = None
    text: TextConfig
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"]
    store: Literal[False] = Field(False, description="nothing is stored")
    background: Literal[False] = False
    previous_response_id: None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    usage: ResponseUsage | None = None


class ResponseEvent(BaseModel):
    """One server-sent event of a streamed response: the events below, each with its place in the stream."""

    type: str
    sequence_number: int


class LifecycleEvent(ResponseEvent):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete",
                  "response.failed"]
    response: ResponseObject


class OutputItemEvent(ResponseEvent):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ItemEvent(ResponseEvent):
    """An event of one output item, by its id and place."""

    item_id: str
    output_index: int


class ContentEvent(ItemEvent):
    """An event of one content part of an output item."""

    content_index: int = 0


class ContentPartEvent(ContentEvent):
    type: Literal["response.content_part.added", "response.content_part.done"]
    part: OutputText | ReasoningText


class OutputTextDelta(ContentEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class OutputTextDone(ContentEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningTextDelta(ContentEvent):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    delta: str


class ReasoningTextDone(ContentEvent):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    text: str


class ArgumentsDelta(ItemEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class ArgumentsDone(ItemEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str
