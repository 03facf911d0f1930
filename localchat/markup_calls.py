"""Tool calls written as markup, not JSON: a function's name, then its arguments in the family's own
notation. Qwen3-Coder and GLM-4.5/4.6 write a block per argument holding its value as text, inside
`<tool_call>`; Gemma 4 writes one object in a notation of its own, inside `<|tool_call>`:

    <function=get_weather>            <tool_call>get_weather               call:get_weather{days:3}
    <parameter=days>                  <arg_key>days</arg_key>
    3                                 <arg_value>3</arg_value>
    </parameter>                      </tool_call>
    </function>

A block's text becomes a JSON value by the type the function's schema gives that parameter, as vLLM's
and llama.cpp's parsers read it: strings stay text, other types are read as JSON, falling back to
the text. DeepSeek's DSML marks each block (`string="true"`: text, `"false"`: JSON) and its mark
decides, as DeepSeek's own decoder reads it. MiniMax-M3 writes an object's members and an array's items
as nested elements, read by the schema too. localchat.reply_parser finds the section; this module
reads its body, writes calls for a history, and gives the Lark grammar (llguidance's) of a forced
call's arguments."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Parameters = Mapping[str, Any]  # a function's parameters' JSON schema
MarkupCall = tuple[str, dict[str, Any]]


class ArgumentNotation(Protocol):
    """How a family writes a call's arguments inside its markup."""

    def read(self, inner: str, parameters: Parameters) -> dict[str, Any] | None:
        """The arguments a closed function block holds; None when other text stands in it."""

    def read_open(self, written: str, parameters: Parameters) -> dict[str, Any]:
        """The arguments finished in a block cut short (a forced call at its token limit); `written`
        follows the end of the function's name."""

    def write(self, arguments: Mapping[str, Any]) -> str:
        """Arguments as the family writes them (a call in a history its template does not render)."""

    def grammar(self, rule: str, parameters: Parameters, layout: Mapping[str, Any], literal: Callable[[str], str]) -> list[str]:
        """Lark rules (llguidance's) under `rule` for arguments that follow `parameters`' schema; `literal`
        writes a text as a grammar literal (control tokens by id)."""


@dataclass(frozen=True)
class MarkupSyntax:
    """One family's markup. `function` finds a function's block in a section's body (group 1 its
    name, 2 its arguments); `opened` a function's start at a body's beginning, its name cut short or not
    (1 the name so far, 2 non-empty once the name has ended). `lead`: what a body begins with, after whitespace.
    `shown`: control tokens the arguments hold, which the reply must show."""

    function: re.Pattern[str]
    opened: re.Pattern[str]
    arguments: ArgumentNotation
    lead: str = ""
    shown: tuple[str, ...] = ()
    # Reads a whole body of calls that no pattern can find one by one (LFM2's Python list); `function` is then unused.
    read_body: Callable[[str], list[MarkupCall] | None] | None = None
    # A body that is a function's name alone calls it without arguments: only a function the request offers, since
    # prose writes a tag around a word so too (`<tool_call>tags</tool_call>`), and a forced call cut short in its name.
    named_alone: bool = False


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


def marked_value(text: str, string: str | None, schema: Mapping[str, Any]) -> Any:
    """A parameter's text by its `string="true|false"` mark (DeepSeek's DSML): the text as written, or JSON;
    unmarked, or marked JSON that does not parse, as `parameter_value` reads it."""
    if string == "true":
        return text
    if string == "false":
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(text)
    return parameter_value(text, schema)


def _string_mark(is_string: bool) -> str:
    return "true" if is_string else "false"


# A value's JSON type as Kimi K3's template names it (`bool` first: it is an `int` too); anything else is an array.
VALUE_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"), (type(None), "null"), ((int, float), "number"), (str, "string"), (Mapping, "object"))


def _value_type(value: Any) -> str:
    return next((name for kinds, name in VALUE_TYPES if isinstance(value, kinds)), "array")


def _schema_type(schema: Mapping[str, Any]) -> str:
    """The JSON type of the values a parameter's schema allows, as `_value_type` names it (a string if it may be one)."""
    types = [kind for kind in _types(schema) if kind != "null"] or ["null"]
    return "string" if "string" in types else "number" if types[0] == "integer" else types[0]


