"""OpenAI's Responses API, POST /v1/responses, stateless as Ollama serves it.

A request becomes the chat request it means (`input`'s items as messages: an earlier reply's
function_call items as its assistant message's tool calls, function_call_output items as tool
messages, reasoning items as the next assistant message's reasoning; `instructions` as a system
message first; `text.format` as response_format; `reasoning.effort` as reasoning_effort) and takes
the path /v1/chat/completions takes: the same prompt, sampler, grammar and reply parser, so the same
greedy reply. The reply's parts become output items in the order the model wrote them (reasoning,
message, function calls), whole or streamed as the events the openai package's stream helper reads.

Nothing is stored: `store` is accepted and the response says `store: false` (as Ollama and vLLM
without a store do); what needs a stored response (previous_response_id, conversation, background,
a stored prompt) is refused naming the field. Omitted sampler fields take the model's defaults, as
/v1/chat/completions' do (Ollama sets temperature 1); the response says what the reply used.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from localchat.errors import ContextOverflowError
from localchat.scheduler import ReplyDone, TextDelta
from localchat.server.chat import call_arguments
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.replies import ReplyFailedError
from localchat.server.responses_schemas import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartEvent,
    FunctionCallInput,
    FunctionCallOutputInput,
    IncompleteDetails,
    InputMessage,
    InputTokensDetails,
    LifecycleEvent,
    OutputFunctionCall,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputReasoning,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
    ReasoningInput,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseError,
    ResponseEvent,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
    TextFormat,
    ToolChoice,
)
from localchat.server.schemas import (
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    FinishReason,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    error_responses,
    unsupported_field,
)
from localchat.server.spliced_json import CONTENT_MARK, NUMBER_MARK, SplicedJson
from localchat.session import GenerationStats

if TYPE_CHECKING:
    from localchat.server.routing import ChatRun, ModelRouter

ERRORS = error_responses(
    "Invalid request, a field that needs stored responses or hosted tools, or an input longer than the context",
    "Every slot is busy and the queue is full, or the model named needs the room of busy models",
)
# With "stream": true the answer is server-sent events, each an `event` line naming its type and a `data` line.
STREAMED = {200: {"content": {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}}}}
# The chat request's fields that an error may name, as a Responses request names them.
RESPONSES_FIELDS = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
ItemKind = Literal["message", "reasoning", "function_call"]
ID_PREFIXES: dict[ItemKind, str] = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
# The events that stream an item's text (a call's arguments), and that end it.
DELTA_EVENTS: dict[ItemKind, type[OutputTextDelta | ReasoningTextDelta | ArgumentsDelta]] = {
    "message": OutputTextDelta, "reasoning": ReasoningTextDelta, "function_call": ArgumentsDelta}
TEXT_DONE_EVENTS: dict[ItemKind, type[OutputTextDone | ReasoningTextDone]] = {
    "message": OutputTextDone, "reasoning": ReasoningTextDone}


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request `body` means; raises APIError naming a function_call item whose arguments are no
    JSON object, or an input with nothing to answer."""
    text_format = body.text.format if body.text is not None else None
    tools = [Tool(type="function", function=FunctionDefinition(name=tool.name, description=tool.description,
                                                               parameters=tool.parameters, strict=tool.strict))
             for tool in body.tools or ()]
    return ChatCompletionRequest(
        model=body.model, messages=_messages(body), max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature, top_p=body.top_p, tools=tools or None, tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls, response_format=_response_format(text_format),
        reasoning_effort=body.reasoning.effort if body.reasoning is not None else None,
    )


def _messages(body: ResponsesRequest) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    reasoning = ""  # a reasoning item's, for the assistant message that follows it
    for index, item in enumerate(body.input):
        if isinstance(item, ReasoningInput):
            reasoning += item.text
        elif isinstance(item, InputMessage):
            thought = reasoning if item.role == "assistant" else ""
            messages.append(ChatMessage(role=item.role, content=item.text, reasoning_content=thought or None))
            reasoning = "" if item.role == "assistant" else reasoning
        elif isinstance(item, FunctionCallInput):
            call_arguments(item.arguments, f"input.{index}.arguments")
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            # The calls of one reply, and the text before them, are one assistant message.
            if messages and messages[-1].role == "assistant":
                last = messages[-1]
                messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or ()), call],
                                                       "reasoning_content": (last.reasoning_content or "") + reasoning or None})
            else:
                messages.append(ChatMessage(role="assistant", tool_calls=[call], reasoning_content=reasoning or None))
            reasoning = ""
        elif isinstance(item, FunctionCallOutputInput):
            messages.append(ChatMessage(role="tool", content=item.text, tool_call_id=item.call_id))
    if not messages:
        raise APIError(400, "input: no message to answer", param="input")
    return messages


def _tool_choice(choice: ToolChoice | None) -> Literal["none", "auto", "required"] | NamedToolChoice | None:
    if choice is None:
        return None
    if choice.name is not None:
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return choice.type  # type: ignore[return-value]  # a choice of type function has a name (ToolChoice)


