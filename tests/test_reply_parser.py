"""Replies split into content, reasoning and tool calls, family by family (pure logic, real
templates): replies are written as each family's model writes them (the forms the families' own
templates render for an assistant's calls), and every case gives the same parts whichever way the
reply is split into streamed pieces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from chat_format_cases import ASK, fmt, prompt_of, template

from localchat.chat_formats import call_opening
from localchat.reply_parser import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    ContentDelta,
    ParsedCall,
    ParsedReply,
    ReasoningDelta,
    ReplyParser,
    ReplyPart,
    parse_reply,
)


@dataclass(frozen=True)
class Case:
    template: str
    reply: str
    expected: ParsedReply
    calls: bool = True
    prompt: str | None = None  # default: the template's own generation prompt
    tools: Mapping[str, Mapping[str, Any]] | None = None  # the functions' parameters, which type markup arguments

    def parse(self) -> ParsedReply:
        prompt = prompt_of(self.template) if self.prompt is None else self.prompt
        return parse_reply(fmt(self.template), self.reply, calls=self.calls, prompt=prompt, tools=self.tools)


WEATHER_ARGS = '{"city": "Zürich"}'
TIME_ARGS = '{"city": "東京"}'
TWO_CALLS = [ParsedCall("get_weather", WEATHER_ARGS), ParsedCall("get_time", TIME_ARGS)]
ONE_CALL = [ParsedCall("get_weather", WEATHER_ARGS)]


def reply(content: str = "", reasoning: str = "", calls: list[ParsedCall] | None = None) -> ParsedReply:
    return ParsedReply(content, reasoning, list(calls or []))


def bare_call(name: str, **parameters: str) -> str:
    """A call as Qwen3-Coder writes it without its <tool_call> wrapper."""
    blocks = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<function={name}>\n{blocks}</function>"


def dsml_parameter(key: str, text: str, string: str | None = "true") -> str:
    """A parameter as DeepSeek V3.2 and V4 write it, its text marked a string ("true"), JSON ("false"), or not at all."""
    mark = "" if string is None else f' string="{string}"'
    return f'<｜DSML｜parameter name="{key}"{mark}>{text}</｜DSML｜parameter>\n'


def dsml_calls(wrapper: str, *calls: tuple[str, str]) -> str:
    """Calls (a name and its parameters' blocks) as DeepSeek V3.2 (`function_calls`) and V4 (`tool_calls`) write them."""
    invokes = "".join(f'<｜DSML｜invoke name="{name}">\n{blocks}</｜DSML｜invoke>\n' for name, blocks in calls)
    return f"<｜DSML｜{wrapper}>\n{invokes}</｜DSML｜{wrapper}>"


DSML_WEATHER = ("get_weather", dsml_parameter("city", "Zürich"))
DSML_TIME = ("get_time", dsml_parameter("city", "東京"))
# Values marked a string or JSON whatever their schema's type (TYPED): the mark decides; marked JSON that does not
# parse, and an unmarked value, are read by the schema.
DSML_MARKED = dsml_calls("function_calls", ("forecast", "".join((
    dsml_parameter("city", "007"), dsml_parameter("scale", "1.5"), dsml_parameter("metric", "true", "false"),
    dsml_parameter("hours", "[6, 18]", "false"), dsml_parameter("note", "line <two>", "false"), dsml_parameter("extra", "12", "false"),
    dsml_parameter("days", "3", None)))))


def solar_call(call_id: str, name: str, arguments: str) -> str:
    """One call as Upstage Solar Open writes it."""
    return f"<|tool_call:begin|>{call_id}<|tool_call:name|>{name}<|tool_call:args|>{arguments}<|tool_call:end|>"


def hy3_calls(*calls: tuple[str, str, str]) -> str:
    """Calls of one argument each (a name, its key and value) as Tencent Hy3 writes them."""
    written = "".join(f"<tool_call:opensource>{name}<tool_sep:opensource>\n<arg_key:opensource>{key}</arg_key:opensource>\n"
                      f"<arg_value:opensource>{value}</arg_value:opensource>\n</tool_call:opensource>\n" for name, key, value in calls)
    return f"<tool_calls:opensource>\n{written}</tool_calls:opensource>"


# GigaChat 3 writes a call as a message of the `function call` role after the reply's; 3.1 after a token of its own.
GIGACHAT3_CALL = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
GIGACHAT3_1_CALL = "<|function_call|>"


def gigachat_call(opening: str, name: str, arguments: str) -> str:
    """One call as GigaChat 3 or 3.1 writes it after `opening`, and the end of its message."""
    return f'{opening}{{"name": "{name}", "arguments": {arguments}}}<|message_sep|>\n\n'


def k3_argument(key: str, kind: str, text: str) -> str:
    """An argument's block as Kimi K3 writes it: its text, and its JSON type beside its key."""
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{text}<|close|>argument<|sep|>'


def k3_reply(reasoning: str, content: str, *calls: tuple[str, str]) -> str:
    """A reply as Kimi K3 writes it in the think section its generation prompt opened: the thinking, the response, the
    calls (a name and its arguments' blocks) in a tools section, and the message's end."""
    blocks = "".join(f'<|open|>call tool="{name}" index="{number}"<|sep|>{arguments}<|close|>call<|sep|>'
                     for number, (name, arguments) in enumerate(calls, 1))
    tools = f"<|open|>tools<|sep|>{blocks}<|close|>tools<|sep|>" if calls else ""
    return f"{reasoning}<|close|>think<|sep|><|open|>response<|sep|>{content}<|close|>response<|sep|>{tools}<|close|>message<|sep|>"


K3_WEATHER = ("get_weather", k3_argument("city", "string", "Zürich"))
K3_TIME = ("get_time", k3_argument("city", "string", "東京"))
MM3 = "]<]minimax[>["  # MiniMax-M3's namespace token, before each of its tags


def mm3_element(key: str, text: str) -> str:
    """An element as MiniMax-M3 writes an argument, an object's member or an array's item (`item`)."""
    return f"{MM3}<{key}>{text}{MM3}</{key}>"


def mm3_calls(*calls: tuple[str, str]) -> str:
    """Calls (a name and its arguments' elements) as MiniMax-M3 writes them."""
    invokes = "".join(f'{MM3}<invoke name="{name}">{elements}{MM3}</invoke>\n' for name, elements in calls)
    return f"{MM3}<tool_call>\n{invokes}{MM3}</tool_call>"


MM3_WEATHER = ("get_weather", mm3_element("city", "Zürich"))
MM3_TIME = ("get_time", mm3_element("city", "東京"))
# Objects and arrays as nested elements, typed by the schema (an object without elements read as JSON), spaced or not.
MM3_TYPED = {"route": {"type": "object", "properties": {
    "days": {"type": "integer"}, "where": {"type": "object"}, "options": {"type": "object", "properties": {
        "avoid": {"type": "array", "items": {"type": "string"}}, "fast": {"type": "boolean"}}},
    "stops": {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}}}},
    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    "via": {"anyOf": [{"type": "object", "properties": {"nights": {"type": "integer"}}}, {"type": "null"}]}}}}
