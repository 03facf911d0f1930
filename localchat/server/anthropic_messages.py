"""Anthropic's Messages API, POST /v1/messages (what Claude Code and the anthropic package call), and
POST /v1/messages/count_tokens, as Ollama serves them.

A request becomes the chat request it means (`system` as a system message first; each message's blocks as
chat messages in their order: text blocks as the message's text parts, tool_result blocks as tool messages,
an assistant's thinking and tool_use blocks as its reasoning and tool calls; tools and tool_choice as their
chat forms; stop_sequences as stop strings; thinking as the template's enable_thinking, output_config's effort
as reasoning_effort and its format as response_format) and takes the path /v1/chat/completions takes: the
same prompt, sampler, grammar and reply parser, so the same greedy reply. The reply's parts become content
blocks in the order the model wrote them (thinking, text, tool_use), whole or streamed as Anthropic's events.

max_tokens, which Anthropic requires and clients set high (Claude Code 32000), is cut to the server's
--max-reply-tokens, as Ollama cuts num_predict. usage counts as Anthropic's does: input_tokens the prompt
tokens evaluated, cache_read_input_tokens those whose KV cache was reused. A conversation that ends with the
assistant's message asks Anthropic to continue that message; the chat path would start a new one, so it is
refused. A call whose arguments are no JSON object (a model's slip outside a forced call) has the input {}.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic_core import from_json

from localchat.errors import ContextOverflowError
from localchat.scheduler import ReplyDone, TextDelta
from localchat.server.anthropic_schemas import (
    BlockDelta,
    BlockStart,
    BlockStop,
    CountTokensRequest,
    CountTokensResponse,
    ErrorBody,
    ErrorDetail,
    InputMessage,
    JsonPiece,
    MessageDelta,
    MessageResponse,
    MessagesRequest,
    MessageStart,
    MessageStop,
    MessageUsage,
    OutputBlock,
    StopDetails,
    StopReason,
    StreamEvent,
    TextBlock,
    TextOutput,
    TextPiece,
    ThinkingBlock,
    ThinkingOutput,
    ThinkingPiece,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    ToolUseOutput,
)
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.logprobs import TokenPiece, token_piece
from localchat.server.replies import ReplyFailedError
from localchat.server.schemas import (
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    TextPart,
    Tool,
    ToolCall,
    error_responses,
    unsupported_field,
)
from localchat.server.spliced_json import CONTENT_MARK, SplicedJson
from localchat.session import GenerationStats

if TYPE_CHECKING:
    from localchat.server.routing import ChatRun, CompletionService, ModelRouter

ERRORS = error_responses(
    "Invalid request, a block or tool that runs on Anthropic's servers, or a prompt longer than the context",
    "Every slot is busy and the queue is full, or the model named needs the room of busy models", ErrorBody,
)
# With "stream": true the answer is server-sent events, each an `event` line naming its type and a `data` line.
STREAMED = {200: {"content": {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}}}}
# The chat request's fields that an error may name, as a Messages request names them.
MESSAGES_FIELDS = {"response_format": "output_config.format", "max_completion_tokens": "max_tokens"}
ChatToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
# output_config.effort as /v1/chat/completions' reasoning_effort takes it (Ollama reads xhigh and max as high).
EFFORTS: dict[str, Literal["low", "medium", "high"]] = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                                                        "max": "high"}
# thinking.type as the template's enable_thinking (None: the template's, or `serve --no-think`'s, default).
THINKING_SWITCH: dict[str, bool | None] = {"enabled": True, "disabled": False, "adaptive": None, "between_tools": None}
TOOL_CHOICES: dict[str, Literal["none", "auto", "required"]] = {"auto": "auto", "any": "required", "none": "none"}
BlockKind = Literal["thinking", "text", "tool_use"]
# Each block kind's delta, holding a piece of its text (a tool_use block's: its input's JSON).
PIECES: dict[BlockKind, Callable[[str], TextPiece | ThinkingPiece | JsonPiece]] = {
    "text": lambda text: TextPiece(text=text), "thinking": lambda text: ThinkingPiece(thinking=text),
    "tool_use": lambda text: JsonPiece(partial_json=text)}


def chat_request(body: CountTokensRequest, *, max_tokens: int | None = None,
                 sampler: dict[str, Any] | None = None) -> ChatCompletionRequest:
    """The chat request `body` means (`max_tokens`, `sampler`: a Messages request's reply limit and sampler
    fields); raises APIError naming a block that is out of place, or a conversation that ends with the assistant."""
    last = len(body.messages) - 1
    if body.messages[last].role == "assistant":
        raise APIError(400, f"messages.{last}: the conversation ends with the assistant's message, which Anthropic "
                            "continues (a prefill) and localchat does not; end it with a user message",
                       param=f"messages.{last}")
    tools = [Tool(type="function", function=FunctionDefinition(name=tool.name, description=tool.description,
                                                               parameters=tool.input_schema))
             for tool in body.tools or ()]
    choice = body.tool_choice
    thinking = THINKING_SWITCH[body.thinking.type] if body.thinking is not None else None
    config = body.output_config
    schema = config.format.schema_ if config is not None and config.format is not None else None
    return ChatCompletionRequest(
        model=body.model, messages=_messages(body), max_completion_tokens=max_tokens, tools=tools or None,
        tool_choice=_tool_choice(choice), parallel_tool_calls=choice is None or not choice.disable_parallel_tool_use,
        response_format=(ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat.model_validate(
            {"name": "output", "schema": schema})) if schema is not None else None),
        reasoning_effort=EFFORTS[config.effort] if config is not None and config.effort is not None else None,
        chat_template_kwargs={"enable_thinking": thinking} if thinking is not None else None,
        **(sampler or {}),
    )


def _messages(body: CountTokensRequest) -> list[ChatMessage]:
    system = [TextPart(type="text", text=block.text) for block in body.system or ()]
    messages = [ChatMessage(role="system", content=system)] if any(part.text for part in system) else []
    for index, message in enumerate(body.messages):
        messages += _assistant(message, index) if message.role == "assistant" else _user(message, index)
    return messages


def _out_of_place(message: InputMessage, index: int, number: int) -> APIError:
    where = f"messages.{index}.content.{number}"
    kind = message.content[number].type
    home = "an assistant" if kind in ("tool_use", "thinking", "redacted_thinking") else "a user"
    return APIError(400, f"{where}: a {kind} block goes in {home} message, not the {message.role}'s", param=where)


def _user(message: InputMessage, index: int) -> list[ChatMessage]:
    """A user (or system) message's text, and its tool results as tool messages, in their order."""
    said: list[ChatMessage] = []
    text: list[TextPart] = []  # the text blocks since the last tool result
    for number, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            text.append(TextPart(type="text", text=block.text))
            continue
        if not (isinstance(block, ToolResultBlock) and message.role == "user"):
            raise _out_of_place(message, index, number)
        if text:
            said.append(ChatMessage(role=message.role, content=text))
            text = []
        said.append(ChatMessage(role="tool", content=[TextPart(type="text", text=part.text) for part in block.content],
                                tool_call_id=block.tool_use_id))
    if text or not said:
        said.append(ChatMessage(role=message.role, content=text or ""))
    return said


