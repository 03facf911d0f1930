"""Splits a model's reply into content, reasoning and tool calls as it streams, by the family's
format (localchat.chat_formats): one parser for every family, fed piece by piece, holding back
text that may be the start of a marker until it is decided. Calls written as JSON are read by
localchat.tool_call_reader, calls written as markup by localchat.markup_calls.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localchat.chat_formats import ChatFormat, Section, SectionKind
from localchat.markup_calls import MarkupCall, may_open, read_markup_calls
from localchat.tool_call_reader import ArgumentsReader, CallsReader

# A header longer than this never ends: its text was not a header.
MAX_HEADER = 256


# -- what the parser yields ----------------------------------------------------------------


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """A piece of a call's arguments, a JSON object's text."""

    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int


ReplyPart = ContentDelta | ReasoningDelta | CallStart | ArgumentsDelta | CallEnd


@dataclass
class ParsedCall:
    name: str
    arguments: str = ""


@dataclass
class ParsedReply:
    """A reply's parts put together."""

    content: str = ""
    reasoning: str = ""
    calls: list[ParsedCall] = dataclasses.field(default_factory=list)

    def add(self, part: ReplyPart) -> None:
        if isinstance(part, ContentDelta):
            self.content += part.text
        elif isinstance(part, ReasoningDelta):
            self.reasoning += part.text
        elif isinstance(part, CallStart):
            self.calls.append(ParsedCall(part.name))
        elif isinstance(part, ArgumentsDelta):
            self.calls[part.index].arguments += part.text


def parse_reply(fmt: ChatFormat, text: str, *, calls: bool = True, prompt: str = "", forced: Sequence[str] = (),
                cut_short: bool = False, tools: Mapping[str, Mapping[str, Any]] | None = None) -> ParsedReply:
    """A whole reply's parts (`cut_short`: it ended at its token limit)."""
    parser = ReplyParser(fmt, calls=calls, prompt=prompt, forced=forced, tools=tools)
    reply = ParsedReply()
    for part in [*parser.feed(text), *parser.finish(cut_short=cut_short)]:
        reply.add(part)
    return reply


# -- the parser -------------------------------------------------------------------------


def _held_prefix(text: str, markers: Sequence[str]) -> int:
    """The length of the longest end of `text` that is the start of one of `markers`."""
    for size in range(min(len(text), max((len(m) for m in markers), default=0) - 1), 0, -1):
        tail = text[-size:]
        if any(marker.startswith(tail) for marker in markers):
            return size
    return 0


