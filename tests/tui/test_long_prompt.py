"""A long message typed into the editor: each key costs the same however long the paragraph is,
and the editor wraps and draws it as Textual's TextArea does."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import textual.document._wrapped_document as textual_wrapping
from rich.text import Text
from textual import events
from textual.document._document import Document
from textual.document._wrapped_document import WrappedDocument
from textual.pilot import Pilot
from textual.widgets import TextArea

from localchat.tui.widgets import paragraph_area
from localchat.tui.app import ChatApp
from localchat.tui.widgets.paragraph_area import ParagraphWrap
from pilot_steps import wait_until

pytestmark = pytest.mark.anyio
MakeApp = Callable[..., ChatApp]
WORDS = "a an the of to is it we model local chat context tokens quickly wrapped paragraph, question; interruption.".split()
# One paragraph, as a long message is (Enter sends, so it has no line breaks), of words of varied
# lengths as prose has: a word typed in its middle moves the words after it a few rows down, not all.
PARAGRAPH = " ".join(random.Random(3).choices(WORDS, k=3_000))


async def type_keys(pilot: Pilot, text: str) -> None:
    """Key events for each character, through the terminal driver as typed keys come, without
    Pilot's pause after each one; returns once the editor holds them all."""
    app = pilot.app
    assert isinstance(app, ChatApp) and app._driver is not None
    before = len(app.prompt.text)
    for character in text:
        key = events.Key("space" if character == " " else character, character)
        key.set_sender(app)
        app._driver.send_message(key)
    await wait_until(pilot, lambda: len(app.prompt.text) == before + len(text), timeout=60)


class WrapWork:
    """Characters wrapped and wrapped rows split out of a line, counted where Textual and the
    editor do that work."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.characters = self.rows_split = 0
        wrap, divide = textual_wrapping.compute_wrap_offsets, Text.divide

        def counted_wrap(text: str, *args: object, **kwargs: object) -> list[int]:
            self.characters += len(text)
            return wrap(text, *args, **kwargs)  # type: ignore[arg-type]

        def counted_divide(text: Text, offsets: list[int]) -> object:
            self.rows_split += len(offsets)
            return divide(text, offsets)

        for module in (textual_wrapping, paragraph_area):
            monkeypatch.setattr(module, "compute_wrap_offsets", counted_wrap)
        monkeypatch.setattr(Text, "divide", counted_divide)


async def test_typing_into_a_long_paragraph_costs_each_key_the_same(make_app: MakeApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """12,000 characters in the editor, 1,200 more typed at its end and in its middle: each key
    re-wraps and splits a few rows, not the paragraph (Textual alone re-wraps all of it, and
    splits all of it for each row it draws: 15,000 typed characters took minutes)."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.focus()
        app.prompt.text = PARAGRAPH[:12_000]
        app.prompt.move_cursor(app.prompt.document.end)
        await pilot.pause()
        work = WrapWork(monkeypatch)
        typed = PARAGRAPH[:1_000]
        await type_keys(pilot, typed)
        app.prompt.move_cursor((0, 6_000))
        await type_keys(pilot, PARAGRAPH[:200])
        await pilot.pause()
        assert app.prompt.text == PARAGRAPH[:6_000] + PARAGRAPH[:200] + PARAGRAPH[6_000:12_000] + typed
        width = app.prompt.wrap_width
        keys = len(typed) + 200
        assert work.characters <= keys * 4 * width, work.characters  # Textual alone: 12,000 a key
        assert work.rows_split <= keys * 2, work.rows_split  # Textual alone: 150 rows a drawn row
        fresh = WrappedDocument(app.prompt.document, width, app.prompt.indent_width)
        assert app.prompt.wrapped_document._wrap_offsets == fresh._wrap_offsets


def test_a_paragraph_is_wrapped_edit_by_edit_as_textual_wraps_it_whole() -> None:
    """Random edits (words, spaces, long words folded, wide characters, tabs and new lines that
    take Textual's way), most of them next to where a row starts: after each one the rows are the
    ones a fresh wrap gives."""
    chooser = random.Random(7)
    words = ["a", "the", "quick", "fox", "supercalifragilistic" * 4, "日本語", "  ", "x", "\t"]
    inserts = ["", "x", " ", "  ", "word ", "  lo", "ngword" * 12, "日", "one two three four five six seven ", "\n", "a\tb"]
    for _ in range(60):
        width = chooser.choice([5, 11, 20, 37])
        document = Document("\n".join(" ".join(chooser.choices(words, k=chooser.randint(0, 60))) for _ in range(3)))
        wrap = ParagraphWrap(document)
        wrap.wrap(width, 4)
        for _ in range(25):
            line_index = chooser.randrange(document.line_count)
            length, row_starts = len(document[line_index]), wrap.get_offsets(line_index)
            near_a_row = chooser.choice(row_starts) + chooser.randint(-3, 3) if row_starts and chooser.random() < 0.7 else None
            start = max(0, min(length, near_a_row if near_a_row is not None else chooser.randint(0, length)))
            end = min(length, start + chooser.choice([0, 0, 1, 1, 2, 25]))
            edited = document.replace_range((line_index, start), (line_index, end), chooser.choice(inserts))
            wrap.wrap_range((line_index, start), (line_index, end), edited.end_location)
            fresh = WrappedDocument(document)
            fresh.wrap(width, 4)
            assert (wrap._wrap_offsets, wrap._offset_to_line_info, wrap._line_index_to_offsets, wrap._tab_width_cache) == (
                fresh._wrap_offsets, fresh._offset_to_line_info, fresh._line_index_to_offsets, fresh._tab_width_cache)


async def test_each_row_of_a_long_paragraph_is_drawn_as_textual_draws_it(make_app: MakeApp) -> None:
    """The rows drawn from their own slices, with the cursor, a selection over rows and a matched
    bracket, are Textual's rows."""
    app = make_app()
    async with app.run_test(size=(60, 24)) as pilot:
        prompt = app.prompt
        prompt.focus()
        prompt.text = "An (aside that spans rows) " + PARAGRAPH[:2_000]
        for selection in [((0, 3), (0, 3)), ((0, 40), (0, 170)), ((0, 2_000), (0, 61))]:
            prompt.selection = selection  # type: ignore[assignment]
            prompt.scroll_cursor_visible()
            await pilot.pause()
            for y in range(prompt.content_size.height):
                assert prompt._render_line(y) == TextArea._render_line(prompt, y), (selection, y)
            assert prompt.wrapped_document.location_to_offset(selection[1]) == WrappedDocument.location_to_offset(
                prompt.wrapped_document, selection[1])