def _regex_text(text: str) -> str:
    """`text` as a Lark regex literal's body that matches it."""
    return re.escape(text).replace("\\\n", "\\n").replace("/", "\\/")


def _string_enum(schema: Mapping[str, Any]) -> list[str] | None:
    enum = schema.get("enum")
    return enum if "string" in _types(schema) and enum and all(isinstance(item, str) for item in enum) else None


CDATA = ("<![CDATA[", "]]>")


@dataclass(frozen=True)
class ParameterBlocks:
    """Arguments as one block per parameter holding its value as text (Qwen3-Coder, GLM): `parameter`
    finds one (named groups: `key`; `value`, its text; `string`, where the family marks a value a string
    or not, "true" or "false"; `type`, where it writes the value's JSON type, read where the schema gives none); `key_open` (formatted with the `key`, that `string` mark and the value's JSON `type`) and
    `value_close` write one; `trim`: the text the family puts on each side of a value, removed once."""

    parameter: re.Pattern[str]
    key_open: str
    value_close: str
    trim: str = ""
    cdata: bool = False  # a value holding <, & or a newline comes in a CDATA block (MiniCPM)

    def read(self, inner: str, parameters: Parameters) -> dict[str, Any] | None:
        properties = parameters.get("properties") or {}
        arguments: dict[str, Any] = {}
        rest, position = "", 0
        for found in self.parameter.finditer(inner):
            rest += inner[position : found.start()]
            position = found.end()
            key, text = found.group("key").strip(), found.group("value")
            if self.trim:
                text = text.removeprefix(self.trim).removesuffix(self.trim)
            if self.cdata and text.startswith(CDATA[0]) and text.endswith(CDATA[1]):
                text = text[len(CDATA[0]) : -len(CDATA[1])]
            schema, written_type = properties.get(key, {}), found.groupdict().get("type")
            if written_type is not None and "type" not in _typed(schema):  # Kimi K3's type, where the schema gives none
                schema = {"type": written_type}
            arguments[key] = marked_value(text, found.groupdict().get("string"), schema)
        return arguments if not (rest + inner[position:]).strip() else None

    def read_open(self, written: str, parameters: Parameters) -> dict[str, Any]:
        closing = self.value_close.strip()
        end = max((found.end() for found in self.parameter.finditer(written) if closing in found.group(0)), default=0)
        return self.read(written[:end], parameters) or {}

    def write(self, arguments: Mapping[str, Any]) -> str:
        """Strings as they are (in CDATA where the family wants it), other values as JSON."""
        def text(value: Any) -> str:
            if not isinstance(value, str):
                return json.dumps(value, ensure_ascii=False)
            return f"{CDATA[0]}{value}{CDATA[1]}" if self.cdata and any(c in value for c in "<&\n") else value

        return "".join(self.key_open.format(key=key, string=_string_mark(isinstance(value, str)), type=_value_type(value))
                       + text(value) + self.value_close for key, value in arguments.items())

    def grammar(self, rule: str, parameters: Parameters, layout: Mapping[str, Any], literal: Callable[[str], str]) -> list[str]:
        """The schema's properties in its order, the required ones present. A string's text is lazy: it
        ends where its closing tag first follows; a string enum is one of its values; other types are
        their JSON schema."""
        closing = self.value_close.rstrip("\n")
        after = literal(self.value_close[len(closing):])

        def block(value: str, key: str, schema: Mapping[str, Any]) -> tuple[str, list[str]]:
            opening = self.key_open.format(key=key, string=_string_mark("string" in _types(schema)), type=_schema_type(schema))
            return f"{literal(opening)} {value} {after}", [_value_rule(value, schema, closing, layout, literal)]

        blocks, rules = _blocks_grammar(rule, parameters, block)
        empty = '""'
        return [f"{rule}: {blocks or empty}", *rules]


def _blocks_grammar(rule: str, schema: Mapping[str, Any],
                    block: Callable[[str, str, Mapping[str, Any]], tuple[str, list[str]]]) -> tuple[str, list[str]]:
    """Lark text for the schema's properties in its order, one block each with nothing between them, the required ones
    present ("" for none), and their rules. `block(value_rule, key, schema)` gives a property's text and its value's rules."""
    required = set(schema.get("required") or ())
    parts, rules = [], []
    for number, (key, member) in enumerate((schema.get("properties") or {}).items()):
        text, value_rules = block(f"{rule}_{number}", key, member)
        rules += value_rules
        parts.append(f"({text})" + ("" if key in required else "?"))
    return " ".join(parts), rules