def _first_marker(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """Where the earliest marker in `text` begins, and which (the longest of those found there)."""
    found = [(index, -len(marker), marker) for marker in markers if (index := text.find(marker)) >= 0]
    if not found:
        return None
    index, _, marker = min(found)
    return index, marker


class ReplyParser:
    """Splits a reply into content, reasoning and tool calls as it streams.

    `calls=False` reads no tool calls (their text stays content). `prompt` is the rendered
    prompt: one that ends with a section's start marker (DeepSeek R1's `<think>`, gpt-oss's
    `<|start|>assistant`) makes the reply start inside that section. `forced`: the functions
    the reply must call one of (the server wrote the call's opening, a grammar holds the rest):
    cut short before its name ends, it is a call of the one function the name begun can be, else
    none, never content. `tools`: each function's parameters' JSON schema, by name, which types
    the arguments of calls written as markup (whose arguments come whole, when the section closes).
    However a reply is split into pieces, its parts put together are the same.
    """

    def __init__(self, fmt: ChatFormat, *, calls: bool = True, prompt: str = "", forced: Sequence[str] = (),
                 tools: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.format = fmt
        self.calls_enabled = calls
        self._forced = tuple(forced)
        self._tools = dict(tools or {})
        self._markup = ""  # a markup section's body so far
        sections = [s for s in fmt.sections if calls or s.kind in ("reasoning", "content") or (s.header and s.header.channels)]
        self._bare = next((s for s in sections if not s.start), None)
        self._openers: dict[str, Section | None] = {m: None for m in fmt.dropped} | {s.start: s for s in sections if s.start}
        self._pending = ""  # received, not yet read
        self._out: list[ReplyPart] = []
        self._mode = "content"  # content, header, text, json or after (a section's JSON has ended)
        self._section: Section | None = None
        self._kind: SectionKind = "content"  # what a text section's body is
        self._held = ""  # the current section's text so far: content again if it turns out not to be one
        self._header = ""
        self._deferred = ""  # whitespace before any content: dropped if a section follows
        self._content_seen = False
        self._skip_space = False  # whitespace after a section is dropped
        self._body_started = False
        self._reasoning_space = ""  # whitespace at the end of reasoning so far
        self._reader: CallsReader | ArgumentsReader | None = None
        self._call_index = -1
        tail = prompt.rstrip()
        opened = next((s for s in sections if s.start and tail.endswith(s.start)), None)
        if opened is not None:
            self._enter(opened, held="")

    def feed(self, text: str) -> list[ReplyPart]:
        """The parts `text` completes; what may still turn out otherwise is held back."""
        self._pending += text
        self._run(final=False)
        return self._take()

    def finish(self, *, cut_short: bool = False) -> list[ReplyPart]:
        """The reply has ended: the rest, as it stands. A call it was `cut_short` in (by its token
        limit) ends as written; one that ended otherwise before its arguments has none: {}."""
        self._run(final=True)
        if self._mode == "markup":
            self._end_markup(cut_short=cut_short)
        elif self._mode == "header" or (self._mode == "json" and not self._committed):
            if self._forced:
                self._end_forced_call()
            else:
                self._revert()
                self._run(final=True)
        elif self._mode == "json":
            assert self._reader is not None
            self._reader.close(cut_short=cut_short)
        self._mode = "content"
        return self._take()

    def _end_forced_call(self) -> None:
        """A forced call cut short in its name: a call of the one function that name can be, with
        no arguments written; else no call (its markup is not content either)."""
        if self._mode == "markup":
            assert self.format.call.markup is not None
            opened = self.format.call.markup.opened.match(self._with_markers(self._markup))
            begun: str | None = opened.group(1) if opened else ""
        elif isinstance(self._reader, CallsReader):
            begun = self._reader.text if self._reader.state == "name" else None
        else:
            assert self._section is not None and self._section.header is not None
            named = re.search(self._section.header.name, self._header)
            begun = named.group(1) if named else ""
        self._close_section()
        functions = [name for name in self._forced if begun is not None and name.startswith(begun)]
        if len(functions) == 1:
            self.start(functions[0])
            self.end()

    @property
    def in_call(self) -> bool:
        """Whether the text read so far ends inside a call, or what may turn out to be one."""
        return self._mode in ("header", "json", "after", "markup")

    # What the readers report, as parts:
    def start(self, name: str) -> None:
        self._call_index += 1
        self._emit(CallStart(self._call_index, name))

    def arguments(self, text: str) -> None:
        if text:
            self._emit(ArgumentsDelta(self._call_index, text))

    def end(self) -> None:
        self._emit(CallEnd(self._call_index))

    def _take(self) -> list[ReplyPart]:
        out, self._out = self._out, []
        return out

    def _emit(self, part: ReplyPart) -> None:
        """Adds a part, merged into the last one when both are text of one kind."""
        last = self._out[-1] if self._out else None
        if isinstance(part, ContentDelta) and isinstance(last, ContentDelta):
            self._out[-1] = ContentDelta(last.text + part.text)
        elif isinstance(part, ReasoningDelta) and isinstance(last, ReasoningDelta):
            self._out[-1] = ReasoningDelta(last.text + part.text)
        elif isinstance(part, ArgumentsDelta) and isinstance(last, ArgumentsDelta) and last.index == part.index:
            self._out[-1] = ArgumentsDelta(part.index, last.text + part.text)
        else:
            self._out.append(part)

    def _content(self, text: str) -> None:
        if not text:
            return
        if not self._content_seen:
            if text.isspace():
                self._deferred += text
                return
            text, self._deferred, self._content_seen = self._deferred + text, "", True
        self._emit(ContentDelta(text))

    @property
    def _committed(self) -> bool:
        """A call has begun in the current section: its text can no longer be content."""
        return isinstance(self._reader, ArgumentsReader) or (isinstance(self._reader, CallsReader) and self._reader.started)

    def _run(self, *, final: bool) -> None:
        steps = {"content": self._run_content, "header": self._run_header, "text": self._run_text,
                 "json": self._run_json, "after": self._run_after, "markup": self._run_markup}
        while self._pending and steps[self._mode](final):
            continue

    def _enter(self, section: Section, *, held: str) -> None:
        self._section, self._held, self._header, self._body_started = section, held, "", False
        if section.header is not None:
            self._mode = "header"
        elif section.kind == "markup":
            self._mode, self._markup = "markup", ""
        elif section.kind == "calls":
            self._mode, self._reader = "json", CallsReader(self, named_by_key=section.named_by_key)
        else:
            self._mode, self._kind = "text", section.kind

    def _close_section(self) -> None:
        self._mode, self._section, self._reader, self._held = "content", None, None, ""
        self._reasoning_space, self._skip_space = "", True

    def _revert(self) -> None:
        """The section was not one: its text is content."""
        held = self._held
        self._mode, self._section, self._reader, self._held = "content", None, None, ""
        self._content(held)

    # Each step reads what it can of `_pending`; True when the mode changed and reading goes on.

    def _run_content(self, final: bool) -> bool:
        text = self._pending
        if self._skip_space or (self._bare is not None and not self._content_seen):
            stripped = text.lstrip()
            if not self._skip_space:
                self._deferred += text[: len(text) - len(stripped)]
            text, self._pending = stripped, stripped
            if not text:
                return False
            self._skip_space = False
            if self._bare is not None and not self._content_seen and text[0] in "{[`":
                self._enter(self._bare, held=self._deferred)
                self._deferred = ""
                return True
        found = _first_marker(text, list(self._openers))
        if found is not None:
            index, marker = found
            self._content(text[:index])
            self._pending = text[index + len(marker):]
            section = self._openers[marker]
            if section is not None and section.leading and self._content_seen:
                self._content(marker)  # prose that says the phrase: it opens nothing after content
                return True
            if section is not None:
                self._enter(section, held=self._deferred + marker)
                self._deferred = ""
            return True
        keep = 0 if final else _held_prefix(text, list(self._openers))
        self._content(text[: len(text) - keep])
        self._pending = text[len(text) - keep:]
        return False

    def _run_header(self, final: bool) -> bool:
        assert self._section is not None and self._section.header is not None
        header = self._section.header
        seen = self._header + self._pending
        found = seen.find(header.end)
        if found < 0:
            self._held += self._pending
            self._header, self._pending = seen, ""
            if len(seen) > MAX_HEADER:
                self._revert()
            return False
        text = seen[:found]
        read = found + len(header.end) - len(self._header)
        self._held += self._pending[:read]
        self._pending = self._pending[read:]
        named = re.search(header.name, text) if self.calls_enabled else None
        if named is not None:
            self._mode, self._reader = "json", ArgumentsReader(self)
            self.start(named.group(1))
            return True
        kind = next((kind for pattern, kind in header.channels if re.search(pattern, text)), None)
        if kind is None:
            self._revert()
        else:
            self._mode, self._kind = "text", kind
        return True

    def _run_text(self, final: bool) -> bool:
        assert self._section is not None
        ends = self._section.end
        found = _first_marker(self._pending, ends)
        if found is not None:
            index, marker = found
            self._body(self._pending[:index], last=True)
            self._pending = self._pending[index + len(marker):]
            self._close_section()
            return True
        keep = 0 if final else _held_prefix(self._pending, ends)
        self._body(self._pending[: len(self._pending) - keep], last=final)
        self._pending = self._pending[len(self._pending) - keep:]
        return False

    def _body(self, text: str, *, last: bool) -> None:
        """A text section's body: content as it is; reasoning without the whitespace around it."""
        if self._kind == "content":
            self._content(text)
            return
        if not self._body_started:
            text = text.lstrip()
            self._body_started = bool(text)
        stripped = text.rstrip()
        if stripped:
            self._emit(ReasoningDelta(self._reasoning_space + stripped))
            self._reasoning_space = ""
        self._reasoning_space = "" if last else self._reasoning_space + text[len(stripped):]

    def _run_json(self, final: bool) -> bool:
        reader = self._reader
        assert reader is not None
        for position, char in enumerate(self._pending):
            started = self._committed
            step = reader.feed(char)
            if step == "more":
                continue
            consumed = position + (1 if step == "done" else 0)
            self._held += self._pending[:consumed]
            self._pending = self._pending[consumed:]
            if step != "error":
                self._mode = "after"
            elif started:
                # The calls' JSON broke off: the call begun ends as written, the rest is content.
                reader.close()
                self._close_section()
                self._skip_space = False
            else:
                self._revert()
            return True
        self._held += self._pending
        self._pending = ""
        return False

    def _run_after(self, final: bool) -> bool:
        """After a section's JSON: its end marker, if it has one and it follows."""
        assert self._section is not None
        ends = self._section.end
        text = self._pending.lstrip()
        if ends and not text:
            self._pending = ""
            return False
        if ends and not final and not any(text.startswith(m) for m in ends) and any(m.startswith(text) for m in ends):
            self._pending = text
            return False
        marker = next((m for m in ends if text.startswith(m)), None)
        if marker is not None:
            self._pending = text[len(marker):]
        self._close_section()
        return True


    def _run_markup(self, final: bool) -> bool:
        """A markup section's body, held until its end marker while it may be a call's; then its
        calls, or it was not one: its start marker is content and what followed is read again."""
        assert self._section is not None
        markup = self.format.call.markup
        seen = self._markup + self._pending
        found = _first_marker(seen, self._section.end)
        if found is None and markup is not None and may_open(markup, self._with_markers(seen)):
            self._markup, self._pending = seen, ""
            return False
        calls = self._read_markup(self._with_markers(seen[: found[0]], found[1]), open_call=False) if found is not None else None
        if found is None or calls is None:
            self._markup, self._pending = "", seen
            self._revert()
        else:
            self._pending = seen[found[0] + len(found[1]) :]
            self._markup_calls(calls)
        return True

    def _with_markers(self, body: str, end: str = "") -> str:
        """A markup section's body with its markers where they belong to it (Section.inclusive)."""
        assert self._section is not None
        return self._section.start + body + end if self._section.inclusive else body

    def _read_markup(self, body: str, *, open_call: bool) -> list[MarkupCall] | None:
        markup = self.format.call.markup
        if markup is None or not self.calls_enabled:
            return None
        return read_markup_calls(markup, body, self._tools, open_call=open_call)

    def _markup_calls(self, calls: list[MarkupCall]) -> None:
        self._close_section()
        for name, arguments in calls:
            self.start(name)
            self.arguments(json.dumps(arguments, ensure_ascii=False))
            self.end()

    def _end_markup(self, *, cut_short: bool) -> None:
        """The reply ended inside a markup section: the functions it closed are calls (a model may
        stop before `</tool_call>`); a forced call, or a wrapped one cut short, also counts with the
        parameters it finished; else its text is content."""
        while True:  # a loop, not recursion: a looping model may leave thousands of sections open
            assert self._section is not None
            # A call left open without its wrapper may as well be text that mentions one: only a wrapped one counts.
            open_call = bool(self._forced) or (cut_short and not self._section.inclusive)
            calls = self._read_markup(self._with_markers(self._markup), open_call=open_call)
            if calls is not None:
                self._markup_calls(calls)
                return
            if self._forced:
                self._end_forced_call()
                return
            self._markup, self._pending = "", self._markup
            self._revert()
            self._run(final=True)
            if self._mode != "markup":  # else its text opened another section (a call without its wrapper)
                return


class CallScope:
    """Where a reply's stop strings apply (localchat.session.StopScope): outside its tool calls.
    A call's text is the function's and its arguments', not the reply's to end: a stop string
    such as "}" must not cut a call into arguments that do not parse."""

    def __init__(self, fmt: ChatFormat, prompt: str = "") -> None:
        self._parser = ReplyParser(fmt, prompt=prompt)

    def feed(self, text: str) -> None:
        self._parser.feed(text)

    def applies(self, before: str) -> bool:
        probe = copy.deepcopy(self._parser)
        probe.feed(before)
        return not probe.in_call
