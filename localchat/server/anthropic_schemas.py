"""Request and response bodies of Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens), the
part a local model answers as Ollama serves it; they also make its part of the OpenAPI schema.

A message's content is a text or a list of blocks: text, tool_use (a call an earlier reply made), tool_result (a
call's result), thinking and redacted_thinking. A text given for a list of blocks is read as one text block before
validation, and blocks of other kinds (images, documents, the blocks of Anthropic's server tools) are refused naming
their kind, not as a block that is none of the kinds read. Tools are custom tools: Anthropic's server tools (web
search, code execution...) are refused by type. Fields for Anthropic's prompt cache (cache_control) and citations are
accepted and ignored: localchat reuses a prompt's KV cache on its own. The stream's events carry what the anthropic
package's types/ say they carry.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from localchat.server.schemas import FunctionName, StopString, _Request, _TopRequest

# The blocks a message may hold; others are refused, saying why.
BLOCK_KINDS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
REFUSED_BLOCKS = {"image": "this server reads text only", "document": "this server reads text only: send the document's text"}
OTHER_BLOCK = ("a message holds text, tool_use, tool_result, thinking and redacted_thinking blocks (Anthropic's server "
               "tools and their blocks run on its servers)")
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"]


def _refuse_kind(kind: Any, where: str) -> None:
    if isinstance(kind, str) and kind not in BLOCK_KINDS:
        why = REFUSED_BLOCKS.get(kind, OTHER_BLOCK)
        raise PydanticCustomError("content_block", "{where}{kind} blocks are not supported: {why}",
                                  {"where": where, "kind": kind, "why": why})


def _text_as_blocks(content: Any) -> Any:
    """A text given for a list of blocks, as that list; blocks of other kinds than text refused by kind."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise PydanticCustomError("text_blocks", "should be a text or a list of text blocks")
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            _refuse_kind(kind, f"block {index}: ")
            if isinstance(kind, str):
                raise PydanticCustomError("text_blocks", "block {index} is a {kind} block; only text blocks go here",
                                          {"index": index, "kind": kind})
    return content


def _blocks(content: Any) -> Any:
    """A message's content: a text as one text block; blocks of kinds not read refused by kind."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    for index, block in enumerate(content if isinstance(content, list) else ()):
        _refuse_kind(block.get("type") if isinstance(block, dict) else None, f"block {index}: ")
    return content


class TextBlock(_Request):
    type: Literal["text"]
    text: str


# A text, or a list of text blocks: a text is read as one text block.
TextBlocks = Annotated[list[TextBlock], BeforeValidator(_text_as_blocks, json_schema_input_type=str | list[TextBlock])]


class ToolUseBlock(_Request):
    """A call an earlier reply made."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: FunctionName
    input: dict[str, Any] = Field(description="the call's arguments")


class ToolResultBlock(_Request):
    """The result of a call, which the model reads as a tool message."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, description="the id of the tool_use block it answers")
    content: TextBlocks = Field(default_factory=list)
    is_error: bool = Field(False, description="accepted; the model reads the result's text, which says what went wrong")


class ThinkingBlock(_Request):
    """An earlier reply's thinking: the assistant message's reasoning."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = Field(None, description="ignored: localchat signs nothing")


class RedactedThinkingBlock(_Request):
    type: Literal["redacted_thinking"]
    data: str = Field(description="ignored: Anthropic's encrypted thinking, which no local model reads")


def _block_kind(block: Any) -> str | None:
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return kind if kind in BLOCK_KINDS else None


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
    Discriminator(_block_kind, custom_error_type="content_block",
                  custom_error_message="should be a text, tool_use, tool_result, thinking or redacted_thinking block"),
]


class InputMessage(_Request):
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[ContentBlock], BeforeValidator(_blocks, json_schema_input_type=str | list[ContentBlock])]

    @field_validator("content")
    @classmethod
    def _not_empty(cls, content: list[ContentBlock]) -> list[ContentBlock]:
        if not content:  # Anthropic's rule too: only a last assistant message may be empty, and localchat continues none
            raise PydanticCustomError("content_required", "a message needs content: a string or a list of blocks")
        return content


class CustomTool(_Request):
    """A tool the model may call, which the client runs."""

    type: Literal["custom"] | None = None
    name: FunctionName
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="a JSON schema of the tool's input")

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, tool: Any) -> Any:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "custom":
            raise PydanticCustomError("server_tool", "{kind} is one of Anthropic's server tools: localchat runs no tools "
                                      "itself (define a custom tool, with name, description and input_schema, and run it "
                                      "in your app)", {"kind": kind})
        return tool