def _value_rule(rule: str, schema: Mapping[str, Any], closing: str, layout: Mapping[str, Any], literal: Callable[[str], str]) -> str:
    """A Lark rule for a value written as text, then its `closing` tag: a string enum one of its values, a string
    free text, another type its JSON schema."""
    enum = _string_enum(schema)
    if enum:
        return f"{rule}: {' | '.join(literal(item + closing) for item in enum)}"
    if "string" in _types(schema):
        return _text_rule(rule, closing, literal)
    return f"{rule}: {_json_rule(schema, layout)} {literal(closing)}"


def _text_rule(rule: str, closing: str, literal: Callable[[str], str]) -> str:
    """A Lark rule for text up to its `closing` tag. Lazy, it ends where the tag first follows; where the tag
    holds a control token (DeepSeek's `｜DSML｜`), which no text can spell, the text runs to the tag's text before
    that token, and the token ends it."""
    written = literal(closing)
    if written.startswith("<["):
        return f"{rule}: /(?s:.*)/ {written}"
    head, end = json.JSONDecoder().raw_decode(written)  # `literal`'s first piece, a JSON string
    after_head = written[end:].strip()
    if not after_head:
        return f"{rule}[lazy]: /(?s:.*){_regex_text(closing)}/"
    return f"{rule}: /(?s:.*){_regex_text(head)}/ {after_head}"


def _json_rule(schema: Mapping[str, Any], layout: Mapping[str, Any]) -> str:
    return f"%json {json.dumps({**schema, 'x-guidance': dict(layout)}, ensure_ascii=False)}"