def _assistant(message: InputMessage, index: int) -> list[ChatMessage]:
    """An assistant message: its text, its thinking as reasoning, its tool_use blocks as tool calls (redacted
    thinking, which no local model reads, left out)."""
    text, reasoning, calls = [], [], []
    for number, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            text.append(TextPart(type="text", text=block.text))
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(ToolCall(id=block.id, function=FunctionCall(name=block.name, arguments=arguments)))
        elif isinstance(block, ToolResultBlock):
            raise _out_of_place(message, index, number)
    return [ChatMessage(role="assistant", content=text, tool_calls=calls or None, reasoning_content="".join(reasoning) or None)]


def _tool_choice(choice: ToolChoice | None) -> ChatToolChoice | None:
    if choice is None:
        return None
    if choice.name is not None:
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return TOOL_CHOICES[choice.type]


def _in_messages_terms(error: APIError) -> APIError:
    """`error` (the chat path's) naming the field as the Messages request has it."""
    param = error.param or ""
    if param not in MESSAGES_FIELDS:
        return error
    name = MESSAGES_FIELDS[param]
    message = name + error.message.removeprefix(param) if error.message.startswith(param) else error.message
    return APIError(error.status, message, code=error.code, param=name)


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its tool_use block's input: a JSON object, as far as written."""
    try:
        value = from_json(arguments or "{}", allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _sse(event: StreamEvent) -> str:
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


def _usage(stats: GenerationStats) -> MessageUsage:
    return MessageUsage(input_tokens=stats.prompt_tokens - stats.cached_tokens, cache_read_input_tokens=stats.cached_tokens,
                        output_tokens=stats.completion_tokens)


@dataclass
class _OpenBlock:
    """The content block the reply is writing: its text (or input's JSON) so far, and its delta event's JSON."""

    kind: BlockKind
    index: int
    delta: SplicedJson  # its delta event, filled with a piece
    id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)

    def block(self) -> OutputBlock:
        text = "".join(self.pieces)
        if self.kind == "text":
            return TextOutput(text=text)
        if self.kind == "thinking":
            return ThinkingOutput(thinking=text)
        return ToolUseOutput(id=self.id, name=self.name, input=_input(text))


