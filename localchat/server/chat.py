"""Chat requests through the model's own formats (localchat.chat_formats): OpenAI's messages,
tools and tool choice become the prompt the model's template writes; the reply's text becomes
content, reasoning and tool calls, streamed as OpenAI's chunks.

Tool choice: "auto" (the default with tools) shows the tools and reads calls from the reply;
"none" shows no tools and reads none; "required" and a named function also write the start of
a call after the prompt (the family's own call syntax, through the function's name when one is
named) and constrain the rest of the reply to one call's grammar (its arguments following the
function's JSON schema), so that the reply is a valid call whatever the model would have
written. `parallel_tool_calls: false` ends the reply after its first call. Families that write
calls as markup (Qwen3-Coder, GLM-4.5: localchat.markup_calls) are typed by the tools' schemas;
a forced one's grammar takes the schema's parameters in order, the required ones present; a
streamed markup call comes as its name and whole arguments once its `</tool_call>` is read.

Thinking: `reasoning_effort: "none"` passes `enable_thinking=false` to the template (Qwen 3 and
SmolLM3 read it; a template reading another switch, Kimi K3's `thinking` or MiniMax-M3's `thinking_mode`,
gets that one: templates.THINKING_SWITCHES), other efforts pass `reasoning_effort` (gpt-oss reads it);
`chat_template_kwargs` (llama.cpp's and vLLM's extension) passes any variable and wins over both. Whatever the template, reasoning the reply holds comes back as
reasoning_content.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localchat.backends.base import Backend
from localchat.chat_formats import (
    ChatFormat,
    TemplateSupport,
    call_grammar,
    call_lead,
    call_opening,
    conversation_format,
    detect_format,
    render_chat,
    template_support,
)
from localchat.constraints import Constraint
from localchat.errors import InvalidSettingError
from localchat.reply_parser import (
    ArgumentsDelta,
    CallEnd,
    CallScope,
    CallStart,
    ContentDelta,
    ParsedReply,
    ReasoningDelta,
    ReplyParser,
    ReplyPart,
)
from localchat.server.errors import APIError
from localchat.server.schemas import (
    AssistantMessage,
    CalledFunction,
    CalledTool,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    FinishReason,
    FunctionDelta,
    ToolCallDelta,
)
from localchat.session import GenerationStats
from localchat.templates import ChatTemplate, Message, ToolCall

# OpenAI clients send the role "developer" for what templates call "system".
TEMPLATE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# Variables render() sets itself: chat_template_kwargs may not name them.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "self"})


@dataclass(frozen=True)
class ModelChat:
    """What a model's template says about chats: its family's format, what it renders, and the
    control tokens a reply must show for the format's markers to be read."""

    template: ChatTemplate
    format: ChatFormat
    support: TemplateSupport
    control: dict[str, int]  # the format's markers that are control tokens, and their ids

    @classmethod
    def of(cls, backend: Backend, template: ChatTemplate) -> ModelChat:
        family = detect_format(template.source)
        support = template_support(template, family)
        fmt = conversation_format(family, support)
        control = {}
        for text in (*fmt.markers, fmt.call.prefix, fmt.call.before_arguments, fmt.call.closing):
            for token in backend.tokenize(text, add_bos=False, special=True):
                if not backend.token_bytes(token) and backend.token_text(token):
                    control[backend.token_text(token)] = token
        return cls(template, fmt, support, control)

    @property
    def shown_tokens(self) -> frozenset[int]:
        return frozenset(self.control.values())


@dataclass(frozen=True)
class ChatPlan:
    """How one request is answered: the prompt, what is written after it for the model (a call's
    opening), and how its reply is read."""

    prompt: str
    forced: str
    format: ChatFormat
    read_calls: bool
    max_calls: int | None
    constraint: Constraint | None = None  # a forced call's grammar
    forced_functions: tuple[str, ...] = ()  # the functions a forced call may be of
    named_call: bool = False  # tool_choice named the function
    # Each shown function's parameters' schema, by name: calls written as markup are typed by it.
    parameters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def stop_scope(self) -> CallScope:
        """Where the reply's stop strings apply: outside the calls it writes."""
        return CallScope(self.format, self.prompt)


