"""Real models' chat templates (tests/data/chat_templates, see SOURCES.md) render exactly as
transformers' `apply_chat_template(..., tokenize=False)` renders them, refusals included."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import pytest

from localchat.templates import (
    THINKING_SWITCH,
    ChatMessage,
    ChatTemplate,
    Message,
    TemplateError,
    TemplateRefusedError,
    ToolCall,
    chat_overhead_bytes,
)

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILIES = sorted(path.stem for path in TEMPLATES.glob("*.jinja"))

# The BOS and EOS text each family's tokenizer passes to its template (special_tokens_map).
SPECIAL_TOKENS: dict[str, tuple[str, str]] = {
    "apertus": ("<s>", "</s>"),
    "apriel1_5": ("<s>", "</s>"),
    "apriel1_6": ("<s>", "</s>"),
    "command_r7b_tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "command_r_plus_tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "deepseek_r1_distill": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek_v3_1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek_v3_2": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek_v4": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "gemma4": ("<bos>", "<eos>"),
    "gigachat3": ("<s>", "</s>"),
    "gigachat3_1": ("<s>", "</s>"),
    "glm4": ("", "<|endoftext|>"),
    "glm4_6": ("", "<|endoftext|>"),
    "glm4_7_flash": ("", "<|endoftext|>"),
    "gpt_oss": ("<|startoftext|>", "<|return|>"),
    "granite3_3": ("<|end_of_text|>", "<|end_of_text|>"),
    "hy3": ("", ""),  # its template sets its own
    "kimi_k2": ("", ""),  # its template writes neither
    "kimi_k3": ("", ""),  # its template writes neither
    "lfm2": ("<|startoftext|>", "<|im_end|>"),
    "lfm2_5": ("<|startoftext|>", "<|im_end|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "minicpm5": ("<s>", ""),  # its template writes no EOS
    "minimax_m2": ("", ""),  # its template writes neither
    "minimax_m3": ("", ""),  # its template sets its own
    "ministral3_reasoning": ("<s>", "</s>"),
    "mistral_nemo": ("<s>", "</s>"),
    "mistral_small3_2": ("<s>", "</s>"),
    "mistral_v0_3": ("<s>", "</s>"),
    "nemotron_nano_v2": ("", ""),  # its template writes neither
    "phi3_5": ("<s>", "<|endoftext|>"),
    "phi4": ("<|endoftext|>", "<|im_end|>"),
    "phi4_mini": ("<|endoftext|>", "<|endoftext|>"),
    "qwen2_5": ("", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"),
    "qwen3_coder": ("", "<|im_end|>"),
    "seed_oss": ("<seed:bos>", "<seed:eos>"),
    "smollm3": ("", "<|im_end|>"),
    "solar_open": ("", ""),  # its template writes neither
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
SYSTEM = Message("system", "You are a terse assistant.")
ASK = Message("user", "What's the weather in Zürich? 東京 too.")
# Mistral's templates want tool call ids of exactly 9 alphanumerics.
WEATHER_CALL = ToolCall("call0zrch", "get_weather", {"city": "Zürich", "unit": "celsius"})
TIME_CALL = ToolCall("call1tkyo", "get_time", {"city": "東京"})
CALLING = Message("assistant", "", tool_calls=(WEATHER_CALL,))
RESULT = Message("tool", '{"temperature": 21, "sky": "clear"}', tool_call_id="call0zrch")
# Arguments that nest an object and arrays (MiniMax-M3's template writes them as nested elements).
ROUTE_TOOL = {"type": "function", "function": {"name": "route", "parameters": {"type": "object", "properties": {
    "stops": {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}}}},
    "options": {"type": "object", "properties": {"avoid": {"type": "array", "items": {"type": "string"}}, "fast": {"type": "boolean"}}}}}}}
ROUTE_CALL = ToolCall("call2rout", "route", {"stops": [{"city": "Zürich", "nights": 2}, {"city": "東京", "nights": 1}],
                                             "options": {"avoid": ["tolls"], "fast": True}})
ANSWER = Message("assistant", "21 °C and clear.")


@dataclass(frozen=True)
class Conversation:
    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


CONVERSATIONS: dict[str, Conversation] = {
    "user": Conversation((ASK,)),
    "system": Conversation((SYSTEM, ASK)),
    "turns": Conversation((SYSTEM, ASK, Message("assistant", "Sunny."), Message("user", "And tomorrow?"))),
    "turns_no_system": Conversation((ASK, Message("assistant", "Sunny."), Message("user", "And tomorrow?"))),
    "tools": Conversation((SYSTEM, ASK), tools=(WEATHER_TOOL, TIME_TOOL)),
    "tools_no_system": Conversation((ASK,), tools=(WEATHER_TOOL,)),
    "tool_call": Conversation((SYSTEM, ASK, CALLING), tools=(WEATHER_TOOL,)),
    "tool_result": Conversation((SYSTEM, ASK, CALLING, RESULT), tools=(WEATHER_TOOL,)),
    "tool_answered": Conversation((ASK, CALLING, RESULT, ANSWER, Message("user", "Thanks!")), tools=(WEATHER_TOOL,)),
    "parallel_calls": Conversation(
        (
            ASK,
            Message("assistant", "Checking both.", tool_calls=(WEATHER_CALL, TIME_CALL)),
            RESULT,
            Message("tool", '"09:30"', tool_call_id="call1tkyo"),
        ),
        tools=(WEATHER_TOOL, TIME_TOOL),
    ),
    "reasoning": Conversation((ASK, Message("assistant", "Sunny.", reasoning="The user wants weather."), Message("user", "Why?"))),
    "reasoning_last": Conversation((ASK, Message("assistant", "Sunny.", reasoning="The user wants weather."))),
    "reasoning_tool_call": Conversation(
        (ASK, Message("assistant", "", tool_calls=(WEATHER_CALL,), reasoning="I need the weather."), RESULT), tools=(WEATHER_TOOL,)
    ),
    # What an OpenAI client sends: content null beside tool calls, arguments as a JSON string.
    "openai_dicts": Conversation(
        (
            {"role": "user", "content": "Weather in Bern?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call2bern", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}
            ]},
            {"role": "tool", "tool_call_id": "call2bern", "content": "18"},
        ),
        tools=(WEATHER_TOOL,),
    ),
    "nested_arguments": Conversation((ASK, Message("assistant", "", tool_calls=(ROUTE_CALL,)), Message("tool", "ok", tool_call_id="call2rout")),
                                     tools=(ROUTE_TOOL,)),
    "no_thinking": Conversation((SYSTEM, ASK), kwargs={"enable_thinking": False}),
    "thinking": Conversation((SYSTEM, ASK), kwargs={"enable_thinking": True}),
    "thinking_mode": Conversation((SYSTEM, ASK), kwargs={"thinking_mode": "enabled"}),  # MiniMax-M3's switch
    # Conversations some templates refuse:
    "two_users": Conversation((ASK, Message("user", "Hello?"))),
    "openai_call_id": Conversation(
        (ASK, Message("assistant", "", tool_calls=(ToolCall("call_abc123def456", "get_weather", {"city": "Bern"}),)),
         Message("tool", "18", tool_call_id="call_abc123def456")),
        tools=(WEATHER_TOOL,),
    ),
}


@cache
def template_for(family: str) -> ChatTemplate:
    bos, eos = SPECIAL_TOKENS[family]
    return ChatTemplate((TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8"), bos_token=bos, eos_token=eos)


def render_both(render_hf: Callable[..., Any], family: str, conversation: Conversation, add_generation_prompt: bool) -> tuple[str | Exception, str | Exception]:
    """transformers' rendering and localchat's, each a text or the exception it raised. transformers is given the
    thinking switch the template reads besides enable_thinking, as localchat sets it (templates.THINKING_SWITCHES)."""
    template = template_for(family)
    tools = None if conversation.tools is None else list(conversation.tools)
    thinking = conversation.kwargs.get(THINKING_SWITCH)
    switches = {} if thinking is None else template.thinking_variables(bool(thinking))
    try:
        rendered, _ = render_hf(
            conversations=[[m.as_template_dict() if isinstance(m, Message) else dict(m) for m in conversation.messages]],
            tools=tools,
            chat_template=template.source,
            add_generation_prompt=add_generation_prompt,
            bos_token=template.bos_token,
            eos_token=template.eos_token,
            **{**switches, **conversation.kwargs},
        )
        expected: str | Exception = rendered[0]
    except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as error:  # the template's own failure
        expected = error
    try:
        actual: str | Exception = template.render(
            list(conversation.messages), add_generation_prompt=add_generation_prompt, tools=tools, **conversation.kwargs
        )
    except TemplateError as error:
        actual = error
    return expected, actual


@pytest.fixture(scope="module")
def render_hf() -> Callable[..., Any]:
    """transformers' own renderer (what apply_chat_template calls with tokenize=False)."""
    utils = pytest.importorskip(
        "transformers.utils.chat_template_utils", reason="needs transformers: pip install 'localchat[convert]'"
    )
    return utils.render_jinja_template