def _typed(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """`schema`, or where it types its value by `anyOf`/`oneOf` alone (pydantic's Optional), its first branch that is not
    null; one that gives properties alone is an object's."""
    if "type" in schema:
        return schema
    branches = [branch for branch in schema.get("anyOf") or schema.get("oneOf") or () if branch.get("type") != "null"]
    return branches[0] if branches else {"type": "object", **schema} if "properties" in schema else schema


def _nested(schema: Mapping[str, Any]) -> str | None:
    """"object" or "array" where a schema's value is written as elements (MiniMax-M3), None where as text."""
    types = _types(schema)
    return None if "string" in types or types[0] not in ("object", "array") else types[0]


@dataclass(frozen=True)
class XmlElements:
    """Arguments as elements named by their keys, each tag after the family's `namespace` token (MiniMax-M3's
    `]<]minimax[>[<city>Bern]<]minimax[>[</city>`): an object's members nest so too and an array's values as `item`
    elements, as its template's to_xml writes them. Read by the schema, as llama.cpp reads them: a string is its text,
    an object or array its elements (or JSON, where it holds none), another type JSON."""

    namespace: str

    def _tag(self, name: str, *, closing: bool = False) -> str:
        return f"{self.namespace}<{'/' if closing else ''}{name}>"

    def _elements(self, text: str) -> tuple[list[tuple[str, str]], int]:
        """The elements `text` begins with, whitespace between them (each its name and inner text), and where they end."""
        elements: list[tuple[str, str]] = []
        end = depth = start = 0
        name = ""
        for tag in re.finditer(rf"{re.escape(self.namespace)}<(/?)([^>\s/]+)>", text):
            closing = bool(tag.group(1))
            if depth == 0:
                if closing or text[end : tag.start()].strip():
                    break
                name, start = tag.group(2), tag.end()
            depth += -1 if closing else 1
            if depth == 0:
                if tag.group(2) != name:
                    break
                elements.append((name, text[start : tag.start()]))
                end = tag.end()
        return elements, end

    def _members(self, elements: list[tuple[str, str]], schema: Mapping[str, Any]) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        return {name: self._value(inner, properties.get(name, {})) for name, inner in elements}

    def _value(self, text: str, schema: Mapping[str, Any]) -> Any:
        """A value by its schema; one the schema does not type that is elements alone, an object (an array where they
        are all items), as the model wrote it."""
        schema = _typed(schema)
        elements, end = self._elements(text)
        untyped = "type" not in schema and bool(elements)
        kind = ("array" if all(name == "item" for name, _ in elements) else "object") if untyped else _nested(schema)
        if kind is None or text[end:].strip() or (kind == "array" and any(name != "item" for name, _ in elements)):
            return parameter_value(text, schema)
        if kind == "object":
            return self._members(elements, schema)
        return [self._value(inner, schema.get("items") or {}) for _, inner in elements]

    def read(self, inner: str, parameters: Parameters) -> dict[str, Any] | None:
        elements, end = self._elements(inner)
        return None if inner[end:].strip() else self._members(elements, parameters)

    def read_open(self, written: str, parameters: Parameters) -> dict[str, Any]:
        return self._members(self._elements(written)[0], parameters)

    def write(self, arguments: Mapping[str, Any]) -> str:
        return self._text(arguments)

    def _text(self, value: Any) -> str:
        """A value as the template's to_xml writes it: None omitted, booleans as JSON, other scalars as text."""
        if isinstance(value, Mapping):
            return "".join(self._tag(key) + self._text(item) + self._tag(key, closing=True) for key, item in value.items() if item is not None)
        if isinstance(value, (list, tuple)):
            return "".join(self._tag("item") + self._text(item) + self._tag("item", closing=True) for item in value)
        return value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)

    def grammar(self, rule: str, parameters: Parameters, layout: Mapping[str, Any], literal: Callable[[str], str]) -> list[str]:
        """The schema's properties in its order, the required ones present, with no space between elements (as the
        template writes them); an object with properties or an array as elements, as llama.cpp's grammar has them."""
        elements, rules = self._elements_grammar(rule, parameters, layout, literal)
        empty = '""'
        return [f"{rule}: {elements or empty}", *rules]

    def _elements_grammar(self, rule: str, schema: Mapping[str, Any], layout: Mapping[str, Any],
                          literal: Callable[[str], str]) -> tuple[str, list[str]]:
        """An object's members as elements, one per property (see `_blocks_grammar`)."""
        def element(value: str, key: str, member: Mapping[str, Any]) -> tuple[str, list[str]]:
            return (f"{literal(self._tag(key))} {value}",
                    self._value_grammar(value, member, self._tag(key, closing=True), layout, literal))

        return _blocks_grammar(rule, schema, element)

    def _value_grammar(self, rule: str, schema: Mapping[str, Any], closing: str, layout: Mapping[str, Any],
                       literal: Callable[[str], str]) -> list[str]:
        schema = _typed(schema)
        kind = _nested(schema)
        if kind == "object" and schema.get("properties"):
            elements, rules = self._elements_grammar(rule, schema, layout, literal)
            return [f"{rule}: {elements} {literal(closing)}", *rules]
        if kind == "array":
            item = f"{rule}_item"
            return [f"{rule}: ({literal(self._tag('item'))} {item})* {literal(closing)}",
                    *self._value_grammar(item, schema.get("items") or {}, self._tag("item", closing=True), layout, literal)]
        return [_value_rule(rule, schema, closing, layout, literal)]


def _members_grammar(rule: str, parameters: Parameters, separator: str,
                     member: Callable[[str, str, Mapping[str, Any]], tuple[str, list[str]]]) -> tuple[str, list[str]]:
    """Lark rules for the schema's properties in its order, `separator` between those written, the required ones
    present: what the members begin with (a rule, or "" for none) and the rules. `member(value_rule, key, schema)`
    gives a property's text and its value's rules."""
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    rules: list[str] = []
    # {rule}_from_{n}: the members from the n-th property on, none written yet; {rule}_more_{n}: after one.
    follow_from = follow_more = '""'
    for number, (key, schema) in reversed(list(enumerate(properties.items()))):
        text, value_rules = member(f"{rule}_{number}", key, schema)
        rules += value_rules
        more, start = f"{rule}_more_{number}", f"{rule}_from_{number}"
        if key in required:
            rules += [f"{more}: {json.dumps(separator)} {text} {follow_more}", f"{start}: {text} {follow_more}"]
        else:
            rules += [f"{more}: ({json.dumps(separator)} {text})? {follow_more}", f"{start}: {text} {follow_more} | {follow_from}"]
        follow_from, follow_more = start, more
    return follow_from, rules


