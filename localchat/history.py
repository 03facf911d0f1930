"""Conversations and their messages (and the app's few preferences), kept in SQLite so they
outlive the app.

The database runs in WAL mode and writes each finished message in its own transaction, so a
killed app loses at most the reply it was still generating. Schema changes are numbered
migrations recorded in `PRAGMA user_version`, so a newer localchat opens an older file.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.settings import Settings
from localchat.templates import Message, Role

HISTORY_FILE = "history.db"
DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 48

# Migration N takes the schema from user_version N to N + 1; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    """
    CREATE TABLE preferences (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # An answer's thinking (the text inside the model's reasoning markers), kept apart from it.
    """
    ALTER TABLE messages ADD COLUMN reasoning TEXT;
    """,
    # How an answer ended when it did not end by itself (a finish reason: 'cancelled', 'length'), so
    # that an answer the user stopped still says so when the conversation is opened again.
    """
    ALTER TABLE messages ADD COLUMN finish TEXT;
    """,
)


def _columns(db: sqlite3.Connection) -> frozenset[tuple[str, str]]:
    """Each (table, column) of the database's tables."""
    rows = db.execute("SELECT t.name, c.name FROM sqlite_master AS t JOIN pragma_table_info(t.name) AS c WHERE t.type = 'table'")
    return frozenset(rows)


@functools.cache
def _promised_columns(version: int) -> frozenset[tuple[str, str]]:
    """The (table, column) pairs a file at schema `version` holds: its migrations, run on an empty database."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript("".join(MIGRATIONS[:version]))
        return _columns(db)


def _missing(promised: frozenset[tuple[str, str]], present: frozenset[tuple[str, str]]) -> list[str]:
    """What of `promised` is not `present`, named for a person: a table wholly missing, else its columns."""
    tables = {table for table, _ in present}
    gone = sorted(promised - present)
    return sorted({f"table {table}" for table, _ in gone if table not in tables}) + [
        f"column {table}.{column}" for table, column in gone if table in tables
    ]


class HistoryError(LocalchatError):
    """A history database that cannot be opened or is newer than this localchat."""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: Role
    content: str
    reasoning: str | None = None
    finish: str | None = None  # an answer cut short: its finish reason ('cancelled', 'length')

    def as_message(self) -> Message:
        return Message(self.role, self.content, reasoning=self.reasoning)


def title_from(text: str) -> str:
    """A conversation title from its first message: the first line, shortened."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "") or DEFAULT_TITLE
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


class ConversationStore:
    """Conversations in one SQLite file; use it from one thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: every write below opens and commits its own transaction.
            self._db = sqlite3.connect(path, isolation_level=None)
            # A byte of a message that is not UTF-8 (a damaged file) reads as U+FFFD, not as an error.
            self._db.text_factory = lambda data: data.decode("utf-8", "replace")
            # Damaged pages are found here, where they can be one line, not in the query that meets them.
            damage = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if damage != "ok":
                raise sqlite3.DatabaseError(f"it is damaged ({damage.splitlines()[-1]})")
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL syncs the WAL on every commit: a finished message survives a power cut too.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as error:
            raise HistoryError(f"cannot open the conversation history {path}: {error}; move the file aside to start a new "
                               f"one, or save what it holds with `sqlite3 {path} .recover`") from error

    @classmethod
    def open(cls, settings: Settings) -> ConversationStore:
        """The history file in the user's data directory."""
        return cls(settings.data_dir / HISTORY_FILE)

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise HistoryError(
                f"{self.path} was written by a newer localchat (schema {version}, this one knows "
                f"{len(MIGRATIONS)}); upgrade localchat"
            )
        # A table dropped by hand or by another tool passes quick_check and user_version alike: a
        # query that meets it would fail later, mid-chat, so the schema is checked here, once.
        if missing := _missing(_promised_columns(version), _columns(self._db)):
            raise sqlite3.DatabaseError(f"it is incomplete (it has no {', no '.join(missing)})")
        for number in range(version, len(MIGRATIONS)):
            # executescript commits first, so BEGIN makes the migration and its version one step.
            self._db.executescript(f"BEGIN; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    # Conversations

    def create(self, title: str = DEFAULT_TITLE, system_prompt: str = "") -> Conversation:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO conversations (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (title, system_prompt, now, now),
        )
        return Conversation(int(cursor.lastrowid or 0), title, system_prompt, now, now)

    def conversations(self) -> list[Conversation]:
        """All conversations, the most recently used first."""
        rows = self._db.execute(
            "SELECT id, title, system_prompt, created_at, updated_at FROM conversations ORDER BY updated_at DESC, id DESC"
        )
        return [Conversation(*row) for row in rows]

    def get(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            "SELECT id, title, system_prompt, created_at, updated_at FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return Conversation(*row) if row else None

    def rename(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or DEFAULT_TITLE, conversation_id))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        self._db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))

    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # Preferences

    def preference(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM preferences WHERE name = ?", (name,)).fetchone()
        return str(row[0]) if row else None

    def set_preference(self, name: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO preferences (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    # Messages

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT id, role, content, reasoning, finish FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return [StoredMessage(*row) for row in rows]

    def add_message(self, conversation_id: int, role: Role, content: str, *, replacing: int | None = None,
                    reasoning: str | None = None, finish: str | None = None) -> StoredMessage:
        """Append a finished message in one transaction; `replacing` deletes an earlier one in the same
        transaction (a regenerated answer replaces the old one only once it exists). `reasoning` is
        an answer's thinking, when it had some; `finish`, how an answer cut short ended."""
        now = time.time()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if replacing is not None:
                self._db.execute("DELETE FROM messages WHERE id = ? AND conversation_id = ?", (replacing, conversation_id))
            cursor = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, reasoning, finish, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, reasoning or None, finish, now),
            )
            self._db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return StoredMessage(int(cursor.lastrowid or 0), role, content, reasoning or None, finish)