MM3_NESTED = "\n".join((
    mm3_element("days", "3"), mm3_element("where", '{"lat": 47.4}'), mm3_element("options", mm3_element("avoid", mm3_element("item", "tolls"))
                                                                               + mm3_element("fast", "true")),
    mm3_element("stops", mm3_element("item", mm3_element("city", "007") + "\n" + mm3_element("nights", "2")) + mm3_element("item", mm3_element("city", "東京"))),
    mm3_element("grid", mm3_element("item", mm3_element("item", "1.5") + mm3_element("item", "2")) + mm3_element("item", "")), mm3_element("extra", "12"),
    mm3_element("via", mm3_element("nights", "2")), mm3_element("meta", mm3_element("a", "1"))))
MM3_NESTED_ARGS = ('{"days": 3, "where": {"lat": 47.4}, "options": {"avoid": ["tolls"], "fast": true}, '
                   '"stops": [{"city": "007", "nights": 2}, {"city": "東京"}], "grid": [[1.5, 2], []], "extra": "12", '
                   '"via": {"nights": 2}, "meta": {"a": "1"}}')  # an Optional object's schema (anyOf), and elements the schema does not type


def markup_call(name: str, **parameters: str) -> str:
    """A call as Qwen3-Coder writes it, each parameter's value as text."""
    return f"<tool_call>\n{bare_call(name, **parameters)}\n</tool_call>"


# Parameters of every JSON type, to check that markup values are read by their schema's type.
TYPED = {"forecast": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"}, "metric": {"type": "boolean"},
    "hours": {"type": "array"}, "where": {"type": "object"}, "note": {"type": ["string", "null"]}, "nothing": {"type": "null"}}}}
TYPED_TEXT = markup_call("forecast", city="007", days="3", scale="1.5", metric="True", hours="[6, 18]", where='{"lat": 47.4}',
                         note="line one\n\nline <two>", nothing="null", extra="12")