# A value Gemma 4 wrote without quotes (a number, a literal, or leniently a word): up to the next separator.
_GEMMA_WORD = re.compile(r"[^,}\]]*")


class _GemmaText:
    """A reader of Gemma 4's argument notation: JSON's values, but strings between `<|"|>` and the keys
    of objects bare (`{city:<|"|>Paris<|"|>,days:3}`), as its template's `format_argument` writes them.
    Read leniently: JSON strings and quoted keys too, and a bare word as a string."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def _space(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def _take(self, expected: str) -> bool:
        self._space()
        if self.text.startswith(expected, self.at):
            self.at += len(expected)
            return True
        return False

    def value(self) -> Any:
        self._space()
        if self._take(GEMMA_QUOTE):
            end = self.text.find(GEMMA_QUOTE, self.at)
            if end < 0:
                raise ValueError("a string left open")
            value, self.at = self.text[self.at : end], end + len(GEMMA_QUOTE)
            return value
        if self._take("{"):
            return self.members({})
        if self._take("["):
            return self.items([])
        if self.text.startswith('"', self.at):
            value, self.at = json.JSONDecoder().raw_decode(self.text, self.at)
            return value
        word = _GEMMA_WORD.match(self.text, self.at)
        assert word is not None
        self.at = word.end()
        text = word.group().strip()
        if not text:
            raise ValueError("a value is missing")
        return _json_or_text(text)

    def members(self, into: dict[str, Any]) -> dict[str, Any]:
        """An object's members after its `{`, added to `into` as each is read (so a cut-short one keeps those)."""
        if self._take("}"):
            return into
        while True:
            self._space()
            colon = self.text.find(":", self.at)
            if colon < 0:
                raise ValueError("a key without a value")
            key = self.text[self.at : colon].strip().removeprefix(GEMMA_QUOTE).removesuffix(GEMMA_QUOTE).strip('"')
            self.at = colon + 1
            into[key] = self.value()
            if self._take("}"):
                return into
            if not self._take(","):
                raise ValueError("members not separated by commas")

    def items(self, into: list[Any]) -> list[Any]:
        if self._take("]"):
            return into
        while True:
            into.append(self.value())
            if self._take("]"):
                return into
            if not self._take(","):
                raise ValueError("items not separated by commas")

    def at_end(self) -> bool:
        self._space()
        return self.at == len(self.text)


GEMMA_QUOTE = '<|"|>'


def _gemma_value(value: Any) -> str:
    if isinstance(value, str):
        return f"{GEMMA_QUOTE}{value}{GEMMA_QUOTE}"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{_gemma_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_gemma_value(item) for item in value) + "]"
    return json.dumps(value)


class GemmaObject:
    """Gemma 4's arguments: one object in its own notation (`_GemmaText`), braces included."""

    def read(self, inner: str, parameters: Parameters) -> dict[str, Any] | None:
        reader = _GemmaText(inner)
        try:
            arguments = reader.value()
        except ValueError:
            return None
        return arguments if isinstance(arguments, dict) and reader.at_end() else None

    def read_open(self, written: str, parameters: Parameters) -> dict[str, Any]:
        """`written` follows the object's `{` (the end of the function's name)."""
        arguments: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            _GemmaText(written).members(arguments)
        return arguments

    def write(self, arguments: Mapping[str, Any]) -> str:
        return _gemma_value(arguments)

    def grammar(self, rule: str, parameters: Parameters, layout: Mapping[str, Any], literal: Callable[[str], str]) -> list[str]:
        """The object's braces around the schema's properties in its order, separated by commas, the required
        ones present. A string is quoted and lazy: it ends at the first closing quote; a string enum is one
        of its values; other types are their JSON schema (which the reader takes too)."""
        quote = literal(GEMMA_QUOTE)

        def member(value: str, key: str, schema: Mapping[str, Any]) -> tuple[str, list[str]]:
            enum = _string_enum(schema)
            if enum:
                rules = [f"{value}: {' | '.join(quote + ' ' + literal(item) + ' ' + quote for item in enum)}"]
            elif "string" in _types(schema):
                rules = [f"{value}: {quote} {value}_text", _text_rule(f"{value}_text", GEMMA_QUOTE, literal)]
            else:
                rules = [f"{value}: {_json_rule(schema, layout)}"]
            return f"{literal(key + ':')} {value}", rules

        first, rules = _members_grammar(rule, parameters, ",", member)
        return [f"{rule}: \"{{\" {first} \"}}\"", *rules]


