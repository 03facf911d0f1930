"""Pulling a model from the Hugging Face hub in a worker thread (asked for in the model picker), and
the messages it posts to the app."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from textual.message import Message

from localchat.errors import LocalchatError
from localchat.hub import HubModelName, PullCancelled, pull
from localchat.settings import Settings


@dataclass
class PullProgress(Message):
    done: int
    total: int | None


@dataclass
class PullEnded(Message):
    name: str  # the model's name in the cache once pulled, else the name asked for
    error: str | None
    cancelled: bool = False

    @property
    def failed(self) -> bool:
        return self.error is not None and not self.cancelled

    def summary(self) -> str:
        if self.cancelled:
            return f"Pull cancelled: {self.error}"
        if self.error:
            return f"Could not pull {self.name}: {self.error}"
        return f"Pulled {self.name}: Enter loads it"


def pull_model(name: HubModelName, settings: Settings, cancel: threading.Event, post: Callable[[Message], object]) -> None:
    """The pull's worker, in its thread: pulls into the Hugging Face cache, posting the bytes as they
    arrive; a cancelled or failed pull takes no file for a model."""
    try:
        result = pull(name, settings, progress=lambda done, total: post(PullProgress(done, total)), cancel=cancel)
    except PullCancelled as error:
        post(PullEnded(str(name), str(error), cancelled=True))
    except (LocalchatError, OSError) as error:
        post(PullEnded(str(name), str(error)))
    else:
        post(PullEnded(result.model.name, None))