def _response_format(text_format: TextFormat | None) -> ResponseFormat | None:
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return ResponseFormat(type="json_object")
    schema = JsonSchemaFormat.model_validate({"name": text_format.name, "schema": text_format.schema_,
                                             "description": text_format.description, "strict": text_format.strict})
    return ResponseFormat(type="json_schema", json_schema=schema)


def _in_responses_terms(error: APIError) -> APIError:
    """`error` (the chat path's) naming the field as the Responses request has it."""
    param = error.param or ""
    if param not in RESPONSES_FIELDS:
        return error
    name = RESPONSES_FIELDS[param]
    message = name + error.message.removeprefix(param) if error.message.startswith(param) else error.message
    return APIError(error.status, message, code=error.code, param=name)


def _sse(event: ResponseEvent) -> str:
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


@dataclass
class _OpenItem:
    """The output item the reply is writing: its text (or arguments) so far, and its delta event's JSON."""

    kind: ItemKind
    index: int
    id: str
    delta_type: str
    delta: SplicedJson  # its delta event, filled with a piece and a sequence number
    call_id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)


class ResponseWriter:
    """One reply's chat deltas in, the response's output items out; with `stream`, also the server-sent
    events a client reads them by, each numbered. A part of another kind than the item being written
    (reasoning, message text, a call) closes it and opens an item of its own."""

    def __init__(self, response: ResponseObject, *, stream: bool) -> None:
        """`response`: what the request asked, no output yet."""
        self.response = response
        self._stream = stream
        self._sequence = 0
        self._open: _OpenItem | None = None

    def start(self) -> list[str]:
        return self._lifecycle("response.created") + self._lifecycle("response.in_progress")

    def feed(self, deltas: Sequence[ChatDelta]) -> list[str]:
        """The reply's next parts (ChatReplyReader's deltas)."""
        events: list[str] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._text("reasoning", delta.reasoning_content)
            if delta.content:
                events += self._text("message", delta.content)
            for call in delta.tool_calls or ():
                if call.id is not None:
                    events += self._open_item("function_call", call.id, call.function.name or "")
                if call.function.arguments:
                    events += self._piece(call.function.arguments)
        return events

    def finish(self, stats: GenerationStats, finish_reason: FinishReason) -> list[str]:
        """The end: the last item closed, the usage, and the response's last event. A reply cut at its token
        limit is incomplete (so is the item it was writing)."""
        cut = finish_reason == "length"
        events = self._close_item("incomplete" if cut else "completed")
        self.response.status = "incomplete" if cut else "completed"
        self.response.incomplete_details = IncompleteDetails(reason="max_output_tokens") if cut else None
        self.response.completed_at = None if cut else int(time.time())
        self.response.usage = ResponseUsage(
            input_tokens=stats.prompt_tokens, input_tokens_details=InputTokensDetails(cached_tokens=stats.cached_tokens),
            output_tokens=stats.completion_tokens, output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            total_tokens=stats.prompt_tokens + stats.completion_tokens)
        return events + self._lifecycle("response.incomplete" if cut else "response.completed")

    def failed(self, message: str) -> list[str]:
        events = self._close_item("incomplete")
        self.response.status = "failed"
        self.response.error = ResponseError(message=message)
        return events + self._lifecycle("response.failed")

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def _lifecycle(self, kind: Literal["response.created", "response.in_progress", "response.completed",
                                       "response.incomplete", "response.failed"]) -> list[str]:
        if not self._stream:
            return []
        return [_sse(LifecycleEvent(type=kind, sequence_number=self._next(), response=self.response))]

    def _text(self, kind: ItemKind, text: str) -> list[str]:
        opened = self._open_item(kind) if self._open is None or self._open.kind != kind else []
        return opened + self._piece(text)

    def _piece(self, text: str) -> list[str]:
        item = self._open
        assert item is not None, "a piece of an item that was never opened"
        item.pieces.append(text)
        if not self._stream:
            return []
        return [f"event: {item.delta_type}\ndata: {item.delta(text, self._next())}\n\n"]

    def _open_item(self, kind: ItemKind, call_id: str = "", name: str = "") -> list[str]:
        events = self._close_item("completed")
        index, item_id = len(self.response.output), f"{ID_PREFIXES[kind]}_{uuid.uuid4().hex}"
        delta = DELTA_EVENTS[kind](sequence_number=NUMBER_MARK, item_id=item_id, output_index=index, delta=CONTENT_MARK)
        self._open = _OpenItem(kind, index, item_id, delta.type, SplicedJson(delta, [CONTENT_MARK, NUMBER_MARK]), call_id, name)
        if not self._stream:
            return events
        added = OutputItemEvent(type="response.output_item.added", sequence_number=self._next(), output_index=index,
                                item=self._item(self._open, "in_progress"))
        events.append(_sse(added))
        part = self._part(self._open)
        if part is not None:
            event = ContentPartEvent(type="response.content_part.added", sequence_number=self._next(), item_id=item_id,
                                     output_index=index, part=part)
            events.append(_sse(event))
        return events

    def _close_item(self, status: Literal["completed", "incomplete"]) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        done = self._item(item, status)
        self.response.output.append(done)
        if not self._stream:
            return []
        text, where = "".join(item.pieces), {"item_id": item.id, "output_index": item.index}
        finished: list[ResponseEvent]
        part = self._part(item)
        if part is None:
            finished = [ArgumentsDone(sequence_number=self._next(), **where, name=item.name, arguments=text)]
        else:
            finished = [TEXT_DONE_EVENTS[item.kind](sequence_number=self._next(), **where, text=text),
                        ContentPartEvent(type="response.content_part.done", sequence_number=self._next(), **where, part=part)]
        finished.append(OutputItemEvent(type="response.output_item.done", sequence_number=self._next(),
                                        output_index=item.index, item=done))
        return [_sse(event) for event in finished]

    @staticmethod
    def _part(item: _OpenItem) -> OutputText | ReasoningText | None:
        """The item's content part so far (a call has none)."""
        if item.kind == "function_call":
            return None
        text = "".join(item.pieces)
        return OutputText(text=text) if item.kind == "message" else ReasoningText(text=text)

    @staticmethod
    def _item(item: _OpenItem, status: Literal["in_progress", "completed", "incomplete"]) -> OutputItem:
        text = "".join(item.pieces)
        if item.kind == "message":
            return OutputMessage(id=item.id, status=status, content=[OutputText(text=text)] if status != "in_progress" else [])
        if item.kind == "reasoning":
            return OutputReasoning(id=item.id, status=status,
                                   content=[ReasoningText(text=text)] if status != "in_progress" else [])
        return OutputFunctionCall(id=item.id, status=status, call_id=item.call_id, name=item.name, arguments=text)


