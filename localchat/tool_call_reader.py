"""Tool calls written as JSON, read a character at a time as a reply streams: where one JSON value
ends, a call object (or an array of them, maybe fenced) naming the function and holding its
arguments, or the arguments alone as a section's body. The readers tell a `CallSink` what they
find; localchat.reply_parser drives them.
"""

from __future__ import annotations

import json
from typing import Literal, Protocol

# JSON keys that hold a call's function name and its arguments (Llama and Command R say
# "parameters", Command R "tool_name"); a call object must begin with one of CALL_KEYS.
NAME_KEYS = frozenset({"name", "tool_name"})
ARGUMENT_KEYS = frozenset({"arguments", "parameters"})
CALL_KEYS = NAME_KEYS | ARGUMENT_KEYS | {"type", "id", "tool_call_id"}
# Fenced JSON (```json ... ```) is accepted around calls written as JSON, with these labels.
FENCE_LABELS = frozenset({"", "json", "tool_code", "tool_call"})

Step = Literal["more", "done", "before", "error"]  # before: the value ended just before this character


class ValueSpan:
    """Finds where one JSON value ends: strings, escapes and nesting are tracked, nothing checked."""

    def __init__(self) -> None:
        self.first = ""
        self.depth = 0
        self.in_string = False
        self.escape = False

    def feed(self, char: str) -> Step:
        if not self.first:
            self.first = char
            if char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth = 1
            elif char in ",:}]":
                return "error"
            return "more"
        if self.first not in '"{[':  # a number or a literal ends at a delimiter
            return "before" if char in ",}]" or char.isspace() else "more"
        if self.in_string:
            if self.escape:
                self.escape = False
            elif char == "\\":
                self.escape = True
            elif char == '"':
                self.in_string = False
                return "done" if self.depth == 0 else "more"
            return "more"
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            if self.depth == 0:
                return "done"
        return "more"


class CallSink(Protocol):
    """What a reader tells the parser: a call began, a piece of its arguments, it ended."""

    def start(self, name: str) -> None: ...

    def arguments(self, text: str) -> None: ...

    def end(self) -> None: ...


class ArgumentsReader:
    """A call's arguments as the body of a section: one JSON value, streamed as it comes (a
    JSON string holding the arguments' text is decoded first)."""

    def __init__(self, calls: CallSink) -> None:
        self.calls = calls
        self.span: ValueSpan | None = None
        self.raw = ""

    def feed(self, char: str) -> Step:
        if self.span is None:
            if char.isspace():
                return "more"
            self.span = ValueSpan()
        step = self.span.feed(char)
        if step == "error":
            return step
        if step != "before":
            self.raw += char
            if self.span.first != '"':
                self.calls.arguments(char)
        if step in ("done", "before"):
            self.close()
        return step

    def close(self, *, cut_short: bool = False) -> None:
        """The value is complete, or broke off (a call without arguments has none: {}), or the
        reply was `cut_short` in it (the arguments as written, maybe none)."""
        if not self.raw:
            if not cut_short:
                self.calls.arguments("{}")
        elif self.span is not None and self.span.first == '"':
            try:
                self.calls.arguments(str(json.loads(self.raw)))
            except json.JSONDecodeError:
                self.calls.arguments(self.raw)
        self.calls.end()


