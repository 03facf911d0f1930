"""Tool calls written as markup, not JSON, inside `<tool_call>`: a function's name, then one block
per argument holding its value as text. Qwen3-Coder and GLM-4.5/4.6 write them so:

    <function=get_weather>                <tool_call>get_weather
    <parameter=days>                      <arg_key>days</arg_key>
    3                                     <arg_value>3</arg_value>
    </parameter>                          </tool_call>
    </function>

The text becomes a JSON value by the type the function's schema gives that parameter, as vLLM's
and llama.cpp's parsers read it: strings stay text, other types are read as JSON, falling back to
the text. localchat.reply_parser finds the section; this module reads its body, writes calls for a
history, and gives the Lark grammar (llguidance's) of a forced call's arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Parameters = Mapping[str, Any]  # a function's parameters' JSON schema
MarkupCall = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class MarkupSyntax:
    """One family's markup. `function` finds a function's block in a section's body (group 1 its
    name, 2 its parameters); `parameter` one parameter in it (1 its key, 2 its value's text);
    `opened` a function's start at a body's beginning (1 the name so far, 2 non-empty once the
    name has ended). `key_open` (formatted with the key), `value_close`: how a parameter is
    written. `trim`: the text the family puts on each side of a value, removed once. `lead`: what
    a body begins with, after whitespace."""

    function: re.Pattern[str]
    parameter: re.Pattern[str]
    opened: re.Pattern[str]
    key_open: str
    value_close: str
    trim: str = ""
    lead: str = ""  # what a body begins with


QWEN3_CODER_MARKUP = MarkupSyntax(
    re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL),
    # A value ends at its closing tag; vLLM also ends one left open at the next parameter.
    re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL),
    re.compile(r"\s*<function=([^>\n]*)(>?)"),
    "<parameter={key}>\n", "\n</parameter>\n", trim="\n", lead="<function=",
)
# GLM's name is the body's first word; its section holds one call.
GLM_MARKUP = MarkupSyntax(
    re.compile(r"\A\s*([^\s<]+)\n(.*)\Z", re.DOTALL),
    re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL),
    re.compile(r"\s*([^\s<]*)(\s?)"),
    "<arg_key>{key}</arg_key>\n<arg_value>", "</arg_value>\n",
)


def _types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    declared = schema.get("type", "string")
    return tuple(declared) if isinstance(declared, list) else (str(declared),)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# How a value's text is read, by its schema type; a parameter the schema does not type is text.
READERS: dict[str, Callable[[str], Any]] = {
    "string": str,
    "boolean": lambda text: {"true": True, "false": False}.get(text.strip().lower(), text),  # `True` is what Jinja prints
    "integer": _json_or_text,
    "number": _json_or_text,
    "object": _json_or_text,
    "array": _json_or_text,
    "null": _json_or_text,
}


def parameter_value(text: str, schema: Mapping[str, Any]) -> Any:
    """A parameter's text as the JSON value its schema's type says."""
    types = _types(schema)
    reader = READERS["string"] if "string" in types else READERS.get(types[0], str)
    return reader(text)


def _arguments(syntax: MarkupSyntax, inner: str, parameters: Parameters) -> dict[str, Any] | None:
    """A function block's arguments; None when text other than parameters stands in it."""
    properties = parameters.get("properties") or {}
    arguments: dict[str, Any] = {}
    rest, position = "", 0
    for found in syntax.parameter.finditer(inner):
        rest += inner[position : found.start()]
        position = found.end()
        key, text = found.group(1).strip(), found.group(2)
        if syntax.trim:
            text = text.removeprefix(syntax.trim).removesuffix(syntax.trim)
        arguments[key] = parameter_value(text, properties.get(key, {}))
    return arguments if not (rest + inner[position:]).strip() else None


def may_open(syntax: MarkupSyntax, body: str) -> bool:
    """Whether a section's body so far may still be calls (else its text is content, told at once)."""
    head = body.lstrip()
    return head.startswith(syntax.lead) or syntax.lead.startswith(head)


def read_markup_calls(syntax: MarkupSyntax, body: str, tools: Mapping[str, Parameters], *,
                      open_call: bool = False) -> list[MarkupCall] | None:
    """The calls a `<tool_call>` section's body holds; None unless it is function blocks only.
    `open_call`: a last function block left open (a forced call cut short) counts, with the
    parameters it finished."""
    calls: list[MarkupCall] = []
    position = 0
    for found in syntax.function.finditer(body):
        name = found.group(1).strip()
        arguments = _arguments(syntax, found.group(2), tools.get(name, {}))
        if body[position : found.start()].strip() or arguments is None:
            break
        calls.append((name, arguments))
        position = found.end()
    rest = body[position:]
    if not rest.strip():
        return calls or None
    opened = syntax.opened.match(rest)
    if not open_call or opened is None or not opened.group(2):
        return None
    name, closed = opened.group(1).strip(), rest[opened.end() :]
    end = max((found.end() for found in syntax.parameter.finditer(closed) if syntax.value_close.strip() in found.group(0)), default=0)
    return [*calls, (name, _arguments(syntax, closed[:end], tools.get(name, {})) or {})]


def write_parameters(syntax: MarkupSyntax, arguments: Mapping[str, Any]) -> str:
    """Arguments as parameter blocks (strings as they are, other values as JSON)."""
    return "".join(syntax.key_open.format(key=key) + (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
                   + syntax.value_close for key, value in arguments.items())


def _regex_text(text: str) -> str:
    """`text` as a Lark regex literal's body that matches it."""
    return re.escape(text).replace("\\\n", "\\n").replace("/", "\\/")


def arguments_grammar(syntax: MarkupSyntax, rule: str, parameters: Parameters, layout: Mapping[str, Any]) -> list[str]:
    """Lark rules (llguidance's) for a function's parameter blocks under `rule`: the schema's
    properties in its order, the required ones present. A string's text is lazy: it ends where
    its closing tag first follows; a string enum is one of its values; other types are their
    JSON schema."""
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    closing = syntax.value_close.rstrip("\n")
    after = json.dumps(syntax.value_close[len(closing):])
    parts, rules = [], []
    for number, (key, schema) in enumerate(properties.items()):
        value = f"{rule}_{number}"
        opening = json.dumps(syntax.key_open.format(key=key), ensure_ascii=False)
        enum = schema.get("enum")
        if "string" in _types(schema) and enum and all(isinstance(item, str) for item in enum):
            rules.append(f"{value}: {' | '.join(json.dumps(item + closing, ensure_ascii=False) for item in enum)}")
        elif "string" in _types(schema):
            rules.append(f"{value}[lazy]: /(?s:.*){_regex_text(closing)}/")
        else:
            typed = {**schema, "x-guidance": dict(layout)}
            rules.append(f"{value}: %json {json.dumps(typed, ensure_ascii=False)} {json.dumps(closing)}")
        parts.append(f"({opening} {value} {after})" + ("" if key in required else "?"))
    empty = '""'
    return [f"{rule}: {' '.join(parts) or empty}", *rules]