def test_the_gathered_families_are_all_here() -> None:
    assert FAMILIES == sorted(SPECIAL_TOKENS)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("family", FAMILIES)
def test_renders_as_transformers_does(render_hf: Callable[..., Any], family: str, conversation: str) -> None:
    for add_generation_prompt in (True, False):
        expected, actual = render_both(render_hf, family, CONVERSATIONS[conversation], add_generation_prompt)
        if isinstance(expected, str):
            assert actual == expected, f"add_generation_prompt={add_generation_prompt}"
        elif type(expected) is jinja2.exceptions.TemplateError:  # the template's raise_exception
            assert isinstance(actual, TemplateRefusedError), f"transformers refused: {expected}"
            assert actual.rule == str(expected)
            assert str(actual) == f"the model's chat template refused this conversation: {expected}"
        else:  # the template breaks on this input (an undefined field, a type error) in both
            assert isinstance(actual, TemplateError) and not isinstance(actual, TemplateRefusedError), repr(expected)


# Outcomes worth pinning, so the comparison above cannot pass by both sides failing the same way.
REFUSALS = [
    ("gemma2", "system", "System role not supported"),
    ("gemma3", "two_users", "Conversation roles must alternate user/assistant/user/assistant/..."),
    ("mistral_nemo", "openai_call_id", "Tool call IDs should be alphanumeric strings with length 9!"),
    ("mistral_nemo", "two_users", "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."),
]