class ResponsesRoutes:
    """POST /v1/responses over the server's models (leased through `models`)."""

    def __init__(self, models: ModelRouter) -> None:
        self.models = models

    async def create(self, body: ResponsesRequest, request: Request) -> Response:
        refused = unsupported_field("responses", body.model_extra)
        if refused is not None:
            raise APIError(400, refused[1], code="unsupported_parameter", param=refused[0])
        if LOGPROBS_INCLUDE in (body.include or ()):
            raise APIError(400, f"include: {LOGPROBS_INCLUDE} is not supported by localchat's /v1/responses "
                                "(/v1/chat/completions gives log-probabilities); leave it out",
                           code="unsupported_parameter", param="include")
        chat = chat_request(body)
        service = self.models.service(await self.models.lease(request, body.model))
        try:
            run = await service.start_chat(chat, fit_context=body.truncation == "auto")
        except APIError as error:
            raise _in_responses_terms(error) from None
        except ContextOverflowError as error:
            raise APIError(400, str(error), code="context_length_exceeded", param="input") from None
        sampler = run.generation.sampler
        writer = ResponseWriter(ResponseObject(
            id=f"resp_{uuid.uuid4().hex}", created_at=int(time.time()), status="in_progress", model=service.model_id,
            instructions=body.instructions, tools=body.tools or [],
            tool_choice=body.tool_choice.echo if body.tool_choice is not None else "auto",
            parallel_tool_calls=body.parallel_tool_calls,
            temperature=sampler.temperature if sampler is not None else body.temperature,
            top_p=sampler.top_p if sampler is not None else body.top_p,
            max_output_tokens=body.max_output_tokens, text=body.text or TextConfig(), reasoning=body.reasoning,
            truncation=body.truncation, metadata=body.metadata or {}, user=body.user,
        ), stream=body.stream)
        if body.stream:
            return StreamingResponse(_events(run, writer), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        reader = run.readers[0]
        writer.feed(reader.start())

        def read(_: int, delta: TextDelta) -> None:
            writer.feed(run.read(0, delta.text))

        await service.read_whole(run.replies, request, read)
        stats = run.replies.stats[0]
        writer.feed(reader.finish(cut_short=stats.finish_reason == "length"))
        writer.finish(stats, reader.finish_reason(stats))
        return JSONResponse(writer.response.model_dump(mode="json"))


async def _events(run: ChatRun, writer: ResponseWriter) -> AsyncIterator[str]:
    """The stream of a reply under way: its lifecycle, its items' events as the reply is written, its end
    (or its failure: response.failed). A client that goes cancels the reply (PendingReplies.events)."""
    reader = run.readers[0]
    yield "".join(writer.start() + writer.feed(reader.start()))
    try:
        async for _, item in run.replies.events():
            if isinstance(item, ReplyDone):
                ending = writer.feed(reader.finish(cut_short=item.stats.finish_reason == "length"))
                yield "".join(ending + writer.finish(item.stats, reader.finish_reason(item.stats)))
            elif events := writer.feed(run.read(0, item.text)):
                yield "".join(events)
    except ReplyFailedError as error:
        yield "".join(writer.failed(f"generation failed: {error}"))


def responses_router(models: ModelRouter) -> APIRouter:
    """The route of OpenAI's Responses API."""
    routes = ResponsesRoutes(models)
    router = APIRouter(route_class=WellFormedRoute)
    router.add_api_route("/v1/responses", routes.create, methods=["POST"], response_model=ResponseObject,
                         responses={**ERRORS, **STREAMED}, summary="OpenAI's Responses API (stateless)")
    return router