TYPED_ARGS = ('{"city": "007", "days": 3, "scale": 1.5, "metric": true, "hours": [6, 18], "where": {"lat": 47.4}, '
              '"note": "line one\\n\\nline <two>", "nothing": null, "extra": "12"}')


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
    # Qwen3-Coder: markup in <tool_call>, typed by the tools' schemas (untyped: text); whole when </tool_call> is read.
    "qwen3_coder": Case("qwen3_coder", markup_call("get_weather", city="Zürich") + "\n" + markup_call("get_time", city="東京"),
                        reply(calls=TWO_CALLS)),
    "qwen3_coder_text_around": Case("qwen3_coder", f"Let me check.\n{markup_call('get_weather', city='Zürich')}\nDone.",
                                    reply("Let me check.\nDone.", calls=ONE_CALL)),
    "qwen3_coder_typed": Case("qwen3_coder", TYPED_TEXT, reply(calls=[ParsedCall("forecast", TYPED_ARGS)]), tools=TYPED),
    "qwen3_coder_untyped": Case("qwen3_coder", markup_call("forecast", days="3"), reply(calls=[ParsedCall("forecast", '{"days": "3"}')])),
    "qwen3_coder_bad_json": Case("qwen3_coder", markup_call("forecast", days="three", hours="[6,"), tools=TYPED,
                                 expected=reply(calls=[ParsedCall("forecast", '{"days": "three", "hours": "[6,"}')])),
    "qwen3_coder_no_parameters": Case("qwen3_coder", markup_call("get_time"), reply(calls=[ParsedCall("get_time", "{}")])),
    "qwen3_coder_no_closing_tag": Case("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=city>\n東京\n</function>",
                                       reply(calls=[ParsedCall("get_time", TIME_ARGS)])),
    "qwen3_coder_json_inside": Case("qwen3_coder", f'<tool_call>\n{{"name": "get_time", "arguments": {TIME_ARGS}}}\n</tool_call>',
                                    reply(f'<tool_call>\n{{"name": "get_time", "arguments": {TIME_ARGS}}}\n</tool_call>')),
    "qwen3_coder_unclosed": Case("qwen3_coder", "Hi <tool_call>\n<function=get_time>\n<parameter=city>\nBern",
                                 reply("Hi <tool_call>\n<function=get_time>\n<parameter=city>\nBern")),
    "qwen3_coder_stray_text": Case("qwen3_coder", "<tool_call>\n<function=get_time>\nnow\n</function>\n</tool_call>",
                                   reply("<tool_call>\n<function=get_time>\nnow\n</function>\n</tool_call>")),
    "qwen3_coder_marker_in_text": Case("qwen3_coder", f"Use <tool_call> then {markup_call('get_time')}",
                                       reply("Use <tool_call> then ", calls=[ParsedCall("get_time", "{}")])),
    "qwen3_coder_calls_off": Case("qwen3_coder", markup_call("get_time"), reply(markup_call("get_time")), calls=False),
    # ... and without the <tool_call> wrapper, as small Qwen3-Coders often write them.
    "qwen3_coder_bare": Case("qwen3_coder", "Let me check.\n" + bare_call("get_weather", city="Zürich") + "\n" + bare_call("get_time", city="東京"),
                             reply("Let me check.\n", calls=TWO_CALLS)),
    "qwen3_coder_bare_typed": Case("qwen3_coder", bare_call("forecast", days="3", metric="false"), tools=TYPED,
                                   expected=reply(calls=[ParsedCall("forecast", '{"days": 3, "metric": false}')])),
    "qwen3_coder_bare_mention": Case("qwen3_coder", "Write <function=name> to call, then </function>.",
                                     reply("Write <function=name> to call, then </function>.")),
    "qwen3_coder_bare_unclosed": Case("qwen3_coder", "Write <function=name> to call.", reply("Write <function=name> to call.")),
    "qwen3_coder_bare_calls_off": Case("qwen3_coder", bare_call("get_time"), reply(bare_call("get_time")), calls=False),
    "qwen3_coder_bare_typed_all": Case("qwen3_coder", TYPED_TEXT.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"),
                                       reply(calls=[ParsedCall("forecast", TYPED_ARGS)]), tools=TYPED),
    "qwen3_coder_bare_spaced": Case("qwen3_coder", " \n" + bare_call("get_weather", city="Zürich") + "\n\n  " + bare_call("get_time", city="東京")
                                    + "\n \n", reply(calls=TWO_CALLS)),
    "qwen3_coder_bare_then_text": Case("qwen3_coder", bare_call("get_weather", city="Zürich") + "\nDone.", reply("Done.", calls=ONE_CALL)),
    "qwen3_coder_bare_and_wrapped": Case("qwen3_coder", bare_call("get_weather", city="Zürich") + "\n" + markup_call("get_time", city="東京"),
                                         reply(calls=TWO_CALLS)),
    "qwen3_coder_bare_after_a_mention": Case("qwen3_coder", "Use <function=x> like so:\n" + bare_call("get_time", city="東京"),
                                             reply("Use <function=x> like so:\n", calls=[ParsedCall("get_time", TIME_ARGS)])),
    # MiniCPM 5: bare `<function name="...">` markup, values with <, & or newlines in CDATA.
    "minicpm5": Case("minicpm5", 'On it.\n<function name="get_weather"><param name="city">Zürich</param></function>\n'
                                 '<function name="get_time"><param name="city">東京</param></function>', reply("On it.\n", calls=TWO_CALLS)),
    "minicpm5_cdata": Case("minicpm5", '<function name="forecast"><param name="note"><![CDATA[a <b> &\nc]]></param>'
                                       '<param name="days">3</param></function>', tools=TYPED,
                           expected=reply(calls=[ParsedCall("forecast", '{"note": "a <b> &\\nc", "days": 3}')])),
    "minicpm5_mention": Case("minicpm5", 'Write <function name="x"> then.', reply('Write <function name="x"> then.')),
    # LFM2: a Python list of calls between <|tool_call_start|> and <|tool_call_end|>, JSON's literals allowed.
    "lfm2": Case("lfm2", 'On it.<|tool_call_start|>[get_weather(city="Zürich"), get_time(city=\'東京\')]<|tool_call_end|>',
                 reply("On it.", calls=TWO_CALLS)),
    "lfm2_values": Case("lfm2", '<|tool_call_start|>[forecast(days=3, hours=[6, 18], where={"lat": 47.4}, metric=true, note=None)]'
                                "<|tool_call_end|>", reply(calls=[ParsedCall(
                                    "forecast", '{"days": 3, "hours": [6, 18], "where": {"lat": 47.4}, "metric": true, "note": null}')])),
    "lfm2_not_a_call": Case("lfm2", "Use <|tool_call_start|>[print(open('x'))]<|tool_call_end|> so.",
                            reply("Use <|tool_call_start|>[print(open('x'))]<|tool_call_end|> so.")),
    "lfm2_calls_off": Case("lfm2", '<|tool_call_start|>[get_time(city="Bern")]<|tool_call_end|>',
                           reply('<|tool_call_start|>[get_time(city="Bern")]<|tool_call_end|>'), calls=False),
    # Gemma 4: `<|tool_call>call:name{...}<tool_call|>` in its own notation; thoughts in a channel.
    "gemma4": Case("gemma4", '<|channel>thought\nBoth.<channel|>On it.<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>}<tool_call|>'
                             '<|tool_call>call:get_time{city:<|"|>東京<|"|>}<tool_call|>', reply("On it.", "Both.", calls=TWO_CALLS),
                   prompt=template("gemma4").render([ASK], enable_thinking=True)),
    "gemma4_nested": Case("gemma4", '<|tool_call>call:forecast{days:3,hours:[6,18],where:{lat:47.4,name:<|"|>a, b}<|"|>},metric:true,'
                                    'note:null}<tool_call|>', reply(calls=[ParsedCall(
                                        "forecast", '{"days": 3, "hours": [6, 18], "where": {"lat": 47.4, "name": "a, b}"}, "metric": true, '
                                        '"note": null}')])),
    "gemma4_not_a_call": Case("gemma4", "Use <|tool_call>call:x{oops<tool_call|> so.", reply("Use <|tool_call>call:x{oops<tool_call|> so.")),
    # GLM-4.5/4.6: `<tool_call>name`, then <arg_key>/<arg_value> pairs; reasoning in <think>.
    "glm": Case("glm4_6", "\n<think>Both.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
                          "</tool_call>\n<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>東京</arg_value>\n</tool_call>",
                reply(reasoning="Both.", calls=TWO_CALLS)),
    "glm_typed": Case("glm4_6", "<tool_call>forecast\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>city</arg_key>\n"
                                "<arg_value>\nBern\n</arg_value>\n<arg_key>hours</arg_key>\n<arg_value>[6, 18]</arg_value>\n</tool_call>",
                      reply(calls=[ParsedCall("forecast", '{"days": 3, "city": "\\nBern\\n", "hours": [6, 18]}')]), tools=TYPED),
    # Apriel 1.5 and 1.6: a JSON list of calls in <tool_calls>; reasoning from "Here are my reasoning steps:" (1.6's prompt ends so)
    # to [BEGIN FINAL RESPONSE].
    "apriel1_6": Case("apriel1_6", f'I\'m\nthinking\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}, '
                                   f'{{"name": "get_time", "arguments": {TIME_ARGS}}}]</tool_calls>', reply(reasoning="I'm\nthinking", calls=TWO_CALLS)),
    "apriel1_6_answer": Case("apriel1_6", "Easy.\n[BEGIN FINAL RESPONSE]\nSunny.", reply("Sunny.", "Easy.")),
    "apriel1_5": Case("apriel1_5", "Here are my reasoning steps:\nBoth.\n[BEGIN FINAL RESPONSE]\nOn it.\n[END FINAL RESPONSE]\n"
                                   f'<tool_calls>[{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}]</tool_calls>', reply("On it.\n\n", "Both.", ONE_CALL)),
    "apriel1_5_thinking": Case("apriel1_5", f'<thinking>Weather.</thinking><tool_calls>[{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}]</tool_calls>',
                               reply(reasoning="Weather.", calls=ONE_CALL)),
    # The phrase opens reasoning only where the reply begins: prose that says it stays content.
    "apriel_phrase_in_prose": Case("apriel1_5", "Sure. Here are my reasoning steps: first, the sky. [BEGIN FINAL RESPONSE] Blue.",
                                   reply("Sure. Here are my reasoning steps: first, the sky. [BEGIN FINAL RESPONSE] Blue.")),
    "apriel_not_a_call": Case("apriel1_5", "Wrap calls in <tool_calls>like this</tool_calls>.", reply("Wrap calls in <tool_calls>like this</tool_calls>.")),
    # GLM-4.7: the same markup, the name followed by its first argument's tag (or the call's end) directly.
    "glm4_7": Case("glm4_7_flash", "Both.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</arg_value></tool_call>"
                                   "<tool_call>get_time<arg_key>city</arg_key><arg_value>東京</arg_value></tool_call>",
                   reply(reasoning="Both.", calls=TWO_CALLS)),
    "glm4_7_no_arguments": Case("glm4_7_flash", "</think><tool_call>get_time</tool_call>", reply(calls=[ParsedCall("get_time", "{}")]),
                                tools={"get_time": {}}),
    "glm4_7_not_a_function": Case("glm4_7_flash", "</think>Use <tool_call>tags</tool_call> so.", reply("Use <tool_call>tags</tool_call> so."),
                                  tools={"get_time": {}}),
    "glm_not_a_call": Case("glm4_6", "Use <tool_call>tags</tool_call> like this.", reply("Use <tool_call>tags</tool_call> like this.")),
    "glm_stray_text": Case("glm4_6", "<tool_call>get_time\nnow</tool_call>", reply("<tool_call>get_time\nnow</tool_call>")),
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
    # Apertus: a list of calls each keyed by its function's name; thoughts between <|inner_prefix|> and <|inner_suffix|>.
    "apertus": Case("apertus", '<|tools_prefix|>[{"get_weather": {"city": "Zürich"}}, {"get_time": {"city": "東京"}}]<|tools_suffix|>',
                    reply(calls=TWO_CALLS)),
    "apertus_reasoning": Case("apertus", '<|inner_prefix|>Need the weather.<|inner_suffix|><|tools_prefix|>[{"get_weather": '
                                         '{"city": "Zürich"}}]<|tools_suffix|>', reply(reasoning="Need the weather.", calls=ONE_CALL)),
    "apertus_more_keys": Case("apertus", '<|tools_prefix|>[{"get_weather": {"city": "Zürich"}, "id": "a1"}]<|tools_suffix|>',
                              reply(calls=ONE_CALL)),
    "apertus_not_a_call": Case("apertus", "Write <|tools_prefix|>[1, 2]<|tools_suffix|> so.",
                               reply("Write <|tools_prefix|>[1, 2]<|tools_suffix|> so.")),
    # Upstage Solar Open: thinking a turn of its own (`<|think|>...<|end|>`), then `<|begin|>assistant` and `<|content|>` or
    # `<|tool_calls|>`, a call per `<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{...}<|tool_call:end|>`.
    "solar_open": Case("solar_open", "<|think|>Both cities.<|end|><|begin|>assistant<|tool_calls|>" + solar_call("a1b2c3d4e5", "get_weather", WEATHER_ARGS)
                       + solar_call("f6g7h8i9j0", "get_time", TIME_ARGS) + "<|calls|>", reply(reasoning="Both cities.", calls=TWO_CALLS)),
    "solar_open_answer": Case("solar_open", "<|think|>Easy.<|end|><|begin|>assistant<|content|>Sunny.", reply("Sunny.", "Easy.")),
    "solar_open_not_a_call": Case("solar_open", "<|content|>Calls open with <|tool_call:begin|> and end so.",
                                  reply("Calls open with <|tool_call:begin|> and end so.")),
    # Tencent Hy3: GLM's markup in `:opensource` tokens inside <tool_calls:opensource>; thinking in <think:opensource> when
    # the prompt opened it (reasoning_effort low or high).
    "hy3": Case("hy3", "On it." + hy3_calls(("get_weather", "city", "Zürich"), ("get_time", "city", "東京")), reply("On it.", calls=TWO_CALLS)),
    "hy3_thinking": Case("hy3", "Need the weather.</think:opensource>" + hy3_calls(("get_weather", "city", "Zürich")),
                         reply(reasoning="Need the weather.", calls=ONE_CALL), prompt=template("hy3").render([ASK], reasoning_effort="high")),
    "hy3_typed": Case("hy3", hy3_calls(("forecast", "days", "3")), tools=TYPED, expected=reply(calls=[ParsedCall("forecast", '{"days": 3}')])),
    "hy3_not_a_call": Case("hy3", "Use <tool_call:opensource>tags</tool_call:opensource> like this.",
                           reply("Use <tool_call:opensource>tags</tool_call:opensource> like this.")),
    # Kimi K3: XTML tags of control tokens; the generation prompt opens the think section (the response with thinking off),
    # then come the response and a tools section of `<|open|>call tool="NAME" index="N"<|sep|>` blocks, arguments typed by
    # the schema whatever type the block names; reasoning also ends where the response opens.
    "kimi_k3": Case("kimi_k3", k3_reply("Both cities.", "On it.", K3_WEATHER, K3_TIME), reply("On it.", "Both cities.", TWO_CALLS)),
    "kimi_k3_calls_only": Case("kimi_k3", k3_reply("", "", K3_WEATHER), reply(calls=ONE_CALL)),
    "kimi_k3_typed": Case("kimi_k3", k3_reply("", "", ("forecast", "".join((
        k3_argument("city", "string", "007"), k3_argument("days", "number", "3"), k3_argument("scale", "number", "1.5"),
        k3_argument("metric", "boolean", "true"), k3_argument("hours", "array", "[6, 18]"), k3_argument("where", "object", '{"lat": 47.4}'),
        k3_argument("note", "string", "line one\n\nline <two>"), k3_argument("nothing", "null", "null"), k3_argument("extra", "number", "12"))))),
        # `extra`, which the schema does not list, by the type the model wrote for it.
        tools=TYPED, expected=reply(calls=[ParsedCall("forecast", TYPED_ARGS.replace('"extra": "12"', '"extra": 12'))])),
    "kimi_k3_no_thinking": Case("kimi_k3", "Sunny.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", reply("Sunny."),
                                prompt=template("kimi_k3").render([ASK], thinking=False)),
    "kimi_k3_think_unclosed": Case("kimi_k3", "Easy.<|open|>response<|sep|>Sunny.<|close|>response<|sep|>", reply("Sunny.", "Easy.")),
    "kimi_k3_not_a_call": Case("kimi_k3", k3_reply("Hm.", "Calls go in <|open|>tools<|sep|> sections."),
                               reply("Calls go in <|open|>tools<|sep|> sections.", "Hm.")),
    # MiniMax-M3: M2's `<invoke name>` markup, every tag after its namespace token, arguments as elements named by their keys
    # (nested for objects and arrays, typed by the schema); thinking in <mm:think>, a turn without it begun by a bare </mm:think>.
    "minimax_m3": Case("minimax_m3", "<mm:think>Both cities.</mm:think>On it." + mm3_calls(MM3_WEATHER, MM3_TIME),
                       reply("On it.", "Both cities.", TWO_CALLS)),
    "minimax_m3_thinking": Case("minimax_m3", "Need the weather.</mm:think>" + mm3_calls(MM3_WEATHER), reply(reasoning="Need the weather.", calls=ONE_CALL),
                                prompt=template("minimax_m3").render([ASK], thinking_mode="enabled")),
    "minimax_m3_no_thinking": Case("minimax_m3", "</mm:think>Sunny.", reply("Sunny.")),
    "minimax_m3_nested": Case("minimax_m3", "</mm:think>" + mm3_calls(("route", MM3_NESTED)), tools=MM3_TYPED,
                              expected=reply(calls=[ParsedCall("route", MM3_NESTED_ARGS)])),
    "minimax_m3_no_arguments": Case("minimax_m3", mm3_calls(("get_time", "")), reply(calls=[ParsedCall("get_time", "{}")])),
    "minimax_m3_not_a_call": Case("minimax_m3", f"</mm:think>Wrap calls in {MM3}<tool_call>tags{MM3}</tool_call>.",
                                  reply(f"Wrap calls in {MM3}<tool_call>tags{MM3}</tool_call>.")),
    # GigaChat 3 and 3.1: the reply's text, then one call; each message ends with `<|message_sep|>\n\n`, one token.
    "gigachat3": Case("gigachat3", "On it." + gigachat_call(GIGACHAT3_CALL, "get_weather", WEATHER_ARGS), reply("On it.", calls=ONE_CALL)),
    "gigachat3_call_only": Case("gigachat3", gigachat_call(GIGACHAT3_CALL, "get_time", TIME_ARGS), reply(calls=[ParsedCall("get_time", TIME_ARGS)])),
    "gigachat3_answer": Case("gigachat3", "Sunny.<|message_sep|>\n\n", reply("Sunny.")),
    "gigachat3_not_a_call": Case("gigachat3", 'Its role is "function call<|role_sep|>\n", then a function call.',
                                 reply('Its role is "function call<|role_sep|>\n", then a function call.')),
    "gigachat3_1": Case("gigachat3_1", "On it." + gigachat_call(GIGACHAT3_1_CALL, "get_weather", WEATHER_ARGS), reply("On it.", calls=ONE_CALL)),
    "gigachat3_1_answer": Case("gigachat3_1", "Sunny.<|message_sep|>\n\n", reply("Sunny.")),
    "gigachat3_1_not_a_call": Case("gigachat3_1", "Calls follow <|function_call|> in a reply.", reply("Calls follow <|function_call|> in a reply.")),
    # DeepSeek V3.2 and V4: DSML markup in <｜DSML｜function_calls> (V3.2) or <｜DSML｜tool_calls> (V4), each value marked a
    # string (as written) or not (JSON), an unmarked one read by its schema; reasoning in <think> when the prompt opened it.
    "deepseek_v3_2": Case("deepseek_v3_2", "On it.\n\n" + dsml_calls("function_calls", DSML_WEATHER, DSML_TIME), reply("On it.\n\n", calls=TWO_CALLS)),
    "deepseek_v3_2_thinking": Case("deepseek_v3_2", "Need the weather.</think>\n\n" + dsml_calls("function_calls", DSML_WEATHER),
                                   reply(reasoning="Need the weather.", calls=ONE_CALL), prompt=template("deepseek_v3_2").render([ASK], enable_thinking=True)),
    "deepseek_v3_2_marked": Case("deepseek_v3_2", DSML_MARKED, tools=TYPED, expected=reply(calls=[ParsedCall(
        "forecast", '{"city": "007", "scale": "1.5", "metric": true, "hours": [6, 18], "note": "line <two>", "extra": 12, "days": 3}')])),
    "deepseek_v3_2_other_wrapper": Case("deepseek_v3_2", dsml_calls("tool_calls", DSML_TIME), reply(dsml_calls("tool_calls", DSML_TIME))),
    "deepseek_v4": Case("deepseek_v4", "On it.\n\n" + dsml_calls("tool_calls", DSML_WEATHER, DSML_TIME), reply("On it.\n\n", calls=TWO_CALLS)),
    "deepseek_v4_thinking": Case("deepseek_v4", "Both cities.</think>" + dsml_calls("tool_calls", DSML_WEATHER, DSML_TIME),
                                 reply(reasoning="Both cities.", calls=TWO_CALLS), prompt=template("deepseek_v4").render([ASK], enable_thinking=True)),
    "deepseek_v4_no_arguments": Case("deepseek_v4", dsml_calls("tool_calls", ("get_time", "\n")), reply(calls=[ParsedCall("get_time", "{}")])),
    "deepseek_v4_not_a_call": Case("deepseek_v4", "Wrap calls in <｜DSML｜tool_calls> tags.</｜DSML｜tool_calls>",
                                   reply("Wrap calls in <｜DSML｜tool_calls> tags.</｜DSML｜tool_calls>")),
    "ministral3_reasoning": Case("ministral3_reasoning", '[THINK]Both cities.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}'
                                                         '[TOOL_CALLS]get_time[ARGS]{"city": "東京"}', reply(reasoning="Both cities.", calls=TWO_CALLS)),
    "ministral3_answer": Case("ministral3_reasoning", "[THINK]Easy.[/THINK]Sunny.", reply("Sunny.", "Easy.")),
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