class ToolChoice(_Request):
    """auto, any (some tool), tool (the one named) or none."""

    type: Literal["auto", "any", "tool", "none"]
    name: FunctionName | None = Field(None, description="with type tool: the tool to call")
    disable_parallel_tool_use: bool = Field(False, description="true: at most one call")

    @model_validator(mode="before")
    @classmethod
    def _known_kind(cls, choice: Any) -> Any:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if isinstance(kind, str) and kind not in ("auto", "any", "tool", "none"):
            raise PydanticCustomError("tool_choice", "{kind} is not a choice: give auto, any, none or {example}",
                                      {"kind": kind, "example": '{"type": "tool", "name": ...}'})
        return choice

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise PydanticCustomError("tool_choice", "a name goes with type tool, and only with it")
        return self


class ThinkingConfig(_Request):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"] = Field(
        description="enabled or disabled turns the template's thinking on or off where it can; adaptive and "
                    "between_tools leave the template's default")
    budget_tokens: int | None = Field(None, ge=1, description="accepted: max_tokens bounds the reply, its thinking included")


class OutputFormat(_Request):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True, serialize_by_alias=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="a JSON schema; the reply follows it (constrained decoding)")


class OutputConfig(_Request):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="reaches the template as reasoning_effort (xhigh and max as high)")
    format: OutputFormat | None = None


class CountTokensRequest(_TopRequest):
    """What /v1/messages/count_tokens takes: the conversation and what the prompt shows of the tools."""

    model: str = Field(min_length=1, description="a model of this server (see /v1/models)")
    messages: list[InputMessage] = Field(min_length=1)
    system: TextBlocks | None = Field(None, description="a system message before the messages")
    tools: list[CustomTool] | None = Field(None, description="tools the model may call")
    tool_choice: ToolChoice | None = Field(None, description="auto (the default with tools), any, tool or none")
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """What /v1/messages takes: count_tokens' fields and the reply's. Fields for Anthropic's own servers (container,
    mcp_servers) are refused by name (schemas.UNSUPPORTED_FIELDS); others it does not read are ignored."""

    max_tokens: int = Field(ge=1, description="most tokens to generate, thinking included; cut to the server's "
                                              "--max-reply-tokens, as Ollama cuts num_predict")
    stop_sequences: list[StopString] | None = None
    temperature: float | None = Field(None, ge=0, le=1, description="0 is greedy; omitted means the model's default")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, lt=2**31, description="0: all tokens")
    stream: bool = False
    metadata: dict[str, Any] | None = Field(None, description="accepted and ignored")

    @property
    def sampler_fields(self) -> dict[str, Any]:
        """The sampler fields the request sets (those it leaves out take the model's defaults)."""
        return {name: getattr(self, name) for name in ("temperature", "top_p", "top_k") if name in self.model_fields_set}


# -- responses -------------------------------------------------------------------------


class TextOutput(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOutput(BaseModel):
    """The model's thinking, whole."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = Field("", description="empty: localchat signs nothing")


class ToolUseOutput(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str = Field(description="what the tool_result block answering it names")
    name: str
    input: dict[str, Any] = Field(description="the call's arguments (as far as written, when the reply was cut short)")


OutputBlock = TextOutput | ThinkingOutput | ToolUseOutput


class MessageUsage(BaseModel):
    input_tokens: int = Field(description="prompt tokens evaluated for this reply (not those read from the cache)")
    cache_read_input_tokens: int = Field(description="prompt tokens whose KV cache was reused, not evaluated")
    output_tokens: int


class MessageResponse(BaseModel):
    """A reply, whole or (in a stream's message_start) as it starts."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[OutputBlock] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = Field(None, description="with stop_reason stop_sequence: which one")
    usage: MessageUsage


class CountTokensResponse(BaseModel):
    input_tokens: int = Field(description="the prompt's tokens, as the model's template writes the request")


class MessageStart(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: MessageResponse


class BlockStart(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: OutputBlock


class TextPiece(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingPiece(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class JsonPiece(BaseModel):
    """A piece of a tool_use block's input, as JSON text."""

    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class BlockDelta(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextPiece | ThinkingPiece | JsonPiece


class BlockStop(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class StopDetails(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None = None


class MessageDelta(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: StopDetails
    usage: MessageUsage = Field(description="the reply's totals")


class MessageStop(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class ErrorDetail(BaseModel):
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, overloaded_error...")
    message: str


class ErrorBody(BaseModel):
    """Anthropic's error, as a response's body or a stream's error event."""

    type: Literal["error"] = "error"
    error: ErrorDetail


StreamEvent = MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop | ErrorBody
