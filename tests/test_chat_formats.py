"""Tool calls and reasoning read out of replies, family by family (pure logic, real templates).

Replies are written as each family's model writes them (the forms the families' own templates
render for an assistant's calls); every case must give the same parts whichever way the reply is
split into streamed pieces.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from localchat.chat_formats import (
    GENERIC,
    ArgumentsDelta,
    CallEnd,
    CallStart,
    ChatFormat,
    ContentDelta,
    ParsedCall,
    ParsedReply,
    ReasoningDelta,
    ReplyParser,
    ReplyPart,
    TemplateSupport,
    call_opening,
    conversation_format,
    detect_format,
    parse_reply,
    render_chat,
    template_support,
)
from localchat.templates import ChatTemplate, Message, TemplateRefusedError, ToolCall

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILY_OF_TEMPLATE = {
    "command_r7b_tool_use": "command-r7b",
    "command_r_plus_tool_use": "command-r",
    "deepseek_r1_distill": "deepseek-r1",
    "gemma2": "generic",
    "gemma3": "generic",
    "glm4": "generic",
    "gpt_oss": "gpt-oss",
    "granite3_3": "granite",
    "llama3_1": "llama-3",
    "llama3_2": "llama-3",
    "mistral_nemo": "mistral",
    "mistral_small3_2": "mistral-v11",
    "mistral_v0_3": "mistral",
    "phi3_5": "generic",
    "phi4": "generic",
    "phi4_mini": "phi-4-mini",
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "smollm3": "hermes",
}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}
ASK = Message("user", "What's the weather in Zürich? 東京 too.")
WEATHER = ToolCall("call_abc123def456", "get_weather", {"city": "Zürich"})
TIME = ToolCall("call_xyz789", "get_time", {"city": "東京"})


@cache
def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"))


@cache
def fmt(name: str) -> ChatFormat:
    return detect_format(template(name).source)


def prompt_of(name: str) -> str:
    return template(name).render([ASK], tools=[WEATHER_TOOL, TIME_TOOL])


def call(name: str, **arguments: str) -> ParsedCall:
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


@dataclass(frozen=True)
class Case:
    template: str
    reply: str
    expected: ParsedReply
    calls: bool = True
    prompt: str | None = None  # default: the template's own generation prompt

    def parse(self) -> ParsedReply:
        prompt = prompt_of(self.template) if self.prompt is None else self.prompt
        return parse_reply(fmt(self.template), self.reply, calls=self.calls, prompt=prompt)


WEATHER_ARGS = '{"city": "Zürich"}'
TIME_ARGS = '{"city": "東京"}'
TWO_CALLS = [ParsedCall("get_weather", WEATHER_ARGS), ParsedCall("get_time", TIME_ARGS)]
ONE_CALL = [ParsedCall("get_weather", WEATHER_ARGS)]


def reply(content: str = "", reasoning: str = "", calls: list[ParsedCall] | None = None) -> ParsedReply:
    return ParsedReply(content, reasoning, list(calls or []))


CASES: dict[str, Case] = {
    # Hermes (Qwen 2.5/3, SmolLM3): <tool_call> blocks, maybe after reasoning or text.
    "hermes": Case("qwen2_5", f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n</tool_call>\n'
                              f'<tool_call>\n{{"name": "get_time", "arguments": {TIME_ARGS}}}\n</tool_call>', reply(calls=TWO_CALLS)),
    "hermes_text_first": Case("qwen2_5", f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n</tool_call>',
                              reply("Let me check.\n", calls=ONE_CALL)),
    "qwen3_thinking": Case("qwen3", f'<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{{"name": "get_weather", '
                                    f'"arguments": {WEATHER_ARGS}}}\n</tool_call>', reply(reasoning="The user wants the weather.", calls=ONE_CALL)),
    "qwen3_answer": Case("qwen3", "<think>\nEasy.\n\nSunny.\n</think>\n\nIt is sunny.", reply("It is sunny.", "Easy.\n\nSunny.")),
    "qwen3_no_thinking": Case("qwen3", "It is sunny.", reply("It is sunny."),
                              prompt=template("qwen3").render([ASK], enable_thinking=False)),
    "arguments_first": Case("qwen2_5", '<tool_call>{"arguments": {"city": "Zürich"}, "name": "get_weather"}</tool_call>',
                            reply(calls=ONE_CALL)),
    "arguments_as_string": Case("qwen2_5", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Zürich\\"}"}</tool_call>',
                                reply(calls=ONE_CALL)),
    "no_arguments": Case("qwen2_5", '<tool_call>{"name": "get_time"}</tool_call>', reply(calls=[ParsedCall("get_time", "{}")])),
    "tricky_strings": Case("qwen2_5", '<tool_call>{"name": "get_weather", "arguments": {"city": "a \\"}\\" <tool_call> ]"}}</tool_call> ok',
                           reply("ok", calls=[ParsedCall("get_weather", '{"city": "a \\"}\\" <tool_call> ]"}')])),
    "not_a_call": Case("qwen2_5", "Use <tool_call>tags</tool_call> like this.", reply("Use <tool_call>tags</tool_call> like this.")),
    "cut_before_the_name": Case("qwen2_5", 'Hi <tool_call>{"name": "get_wea', reply('Hi <tool_call>{"name": "get_wea')),
    "cut_in_the_arguments": Case("qwen2_5", '<tool_call>{"name": "get_weather", "arguments": {"city": "Zü',
                                 reply(calls=[ParsedCall("get_weather", '{"city": "Zü')])),
    "broken_after_the_name": Case("qwen2_5", '<tool_call>{"name": "get_weather" oops', reply("oops", calls=[ParsedCall("get_weather", "{}")])),
    "calls_off": Case("qwen3", '<think>Hmm.</think><tool_call>{"name": "x"}</tool_call>', reply('<tool_call>{"name": "x"}</tool_call>', "Hmm."),
                      calls=False),
    # Llama 3.x: bare JSON with "parameters" where the reply begins, or after <|python_tag|>.
    "llama": Case("llama3_1", '{"name": "get_weather", "parameters": {"city": "Zürich"}}', reply(calls=ONE_CALL)),
    "llama_typed": Case("llama3_2", ' {"type": "function", "name": "get_weather", "parameters": {"city": "Zürich"}}', reply(calls=ONE_CALL)),
    "llama_python_tag": Case("llama3_1", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich"}}', reply(calls=ONE_CALL)),
    "llama_json_answer": Case("llama3_1", '{"city": "Zürich"} is the JSON.', reply('{"city": "Zürich"} is the JSON.')),
    "llama_text": Case("llama3_1", "Sunny, {name}.", reply("Sunny, {name}.")),
    # Mistral: [TOOL_CALLS] and a JSON array (v0.3, Nemo); v11+: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}.
    "mistral": Case("mistral_nemo", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich"}, "id": "a1b2c3d4e"}, '
                                    '{"name": "get_time", "arguments": {"city": "東京"}, "id": "f5g6h7i8j"}]', reply(calls=TWO_CALLS)),
    "mistral_v03": Case("mistral_v0_3", ' [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich"}}]', reply(calls=ONE_CALL)),
    "mistral_v11": Case("mistral_small3_2", '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]'
                                            '{"city": "東京"}', reply(calls=TWO_CALLS)),
    # DeepSeek R1: the prompt leaves the reply inside <think>.
    "deepseek_r1": Case("deepseek_r1_distill", "Weather and time.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                                               'get_weather\n```json\n{"city": "Zürich"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
                                               '<｜tool▁sep｜>get_time\n```json\n{"city": "東京"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
                        reply(reasoning="Weather and time.", calls=TWO_CALLS)),
    "deepseek_r1_answer": Case("deepseek_r1_distill", "Easy.\n</think>\n\nSunny.", reply("Sunny.", "Easy.")),
    # gpt-oss: harmony channels; the prompt ends with <|start|>assistant; <|call|> and <|return|> end the reply.
    "gpt_oss_call": Case("gpt_oss", "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                                    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Zürich"}', reply(reasoning="Need the weather.", calls=ONE_CALL)),
    "gpt_oss_recipient_first": Case("gpt_oss", ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Zürich"}<|call|>',
                                    reply(calls=ONE_CALL)),
    "gpt_oss_answer": Case("gpt_oss", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
                           reply("It is sunny.", "Easy.")),
    "gpt_oss_calls_off": Case("gpt_oss", "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi.",
                              reply("Hi.", "Hm."), calls=False),
    # Granite 3.x: <|tool_call|> and a JSON array; thinking as <think>, the answer in <response>.
    "granite": Case("granite3_3", f'<|tool_call|>[{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}, '
                                  f'{{"name": "get_time", "arguments": {TIME_ARGS}}}]', reply(calls=TWO_CALLS)),
    "granite_thinking": Case("granite3_3", "<think>Sunny, surely.</think><response>Sunny.</response>", reply("Sunny.", "Sunny, surely.")),
    # Phi-4-mini: <|tool_call|>[...]<|/tool_call|>.
    "phi4_mini": Case("phi4_mini", f'<|tool_call|>[{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}]<|/tool_call|>', reply(calls=ONE_CALL)),
    # Command R7B: thinking, then an action list with tool_name/parameters; answers in START_RESPONSE.
    "command_r7b": Case("command_r7b_tool_use", '<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n'
                                                '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Zürich"}}\n'
                                                "]<|END_ACTION|>", reply(reasoning="I will look it up.", calls=ONE_CALL)),
    "command_r7b_answer": Case("command_r7b_tool_use", "<|START_RESPONSE|>Sunny.<|END_RESPONSE|>", reply("Sunny.")),
    # Command R+: "Action:" and a fenced JSON list.
    "command_r_plus": Case("command_r_plus_tool_use", 'Action: ```json\n[\n    {\n        "tool_name": "get_weather",\n'
                                                      '        "parameters": {"city": "Zürich"}\n    }\n]\n```', reply(calls=ONE_CALL)),
    # Templates that know no tool syntax: a bare (maybe fenced) JSON object or array where the reply begins.
    "generic": Case("gemma3", '{"name": "get_weather", "arguments": {"city": "Zürich"}}', reply(calls=ONE_CALL)),
    "generic_fenced_array": Case("gemma3", f'```json\n[{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}, '
                                           f'{{"name": "get_time", "arguments": {TIME_ARGS}}}]\n```\nDone.', reply("Done.", calls=TWO_CALLS)),
    "generic_two_objects": Case("gemma3", f'{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n{{"name": "get_time", "arguments": {TIME_ARGS}}}',
                                reply(calls=TWO_CALLS)),
    "generic_code": Case("gemma3", "```python\nprint({'a': 1})\n```", reply("```python\nprint({'a': 1})\n```")),
    "generic_other_json": Case("gemma3", '[1, 2, {"name": "x"}]', reply('[1, 2, {"name": "x"}]')),
    "generic_empty_array": Case("gemma3", "[] is empty", reply("[] is empty")),
    "generic_text": Case("gemma3", "  Paris is the capital.\n", reply("  Paris is the capital.\n")),
}


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_the_family_is_detected_from_the_template(name: str) -> None:
    assert fmt(name).name == FAMILY_OF_TEMPLATE[name]


def test_reasoning_markers_come_from_the_template() -> None:
    thinking = {name: [s.start for s in fmt(name).sections if s.kind == "reasoning"] for name in FAMILY_OF_TEMPLATE}
    assert thinking["qwen3"] == ["<think>"] and thinking["qwen2_5"] == []
    assert thinking["command_r7b_tool_use"] == ["<|START_THINKING|>"]
    assert thinking["deepseek_r1_distill"] == ["<think>"] and thinking["gemma3"] == []


@pytest.mark.parametrize("name", list(CASES))
def test_a_reply_splits_into_content_reasoning_and_calls(name: str) -> None:
    assert CASES[name].parse() == CASES[name].expected


def _streamed(case: Case, pieces: list[str]) -> tuple[ParsedReply, list[ReplyPart]]:
    prompt = prompt_of(case.template) if case.prompt is None else case.prompt
    parser = ReplyParser(fmt(case.template), calls=case.calls, prompt=prompt)
    parts = [part for piece in pieces for part in parser.feed(piece)] + parser.finish()
    assembled = ParsedReply()
    for part in parts:
        assembled.add(part)
    return assembled, parts


@pytest.mark.parametrize("name", list(CASES))
def test_any_split_of_a_reply_gives_the_same_parts(name: str) -> None:
    case = CASES[name]
    text = case.reply
    for cut in range(len(text) + 1):
        assert _streamed(case, [text[:cut], text[cut:]])[0] == case.expected, f"split at {cut}: {text[:cut]!r}"
    assembled, parts = _streamed(case, list(text))
    assert assembled == case.expected
    # Calls are well formed as a stream: each starts once, its pieces follow, it ends once.
    starts = [p.index for p in parts if isinstance(p, CallStart)]
    ends = [p.index for p in parts if isinstance(p, CallEnd)]
    assert starts == ends == list(range(len(case.expected.calls)))
    for part in parts:
        if isinstance(part, ArgumentsDelta):
            assert starts.index(part.index) >= 0 and part.index not in ends[: part.index]


def test_parts_stream_as_soon_as_they_are_decided() -> None:
    parser = ReplyParser(fmt("qwen3"), prompt=prompt_of("qwen3"))
    assert parser.feed("<think>\nPonder") == [ReasoningDelta("Ponder")]
    assert parser.feed("ing \n") == [ReasoningDelta("ing")]  # trailing whitespace waits
    assert parser.feed("more</think>\n\nHi <tool") == [ReasoningDelta(" \nmore"), ContentDelta("Hi ")]  # "<tool" may be a marker
    assert parser.feed("_call>\n") == []
    assert parser.feed('{"name": "get_weather", "argu') == [CallStart(0, "get_weather")]
    assert parser.feed('ments": {"city": "Zü') == [ArgumentsDelta(0, '{"city": "Zü')]
    assert parser.feed('rich"}}\n</tool_call>') == [ArgumentsDelta(0, 'rich"}'), CallEnd(0)]
    assert parser.finish() == []


def test_text_that_only_looks_like_a_marker_start_is_released() -> None:
    parser = ReplyParser(fmt("qwen2_5"))
    assert parser.feed("a <") == [ContentDelta("a ")]
    assert parser.feed("b") == [ContentDelta("<b")]
    assert parser.feed("<tool_c") == []
    assert parser.finish() == [ContentDelta("<tool_c")]


def _assistant_text(name: str, messages: list[Message], fmt_: ChatFormat, support: TemplateSupport) -> tuple[str, str]:
    """What the template writes for the last (assistant) message, and the text before it: where
    it parts from the generation prompt, not inside a `<...>` marker."""
    prompt = render_chat(template(name), fmt_, support, messages[:-1], tools=[WEATHER_TOOL, TIME_TOOL])
    whole = render_chat(template(name), fmt_, support, messages, tools=[WEATHER_TOOL, TIME_TOOL], add_generation_prompt=False)
    cut = next((i for i, (a, b) in enumerate(zip(prompt, whole, strict=False)) if a != b), min(len(prompt), len(whole)))
    if whole.rfind("<", 0, cut) > whole.rfind(">", 0, cut):
        cut = whole.rfind("<", 0, cut)
    return whole[:cut], whole[cut:]


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_calls_written_into_a_history_read_back_as_those_calls(name: str) -> None:
    """What localchat writes for an assistant's calls (through the template, or into its text
    where the template shows no calls) parses back to the same calls."""
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    calls = (WEATHER,) if conversation.one_call_per_message else (WEATHER, TIME)
    try:
        prompt, written = _assistant_text(name, [ASK, Message("assistant", "", tool_calls=calls)], conversation, support)
    except TemplateRefusedError:
        pytest.skip(f"{name} refuses a conversation ending with an assistant's calls")
    parsed = parse_reply(conversation, written, prompt=prompt)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(c.name, dict(c.arguments)) for c in calls], written


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_a_tool_conversation_renders_through_every_template(name: str) -> None:
    """OpenAI's shape (two calls in one message, long call ids, results by id) renders with
    everything in it, whatever the template lacks."""
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    messages = [Message("system", "Be terse."), ASK, Message("assistant", "Checking.", tool_calls=(WEATHER, TIME)),
                Message("tool", "21 °C", tool_call_id=WEATHER.id), Message("tool", "09:30", tool_call_id=TIME.id)]
    text = render_chat(template(name), conversation, support, messages, tools=[WEATHER_TOOL, TIME_TOOL])
    expected = ["get_weather", "get_time", "21 °C", "09:30", "Zürich", "東京", "city"]
    if name != "mistral_nemo":  # Nemo shows the system prompt only with the last message, a tool result here
        expected.append("Be terse.")
    assert [word for word in expected if word not in text] == []


def test_what_each_template_renders_is_probed() -> None:
    supports = {name: template_support(template(name), fmt(name)) for name in ("qwen3", "gemma3", "gemma2", "smollm3", "phi4_mini", "granite3_3")}
    assert supports["qwen3"] == TemplateSupport()
    assert supports["gemma3"] == TemplateSupport(system=True, tools=False, calls=False, results=False)
    assert supports["gemma2"] == TemplateSupport(system=False, tools=False, calls=False, results=False)
    assert supports["smollm3"].tools  # under its own name, xml_tools
    assert not supports["phi4_mini"].tools and supports["granite3_3"] == TemplateSupport(calls=False)


def test_mistral_call_ids_are_nine_letters_and_digits_and_stable() -> None:
    support = template_support(template("mistral_small3_2"), fmt("mistral_small3_2"))
    messages = [ASK, Message("assistant", "", tool_calls=(WEATHER,)), Message("tool", "21", tool_call_id=WEATHER.id)]
    first = render_chat(template("mistral_small3_2"), fmt("mistral_small3_2"), support, messages)
    ids = re.findall(r"\[CALL_ID\](\w+)\[ARGS\]", first) + re.findall(r"\[TOOL_RESULTS\](\w+)\[TOOL_CONTENT\]", first)
    assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 9 and ids[0].isalnum()
    assert render_chat(template("mistral_small3_2"), fmt("mistral_small3_2"), support, messages) == first


def test_deepseek_gets_null_content_and_string_arguments() -> None:
    support = template_support(template("deepseek_r1_distill"), fmt("deepseek_r1_distill"))
    messages = [ASK, Message("assistant", "", tool_calls=(WEATHER,)), Message("tool", "21", tool_call_id=WEATHER.id)]
    text = render_chat(template("deepseek_r1_distill"), fmt("deepseek_r1_distill"), support, messages)
    assert '<｜tool▁sep｜>get_weather\n```json\n{"city": "Zürich"}\n```' in text


def test_llama_gets_one_call_per_message_each_with_its_result() -> None:
    support = template_support(template("llama3_1"), fmt("llama3_1"))
    messages = [ASK, Message("assistant", "", tool_calls=(WEATHER, TIME)),
                Message("tool", "09:30", tool_call_id=TIME.id), Message("tool", "21", tool_call_id=WEATHER.id)]
    text = render_chat(template("llama3_1"), fmt("llama3_1"), support, messages)
    order = [text.index(word) for word in ('"get_weather"', "21", '"get_time"', "09:30")]
    assert order == sorted(order)


def test_phi4_mini_reads_the_tools_from_the_system_message() -> None:
    support = template_support(template("phi4_mini"), fmt("phi4_mini"))
    text = render_chat(template("phi4_mini"), fmt("phi4_mini"), support, [ASK], tools=[WEATHER_TOOL])
    assert text.startswith('<|system|><|tool|>[{"name": "get_weather"')


@pytest.mark.parametrize("name", ["qwen3", "llama3_1", "mistral_nemo", "mistral_small3_2", "deepseek_r1_distill", "gpt_oss", "granite3_3",
                                  "phi4_mini", "command_r7b_tool_use", "command_r_plus_tool_use", "gemma3"])
def test_a_forced_call_opening_reads_as_that_call(name: str) -> None:
    """The server writes a call's opening after the prompt; with the model's continuation the
    reply reads as the call (DeepSeek's opening first closes the reasoning the prompt opened)."""
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    prompt = render_chat(template(name), conversation, support, [ASK], tools=[WEATHER_TOOL])
    syntax = conversation.call
    written = syntax.write("get_weather", {"city": "Zürich"})
    named = call_opening(conversation, prompt, "get_weather")
    required = call_opening(conversation, prompt)
    assert named.endswith(syntax.prefix + "get_weather" + syntax.before_arguments) and required.endswith(syntax.prefix)
    for whole in (named + written[len(syntax.prefix + "get_weather" + syntax.before_arguments):], required + written[len(syntax.prefix):]):
        parsed = parse_reply(conversation, whole, prompt=prompt)
        assert parsed.calls == [ParsedCall("get_weather", '{"city": "Zürich"}')] and parsed.content == "", whole


def test_generic_is_used_when_a_template_cannot_show_tools() -> None:
    support = template_support(template("deepseek_r1_distill"), fmt("deepseek_r1_distill"))
    conversation = conversation_format(fmt("deepseek_r1_distill"), support)
    assert not support.tools and conversation.call == GENERIC.call
    parsed = parse_reply(conversation, 'Hm.</think>{"name": "get_weather", "arguments": {"city": "Zürich"}}',
                         prompt=prompt_of("deepseek_r1_distill"))
    assert parsed == reply(reasoning="Hm.", calls=ONE_CALL)
    assert parse_reply(GENERIC, "x").content == "x"


FRAGMENTS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|start|>assistant", "<|channel|>analysis", "<|channel|>final",
             " to=functions.f", "<|message|>", "<|end|>", "[TOOL_CALLS]", "[ARGS]", '{"name": "f"', '"arguments": ', '{"a": [1, "}"]}',
             "{", "}", "[", "]", ",", ":", '"', "\\", " ", "\n", "```json\n", "```", "x", "é", "<", "<tool"]


@pytest.mark.parametrize("name", ["qwen3", "gpt_oss", "mistral_small3_2", "llama3_1", "gemma3"])
def test_any_reply_parses_the_same_however_it_is_split(name: str) -> None:
    """Random replies made of markers and JSON pieces: never an error, the same parts for any split."""
    hypothesis = pytest.importorskip("hypothesis")
    strategies = hypothesis.strategies

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
    @hypothesis.given(strategies.lists(strategies.sampled_from(FRAGMENTS), max_size=30), strategies.data())
    def check(pieces: list[str], data: hypothesis.strategies.DataObject) -> None:
        text = "".join(pieces)
        case = Case(name, text, ParsedReply())
        whole, _ = _streamed(case, [text])
        cuts = sorted(data.draw(strategies.lists(strategies.integers(0, len(text)), max_size=4)))
        split = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _streamed(case, split)[0] == whole
        assert _streamed(case, list(text))[0] == whole

    check()