# Names LFM2 may write for JSON's literals in its Python calls.
JSON_NAMES = {"true": True, "false": False, "null": None}


class _JsonNames(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(JSON_NAMES[node.id]) if node.id in JSON_NAMES else node


def _python_arguments(call: ast.Call) -> dict[str, Any] | None:
    """A call's keyword arguments as values (Python's literals and JSON's names); None for anything else."""
    if call.args or any(keyword.arg is None for keyword in call.keywords):
        return None
    try:
        return {str(keyword.arg): ast.literal_eval(_JsonNames().visit(keyword.value)) for keyword in call.keywords}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def read_python_calls(body: str) -> list[MarkupCall] | None:
    """LFM2's calls: a Python list of calls with keyword arguments (`[get_weather(city="Bern"), ...]`), read by
    Python's own parser and `literal_eval` (nothing is run); None unless the whole body is such calls."""
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    calls: list[MarkupCall] = []
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))):
            return None
        arguments = _python_arguments(node)
        if arguments is None:
            return None
        calls.append((ast.unparse(node.func), arguments))
    return calls or None


class PythonKeywords:
    """Arguments as a Python call's keywords after its `(`: `city="Bern", days=3` (values as JSON, which Python reads)."""

    def read(self, inner: str, parameters: Parameters) -> dict[str, Any] | None:
        calls = read_python_calls(f"f{inner}")
        return calls[0][1] if calls else None

    def read_open(self, written: str, parameters: Parameters) -> dict[str, Any]:
        """The keywords finished before the call was cut short (each a prefix that parses)."""
        for end in sorted({found.start() for found in re.finditer(r",", written)} | {len(written)}, reverse=True):
            arguments = self.read(f"({written[:end]})", parameters)
            if arguments is not None:
                return arguments
        return {}

    def write(self, arguments: Mapping[str, Any]) -> str:
        return ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items())

    def grammar(self, rule: str, parameters: Parameters, layout: Mapping[str, Any], literal: Callable[[str], str]) -> list[str]:
        """The schema's properties in its order as keywords, separated by commas, the required ones present; each
        value its JSON schema."""
        def member(value: str, key: str, schema: Mapping[str, Any]) -> tuple[str, list[str]]:
            return f"{literal(key + '=')} {value}", [f"{value}: {_json_rule(schema, layout)}"]

        first, rules = _members_grammar(rule, parameters, ", ", member)
        return [f"{rule}: {first}", *rules]


