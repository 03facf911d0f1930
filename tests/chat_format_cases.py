"""The real chat templates (tests/data/chat_templates), the family each belongs to, and the
conversation pieces the chat-format and reply-parser tests share."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from localchat.chat_formats import ChatFormat, detect_format
from localchat.templates import ChatTemplate, Message, ToolCall

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILY_OF_TEMPLATE = {
    "apertus": "apertus",
    "apriel1_5": "apriel",
    "apriel1_6": "apriel",
    "command_r7b_tool_use": "command-r7b",
    "command_r_plus_tool_use": "command-r",
    "deepseek_r1_distill": "deepseek-r1",
    "deepseek_v3_2": "deepseek-v3.2",
    "deepseek_v4": "deepseek-v4",
    "gemma2": "generic",
    "gemma3": "generic",
    "gigachat3": "gigachat-3",
    "gigachat3_1": "gigachat-3.1",
    "glm4": "generic",
    "gpt_oss": "gpt-oss",
    "granite3_3": "granite",
    "hy3": "hy3",
    "kimi_k3": "kimi-k3",
    "llama3_1": "llama-3",
    "llama3_2": "llama-3",
    "minimax_m3": "minimax-m3",
    "mistral_nemo": "mistral",
    "mistral_small3_2": "mistral-v11",
    "ministral3_reasoning": "mistral-v11",
    "mistral_v0_3": "mistral",
    "phi3_5": "generic",
    "phi4": "generic",
    "phi4_mini": "phi-4-mini",
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "qwen3_coder": "qwen3-coder",
    "glm4_6": "glm-4.5",
    "glm4_7_flash": "glm-4.5",
    "smollm3": "hermes",
    "solar_open": "solar-open",
}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}
ASK = Message("user", "What's the weather in Zürich? 東京 too.")
# The server tests' scripted Qwen3 turn: a question for both tools, and a reply that reasons, then calls both.
QWEN3 = (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
TOOLS = [WEATHER_TOOL, TIME_TOOL]
TOOLS_QUESTION = [{"role": "user", "content": "Weather and time in Zürich?"}]
QWEN3_CALLS = ('<think>\nThe user wants both.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Zürich"}}\n</tool_call>')
WEATHER = ToolCall("call_abc123def456", "get_weather", {"city": "Zürich"})
TIME = ToolCall("call_xyz789", "get_time", {"city": "東京"})


@cache
def template_text(name: str) -> str:
    """The real template `name` of tests/data/chat_templates."""
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def template(name: str) -> ChatTemplate:
    return ChatTemplate(template_text(name))


@cache
def fmt(name: str) -> ChatFormat:
    return detect_format(template(name).source)


@cache
def prompt_of(name: str) -> str:
    return template(name).render([ASK], tools=[WEATHER_TOOL, TIME_TOOL])