class MessageWriter:
    """One reply's chat deltas in, the message's content blocks out; with `stream`, also the server-sent events
    Anthropic's clients read them by. A part of another kind than the block being written (thinking, text, a
    call) closes it and opens a block of its own."""

    def __init__(self, message: MessageResponse, *, stream: bool) -> None:
        """`message`: the reply as it starts, no content yet."""
        self.message = message
        self._stream = stream
        self._open: _OpenBlock | None = None

    def start(self) -> list[str]:
        return [_sse(MessageStart(message=self.message))] if self._stream else []

    def feed(self, deltas: Sequence[ChatDelta]) -> list[str]:
        """The reply's next parts (ChatReplyReader's deltas)."""
        events: list[str] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._text("thinking", delta.reasoning_content)
            if delta.content:
                events += self._text("text", delta.content)
            for call in delta.tool_calls or ():
                if call.id is not None:
                    events += self._open_block("tool_use", call.id, call.function.name or "")
                if call.function.arguments:
                    events += self._piece(call.function.arguments)
        return events

    def finish(self, stats: GenerationStats, reason: StopReason, stop_sequence: str | None) -> list[str]:
        """The end: the last block closed, why the reply stopped, the usage, and the stream's last events."""
        events = self._close_block()
        self.message.stop_reason, self.message.stop_sequence = reason, stop_sequence
        self.message.usage = _usage(stats)
        if not self._stream:
            return events
        ending = MessageDelta(delta=StopDetails(stop_reason=reason, stop_sequence=stop_sequence), usage=self.message.usage)
        return [*events, _sse(ending), _sse(MessageStop())]

    def failed(self, message: str) -> list[str]:
        """A stream's error event, as Anthropic ends a stream that fails."""
        return [*self._close_block(), _sse(ErrorBody(error=ErrorDetail(type="api_error", message=message)))]

    def _text(self, kind: BlockKind, text: str) -> list[str]:
        opened = self._open_block(kind) if self._open is None or self._open.kind != kind else []
        return opened + self._piece(text)

    def _piece(self, text: str) -> list[str]:
        block = self._open
        assert block is not None, "a piece of a block that was never opened"
        block.pieces.append(text)
        return [f"event: content_block_delta\ndata: {block.delta(text)}\n\n"] if self._stream else []

    def _open_block(self, kind: BlockKind, call_id: str = "", name: str = "") -> list[str]:
        events = self._close_block()
        index = len(self.message.content)
        delta = SplicedJson(BlockDelta(index=index, delta=PIECES[kind](CONTENT_MARK)), [CONTENT_MARK])
        self._open = _OpenBlock(kind, index, delta, call_id, name)
        return [*events, _sse(BlockStart(index=index, content_block=self._open.block()))] if self._stream else events

    def _close_block(self) -> list[str]:
        block, self._open = self._open, None
        if block is None:
            return []
        self.message.content.append(block.block())
        return [_sse(BlockStop(index=block.index))] if self._stream else []


@dataclass
class _Reply:
    """A reply under way, and the text it has returned: where that ends, the text its tokens write goes on with the
    stop sequence that ended it, if one did."""

    run: ChatRun
    piece: TokenPiece
    said: list[str] = field(default_factory=list)

    def read(self, text: str) -> list[ChatDelta]:
        self.said.append(text)
        return self.run.read(0, text)

    def end(self, stats: GenerationStats) -> tuple[list[ChatDelta], StopReason, str | None]:
        """What the reply's end releases, why it stopped, and the stop sequence that stopped it."""
        reader = self.run.readers[0]
        deltas = reader.finish(cut_short=stats.finish_reason == "length")
        finish = reader.finish_reason(stats)
        if finish == "tool_calls":
            return deltas, "tool_use", None
        if finish == "length":
            limit = self.run.generation.max_tokens
            cut = limit is not None and stats.completion_tokens >= limit
            return deltas, "max_tokens" if cut else "model_context_window_exceeded", None
        if stats.text_tokens is None:  # it stopped without a stop string
            return deltas, "end_turn", None
        written = b"".join(self.piece(token) for token in stats.completion_ids).decode("utf-8", errors="replace")
        rest = written[len("".join(self.said)):]
        stop = next((stop for stop in self.run.generation.stop if rest.startswith(stop)), None)
        return deltas, "stop_sequence" if stop is not None else "end_turn", stop