class CallsReader:
    """Calls written as JSON, a character at a time: an object naming the function and holding its
    arguments, or an array of them, maybe fenced. A call begins once its name is read; arguments
    read before the name wait for it. `named_by_key`: an object's first key is the name, its value
    the arguments (Apertus's `{"get_weather": {"city": "Bern"}}`); later keys are skipped."""

    def __init__(self, calls: CallSink, *, named_by_key: bool = False) -> None:
        self.calls = calls
        self.named_by_key = named_by_key
        self.state = "top"
        self.fence: str | None = None  # the fence's opening text while it is read, then its label
        self.fenced = False
        self.in_array = False
        self.text = ""  # a key or a name being read
        self.escape = False
        self.key = ""
        self.keys_seen = 0
        self.name: str | None = None
        self.waiting_arguments = ""  # arguments read before the name
        self.quoted = ""  # arguments written as a JSON string, as read so far
        self.arguments_seen = False
        self.span: ValueSpan | None = None
        self.started = False  # a call of this reader has begun (its text can no longer be content)
        self.open = False  # a call has begun and not ended

    def feed(self, char: str) -> Step:
        handler = getattr(self, f"_{self.state}")
        step: Step = handler(char)
        return step

    def _top(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == "`" and not self.fenced:
            self.state, self.fence = "fence", "`"
            return "more"
        if char == "[":
            self.in_array, self.state = True, "element"
            return "more"
        if char == "{":
            self._begin_object()
            return "more"
        return "error"

    def _fence(self, char: str) -> Step:
        assert self.fence is not None
        if len(self.fence) < 3:
            if char != "`":
                return "error"
            self.fence += char
            return "more"
        if char == "\n":
            if self.fence[3:].strip() not in FENCE_LABELS:
                return "error"
            self.fenced, self.state = True, "top"
            return "more"
        if len(self.fence) > 16:
            return "error"
        self.fence += char
        return "more"

    def _element(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == "{":
            self._begin_object()
            return "more"
        return "error"

    def _next_element(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == ",":
            self.state = "element"
            return "more"
        if char == "]":
            return self._complete()
        return "error"

    def _begin_object(self) -> None:
        self.state, self.keys_seen, self.name = "key_or_close", 0, None
        self.waiting_arguments, self.quoted, self.arguments_seen = "", "", False

    def _key_or_close(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == '"':
            self.state, self.text = "key", ""
            return "more"
        if char == "}" and self.keys_seen:
            return self._end_object()
        return "error"

    def _key(self, char: str) -> Step:
        if self.escape:
            self.escape = False
        elif char == "\\":
            self.escape = True
        elif char == '"':
            try:
                self.key = str(json.loads(f'"{self.text}"'))
            except json.JSONDecodeError:
                return "error"
            if self.named_by_key:
                return self._named_by_key()
            if self.keys_seen == 0 and self.key not in CALL_KEYS:
                return "error"  # not a call: some other JSON
            self.keys_seen += 1
            self.state = "colon"
            return "more"
        self.text += char
        return "more"

    def _named_by_key(self) -> Step:
        """The object's first key names the function and its value is the arguments; a later key is skipped,
        as one a call object of names and arguments does not know."""
        if not self.keys_seen:
            if not self.key:
                return "error"
            self._start_call(self.key)
        self.key = "" if self.keys_seen else "arguments"
        self.keys_seen += 1
        self.state = "colon"
        return "more"

    def _colon(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == ":":
            self.state = "value"
            return "more"
        return "error"

    def _value(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if self.key in NAME_KEYS and self.name is None:
            if char != '"':
                return "error"
            self.state, self.text = "name", ""
            return "more"
        self.span = ValueSpan()
        self.state = "arguments" if self.key in ARGUMENT_KEYS and not self.arguments_seen else "skip"
        self.arguments_seen |= self.state == "arguments"
        return self.feed(char)

    def _name(self, char: str) -> Step:
        if self.escape:
            self.escape = False
        elif char == "\\":
            self.escape = True
        elif char == '"':
            try:
                name = str(json.loads(f'"{self.text}"'))
            except json.JSONDecodeError:
                return "error"
            if not name:
                return "error"
            self._start_call(name)
            if self.waiting_arguments:
                self.calls.arguments(self.waiting_arguments)
            self.state = "after_value"
            return "more"
        self.text += char
        return "more"

    def _start_call(self, name: str) -> None:
        self.name, self.started, self.open = name, True, True
        self.calls.start(name)

    def _arguments(self, char: str) -> Step:
        assert self.span is not None
        step = self.span.feed(char)
        if step == "error":
            return step
        if step != "before":
            if self.span.first == '"':  # the arguments' text as a JSON string: decoded once whole
                self.quoted += char
            elif self.name is None:
                self.waiting_arguments += char
            else:
                self.calls.arguments(char)
        if step == "more":
            return step
        if self.span.first == '"':
            try:
                decoded = str(json.loads(self.quoted))
            except json.JSONDecodeError:
                decoded = self.quoted
            if self.name is None:
                self.waiting_arguments = decoded
            else:
                self.calls.arguments(decoded)
        self.state = "after_value"
        return "more" if step == "done" else self.feed(char)

    def _skip(self, char: str) -> Step:
        assert self.span is not None
        step = self.span.feed(char)
        if step in ("more", "error"):
            return step
        self.state = "after_value"
        return "more" if step == "done" else self.feed(char)

    def _after_value(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == ",":
            self.state = "key_after_comma"
            return "more"
        if char == "}":
            return self._end_object()
        return "error"

    def _key_after_comma(self, char: str) -> Step:
        if char.isspace():
            return "more"
        if char == '"':
            self.state, self.text = "key", ""
            return "more"
        return "error"

    def _end_object(self) -> Step:
        if self.name is None:
            return "error"
        if not self.arguments_seen:
            self.calls.arguments("{}")
        self.open = False
        self.calls.end()
        if self.in_array:
            self.state = "next_element"
            return "more"
        return self._complete()

    def _complete(self) -> Step:
        if not self.started:
            return "error"  # an empty array
        if self.fenced:
            self.state, self.text = "fence_close", ""
            return "more"
        self.state = "finished"
        return "done"

    def _fence_close(self, char: str) -> Step:
        if not self.text and char.isspace():
            return "more"
        if char != "`":
            return "before"
        self.text += char
        if len(self.text) == 3:
            self.state = "finished"
            return "done"
        return "more"

    def close(self, *, cut_short: bool = False) -> None:
        """The calls broke off: a call begun ends, with no arguments ({}) if it had none yet; or
        the reply was `cut_short` inside them: a call begun ends as written."""
        if self.open:
            if not self.arguments_seen and not cut_short:
                self.calls.arguments("{}")
            self.open = False
            self.calls.end()