# A value ends at its closing tag; vLLM also ends one left open at the next parameter.
QWEN3_CODER_PARAMETER = re.compile(r"<parameter=(?P<key>[^>\n]+)>(?P<value>.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
QWEN3_CODER_MARKUP = MarkupSyntax(
    re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL),
    re.compile(r"\s*<function=([^>\n]*)(>?)"),
    ParameterBlocks(QWEN3_CODER_PARAMETER, "<parameter={key}>\n", "\n</parameter>\n", trim="\n"),
    lead="<function=",
)
# Seed-OSS: Qwen3-Coder's markup inside `<seed:tool_call>`, values without newlines around them.
SEED_OSS_MARKUP = dataclasses.replace(
    QWEN3_CODER_MARKUP, arguments=ParameterBlocks(QWEN3_CODER_PARAMETER, "<parameter={key}>", "</parameter>\n")
)
# MiniMax-M2: `<invoke name="...">` and `<parameter name="...">` inside `<minimax:tool_call>`.
MINIMAX_MARKUP = MarkupSyntax(
    re.compile(r'<invoke name="([^"\n]+)">(.*?)</invoke>', re.DOTALL),
    re.compile(r'\s*<invoke name="([^"\n]*)((?:">?)?)'),
    ParameterBlocks(re.compile(r'<parameter name="(?P<key>[^"\n]+)">(?P<value>.*?)</parameter>', re.DOTALL), '<parameter name="{key}">',
                    "</parameter>\n"),
    lead="<invoke name=",
)
# MiniMax-M3: M2's `<invoke name="...">` blocks, each tag after its namespace token (a special token), of elements named
# by the arguments' keys (XmlElements).
MINIMAX_M3_TOKEN = "]<]minimax[>["
MINIMAX_M3_MARKUP = MarkupSyntax(
    re.compile(rf'{re.escape(MINIMAX_M3_TOKEN)}<invoke name="([^"\n]+)">(.*?){re.escape(MINIMAX_M3_TOKEN)}</invoke>', re.DOTALL),
    re.compile(rf'\s*{re.escape(MINIMAX_M3_TOKEN)}<invoke name="([^"\n]*)((?:">?)?)'),
    XmlElements(MINIMAX_M3_TOKEN),
    lead=f"{MINIMAX_M3_TOKEN}<invoke name=",
)
# MiniCPM 5: `<function name="...">` blocks of `<param name="...">`, with no wrapper around them.
MINICPM_MARKUP = MarkupSyntax(
    re.compile(r'<function name="([^"\n]+)">(.*?)</function>', re.DOTALL),
    re.compile(r'\s*<function name="([^"\n]*)((?:">?)?)'),
    ParameterBlocks(re.compile(r'<param name="(?P<key>[^"\n]+)">(?P<value>.*?)</param>', re.DOTALL), '<param name="{key}">', "</param>",
                    cdata=True),
    lead='<function name="',
)
# DeepSeek V3.2 and V4 (DSML): `<｜DSML｜invoke name="...">` blocks of `<｜DSML｜parameter name="..." string="true|false">`.
DSML_TOKEN = "｜DSML｜"
DSML_MARKUP = MarkupSyntax(
    re.compile(rf'<{DSML_TOKEN}invoke name="([^"\n]+)">(.*?)</{DSML_TOKEN}invoke>', re.DOTALL),
    re.compile(rf'\s*<{DSML_TOKEN}invoke name="([^"\n]*)((?:">?)?)'),
    ParameterBlocks(re.compile(rf'<{DSML_TOKEN}parameter name="(?P<key>[^"\n]+)"(?: string="(?P<string>true|false)")?>'
                               rf"(?P<value>.*?)</{DSML_TOKEN}parameter>", re.DOTALL),
                    f'<{DSML_TOKEN}parameter name="{{key}}" string="{{string}}">', f"</{DSML_TOKEN}parameter>\n"),
    lead=f'<{DSML_TOKEN}invoke name=',
)
# LFM2 and LFM2.5: a Python list of calls, `[name(key=value, ...), ...]`.
LFM2_MARKUP = MarkupSyntax(
    re.compile(r"(?!)"),
    re.compile(r"\s*\[?\s*([\w.]*)(\(?)"),
    PythonKeywords(),
    read_body=read_python_calls,
)
# GLM's name is the body's first word, then its arguments' blocks: after a newline (GLM-4.5 and 4.6, as written
# here) or directly (GLM-4.7, which writes a call without arguments as the name alone); its section
# holds one call.
GLM_MARKUP = MarkupSyntax(
    re.compile(r"\A\s*([^\s<]+)(?:[^\S\n]*\n|(?=<))(.*)\Z", re.DOTALL),
    re.compile(r"\s*([^\s<]*)(\s?)"),
    ParameterBlocks(re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>", re.DOTALL),
                    "<arg_key>{key}</arg_key>\n<arg_value>", "</arg_value>\n"),
    named_alone=True,
)
# GLM-4.7's way of writing the same (its template's, Spark 2.5's and Laguna S 2.1's): no newline after the name or between
# blocks. A call is written so where the template's own rendering of one shows it (chat_formats.TemplateSupport).
GLM_4_7_MARKUP = dataclasses.replace(GLM_MARKUP, arguments=dataclasses.replace(
    GLM_MARKUP.arguments, key_open="<arg_key>{key}</arg_key><arg_value>", value_close="</arg_value>"))