@pytest.mark.parametrize("name", list(CASES))
def test_a_reply_splits_into_content_reasoning_and_calls(name: str) -> None:
    assert CASES[name].parse() == CASES[name].expected


def _streamed(case: Case, pieces: list[str]) -> tuple[ParsedReply, list[ReplyPart]]:
    prompt = prompt_of(case.template) if case.prompt is None else case.prompt
    parser = ReplyParser(fmt(case.template), calls=case.calls, prompt=prompt, tools=case.tools)
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


def test_markup_that_cannot_be_a_call_is_released_at_once() -> None:
    """Qwen3-Coder's call section is held until it closes, but only while its body may be a call."""
    parser = ReplyParser(fmt("qwen3_coder"))
    assert parser.feed("Wrap it in <tool_call>\n<func") == [ContentDelta("Wrap it in ")]
    assert parser.feed("tion=get_time>\n") == []
    parser = ReplyParser(fmt("qwen3_coder"))
    assert parser.feed("Wrap it in <tool_call> tags") == [ContentDelta("Wrap it in <tool_call> tags")]


def test_a_bare_markup_call_is_held_from_inside_its_opener() -> None:
    """Qwen3-Coder's `<function=` without `<tool_call>`: held from its first characters until the function
    closes, then a call; text that only mentions one is content again when the reply ends."""
    parser = ReplyParser(fmt("qwen3_coder"), tools=TYPED)
    assert parser.feed("Let me check.\n<func") == [ContentDelta("Let me check.\n")]
    assert parser.feed("tion=forecast>\n<parameter=days>\n3\n</parameter>\n</func") == []
    assert parser.feed("tion>\n") == [CallStart(0, "forecast"), ArgumentsDelta(0, '{"days": 3}'), CallEnd(0)]
    assert parser.finish() == []
    parser = ReplyParser(fmt("qwen3_coder"), tools=TYPED)
    assert parser.feed("Write <function") == [ContentDelta("Write ")]
    assert parser.feed("=name> to call it.") == []
    assert parser.finish() == [ContentDelta("<function=name> to call it.")]