@pytest.mark.parametrize(("family", "conversation", "rule"), REFUSALS)
def test_a_template_refusal_names_the_templates_rule(render_hf: Callable[..., Any], family: str, conversation: str, rule: str) -> None:
    expected, actual = render_both(render_hf, family, CONVERSATIONS[conversation], True)
    assert str(expected) == rule
    assert isinstance(actual, TemplateRefusedError) and actual.rule == rule


@pytest.mark.parametrize("family", FAMILIES)
def test_every_template_renders_a_plain_chat(family: str) -> None:
    """Without transformers too: each real template takes a plain conversation and writes every message
    (with a tool offered, which the Command R tool_use templates require)."""
    conversation = CONVERSATIONS["turns_no_system"]
    text = template_for(family).render(list(conversation.messages), tools=[WEATHER_TOOL])
    for message in conversation.messages:
        assert isinstance(message, Message) and message.content in text


# Templates that ignore the `tools` variable: their models take tools some other way, or none.
WITHOUT_TOOLS = {"deepseek_r1_distill", "gemma2", "gemma3", "glm4", "phi3_5", "phi4", "phi4_mini", "smollm3"}
# Mistral v0.3's first template renders results from a "tool_results" role, not "tool".
WITHOUT_TOOL_ROLE = {"mistral_v0_3"}


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - WITHOUT_TOOLS))
def test_templates_with_tools_show_them_to_the_model(family: str) -> None:
    conversation = CONVERSATIONS["tool_result"]
    text = template_for(family).render(list(conversation.messages), tools=list(conversation.tools or ()))
    assert "get_weather" in text
    assert ("temperature" in text) != (family in WITHOUT_TOOL_ROLE)  # the result, often re-encoded as JSON


@pytest.mark.parametrize("family", FAMILIES)
def test_what_a_template_writes_around_a_replys_messages_is_no_more_than_its_overhead(family: str) -> None:
    """A context for one reply is sized by the messages' text and the template's overhead (planner.OneReply), measured
    on messages of a byte: every template writes no more around longer, many-line or non-ASCII messages, with or
    without a system prompt. BOS and EOS render as in the measure (their text is one token whatever it is)."""
    source = (TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8")
    overhead = chat_overhead_bytes(source, "llama")
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    texts = ["Hi", "Write a haiku about the sea.\n\nMake it sad.  ", "Zürich, 東京 and 🙂 " * 30, "x" * 2000]
    rendered = 0
    for system in (None, "You are a pirate.", "Answer in French.\n" * 20):
        for text in texts:
            messages = [*([Message("system", system)] if system else []), Message("user", text)]
            try:
                prompt = template.render(messages)
            except TemplateError:
                continue  # such a reply is refused whatever its context
            rendered += 1
            assert len(prompt.encode()) - sum(len(m.content.encode()) for m in messages) <= overhead, (system, text)
    # One that renders no plain chat (Command R+'s tool-use template wants tools) counts its own text twice.
    assert rendered >= len(texts) or overhead == 2 * len(source.encode())