# Tencent Hy3: GLM's markup in tokens of its own (`<arg_key:opensource>`), a call's name ended by `<tool_sep:opensource>`.
HY3_TOKEN = ":opensource"
HY3_MARKUP = MarkupSyntax(
    re.compile(rf"<tool_call{HY3_TOKEN}>\s*([^\s<]+)<tool_sep{HY3_TOKEN}>(.*?)</tool_call{HY3_TOKEN}>", re.DOTALL),
    re.compile(rf"\s*<tool_call{HY3_TOKEN}>([^\s<]*)((?:<tool_sep{HY3_TOKEN}>)?)"),
    ParameterBlocks(re.compile(rf"<arg_key{HY3_TOKEN}>(?P<key>.*?)</arg_key{HY3_TOKEN}>\s*<arg_value{HY3_TOKEN}>(?P<value>.*?)"
                               rf"</arg_value{HY3_TOKEN}>", re.DOTALL),
                    f"<arg_key{HY3_TOKEN}>{{key}}</arg_key{HY3_TOKEN}>\n<arg_value{HY3_TOKEN}>", f"</arg_value{HY3_TOKEN}>\n"),
    lead=f"<tool_call{HY3_TOKEN}>",
    shown=tuple(f"<{tag}{HY3_TOKEN}>" for tag in ("tool_call", "/tool_call", "tool_sep", "arg_key", "/arg_key", "arg_value", "/arg_value")),
)
# Kimi K3 (XTML, tags of control tokens: `<|open|>tag attributes<|sep|>` ... `<|close|>tag<|sep|>`): `<|open|>call tool="..."
# index="N"<|sep|>` blocks of `<|open|>argument key="..." type="..."<|sep|>`, the type the value's JSON type; read by the schema,
# as llama.cpp reads them. The calls' other attributes (index) are skipped.
KIMI_K3_MARKUP = MarkupSyntax(
    re.compile(r'<\|open\|>call tool="([^"\n]+)"[^<]*?<\|sep\|>(.*?)<\|close\|>call<\|sep\|>', re.DOTALL),
    re.compile(r'\s*<\|open\|>call tool="([^"\n]*)((?:"[^<]*?<\|sep\|>)?)'),
    ParameterBlocks(re.compile(r'<\|open\|>argument key="(?P<key>[^"\n]+)"(?: type="(?P<type>\w+)")?[^<]*?<\|sep\|>(?P<value>.*?)'
                               r"<\|close\|>argument<\|sep\|>", re.DOTALL),
                    '<|open|>argument key="{key}" type="{type}"<|sep|>', "<|close|>argument<|sep|>"),
    lead='<|open|>call tool="',
)
# Gemma 4: `call:NAME{...}`, one call a section.
GEMMA4_MARKUP = MarkupSyntax(
    re.compile(r"\A\s*call:([^{\s]+)(\{.*\})\s*\Z", re.DOTALL),
    re.compile(r"\s*call:([^{\s]*)(\{?)"),
    GemmaObject(),
    lead="call:",
    shown=(GEMMA_QUOTE,),
)


def may_open(syntax: MarkupSyntax, body: str) -> bool:
    """Whether a section's body so far may still be calls (else its text is content, told at once)."""
    head = body.lstrip()
    return head.startswith(syntax.lead) or syntax.lead.startswith(head)


_SPACE = re.compile(r"\s*")


def _after_space(pattern: re.Pattern[str], text: str, position: int) -> re.Match[str] | None:
    """`pattern` matched past the whitespace at `position`; None where there is none."""
    start = _SPACE.match(text, position).end()  # type: ignore[union-attr]  # \s* always matches
    return pattern.match(text, start) if start > position else None


def read_markup_calls(syntax: MarkupSyntax, body: str, tools: Mapping[str, Parameters], *,
                      open_call: bool = False) -> list[MarkupCall] | None:
    """The calls a section's body holds; None unless it is function blocks only. `open_call`: a last
    function block left open (a forced call cut short) counts, with the arguments it finished."""
    calls: list[MarkupCall] = []
    if syntax.named_alone and body.strip() in tools:
        return [(body.strip(), {})]
    if syntax.read_body is not None:
        whole = syntax.read_body(body)
        if whole is not None:
            return whole
        rest = body
    else:
        position = 0
        # Each block where the last ended (GLM's and Gemma 4's patterns take the whitespace before it), or after the
        # whitespace there: searching further would scan the rest of the body again from every block a looping model
        # left open.
        while (found := syntax.function.match(body, position) or _after_space(syntax.function, body, position)):
            name = found.group(1).strip()
            arguments = syntax.arguments.read(found.group(2), tools.get(name, {}))
            if arguments is None:
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
    return [*calls, (name, syntax.arguments.read_open(closed, tools.get(name, {})))]
