"""How model families write tool calls and reasoning, as data, and conversations written for them.

Each family is data (`FAMILIES`): the sections a reply may hold (tool calls, a call's arguments,
gpt-oss's channels), the markers that open and close them, how the family writes a call (which
the server writes to force one, with a grammar for the rest), and what its template wants of an
OpenAI history. The family is detected from markers its chat template contains; reasoning markers
(`REASONING`) are active when the template contains them too. localchat.reply_parser reads
replies by these formats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from localchat.constraints import JSON_LAYOUT
from localchat.markup_calls import (
    DSML_MARKUP,
    GEMMA4_MARKUP,
    GLM_4_7_MARKUP,
    GLM_MARKUP,
    HY3_MARKUP,
    KIMI_K3_MARKUP,
    LFM2_MARKUP,
    MINICPM_MARKUP,
    MINIMAX_M3_MARKUP,
    MINIMAX_M3_TOKEN,
    MINIMAX_MARKUP,
    QWEN3_CODER_MARKUP,
    SEED_OSS_MARKUP,
    MarkupSyntax,
)
from localchat.templates import ChatTemplate, Message, TemplateError, ToolCall

SectionKind = Literal["reasoning", "content", "calls", "call", "markup"]

@dataclass(frozen=True)
class Header:
    """The text between a section's start marker and `end`, which says what its body is: with
    `name` (a regex, group 1) matching, the body is that function's arguments; else the first of
    `channels` (regex, kind) that matches; else the section was not one and its text is content."""

    end: str
    name: str
    channels: tuple[tuple[str, SectionKind], ...] = ()


@dataclass(frozen=True)
class Section:
    """A stretch of a reply opened by `start` ("": where the reply's content begins, for calls
    written as bare JSON) and closed by one of `end` (none: by the end of its JSON, or the reply's).

    kind: "reasoning" or "content" text; "calls", a JSON object naming the function and holding
    its arguments, or an array of them; "call", one call named in the `header`, its arguments
    the body; "markup", calls written as markup (localchat.markup_calls), read when it closes."""

    kind: SectionKind
    start: str
    end: tuple[str, ...] = ()
    header: Header | None = None
    # Its start and end markers belong to its body: markup calls written without their wrapper.
    inclusive: bool = False
    # "calls": each call an object whose first key is the function's name, its value the arguments (Apertus).
    named_by_key: bool = False
    # It opens only before the reply's content: its start is a phrase that prose says too (Apriel's reasoning).
    leading: bool = False


@dataclass(frozen=True)
class CallSyntax:
    """How the family writes one call: `prefix`, the function's name, `before_arguments`, the
    arguments' JSON, `closing`. The server writes a call's opening after the prompt to make the
    model call a tool (tool_choice "required" or named), and whole calls into the history of a
    template that does not render them. `markup`: the arguments are so written (localchat.markup_calls), not as JSON."""

    prefix: str
    before_arguments: str
    closing: str
    markup: MarkupSyntax | None = None

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        written = self.markup.arguments.write(arguments) if self.markup else json.dumps(dict(arguments), ensure_ascii=False)
        return f"{self.prefix}{name}{self.before_arguments}{written}{self.closing}"


@dataclass(frozen=True)
class ChatFormat:
    """One family's reply syntax and the history its template wants."""

    name: str
    detect: tuple[str, ...]  # markers its template contains, all of them
    sections: tuple[Section, ...]
    call: CallSyntax
    dropped: tuple[str, ...] = ()  # markers removed from the content (wrappers, call-list brackets)
    read_in_headers: tuple[str, ...] = ()  # control tokens a header holds: the reply must show them too
    # What an OpenAI history needs to render through the family's template:
    string_arguments: bool = False  # a call's arguments as the JSON string (DeepSeek R1 concatenates them)
    null_content_with_calls: bool = False  # content null beside tool calls (DeepSeek R1 tests `is none`)
    call_id_length: int | None = None  # Mistral: ids of exactly 9 letters and digits
    one_call_per_message: bool = False  # Llama 3.x refuses two calls in a message; gpt-oss drops the second
    tools_in_system: bool = False  # Phi-4-mini reads the tools from the system message, as JSON text
    # Other ways the family's templates write a call: the one a template's rendering of a call shows is written for it.
    call_layouts: tuple[CallSyntax, ...] = ()

    @property
    def reasons(self) -> bool:
        """Whether its replies may hold reasoning apart from the answer (a thinking model's)."""
        return any(section.kind == "reasoning" or (section.header is not None and any(
            kind == "reasoning" for _, kind in section.header.channels)) for section in self.sections)

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker the parser looks for: control tokens among them must be shown in the reply."""
        found: list[str] = [*self.dropped, *self.read_in_headers, *(self.call.markup.shown if self.call.markup else ())]
        for section in self.sections:
            found += [section.start, *section.end] + ([section.header.end] if section.header else [])
        return tuple(marker for marker in dict.fromkeys(found) if marker)


FAMILIES: tuple[ChatFormat, ...] = (
    ChatFormat(
        "gpt-oss", ("<|channel|>", "<|message|>"),
        # The generation prompt ends with `<|start|>assistant`, so a reply starts in a header.
        (Section("call", "<|start|>assistant", ("<|end|>", "<|call|>", "<|return|>"), Header(
            "<|message|>", r"to=functions\.([^\s<]+)",
            ((r"<\|channel\|>\s*analysis", "reasoning"), (r"", "content")))),),
        CallSyntax("<|channel|>commentary to=functions.", " <|constrain|>json<|message|>", ""),
        read_in_headers=("<|channel|>", "<|constrain|>"), one_call_per_message=True,
    ),
    ChatFormat(
        "deepseek-r1", ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "```json"),
        (Section("call", "<｜tool▁call▁begin｜>", ("```<｜tool▁call▁end｜>",),
                 Header("```json", r"<｜tool▁sep｜>\s*([^\s`]+)")),),
        CallSyntax("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n",
                   "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        dropped=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
        string_arguments=True, null_content_with_calls=True,
    ),
    # DeepSeek V3.1: R1's markers, the name right after the call's start and the arguments bare.
    ChatFormat(
        "deepseek-v3.1", ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"),
        (Section("call", "<｜tool▁call▁begin｜>", ("<｜tool▁call▁end｜>",), Header("<｜tool▁sep｜>", r"^\s*([^\s<]+)")),),
        CallSyntax("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        dropped=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    ),
    # DeepSeek V3.2: `<｜DSML｜function_calls>` around `<｜DSML｜invoke name="...">` blocks (DSML markup); its
    # template writes the markers by concatenation, so it is detected by their pieces.
    ChatFormat(
        "deepseek-v3.2", ("｜DSML｜", "function_calls>"),
        (Section("markup", "<｜DSML｜function_calls>", ("</｜DSML｜function_calls>",)),),
        CallSyntax('<｜DSML｜function_calls>\n<｜DSML｜invoke name="', '">\n', "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
                   markup=DSML_MARKUP),
    ),
    # DeepSeek V4: V3.2's markup inside `<｜DSML｜tool_calls>`.
    ChatFormat(
        "deepseek-v4", ("｜DSML｜", "tool_calls>"),
        (Section("markup", "<｜DSML｜tool_calls>", ("</｜DSML｜tool_calls>",)),),
        CallSyntax('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="', '">\n', "</｜DSML｜invoke>\n</｜DSML｜tool_calls>", markup=DSML_MARKUP),
    ),
    # Kimi K2: `<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>`.
    ChatFormat(
        "kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_argument_begin|>"),
        (Section("call", "<|tool_call_begin|>", ("<|tool_call_end|>",),
                 Header("<|tool_call_argument_begin|>", r"^\s*(?:functions\.)?([^\s:<]+)")),),
        CallSyntax("<|tool_calls_section_begin|><|tool_call_begin|>functions.", ":0<|tool_call_argument_begin|>",
                   "<|tool_call_end|><|tool_calls_section_end|>"),
        dropped=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    ),
    # Kimi K3 (XTML: `<|open|>tag<|sep|>` ... `<|close|>tag<|sep|>`, of control tokens): a message is a think section, a response
    # and a tools section of call blocks, then `<|close|>message<|sep|><|end_of_msg|>`; its generation prompt opens the think
    # section (the response with thinking off). Reasoning ends at the response's opening too, as llama.cpp's parser reads it.
    ChatFormat(
        "kimi-k3", ("<|open|>", "<|close|>", "<|end_of_msg|>"),
        (Section("reasoning", "<|open|>think<|sep|>", ("<|close|>think<|sep|>", "<|open|>response<|sep|>")),
         Section("markup", "<|open|>tools<|sep|>", ("<|close|>tools<|sep|>",))),
        CallSyntax('<|open|>tools<|sep|><|open|>call tool="', '" index="1"<|sep|>', "<|close|>call<|sep|><|close|>tools<|sep|>",
                   markup=KIMI_K3_MARKUP),
        dropped=("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>"),
    ),
    # Upstage Solar Open: `<|begin|>assistant<|tool_calls|>`, then `<|tool_call:begin|>ID<|tool_call:name|>name<|tool_call:args|>{...}
    # <|tool_call:end|>` per call and `<|calls|>`; thinking is a turn of its own, `<|begin|>assistant<|think|>...<|end|>`.
    ChatFormat(
        "solar-open", ("<|tool_call:begin|>", "<|tool_call:args|>"),
        (Section("reasoning", "<|think|>", ("<|end|>",)),
         Section("call", "<|tool_call:begin|>", ("<|tool_call:end|>",), Header("<|tool_call:args|>", r"<\|tool_call:name\|>\s*([^\s<]+)"))),
        # The call's id: 10 lowercase letters or digits, as the template asks, its own example.
        CallSyntax("<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|><|calls|>"),
        dropped=("<|begin|>assistant", "<|content|>", "<|tool_calls|>", "<|calls|>"), read_in_headers=("<|tool_call:name|>",),
    ),
    # Tencent Hy3: `<tool_call:opensource>name<tool_sep:opensource>` blocks, GLM's markup in `:opensource` tokens, inside
    # `<tool_calls:opensource>`; its template builds each token by `.format(HYTK)`, so it is detected by their pieces.
    ChatFormat(
        "hy3", ("<tool_sep{}>", "<arg_key{}>", "':opensource'"),
        (Section("reasoning", "<think:opensource>", ("</think:opensource>",)),
         Section("markup", "<tool_calls:opensource>", ("</tool_calls:opensource>",))),
        CallSyntax("<tool_calls:opensource>\n<tool_call:opensource>", "<tool_sep:opensource>\n",
                   "</tool_call:opensource>\n</tool_calls:opensource>", markup=HY3_MARKUP),
    ),
    # Mistral v11+ (Small 3.2, Magistral, Devstral): `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`.
    ChatFormat(
        "mistral-v11", ("[TOOL_CALLS]", "[ARGS]"),
        (Section("call", "[TOOL_CALLS]", header=Header("[ARGS]", r"^\s*([^\s\[]+)")),),
        CallSyntax("[TOOL_CALLS]", "[ARGS]", ""),
        read_in_headers=("[CALL_ID]",), call_id_length=9,
    ),
    ChatFormat(
        "mistral", ("[TOOL_CALLS]",),
        (Section("calls", "[TOOL_CALLS]"),),
        CallSyntax('[TOOL_CALLS][{"name": "', '", "arguments": ', "}]"),
        call_id_length=9,
    ),
    ChatFormat(
        "command-r7b", ("<|START_ACTION|>",),
        (Section("calls", "<|START_ACTION|>", ("<|END_ACTION|>",)),),
        CallSyntax('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "', '", "parameters": ',
                   "}\n]<|END_ACTION|>"),
        dropped=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    ),
    ChatFormat(
        "command-r", ("<|CHATBOT_TOKEN|>", "Action:"),
        (Section("calls", "Action:"),),
        CallSyntax('Action: ```json\n[\n    {\n        "tool_name": "', '",\n        "parameters": ',
                   "\n    }\n]```"),
    ),
    ChatFormat(
        "granite", ("<|start_of_role|>", "<|tool_call|>"),
        (Section("calls", "<|tool_call|>"),),
        CallSyntax('<|tool_call|>[{"name": "', '", "arguments": ', "}]"),
        dropped=("<response>", "</response>"),
    ),
    ChatFormat(
        "phi-4-mini", ("<|tool|>", "<|/tool|>"),
        (Section("calls", "<|tool_call|>", ("<|/tool_call|>",)),),
        CallSyntax('<|tool_call|>[{"name": "', '", "arguments": ', "}]<|/tool_call|>"),
        tools_in_system=True,
    ),
    ChatFormat(
        "llama-3", ("<|start_header_id|>", '"parameters"'),
        (Section("calls", "<|python_tag|>"), Section("calls", "")),
        CallSyntax('{"name": "', '", "parameters": ', "}"),
        one_call_per_message=True,
    ),
    # Qwen3-Coder: `<tool_call>` around markup, `<function=name>` and a `<parameter=key>` per argument.
    ChatFormat(
        "qwen3-coder", ("<tool_call>", "<function=", "<parameter="),
        # Small and quantized ones often leave the wrapper out (vLLM's parser reads such calls too).
        (Section("markup", "<tool_call>", ("</tool_call>",)), Section("markup", "<function=", ("</function>",), inclusive=True)),
        CallSyntax("<tool_call>\n<function=", ">\n", "</function>\n</tool_call>", markup=QWEN3_CODER_MARKUP),
    ),
    # Gemma 4: `<|tool_call>call:name{key:value,...}<tool_call|>`, strings between `<|"|>`.
    ChatFormat(
        "gemma-4", ("<|tool_call>call:",),
        (Section("markup", "<|tool_call>", ("<tool_call|>",)),),
        CallSyntax("<|tool_call>call:", "", "<tool_call|>", markup=GEMMA4_MARKUP),
    ),
    # Seed-OSS: Qwen3-Coder's markup inside `<seed:tool_call>`.
    ChatFormat(
        "seed-oss", ("<seed:tool_call>", "<function="),
        (Section("markup", "<seed:tool_call>", ("</seed:tool_call>",)),),
        CallSyntax("<seed:tool_call>\n<function=", ">\n", "</function>\n</seed:tool_call>", markup=SEED_OSS_MARKUP),
    ),
    # MiniMax-M2: `<minimax:tool_call>` around `<invoke name="...">` blocks.
    ChatFormat(
        "minimax-m2", ("<minimax:tool_call>", "<invoke name="),
        (Section("markup", "<minimax:tool_call>", ("</minimax:tool_call>",)),),
        CallSyntax('<minimax:tool_call>\n<invoke name="', '">\n', "</invoke>\n</minimax:tool_call>", markup=MINIMAX_MARKUP),
    ),
    # MiniMax-M3: M2's markup with each tag after its namespace token, `]<]minimax[>[<tool_call>` around `<invoke name="...">`
    # blocks of elements named by the arguments' keys (nested for objects and arrays); its thinking in `<mm:think>`, a turn
    # without it begun by a bare `</mm:think>`.
    ChatFormat(
        "minimax-m3", (MINIMAX_M3_TOKEN, "<invoke name="),
        (Section("reasoning", "<mm:think>", ("</mm:think>",)),
         Section("markup", f"{MINIMAX_M3_TOKEN}<tool_call>", (f"{MINIMAX_M3_TOKEN}</tool_call>",))),
        CallSyntax(f'{MINIMAX_M3_TOKEN}<tool_call>\n{MINIMAX_M3_TOKEN}<invoke name="', '">',
                   f"{MINIMAX_M3_TOKEN}</invoke>\n{MINIMAX_M3_TOKEN}</tool_call>", markup=MINIMAX_M3_MARKUP),
        dropped=("</mm:think>",),
    ),
    # LFM2 and LFM2.5: a Python list of calls inside `<|tool_call_start|>`; their templates write no calls of a history.
    ChatFormat(
        "lfm2", ("List of tools: ",),
        (Section("markup", "<|tool_call_start|>", ("<|tool_call_end|>",)),),
        CallSyntax("<|tool_call_start|>[", "(", ")]<|tool_call_end|>", markup=LFM2_MARKUP),
    ),
    # MiniCPM 5: `<function name="...">` markup with no wrapper.
    ChatFormat(
        "minicpm5", ('<function name="', '<param name="'),
        (Section("markup", '<function name="', ("</function>",), inclusive=True),),
        CallSyntax('<function name="', '">', "</function>", markup=MINICPM_MARKUP),
    ),
    # Apertus: `<|tools_prefix|>[{"name": {...}}, ...]<|tools_suffix|>`, each call keyed by its function's name.
    ChatFormat(
        "apertus", ("<|tools_prefix|>", "<|tools_suffix|>"),
        (Section("calls", "<|tools_prefix|>", ("<|tools_suffix|>",), named_by_key=True),),
        CallSyntax('<|tools_prefix|>[{"', '": ', "}]<|tools_suffix|>"),
    ),
    # GigaChat 3.1: the reply's text, then `<|function_call|>{"name": ..., "arguments": {...}}`, one call a message. The
    # message ends with `<|message_sep|>\n\n`, one token (its newlines too), dropped where the model writes it.
    ChatFormat(
        "gigachat-3.1", ("<|role_sep|>", "<|message_sep|>", "<|function_call|>"),
        (Section("calls", "<|function_call|>"),),
        CallSyntax('<|function_call|>{"name": "', '", "arguments": ', "}"),
        dropped=("<|message_sep|>\n\n",), one_call_per_message=True,
    ),
    # GigaChat 3: the call a message of its own role after the reply's, `<|message_sep|>\n\nfunction call<|role_sep|>\n{...}`
    # (the separators tokens with their newlines); its template names that role in its text, as 3.1's does (first, above).
    ChatFormat(
        "gigachat-3", ("<|role_sep|>", "<|message_sep|>", "function call"),
        (Section("calls", "function call<|role_sep|>\n"),),
        CallSyntax('<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "', '", "arguments": ', "}"),
        dropped=("<|message_sep|>\n\n",), one_call_per_message=True,
    ),
    # Nemotron Nano 2: a JSON list of calls inside `<TOOLCALL>`.
    ChatFormat(
        "nemotron", ("<TOOLCALL>",),
        (Section("calls", "<TOOLCALL>", ("</TOOLCALL>",)),),
        CallSyntax('<TOOLCALL>[{"name": "', '", "arguments": ', "}]</TOOLCALL>"),
    ),
    # GLM-4.5/4.6: `<tool_call>name`, then `<arg_key>key</arg_key>` and `<arg_value>value</arg_value>` per argument, each
    # on a line; GLM-4.7 writes them with no newlines.
    ChatFormat(
        "glm-4.5", ("<tool_call>", "<arg_key>", "<arg_value>"),
        (Section("markup", "<tool_call>", ("</tool_call>",)),),
        CallSyntax("<tool_call>", "\n", "</tool_call>", markup=GLM_MARKUP),
        call_layouts=(CallSyntax("<tool_call>", "", "</tool_call>", markup=GLM_4_7_MARKUP),),
    ),
    # ServiceNow Apriel 1.5 and 1.6: a JSON list of calls inside `<tool_calls>`. Its reasoning opens with "Here are my reasoning
    # steps:" (1.6's generation prompt writes it) and ends at `[BEGIN FINAL RESPONSE]`; 1.5 asks for `<thinking>` before calls.
    ChatFormat(
        "apriel", ("<tool_calls>[",),
        (Section("reasoning", "Here are my reasoning steps:", ("[BEGIN FINAL RESPONSE]",), leading=True), Section("reasoning", "<thinking>", ("</thinking>",)),
         Section("calls", "<tool_calls>", ("</tool_calls>",))),
        CallSyntax('<tool_calls>[{"name": "', '", "arguments": ', "}]</tool_calls>"),
        dropped=("[END FINAL RESPONSE]",),
    ),
    ChatFormat(
        "hermes", ("<tool_call>",),
        (Section("calls", "<tool_call>", ("</tool_call>",)),),
        CallSyntax('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>"),
    ),
)
# Templates that know no tool syntax: calls as a bare JSON object (or array) at the reply's start.
GENERIC = ChatFormat("generic", (), (Section("calls", ""),), CallSyntax('{"name": "', '", "arguments": ', "}"))

REASONING: tuple[Section, ...] = (
    Section("reasoning", "<think>", ("</think>",)),
    Section("reasoning", "<|START_THINKING|>", ("<|END_THINKING|>",)),
    Section("reasoning", "[THINK]", ("[/THINK]",)),
    Section("reasoning", "<|channel>thought", ("<channel|>",)),  # Gemma 4
    Section("reasoning", "<seed:think>", ("</seed:think>",)),  # Seed-OSS
    Section("reasoning", "<|inner_prefix|>", ("<|inner_suffix|>",)),  # Apertus
)

# What the server adds to the system prompt when the template shows no tools to the model.
GENERIC_TOOL_PROMPT = (
    "You can call these functions (JSON schemas follow):\n{tools}\n\n"
    "To call one, reply with only a JSON object, nothing else: "
    '{{"name": <function name>, "arguments": <object of its arguments>}}; '
    "for several, a JSON array of such objects. Otherwise, answer as usual."
)


def detect_format(template_source: str) -> ChatFormat:
    """The family whose markers the template contains (else GENERIC), with the reasoning markers
    the template contains."""
    family = next((f for f in FAMILIES if all(marker in template_source for marker in f.detect)), GENERIC)
    thinking = tuple(s for s in REASONING if s.start in template_source and all(e in template_source for e in s.end))
    return dataclasses.replace(family, sections=thinking + family.sections)


# -- writing a conversation for a family's template ------------------------------------------

# Other names templates read the tools under (SmolLM3's `xml_tools`): given too when mentioned.
TOOLS_ALIASES = ("xml_tools",)
# Names and texts the probes look for in a rendering.
PROBE_TOOL = "localchat_probe_tool"
PROBE_CALL = "localchat_probe_call"
PROBE_RESULT = "localchat probe result"
PROBE_SYSTEM = "localchat probe system"


@dataclass(frozen=True)
class TemplateSupport:
    """What a template renders of a conversation with tools; what it does not is rewritten into
    what it does (tools into the system prompt, calls into the assistant's text, results into
    user messages, a system prompt into the first user message), as llama.cpp's polyfills do."""

    system: bool = True
    tools: bool = True
    calls: bool = True
    results: bool = True
    # Of a family with several ways to write a call (`ChatFormat.call_layouts`), the one its rendering shows.
    call: CallSyntax | None = None


def template_support(template: ChatTemplate, fmt: ChatFormat) -> TemplateSupport:
    """Probes `template` with small conversations, written with `fmt`'s quirks."""
    full = TemplateSupport()
    # Parameters as OpenAI's SDK writes a function's without any (Seed-OSS's template reads their properties).
    tool = {"type": "function", "function": {"name": PROBE_TOOL, "description": "", "parameters": {"type": "object", "properties": {}}}}
    question = Message("user", "probe question")
    call = Message("assistant", "", tool_calls=(ToolCall("call_probe", PROBE_CALL, {"probe": 1}),))
    result = Message("tool", PROBE_RESULT, tool_call_id="call_probe")

    def rendering(messages: Sequence[Message], prompt: bool = True) -> str:
        try:
            return render_chat(template, fmt, full, messages, tools=[tool], add_generation_prompt=prompt)
        except TemplateError:
            return ""

    answered = rendering([question, call, result])
    called = answered or rendering([question, call], prompt=False)
    layouts = (fmt.call, *fmt.call_layouts) if fmt.call_layouts else ()
    return TemplateSupport(
        system=PROBE_SYSTEM in rendering([Message("system", PROBE_SYSTEM), question]),
        tools=PROBE_TOOL in rendering([question]),
        calls=PROBE_CALL in called,
        results=PROBE_RESULT in answered,
        call=next((layout for layout in layouts if layout.write(PROBE_CALL, call.tool_calls[0].arguments) in called), None),
    )


def conversation_format(fmt: ChatFormat, support: TemplateSupport) -> ChatFormat:
    """The format of a conversation with tools: the family's, written as its template writes a call, unless its
    template cannot show the tools; then the generic tool prompt says how to call, and the replies are read so."""
    if support.call is not None:
        fmt = dataclasses.replace(fmt, call=support.call)
    if support.tools or fmt.tools_in_system:
        return fmt
    generic = tuple(section for section in GENERIC.sections if section not in fmt.sections)
    return dataclasses.replace(fmt, sections=fmt.sections + generic, call=GENERIC.call)


def _short_id(call_id: str, length: int) -> str:
    """`call_id` as `length` letters and digits (Mistral's templates want 9): kept if it is one,
    else derived from it, the same every time so that a resent history renders alike."""
    if len(call_id) == length and call_id.isascii() and call_id.isalnum():
        return call_id
    digest = int.from_bytes(hashlib.sha256(call_id.encode()).digest(), "big")
    alphabet = string.ascii_letters + string.digits
    return "".join(alphabet[(digest >> (6 * i)) % len(alphabet)] for i in range(length))


def _one_call_each(messages: Sequence[Message]) -> list[Message]:
    """Assistant messages with several calls split into one message per call, each followed by
    its result (for templates that render one call per message)."""
    out: list[Message] = []
    rest = list(messages)
    while rest:
        message = rest.pop(0)
        if message.role != "assistant" or len(message.tool_calls) < 2:
            out.append(message)
            continue
        results = []
        while rest and rest[0].role == "tool":
            results.append(rest.pop(0))
        for number, call in enumerate(message.tool_calls):
            first = number == 0
            out.append(dataclasses.replace(message, content=message.content if first else "", tool_calls=(call,),
                                           reasoning=message.reasoning if first else None))
            out += [result for result in results if result.tool_call_id == call.id]
        ids = {call.id for call in message.tool_calls}
        out += [result for result in results if result.tool_call_id not in ids]
    return out


def _template_dict(message: Message, fmt: ChatFormat, support: TemplateSupport, names: Mapping[str, str]) -> dict[str, Any]:
    """One message as `fmt`'s template wants it."""

    def call_id(raw: str) -> str:
        return raw if fmt.call_id_length is None else _short_id(raw, fmt.call_id_length)

    if message.role == "tool" and not support.results:
        result = {"tool_result": {"name": names.get(message.tool_call_id or "", ""), "content": message.content}}
        return {"role": "user", "content": json.dumps(result, ensure_ascii=False)}
    written: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls and not support.calls:
        calls = "\n".join(fmt.call.write(call.name, call.arguments) for call in message.tool_calls)
        # Bare JSON calls are read only where a reply begins: the calls go first.
        bare = any(not section.start for section in fmt.sections)
        parts = (calls, message.content) if bare else (message.content, calls)
        written["content"] = "\n".join(text for text in parts if text)
    elif message.tool_calls:
        written["tool_calls"] = [
            {"id": call_id(call.id), "type": "function", "function": {
                "name": call.name,
                "arguments": json.dumps(dict(call.arguments), ensure_ascii=False) if fmt.string_arguments else dict(call.arguments),
            }}
            for call in message.tool_calls
        ]
        if fmt.null_content_with_calls and not message.content:
            written["content"] = None
    if message.tool_call_id is not None:
        written["tool_call_id"] = call_id(message.tool_call_id)
    if message.reasoning is not None:
        written["reasoning_content"] = message.reasoning
    return written


def _merge_users(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user messages as one: tool results written as user messages must not break a
    template's user/assistant alternation."""
    merged: list[dict[str, Any]] = []
    for message in history:
        if merged and message["role"] == "user" and merged[-1]["role"] == "user":
            merged[-1] = {**merged[-1], "content": f"{merged[-1]['content']}\n\n{message['content']}"}
        else:
            merged.append(message)
    return merged


def template_history(messages: Sequence[Message], fmt: ChatFormat, support: TemplateSupport,
                     tools: Sequence[Mapping[str, Any]] = ()) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages as `fmt`'s template wants them, and the tools to give it (None when there
    are none, or when they are written into the system prompt instead)."""
    if fmt.one_call_per_message:
        messages = _one_call_each(messages)
    names = {call.id: call.name for message in messages for call in message.tool_calls}
    history = [_template_dict(message, fmt, support, names) for message in messages]
    shown: list[dict[str, Any]] | None = [dict(tool) for tool in tools] or None
    if tools and not support.tools:
        functions = [dict(tool["function"]) for tool in tools]
        if not history or history[0]["role"] != "system":
            history.insert(0, {"role": "system", "content": ""})
        if fmt.tools_in_system:
            history[0]["tools"] = json.dumps(functions, ensure_ascii=False)
        else:
            prompt = GENERIC_TOOL_PROMPT.format(tools=json.dumps(functions, ensure_ascii=False, indent=2))
            history[0]["content"] = "\n\n".join(text for text in (history[0]["content"], prompt) if text)
        shown = None
    if not support.results:
        history = _merge_users(history)
    if not support.system and history and history[0]["role"] == "system":
        system = history.pop(0)["content"]
        if history and history[0]["role"] == "user":
            history[0] = {**history[0], "content": "\n\n".join(text for text in (system, history[0]["content"]) if text)}
        else:
            history.insert(0, {"role": "user", "content": system})
    return history, shown


def render_chat(template: ChatTemplate, fmt: ChatFormat, support: TemplateSupport, messages: Sequence[Message], *,
                tools: Sequence[Mapping[str, Any]] = (), add_generation_prompt: bool = True,
                template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The prompt for the assistant's next message, tools and tool history included."""
    history, shown = template_history(messages, fmt, support, tools)
    aliases = {alias: shown for alias in TOOLS_ALIASES if shown and alias in template.source}
    return template.render(history, tools=shown, add_generation_prompt=add_generation_prompt,
                           **{**aliases, **(template_kwargs or {})})


def call_lead(template: ChatTemplate, fmt: ChatFormat, support: TemplateSupport, messages: Sequence[Message], prompt: str, *,
              tools: Sequence[Mapping[str, Any]] = (), template_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """What the template writes between `prompt` (the messages' generation prompt) and a call, in a reply that is a call
    alone: Kimi K3 closes its response section first, Qwen3 writes an empty think block. Read from the messages rendered
    with such a reply; None where that rendering does not continue the prompt (a template that writes a past reply
    otherwise than a new one, as thinking templates that drop past reasoning do)."""
    reply = Message("assistant", "", tool_calls=(ToolCall("call_probe", PROBE_CALL, {}),))
    try:
        written = render_chat(template, fmt, support, [*messages, reply], tools=tools, add_generation_prompt=False,
                              template_kwargs=template_kwargs)
    except TemplateError:
        return None
    end = written.find(fmt.call.prefix + PROBE_CALL, len(prompt)) if written.startswith(prompt) else -1
    return written[len(prompt) : end] if end >= 0 else None


def call_opening(fmt: ChatFormat, prompt: str, name: str | None = None, lead: str | None = None) -> str:
    """What to write after `prompt` so that the reply is a call: of `name`, or of a function the
    model picks, after the template's `lead` (`call_lead`). Without one, a prompt that leaves the reply
    inside reasoning closes it first."""
    if lead is None:
        tail = prompt.rstrip()
        thinking = next((s for s in fmt.sections if s.kind == "reasoning" and tail.endswith(s.start)), None)
        lead = f"{thinking.end[0]}\n\n" if thinking else ""
    call = fmt.call
    return lead + call.prefix + (f"{name}{call.before_arguments}" if name else "")


# A function defined without parameters takes none, as OpenAI reads it: its arguments are {}.
NO_PARAMETERS = {"properties": {}, "additionalProperties": False}


def call_grammar(fmt: ChatFormat, tools: Sequence[Mapping[str, Any]], name: str | None = None,
                 control: Mapping[str, int] | None = None) -> str:
    """A Lark grammar (llguidance's) for what follows `call_opening(fmt, prompt, name)`: the
    arguments of `name`, or the name and arguments of one of `tools`, then the call's closing,
    the arguments following the function's JSON schema. `control` gives the token id of markers
    that are control tokens (a grammar names those by id: as text they never match)."""
    pieces = sorted((control or {}).items(), key=lambda item: -len(item[0]))
    pattern = re.compile("|".join(re.escape(marker) for marker, _ in pieces)) if pieces else None

    def literal(text: str) -> str:
        parts, position = [], 0
        for found in pattern.finditer(text) if pattern else ():
            parts += [json.dumps(text[position : found.start()], ensure_ascii=False), f"<[{dict(pieces)[found.group()]}]>"]
            position = found.end()
        parts.append(json.dumps(text[position:], ensure_ascii=False))
        return " ".join(part for part in parts if part != '""')

    syntax = fmt.call
    chosen = [tool["function"] for tool in tools if name is None or tool["function"]["name"] == name]
    rules = []
    for number, function in enumerate(chosen):
        parameters = function.get("parameters", NO_PARAMETERS)
        arguments = syntax.markup.arguments.grammar(f"arguments_{number}", parameters, JSON_LAYOUT, literal) if syntax.markup else [
            f"arguments_{number}: %json {json.dumps({'type': 'object', **parameters, 'x-guidance': JSON_LAYOUT}, ensure_ascii=False)}"]
        body = ("" if name else literal(function["name"] + syntax.before_arguments), f"arguments_{number}", literal(syntax.closing))
        rules += [f"call_{number}: {' '.join(part for part in body if part)}", *arguments]
    return "\n".join([f"start: {' | '.join(f'call_{n}' for n in range(len(chosen)))}", *rules])