def _refuse_unsupported(body: CountTokensRequest) -> None:
    refused = unsupported_field("messages", body.model_extra)
    if refused is not None:
        raise APIError(400, refused[1], code="unsupported_parameter", param=refused[0])


class MessagesRoutes:
    """POST /v1/messages and /v1/messages/count_tokens over the server's models (leased through `models`)."""

    def __init__(self, models: ModelRouter) -> None:
        self.models = models

    async def _service(self, body: CountTokensRequest, request: Request) -> CompletionService:
        return self.models.service(await self.models.lease(request, body.model))

    async def create(self, body: MessagesRequest, request: Request) -> Response:
        _refuse_unsupported(body)
        limit = self.models.settings.max_reply_tokens
        reply_limit = body.max_tokens if limit is None else min(body.max_tokens, limit)
        chat = chat_request(body, max_tokens=reply_limit, sampler=body.sampler_fields)
        service = await self._service(body, request)
        try:
            run = await service.start_chat(chat, tuple(body.stop_sequences or ()) or None)
        except APIError as error:
            raise _in_messages_terms(error) from None
        except ContextOverflowError as error:
            raise APIError(400, f"prompt is too long: {error}", code="context_length_exceeded", param="messages") from None
        reply = _Reply(run, token_piece(service.engine.backend, service.chat.shown_tokens))
        writer = MessageWriter(MessageResponse(
            id=f"msg_{uuid.uuid4().hex}", model=service.model_id,
            usage=MessageUsage(input_tokens=len(run.prompt), cache_read_input_tokens=0, output_tokens=0),
        ), stream=body.stream)
        if body.stream:
            return StreamingResponse(_events(reply, writer), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        writer.feed(run.readers[0].start())

        def read(_: int, delta: TextDelta) -> None:
            writer.feed(reply.read(delta.text))

        await service.read_whole(run.replies, request, read)
        stats = run.replies.stats[0]
        deltas, reason, stop = reply.end(stats)
        writer.feed(deltas)
        writer.finish(stats, reason, stop)
        return JSONResponse(writer.message.model_dump(mode="json"))

    async def count_tokens(self, body: CountTokensRequest, request: Request) -> CountTokensResponse:
        """The prompt's tokens, as /v1/messages would write it for the model (nothing is generated)."""
        _refuse_unsupported(body)
        chat = chat_request(body)
        service = await self._service(body, request)
        try:
            _, tokens = await service.chat_prompt(chat)
        except APIError as error:
            raise _in_messages_terms(error) from None
        return CountTokensResponse(input_tokens=len(tokens))


async def _events(reply: _Reply, writer: MessageWriter) -> AsyncIterator[str]:
    """The stream of a reply under way: message_start, its blocks' events as the reply is written, its end (or an
    error event). A client that goes cancels the reply (PendingReplies.events)."""
    run = reply.run
    yield "".join(writer.start() + writer.feed(run.readers[0].start()))
    try:
        async for _, item in run.replies.events():
            if isinstance(item, ReplyDone):
                deltas, reason, stop = reply.end(item.stats)
                yield "".join(writer.feed(deltas) + writer.finish(item.stats, reason, stop))
            elif events := writer.feed(reply.read(item.text)):
                yield "".join(events)
    except ReplyFailedError as error:
        yield "".join(writer.failed(f"generation failed: {error}"))


def messages_router(models: ModelRouter) -> APIRouter:
    """The routes of Anthropic's Messages API."""
    routes = MessagesRoutes(models)
    router = APIRouter(route_class=WellFormedRoute)
    router.add_api_route("/v1/messages", routes.create, methods=["POST"], response_model=MessageResponse,
                         responses={**ERRORS, **STREAMED}, summary="Anthropic's Messages API")
    router.add_api_route("/v1/messages/count_tokens", routes.count_tokens, methods=["POST"],
                         response_model=CountTokensResponse, responses=ERRORS,
                         summary="The input tokens of a Messages request")
    return router