def test_text_that_only_looks_like_a_marker_start_is_released() -> None:
    parser = ReplyParser(fmt("qwen2_5"))
    assert parser.feed("a <") == [ContentDelta("a ")]
    assert parser.feed("b") == [ContentDelta("<b")]
    assert parser.feed("<tool_c") == []
    assert parser.finish() == [ContentDelta("<tool_c")]


FRAGMENTS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|start|>assistant", "<|channel|>analysis", "<|channel|>final",
             " to=functions.f", "<|message|>", "<|end|>", "[TOOL_CALLS]", "[ARGS]", '{"name": "f"', '"arguments": ', '{"a": [1, "}"]}',
             "{", "}", "[", "]", ",", ":", '"', "\\", " ", "\n", "```json\n", "```", "x", "é", "<", "<tool",
             "<function=f>", "</function>", "<parameter=a>", "</parameter>", "<arg_key>a</arg_key>", "<arg_value>", "</arg_value>",
             "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", '<｜DSML｜invoke name="f">', "</｜DSML｜invoke>", '<｜DSML｜parameter name="a" string="false">',
             "</｜DSML｜parameter>", "<|message_sep|>\n\n", "function call<|role_sep|>\n", "<|function_call|>",
             "<|open|>think<|sep|>", "<|close|>think<|sep|>", "<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|open|>tools<|sep|>",
             "<|close|>tools<|sep|>", '<|open|>call tool="f" index="1"<|sep|>', "<|close|>call<|sep|>", '<|open|>argument key="a" type="number"<|sep|>',
             "<|close|>argument<|sep|>", "<|close|>message<|sep|>", "<mm:think>", "</mm:think>", f"{MM3}<tool_call>", f"{MM3}</tool_call>",
             f'{MM3}<invoke name="f">', f"{MM3}</invoke>", f"{MM3}<a>", f"{MM3}</a>", f"{MM3}<item>", f"{MM3}</item>"]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_coder", "glm4_6", "gpt_oss", "mistral_small3_2", "llama3_1", "gemma3", "deepseek_v4", "gigachat3",
                                  "gigachat3_1", "kimi_k3", "minimax_m3"])
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


