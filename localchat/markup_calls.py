"""Tool calls written as markup (Qwen3-Coder's), not JSON: inside `<tool_call>`, a
`<function=NAME>` block holds one `<parameter=KEY>` block per argument, each value as text:

    <function=get_weather>
    <parameter=days>
    3
    </parameter>
    </function>

The text becomes a JSON value by the type the function's schema gives that parameter, as vLLM's
and llama.cpp's Qwen3-Coder parsers read it: strings stay text, other types are read as JSON,
falling back to the text. localchat.reply_parser finds the section; this module reads its body,
writes calls for a history, and gives the Lark grammar (llguidance's) of a forced call's arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
# A parameter's text ends at its closing tag; vLLM also ends one left open at the next parameter.
PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
OPEN_FUNCTION = re.compile(r"\s*<function=([^>\n]*)(>?)")
Parameters = Mapping[str, Any]  # a function's parameters' JSON schema
MarkupCall = tuple[str, dict[str, Any]]


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
    """A parameter's text (less the one newline each side that the format puts there) as the
    JSON value its schema's type says."""
    text = text.removeprefix("\n").removesuffix("\n")
    types = _types(schema)
    reader = READERS["string"] if "string" in types else READERS.get(types[0], str)
    return reader(text)


def _arguments(inner: str, parameters: Parameters) -> dict[str, Any] | None:
    """A function block's arguments; None when text other than parameters stands in it."""
    properties = parameters.get("properties") or {}
    arguments: dict[str, Any] = {}
    rest = inner
    for found in PARAMETER.finditer(inner):
        arguments[found.group(1).strip()] = parameter_value(found.group(2), properties.get(found.group(1).strip(), {}))
        rest = rest.replace(found.group(0), "", 1)
    return arguments if not rest.strip() else None


def read_markup_calls(body: str, tools: Mapping[str, Parameters], *, open_call: bool = False) -> list[MarkupCall] | None:
    """The calls a `<tool_call>` section's body holds; None unless it is function blocks only.
    `open_call`: a last function block left open (a forced call cut short) counts, with the
    parameters it finished."""
    calls: list[MarkupCall] = []
    position = 0
    for found in FUNCTION.finditer(body):
        if body[position : found.start()].strip():
            return None
        name = found.group(1).strip()
        arguments = _arguments(found.group(2), tools.get(name, {}))
        if arguments is None:
            return None
        calls.append((name, arguments))
        position = found.end()
    rest = body[position:]
    opened = OPEN_FUNCTION.match(rest)
    if open_call and opened is not None and opened.group(2):
        name = opened.group(1).strip()
        finished = rest[opened.end() :].rsplit("</parameter>", 1)[0] + "</parameter>" if "</parameter>" in rest else ""
        arguments = _arguments(finished, tools.get(name, {})) or {}
        return [*calls, (name, arguments)]
    return calls if calls and not rest.strip() else None


def write_parameters(arguments: Mapping[str, Any]) -> str:
    """Arguments as parameter blocks (strings as they are, other values as JSON)."""
    return "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}\n</parameter>\n"
                   for key, value in arguments.items())


def arguments_grammar(rule: str, parameters: Parameters, layout: Mapping[str, Any]) -> list[str]:
    """Lark rules (llguidance's) for a function's parameter blocks under `rule`: the schema's
    properties in its order, the required ones present. A string's text is lazy: it ends at the
    first `\\n</parameter>`; a string enum is one of its values; other types are their JSON schema."""
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    parts, rules = [], []
    for number, (key, schema) in enumerate(properties.items()):
        value = f"{rule}_{number}"
        opening = json.dumps(f"<parameter={key}>\n", ensure_ascii=False)
        enum = schema.get("enum")
        if "string" in _types(schema) and enum and all(isinstance(item, str) for item in enum):
            rules.append(f"{value}: {' | '.join(json.dumps(item + chr(10) + '</parameter>', ensure_ascii=False) for item in enum)}")
        elif "string" in _types(schema):
            rules.append(f"{value}[lazy]: /(?s:.*)\\n<\\/parameter>/")
        else:
            typed = {**schema, "x-guidance": dict(layout)}
            rules.append(f'{value}: %json {json.dumps(typed, ensure_ascii=False)} "\\n</parameter>"')
        parts.append(f'({opening} {value} "\\n")' + ("" if key in required else "?"))
    empty = '""'
    return [f"{rule}: {' '.join(parts) or empty}", *rules]
