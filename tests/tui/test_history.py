"""The conversation store: schema migrations, WAL, and what survives a killed process."""

from __future__ import annotations

import os
import pty
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localchat.history import DEFAULT_TITLE, MIGRATIONS, ConversationStore, HistoryError, title_from


def test_a_new_file_is_wal_at_the_latest_schema(history_path: Path) -> None:
    store = ConversationStore(history_path)
    assert store.schema_version == len(MIGRATIONS)
    store.close()
    with sqlite3.connect(history_path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_conversations_and_messages(store: ConversationStore) -> None:
    first = store.create(system_prompt="Be brief.")
    second = store.create()
    store.add_message(first.id, "user", "hello")
    store.add_message(first.id, "assistant", "hi")
    assert [c.id for c in store.conversations()] == [first.id, second.id]  # most recently used first
    assert [(m.role, m.content) for m in store.messages(first.id)] == [("user", "hello"), ("assistant", "hi")]
    store.rename(first.id, "  Greetings ")
    store.set_system_prompt(first.id, "Be kind.")
    renamed = store.get(first.id)
    assert renamed is not None and (renamed.title, renamed.system_prompt) == ("Greetings", "Be kind.")
    store.rename(second.id, "   ")
    assert store.get(second.id).title == DEFAULT_TITLE  # type: ignore[union-attr]
    store.delete(first.id)
    assert store.get(first.id) is None
    assert store.messages(first.id) == []  # deleted with their conversation


def test_preferences_are_kept_and_replaced(history_path: Path) -> None:
    store = ConversationStore(history_path)
    assert store.preference("theme") is None
    store.set_preference("theme", "textual-light")
    store.set_preference("theme", "textual-dark")
    store.close()
    reopened = ConversationStore(history_path)
    assert reopened.preference("theme") == "textual-dark"
    reopened.close()


def test_a_regenerated_answer_replaces_the_old_one_in_one_step(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_message(conversation.id, "user", "hello")
    old = store.add_message(conversation.id, "assistant", "hi")
    new = store.add_message(conversation.id, "assistant", "hello there", replacing=old.id)
    assert [m.id for m in store.messages(conversation.id)][-1] == new.id
    assert [m.content for m in store.messages(conversation.id)] == ["hello", "hello there"]


def test_an_older_file_is_migrated_and_a_newer_one_refused(history_path: Path) -> None:
    with sqlite3.connect(history_path) as db:
        db.execute("PRAGMA user_version = 0")
    ConversationStore(history_path).close()
    with sqlite3.connect(history_path) as db:
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(HistoryError, match="newer localchat"):
        ConversationStore(history_path)


def test_a_file_that_is_not_a_database_is_a_readable_error(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(HistoryError, match="cannot open the conversation history"):
        ConversationStore(path)


def test_damaged_pages_are_found_at_open_and_a_byte_not_utf8_reads_as_the_replacement(tmp_path: Path) -> None:
    """A damaged file is one line when the app opens it, not an error in the query that meets the
    damage; a message's byte that is not UTF-8 costs that character alone."""
    path = tmp_path / "history.db"
    store = ConversationStore(path)
    for number in range(40):
        store.add_message(store.create(f"chat {number}").id, "user", f"question {number} " * 60)
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE messages SET content = CAST(X'48ff69' AS TEXT) WHERE id = 1")
    store = ConversationStore(path)
    assert [m.content for m in store.messages(store.conversations()[-1].id)] == ["H\ufffdi"]
    store.close()
    page_size = 4096
    data = bytearray(path.read_bytes())
    assert len(data) > 4 * page_size
    data[2 * page_size : 3 * page_size] = b"\xff" * page_size  # a b-tree page of the tables, written over
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match="it is damaged .*; move the file aside"):
        ConversationStore(path)


@pytest.mark.parametrize(("version", "damage", "missing"), [
    (len(MIGRATIONS), "DROP TABLE preferences", "table preferences"),
    (len(MIGRATIONS), "DROP TABLE messages", "table messages"),
    (len(MIGRATIONS), "ALTER TABLE messages DROP COLUMN reasoning", "column messages.reasoning"),
    (len(MIGRATIONS), "ALTER TABLE messages DROP COLUMN finish", "column messages.finish"),
    (2, "DROP TABLE messages", "table messages"),  # an older file, checked against what its own version holds
])
def test_a_file_missing_a_table_is_found_at_open(history_path: Path, version: int, damage: str, missing: str) -> None:
    """A table dropped by hand passes quick_check and user_version: it is one line at open, not an
    error in the query that meets it."""
    with sqlite3.connect(history_path) as db:
        db.executescript("".join(MIGRATIONS[:version]) + f"PRAGMA user_version = {version}; {damage};")
    with pytest.raises(HistoryError, match=rf"it is incomplete \(it has no {missing}\); move the file aside"):
        ConversationStore(history_path)


def test_the_chat_app_on_a_file_missing_a_table_ends_with_one_line(tmp_path: Path) -> None:
    """`localchat` in a terminal, its history missing a table: one line on stderr and status 1, no
    traceback (the model named is missing, so nothing loads: the history is opened either way)."""
    home = tmp_path / "home"
    ConversationStore(home / "data" / "history.db").close()
    with sqlite3.connect(home / "data" / "history.db") as db:
        db.execute("DROP TABLE preferences")
    leader, follower = pty.openpty()
    try:
        app = subprocess.run([sys.executable, "-m", "localchat", "-m", str(tmp_path / "model.gguf")], stdin=follower,
                             stdout=follower, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                             env={**os.environ, "LOCALCHAT_HOME": str(home)})
    finally:
        os.close(follower)
        os.close(leader)
    assert app.returncode == 1
    (line,) = app.stderr.splitlines()
    assert line.startswith("localchat: error: cannot open the conversation history") and "it is incomplete" in line
    assert "move the file aside" in line


def test_titles_come_from_the_first_line() -> None:
    assert title_from("\n  What is WAL?\nmore") == "What is WAL?"
    assert len(title_from("x" * 200)) <= 48
    assert title_from("   ") == DEFAULT_TITLE


def test_a_killed_writer_loses_no_finished_message(history_path: Path) -> None:
    """SIGKILL between commits: every message written before the kill is there afterwards."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from localchat.history import ConversationStore
        store = ConversationStore(Path({str(history_path)!r}))
        conversation = store.create()
        for i in range(1000000):
            store.add_message(conversation.id, "user", f"message {{i}}")
            print(i, flush=True)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    last = -1
    for line in writer.stdout:
        last = int(line)
        if last >= 50:
            break
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    store = ConversationStore(history_path)
    contents = [m.content for m in store.messages(store.conversations()[0].id)]
    assert contents[: last + 1] == [f"message {i}" for i in range(last + 1)]
    assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.close()


def test_an_answer_keeps_its_thinking_and_a_schema_2_file_gains_the_column(history_path: Path) -> None:
    with sqlite3.connect(history_path) as db:  # a file as localchat wrote it before reasoning was kept
        for migration in MIGRATIONS[:2]:
            db.executescript(migration)
        db.execute("PRAGMA user_version = 2")
        db.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('Old', 0, 0)")
        db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (1, 'user', 'hello', 0)")
    store = ConversationStore(history_path)
    assert store.schema_version == len(MIGRATIONS)
    assert [(m.content, m.reasoning) for m in store.messages(1)] == [("hello", None)]
    answer = store.add_message(1, "assistant", "Hi.", reasoning="A greeting: greet back.")
    assert store.messages(1)[-1] == answer and answer.as_message().reasoning == "A greeting: greet back."
    assert store.add_message(1, "assistant", "Hi again.", reasoning="").reasoning is None  # no thinking, not an empty one
    store.close()


def test_an_answer_cut_short_keeps_how_it_ended_and_a_schema_3_file_gains_the_column(history_path: Path) -> None:
    with sqlite3.connect(history_path) as db:  # a file as localchat wrote it before the finish was kept
        db.executescript("".join(MIGRATIONS[:3]) + "PRAGMA user_version = 3;")
        db.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('Old', 0, 0)")
        db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (1, 'user', 'count', 0)")
        db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (1, 'assistant', 'one, two', 0)")
    store = ConversationStore(history_path)
    assert store.schema_version == len(MIGRATIONS)
    assert [(m.content, m.finish) for m in store.messages(1)] == [("count", None), ("one, two", None)]
    store.add_message(1, "user", "again")
    stopped = store.add_message(1, "assistant", "one, two, three", finish="cancelled")
    store.add_message(1, "user", "go on")
    store.add_message(1, "assistant", "four")
    store.close()
    reopened = ConversationStore(history_path)
    assert [m.finish for m in reopened.messages(1)] == [None, None, None, "cancelled", None, None]
    assert reopened.messages(1)[3] == stopped
    reopened.close()
