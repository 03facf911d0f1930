"""The list of saved conversations, most recent first."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from localchat.history import Conversation


class ConversationList(OptionList):
    BINDINGS = [
        Binding("r", "rename", "Rename", show=False),
        Binding("d,delete", "delete", "Delete", show=False),
    ]

    @dataclass
    class Chosen(Message):
        conversation_id: int

    @dataclass
    class Action(Message):
        action: str
        conversation_id: int

    def show(self, conversations: list[Conversation], current: int | None) -> None:
        self.clear_options()
        self.add_options(Option(c.title, id=str(c.id)) for c in conversations)
        if current is not None:
            self.select(current)

    def select(self, conversation_id: int) -> None:
        try:
            self.highlighted = self.get_option_index(str(conversation_id))
        except OptionDoesNotExist:
            self.highlighted = None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Chosen(int(event.option.id)))

    def _highlighted_id(self) -> int | None:
        if self.highlighted is None:
            return None
        option = self.get_option_at_index(self.highlighted)
        return int(option.id) if option.id is not None else None

    def action_rename(self) -> None:
        if (cid := self._highlighted_id()) is not None:
            self.post_message(self.Action("rename", cid))

    def action_delete(self) -> None:
        if (cid := self._highlighted_id()) is not None:
            self.post_message(self.Action("delete", cid))