def call_arguments(text: str, where: str) -> dict[str, Any]:
    """A call's arguments, given as JSON text; raises APIError naming `where` unless they are a JSON object."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise APIError(400, f"{where} must be a JSON object, as text", param=where)
    return value


def _message(message: ChatMessage, index: int) -> Message:
    where = f"messages.{index}"
    if message.role == "tool" and not message.tool_call_id:
        raise APIError(400, f"{where}.tool_call_id: a tool message needs the id of the call it answers", param=f"{where}.tool_call_id")
    if message.tool_calls and message.role != "assistant":
        raise APIError(400, f"{where}.tool_calls: only an assistant message has tool calls", param=f"{where}.tool_calls")
    calls = tuple(
        ToolCall(call.id, call.function.name, call_arguments(call.function.arguments, f"{where}.tool_calls.{number}.function.arguments"))
        for number, call in enumerate(message.tool_calls or ())
    )
    return Message(
        TEMPLATE_ROLES[message.role],  # type: ignore[arg-type]
        message.text,
        tool_calls=calls,
        tool_call_id=message.tool_call_id if message.role == "tool" else None,
        reasoning=message.reasoning_content if message.role == "assistant" else None,
    )


def _template_kwargs(body: ChatCompletionRequest, default_thinking: bool | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {} if default_thinking is None else {"enable_thinking": default_thinking}
    if body.reasoning_effort == "none":
        kwargs["enable_thinking"] = False
    elif body.reasoning_effort is not None:
        kwargs["reasoning_effort"] = body.reasoning_effort
    extra = body.chat_template_kwargs or {}
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES.intersection(extra))
    if reserved:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(reserved)}: the request's own fields do",
                       param="chat_template_kwargs")
    return {**kwargs, **extra}


def plan_chat(body: ChatCompletionRequest, chat: ModelChat, *, default_thinking: bool | None = None,
              opening: Callable[[list[Message]], list[Message]] = list) -> ChatPlan:
    """The prompt for `body` and how to read its reply; raises APIError for a request that
    contradicts itself (tool_choice without tools, a named function not among them). `opening`: the
    request's messages with what the model starts every chat with (a preset's: Engine.opening)."""
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or ()]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) < len(names):
        raise APIError(400, "tools: two tools have the same name", param="tools")
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    forced_name: str | None = None
    if not isinstance(choice, str):
        forced_name = choice.function.name
        if forced_name not in names:
            raise APIError(400, f"tool_choice names the function '{forced_name}', which is not among the tools", param="tool_choice")
    # "auto" with no tools is no tools, as llama-server, vLLM and Ollama read it.
    if choice not in ("none", "auto") and not tools:
        raise APIError(400, "tool_choice asks for a tool call but the request has no tools", param="tool_choice")
    shown = tools if choice != "none" else []
    messages = opening([_message(message, index) for index, message in enumerate(body.messages)])
    template_kwargs = _template_kwargs(body, default_thinking)
    prompt = render_chat(chat.template, chat.format, chat.support, messages, tools=shown, template_kwargs=template_kwargs)
    max_calls = None if body.parallel_tool_calls else 1
    parameters = {tool["function"]["name"]: tool["function"].get("parameters", {}) for tool in shown}
    # A reply held to a response_format is that JSON, never a call (bare JSON calls would read it so).
    structured = body.response_format is not None and body.response_format.type != "text"
    if choice != "required" and forced_name is None:
        return ChatPlan(prompt, "", chat.format, read_calls=bool(shown) and not structured, max_calls=max_calls,
                        parameters=parameters)
    if structured:
        raise APIError(400, "response_format cannot constrain a reply that must be a tool call (tool_choice)", param="response_format")
    try:
        constraint = Constraint("lark", call_grammar(chat.format, shown, forced_name, chat.control))
    except InvalidSettingError as error:
        raise APIError(400, f"tools: {error}", param="tools") from None
    lead = call_lead(chat.template, chat.format, chat.support, messages, prompt, tools=shown, template_kwargs=template_kwargs)
    forced = call_opening(chat.format, prompt, forced_name, lead)
    functions = (forced_name,) if forced_name is not None else tuple(names)
    return ChatPlan(prompt, forced, chat.format, read_calls=True, max_calls=max_calls, constraint=constraint,
                    forced_functions=functions, named_call=forced_name is not None, parameters=parameters)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChatReplyReader:
    """A reply's text in, OpenAI's chat deltas out; the whole message at the end.

    `complete` turns true once the calls wanted are made (parallel_tool_calls false): the rest
    of the reply is not read, and the caller may stop it.
    """

    def __init__(self, plan: ChatPlan, new_id: Callable[[], str] = new_call_id) -> None:
        self._parser = ReplyParser(plan.format, calls=plan.read_calls, prompt=plan.prompt, forced=plan.forced_functions,
                                   tools=plan.parameters)
        self._max_calls = plan.max_calls
        self._new_id = new_id
        self._reply = ParsedReply()
        self._ids: list[str] = []
        self.complete = False
        self._forced = plan.forced
        self._named_call = plan.named_call

    def start(self) -> list[ChatDelta]:
        """The deltas of what the server wrote for the model (a named call's start)."""
        return self.feed(self._forced)

    def feed(self, text: str) -> list[ChatDelta]:
        return self._deltas(self._parser.feed(text))

    def finish(self, *, cut_short: bool = False) -> list[ChatDelta]:
        """What the reply's end releases; `cut_short`: it ended at its token limit."""
        return self._deltas(self._parser.finish(cut_short=cut_short))

    def _deltas(self, parts: list[ReplyPart]) -> list[ChatDelta]:
        deltas = []
        for part in parts:
            if self.complete:
                break
            self._reply.add(part)
            if isinstance(part, ContentDelta):
                deltas.append(ChatDelta(content=part.text))
            elif isinstance(part, ReasoningDelta):
                deltas.append(ChatDelta(reasoning_content=part.text))
            elif isinstance(part, CallStart):
                self._ids.append(self._new_id())
                call = ToolCallDelta(index=part.index, id=self._ids[-1], type="function",
                                     function=FunctionDelta(name=part.name, arguments=""))
                deltas.append(ChatDelta(tool_calls=[call]))
            elif isinstance(part, ArgumentsDelta):
                deltas.append(ChatDelta(tool_calls=[ToolCallDelta(index=part.index, function=FunctionDelta(arguments=part.text))]))
            elif isinstance(part, CallEnd):
                self.complete = self._max_calls is not None and part.index + 1 >= self._max_calls
        return deltas

    @property
    def calls(self) -> int:
        return len(self._ids)

    def message(self) -> AssistantMessage:
        calls = [CalledTool(id=call_id, function=CalledFunction(name=call.name, arguments=call.arguments))
                 for call_id, call in zip(self._ids, self._reply.calls, strict=True)]
        return AssistantMessage(
            content=self._reply.content if self._reply.content or not calls else None,
            reasoning_content=self._reply.reasoning or None,
            tool_calls=calls or None,
        )

    def finish_reason(self, stats: GenerationStats) -> FinishReason:
        if self.complete or (self.calls and stats.finish_reason != "length"):
            return "tool_calls"
        return text_finish_reason(stats)

    def chat_completions_finish_reason(self, stats: GenerationStats) -> FinishReason:
        """`finish_reason` as OpenAI's chat completions say it (and vLLM's, which matched them): a call of the
        function tool_choice named ends as "stop", streamed or not; calls the model chose (auto, required) as
        "tool_calls"."""
        reason = self.finish_reason(stats)
        return "stop" if reason == "tool_calls" and self._named_call else reason


def text_finish_reason(stats: GenerationStats) -> FinishReason:
    """How a reply without calls ended, in OpenAI's words. A reply this request cancelled itself ends as "stop"; one the
    server cut as it stopped raises instead (PendingReplies.events)."""
    return "length" if stats.finish_reason == "length" else "stop"