FORCED = ("get_weather", "get_time")


@pytest.mark.parametrize(("name", "written", "expected"), [
    ("qwen2_5", "get_wea", [ParsedCall("get_weather")]),  # the one function its name begun can be
    ("qwen2_5", "get_", []),  # two functions it can be: no call yet
    ("qwen2_5", 'get_time", "argum', [ParsedCall("get_time")]),  # no arguments written: none made up
    ("qwen2_5", 'get_time", "arguments": {"ci', [ParsedCall("get_time", '{"ci')]),
    ("gemma3", "get_ti", [ParsedCall("get_time")]),
    ("mistral_small3_2", "get_wea", [ParsedCall("get_weather")]),
    ("mistral_small3_2", "get_weather[AR", [ParsedCall("get_weather")]),
    ("gpt_oss", "get_w", [ParsedCall("get_weather")]),
    ("deepseek_r1_distill", "get_t", [ParsedCall("get_time")]),
    ("qwen3_coder", "get_wea", [ParsedCall("get_weather")]),
    ("glm4_6", "get_ti", [ParsedCall("get_time")]),
    ("glm4_6", "get_time\n<arg_key>city</arg_key>\n<arg_value>Bern</arg_value>\n<arg_key>da", [ParsedCall("get_time", '{"city": "Bern"}')]),
    ("qwen3_coder", "get_time>\n<parameter=city>\nBern\n</parameter>\n<parameter=days>\n3", [ParsedCall("get_time", '{"city": "Bern"}')]),
    ("deepseek_v3_2", "get_wea", [ParsedCall("get_weather")]),
    ("minimax_m2", "get_wea", [ParsedCall("get_weather")]),
    ("minicpm5", "get_ti", [ParsedCall("get_time")]),
    ("gigachat3", "get_wea", [ParsedCall("get_weather")]),
    ("gigachat3_1", 'get_time", "arguments": {"ci', [ParsedCall("get_time", '{"ci')]),
    ("deepseek_v4", 'get_time">\n' + dsml_parameter("city", "Bern") + '<｜DSML｜parameter name="da', [ParsedCall("get_time", '{"city": "Bern"}')]),
    ("kimi_k3", "get_wea", [ParsedCall("get_weather")]),
    ("minimax_m3", "get_wea", [ParsedCall("get_weather")]),
    ("minimax_m3", 'get_time">' + mm3_element("city", "Bern") + f"{MM3}<da", [ParsedCall("get_time", '{"city": "Bern"}')]),
    ("kimi_k3", 'get_time" index="1"<|sep|>' + k3_argument("city", "string", "Bern") + '<|open|>argument key="da',
     [ParsedCall("get_time", '{"city": "Bern"}')]),
])
def test_a_forced_call_cut_short_is_a_call_or_none_never_content(name: str, written: str, expected: list[ParsedCall]) -> None:
    """tool_choice required, cut by max_tokens: the server wrote the call's opening, the model part of the rest."""
    prompt = prompt_of(name)
    text = call_opening(fmt(name), prompt) + written
    assert parse_reply(fmt(name), text, prompt=prompt, forced=FORCED, cut_short=True) == reply(calls=expected)


def test_a_model_looping_on_an_unclosed_call_gets_its_text_back() -> None:
    """Blocks never closed, to the end of the reply, are content; each was read again recursively, over the whole rest, which
    raised RecursionError past about 1,000 blocks and took 20 s at 500."""
    text = "<tool_call>\n" + "<function=get_weather>\n<parameter=city>\nZürich\n" * 1500
    assert parse_reply(fmt("qwen3_coder"), text, prompt=prompt_of("qwen3_coder")) == reply(text)


@pytest.mark.parametrize(("name", "written"), [
    ("qwen2_5", '<tool_call>\n{"name": "get_time", "arguments": '),
    ("mistral_small3_2", "[TOOL_CALLS]get_time[ARGS]"),
])
def test_a_call_that_ends_before_its_arguments_has_none(name: str, written: str) -> None:
    """Ended by the model (end of generation), not by max_tokens: the arguments are {}, which parse."""
    assert parse_reply(fmt(name), written, prompt=prompt_of(name)) == reply(calls=[ParsedCall("get_time", "{}")])
