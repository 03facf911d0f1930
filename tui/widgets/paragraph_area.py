"""A TextArea whose cost per key does not grow with the paragraph being typed.

Enter sends a message, so a long message is one long document line. Textual's TextArea (8.2) re-wraps
a whole document line after each edit, splits all of it into wrapped rows to draw each visible row,
and again to place the cursor: typing 15,000 characters took minutes. Here an edit re-wraps from the
row before it until the rows meet the old ones again, and a row is drawn, and the cursor placed, from
its own slice of the line. Lines with tabs, and edits across lines, keep Textual's own way.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right

from rich.style import Style
from rich.text import Text
from textual._cells import cell_len
from textual._wrap import compute_wrap_offsets
from textual.document._document import Location
from textual.document._document_navigator import DocumentNavigator
from textual.document._wrapped_document import WrappedDocument
from textual.expand_tabs import expand_tabs_inline
from textual.geometry import Offset, clamp
from textual.strip import Strip
from textual.widgets import TextArea

# Where a window of a line may end: at a word's start, so that every chunk in it is whole.
WORD_START = re.compile(r"(?<=\s)\S")
# The rest of the word (and its trailing spaces) from a position: the chunk that wrapping measures.
CHUNK_REST = re.compile(r"\S*\s*")


class ParagraphWrap(WrappedDocument):
    """Wrapped rows kept up to date edit by edit: a one-line edit re-wraps a few rows around it.

    Wrapping is greedy, word by word: where a row starts depends only on the text before it, and
    the rows after a row that starts at a word start depend only on the text from there on. So an
    edit re-wraps from a row whose first chunk ends before the edit, and stops at the first row
    that starts at a word start past the edit where an old row started, the same text following."""

    def wrap(self, width: int, tab_width: int | None = None) -> None:
        super().wrap(width, tab_width)
        self._wrapped_lines = list(self.document.lines)  # each line as it was when last wrapped

    def wrap_range(self, start: Location, old_end: Location, new_end: Location) -> None:
        one_line = start[0] == old_end[0] == new_end[0]
        if not (one_line and self._rewrap_line(start[0], start[1])):
            super().wrap_range(start, old_end, new_end)
            self._wrapped_lines = list(self.document.lines)

    def _rewrap_line(self, index: int, column: int) -> bool:
        """Re-wrap line `index`, edited from `column` on, where it can be done in part; says whether it was."""
        if index >= len(self._wrapped_lines) or index >= self.document.line_count or not self._width:
            return False
        old, new = self._wrapped_lines[index], self.document[index]
        if "\t" in old or "\t" in new or old[:column] != new[:column]:
            return False
        delta = len(new) - len(old)
        old_breaks = self._wrap_offsets[index]
        restart = self._restart(old, old_breaks, column)
        kept = old_breaks[: bisect_right(old_breaks, restart)]
        window = 2 * self._width
        while True:
            end = _window_end(new, restart + window)
            found = [restart + at for at in compute_wrap_offsets(new[restart:end], self._width, self._tab_width)]
            for at, row_start in enumerate(found):
                if row_start > column and _same_row_start(old, new, old_breaks, row_start, delta):
                    tail = old_breaks[bisect_left(old_breaks, row_start - delta) :]
                    self._set_breaks(index, kept + found[:at] + [old_break + delta for old_break in tail], new)
                    return True
            if end == len(new):
                self._set_breaks(index, kept + found, new)
                return True
            window *= 2

    @staticmethod
    def _restart(old: str, old_breaks: list[int], column: int) -> int:
        """The start of the last row before `column` whose first chunk ends before it: the rows
        up to there stay as they are (0 when there is none)."""
        row = bisect_right(old_breaks, column) - 1
        while row >= 0:
            row_start = old_breaks[row]
            chunk = CHUNK_REST.match(old, row_start)
            if chunk is not None and chunk.end() < column:
                return row_start
            row -= 1
        return 0

    def _set_breaks(self, index: int, breaks: list[int], line: str) -> None:
        old_rows = len(self._wrap_offsets[index]) + 1
        self._wrap_offsets[index] = breaks
        self._tab_width_cache[index] = [0] if line else []  # as Textual keeps a line without tabs
        self._wrapped_lines[index] = line
        shift = len(breaks) + 1 - old_rows
        if not shift:
            return
        top = self._line_index_to_offsets[index][0]
        self._offset_to_line_info[top : top + old_rows] = [(index, row) for row in range(len(breaks) + 1)]
        self._line_index_to_offsets[index] = list(range(top, top + len(breaks) + 1))
        for below in range(index + 1, len(self._line_index_to_offsets)):
            self._line_index_to_offsets[below] = [y + shift for y in self._line_index_to_offsets[below]]

    def location_to_offset(self, location: Location) -> Offset:
        """Where `location` is drawn, measured on its own row's slice (Textual's splits the whole line)."""
        line_index, column = location
        line_index = clamp(line_index, 0, len(self._line_index_to_offsets))
        breaks = self.get_offsets(line_index)
        row = bisect_right(breaks, column)
        row_start = breaks[row - 1] if row else 0
        before = self.document[line_index][row_start:column]
        return Offset(cell_len(expand_tabs_inline(before, self._tab_width)), self._line_index_to_offsets[line_index][row])


def _window_end(text: str, at: int) -> int:
    """The first word start at or after `at` (or the end of `text`)."""
    if at >= len(text):
        return len(text)
    found = WORD_START.search(text, at)
    return found.start() if found is not None else len(text)


def _same_row_start(old: str, new: str, old_breaks: list[int], row_start: int, delta: int) -> bool:
    """Whether a new row starting at `row_start` (a word start) continues as the old rows did: an
    old row started at the same word, with the same text from the space before it on."""
    old_start = row_start - delta
    at = bisect_left(old_breaks, old_start)
    return (at < len(old_breaks) and old_breaks[at] == old_start and new[row_start - 1].isspace()
            and new[row_start - 1 :] == old[old_start - 1 :])


class ParagraphArea(TextArea):
    """A TextArea on a `ParagraphWrap`, whose rows of a tab-free line without syntax highlighting
    are drawn from their own slice (Textual's draws each row from the whole line, split)."""

    def _set_document(self, text: str, language: str | None) -> None:
        super()._set_document(text, language)
        self.wrapped_document = ParagraphWrap(self.document, tab_width=self.indent_width)
        self.navigator = DocumentNavigator(self.wrapped_document)
        self._rewrap_and_refresh_virtual_size()

    def _render_line(self, y: int) -> Strip:
        wrapped = self.wrapped_document
        row = y + self.scroll_offset.y
        plain = self.soft_wrap and not self.show_line_numbers and not self._highlights and not self.suggestion
        if not plain or row >= len(wrapped._offset_to_line_info):
            return super()._render_line(y)
        line_index, section = wrapped._offset_to_line_info[row]
        line, breaks = self.document[line_index], wrapped.get_offsets(line_index)
        if not breaks or "\t" in line:
            return super()._render_line(y)
        start = breaks[section - 1] if section else 0
        end = breaks[section] if section < len(breaks) else len(line) + 1  # the last row has room for the cursor
        text = Text((line + " ")[start:end], end="", no_wrap=True)

        def stylize(style: Style | None, first: int, last: int) -> None:
            if style is not None and first < end and last > start:
                text.stylize(style, max(first, start) - start, min(last, end) - start)

        # The styles of Textual's TextArea._render_line, each cut to this row.
        theme = self._theme
        selection = self.selection
        (top_row, top_column), (bottom_row, bottom_column) = sorted(selection)
        cursor_row, cursor_column = selection.end
        cursor_line_style = theme.cursor_line_style if theme and self.highlight_cursor_line and self._has_cursor else None
        if cursor_line_style is not None and cursor_row == line_index:
            text.stylize(cursor_line_style)
        if theme and selection.start != selection.end and top_row <= line_index <= bottom_row:
            stylize(theme.selection_style, top_column if line_index == top_row else 0,
                    bottom_column if line_index == bottom_row else len(line))
        bracket = self._matching_bracket_location
        brackets = self._has_cursor and self.match_cursor_bracket and bracket is not None and selection.start == selection.end
        if theme and cursor_row == line_index:
            if brackets:
                stylize(theme.bracket_matching_style, cursor_column, cursor_column + 1)
            if self._draw_cursor:
                stylize(theme.cursor_style, cursor_column, cursor_column + 1)
        if theme and brackets and bracket is not None and bracket[0] == line_index:
            stylize(theme.bracket_matching_style, bracket[1], bracket[1] + 1)
        on_cursor_line = cursor_row == line_index and self.highlight_cursor_line
        fill = cursor_line_style if on_cursor_line else theme.base_style if theme else None
        strip = Strip(text.render(self.app.console), cell_length=text.cell_len)
        strip = strip.extend_cell_length(self.scrollable_content_region.size.width, fill)
        return strip.apply_style(theme.base_style if theme and theme.base_style is not None else self.rich_style)
