"""The chat app driven with Pilot on the real default model: turns, stopping, conversations, models."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pilot_steps import ENDLESS, press_and_wait_for_reply, send, wait_until
from textual.widgets import OptionList, ProgressBar

from localchat.backends.base import SamplerSettings
from localchat.engine import Engine
from localchat.history import ConversationStore
from localchat.model_loading import ProgressRelay, start_loading
from localchat.models import PACKAGED_MODELS
from localchat.planner import PlanRequest
from localchat.presets import ModelPreset, write_preset
from localchat.session import GenerationSettings
from localchat.settings import Settings
from localchat.tui.app import ChatApp
from localchat.tui.widgets.dialogs import HelpScreen, ModelPicker
from localchat.tui.widgets.messages import AssistantMessage, Notice, UserMessage
from localchat.tui.widgets.sidebar import ConversationList
from localchat.tui.widgets.status import StatusBar

pytestmark = pytest.mark.anyio
MakeApp = Callable[..., ChatApp]
# A terminal's colour and cursor sequences, taken out before the screen's words are read.
CONTROL_SEQUENCE = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]")
LONG_SYSTEM = "You are a careful assistant who answers questions about the geography of Europe. " * 5


async def test_a_real_turn_streams_into_the_view_and_is_stored(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        status = app.query_one(StatusBar)
        app.prompt.text = "What is the capital of Japan?"
        await press_and_wait_for_reply(pilot, "enter")
        assert app.prompt.text == ""

        answer = app.query(AssistantMessage).last()
        assert app.last_stats is not None and app.last_stats.completion_tokens > 0
        assert answer.text and answer.text == app.chat.messages[-1].content  # type: ignore[union-attr]
        assert "Tokyo" in answer.text  # the default model is a chat model: it answers
        stored = store.messages(app.conversation.id)  # type: ignore[union-attr]
        assert [(m.role, m.content) for m in stored] == [("user", "What is the capital of Japan?"), ("assistant", answer.text)]
        assert store.get(app.conversation.id).title == "What is the capital of Japan?"  # type: ignore[union-attr]
        assert status.state == "ready" and status.tokens_per_s is not None and status.ttft_s is not None
        assert 0 < status.context_used <= status.context_size == 2048
        assert status.backend == "llama.cpp" and status.rss_bytes > 0


async def test_a_reply_clears_the_toasts_over_the_conversation(make_app: MakeApp) -> None:
    """A toast (the model's "ready" note lasts 6 s) sits over the conversation at 80x24, where the reply is
    written: sending a message takes it away."""
    app = make_app()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.notify("smollm2-135m-instruct is ready: a small chat model", timeout=60)
        await wait_until(pilot, lambda: app.screen.query("Toast"), timeout=10)
        app.prompt.text = "What is the capital of Japan?"
        await press_and_wait_for_reply(pilot, "enter")
        assert not app.screen.query("Toast")


async def test_escape_stops_a_reply_and_keeps_what_was_written(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app(reply_settings=ENDLESS)
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.text = "Count from one to one thousand."
        await pilot.press("enter")
        # The answer shows while it is written, and the status bar follows it live.
        await wait_until(pilot, lambda: app.reply is not None and len(app.query(AssistantMessage).last().text) > 20)
        await wait_until(pilot, lambda: (app.query_one(StatusBar).tokens_per_s or 0) > 0)
        status = app.query_one(StatusBar)
        assert app.reply is not None and status.state == "writing" and status.ttft_s is not None
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.reply is None, timeout=10)
        assert app.last_stats is not None and app.last_stats.finish_reason == "cancelled"
        written = store.messages(app.conversation.id)[-1]  # type: ignore[union-attr]
        assert written.role == "assistant" and written.content == app.query(AssistantMessage).last().text
        assert len(written.content) > 0
        # The app is responsive again: the next turn goes through.
        app.reply_settings = make_app().reply_settings
        await send(pilot, "Thanks.")
        assert len(store.messages(app.conversation.id)) == 4  # type: ignore[union-attr]


async def test_a_stopped_reply_still_says_so_after_a_restart(make_app: MakeApp) -> None:
    """The note under an answer cut short (stopped with Esc, or at the length limit) is kept with it."""
    app = make_app(reply_settings=ENDLESS)
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.text = "Count from one to one thousand."
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.reply is not None and len(app.query(AssistantMessage).last().text) > 20)
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.reply is None, timeout=10)
        stopped = app.query(AssistantMessage).last()
        assert stopped.source.endswith("*stopped*")
        app.reply_settings = make_app().reply_settings
        await send(pilot, "Thanks.")  # 8 tokens at most: cut off
        limited = app.query(AssistantMessage).last()
        assert limited.source.endswith("*cut off at the length limit*")
    again = make_app()
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        first, second = again.query(AssistantMessage)
        assert first.text == stopped.text and first.source == stopped.source
        assert "stopped" in first.query_one("MarkdownParagraph:last-of-type").visual.plain  # type: ignore[attr-defined]
        assert second.text == limited.text and second.source == limited.source


async def test_editor_keys_regenerate_and_copy(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.focus()
        await pilot.press("H", "i", "ctrl+j", "t", "h", "e", "r", "e")
        assert app.prompt.text == "Hi\nthere" and app.reply is None  # a new line, nothing sent
        await press_and_wait_for_reply(pilot, "enter")
        first = store.messages(app.conversation.id)  # type: ignore[union-attr]

        await press_and_wait_for_reply(pilot, "ctrl+r")
        again = store.messages(app.conversation.id)  # type: ignore[union-attr]
        assert [m.role for m in again] == ["user", "assistant"] and len(first) == 2
        assert len(app.query(AssistantMessage)) == 1 and [m.role for m in app.chat.messages] == ["user", "assistant"]  # type: ignore[union-attr]

        await pilot.press("ctrl+g")
        assert app.clipboard == again[-1].content


async def test_conversations_survive_a_restart(make_app: MakeApp, history_path: Path) -> None:
    first_store = ConversationStore(history_path)
    app = make_app(store=first_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "Name a colour.")
        answer = app.chat.messages[-1].content  # type: ignore[union-attr]
    first_store.close()

    second_store = ConversationStore(history_path)
    again = make_app(store=second_store)
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert [w.text for w in again.query(UserMessage)] == ["Name a colour."]
        assert [w.text for w in again.query(AssistantMessage)] == [answer]
        assert [m.content for m in again.chat.messages] == ["Name a colour.", answer]  # type: ignore[union-attr]
    second_store.close()


async def test_the_theme_chosen_is_kept_for_the_next_start(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.theme == "textual-dark"
        await pilot.press("ctrl+t")
        assert app.theme == "textual-light"
    again = make_app()
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert again.theme == "textual-light"


async def test_a_stored_theme_this_textual_lacks_is_ignored(make_app: MakeApp, store: ConversationStore) -> None:
    store.set_preference("theme", "a-theme-from-another-version")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.theme == "textual-dark"


async def test_new_rename_switch_and_delete(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "First conversation")
        first = app.conversation
        await pilot.press("ctrl+n")
        assert app.conversation is not None and app.conversation.id != first.id  # type: ignore[union-attr]
        assert not app.query(UserMessage) and app.query_one("#welcome", Notice)
        await pilot.press("ctrl+n")  # an empty conversation is reused, not duplicated
        assert len(store.conversations()) == 2

        await pilot.press("f2")
        await pilot.press(*"Second")  # the old title is selected, typing replaces it
        await pilot.press("enter")
        assert store.get(app.conversation.id).title == "Second"  # type: ignore[union-attr]
        listing = app.query_one(ConversationList)
        assert [str(listing.get_option_at_index(i).prompt) for i in range(listing.option_count)] == ["Second", "First conversation"]

        await pilot.press("ctrl+l", "down", "enter")  # open the other one from the list
        assert app.conversation.id == first.id  # type: ignore[union-attr]
        assert [w.text for w in app.query(UserMessage)] == ["First conversation"]

        await pilot.press("f8", "y")
        await pilot.pause()
        assert store.get(first.id) is None and [c.title for c in store.conversations()] == ["Second"]  # type: ignore[union-attr]
        assert app.conversation.title == "Second"  # type: ignore[union-attr]


async def test_switching_back_reuses_the_prefix_cache(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app()
    app.engine.prefix_cache.clear()  # type: ignore[union-attr]
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("TextArea").text = LONG_SYSTEM  # type: ignore[attr-defined]
        await pilot.press("ctrl+s")
        assert store.get(app.conversation.id).system_prompt == LONG_SYSTEM.strip()  # type: ignore[union-attr]
        assert app.chat.messages[0].role == "system"  # type: ignore[union-attr]
        await send(pilot, "Which river flows through Paris?")
        first = app.conversation

        await pilot.press("ctrl+n")
        await send(pilot, "Say hello.")  # overwrites the KV cache; the first conversation is saved
        await app.open_conversation(first.id)  # type: ignore[union-attr]
        await send(pilot, "And through Rome?")
        assert app.last_stats is not None and app.last_stats.prefix_cache_tokens > 64


async def test_help_screen_lists_the_keys(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        keys = [row[0] for row in app.screen.rows]
        assert {"Enter", "Ctrl+J / Shift+Enter", "Esc", "Ctrl+N", "Ctrl+R", "Ctrl+G", "Ctrl+O", "F1"} <= set(keys)
        await pilot.press("ctrl+n")  # app keys are off behind a dialog
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_a_model_that_fails_to_load_is_a_readable_error(make_app: MakeApp, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", hf_cache_dir=tmp_path / "hf")
    settings.models_dir.mkdir(parents=True)
    (settings.models_dir / "broken.gguf").write_bytes(b"not a model" * 100)
    app = make_app()
    app.settings = settings
    async with app.run_test(size=(80, 24)) as pilot:
        engine = app.engine
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, ModelPicker)
        labels = [c.label for c in app.screen.choices]
        assert labels == [*PACKAGED_MODELS, "broken"]  # the default model first
        app.screen.query_one(OptionList).highlighted = labels.index("broken")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.loading)
        error = app.query_one(".error", Notice)
        assert "Could not load broken" in str(error.render()) and "not a GGUF file" in str(error.render())
        assert app.engine is engine  # the working model stays
        await send(pilot, "Still there?")
        assert app.last_stats is not None


async def test_a_draft_model_drafts_for_the_model_it_was_given_with(settings: Settings, store: ConversationStore,
                                                                     default_model: Path, tmp_path: Path) -> None:
    """`localchat chat --draft-model`: the draft model serves the model of -m; one that cannot be
    used is a readable error, and no model is left loaded."""
    app = ChatApp(settings, model=str(default_model), store=store, draft_model=str(default_model))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: not app.loading)
        assert isinstance(app.engine, Engine) and all(s.draft_model is not None for s in app.engine.sessions)
        await send(pilot, "The capital of France is")
        assert app.last_stats is not None and app.last_stats.completion_tokens > 0
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model" * 100)
    app = ChatApp(settings, model=str(default_model), store=store, draft_model=str(broken))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: not app.loading)
        error = str(app.query_one(".error", Notice).render())
        assert app.engine is None and "draft model:" in error and "not a GGUF file" in error


async def test_a_model_run_as_a_preset_stops_at_its_stop_strings_and_reply_limit(settings: Settings, store: ConversationStore,
                                                                                  default_model: Path, tmp_path: Path) -> None:
    """A preset's stop strings and num_predict hold in the app, in place of its own reply settings (as in `run` and
    the server)."""
    home = dataclasses.replace(settings, cache_dir=tmp_path / "cache", data_dir=tmp_path / "data")
    write_preset(ModelPreset("curt", str(default_model), stop=("\n",), max_tokens=12), home.models_dir)
    long_replies = GenerationSettings(max_tokens=64, sampler=SamplerSettings(temperature=0))
    with Engine.load("curt", home, PlanRequest(n_ctx=1024)) as engine:
        app = ChatApp(settings, engine=engine, store=store, reply_settings=long_replies)
        async with app.run_test(size=(80, 24)) as pilot:
            await send(pilot, "Name three colours, one per line.")
            answer = app.query(AssistantMessage).last().text
            assert app.last_stats is not None and app.last_stats.finish_reason == "stop"
            assert answer and "\n" not in answer
            await send(pilot, "Tell me a long story about a dragon.")
            assert app.last_stats is not None and app.last_stats.completion_tokens == 12


async def test_loading_at_start_shows_progress_and_errors(settings: Settings, store: ConversationStore, default_model: Path) -> None:
    app = ChatApp(settings, model=str(default_model), store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.loading and app.query_one("#load").display
        await wait_until(pilot, lambda: not app.loading)
        assert app.engine is not None and app.query_one(ProgressBar).progress == 1.0
        assert not app.query_one("#load").display and app.query_one(StatusBar).state == "ready"
        engine = app.engine
    assert engine.backend._model.pointer is None  # type: ignore[attr-defined]  # closed by the app that loaded it

    missing = ChatApp(settings, model="/nowhere/model.gguf", store=store)
    async with missing.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: not missing.loading)
        assert missing.engine is None and missing.query_one(StatusBar).state == "no model"
        assert "does not exist" in str(missing.query_one(".error", Notice).render())
        missing.prompt.text = "hello"
        await pilot.press("enter")  # no model: a notice, not a crash
        assert missing.reply is None


async def test_a_load_started_before_the_app_is_finished_by_it(settings: Settings, store: ConversationStore,
                                                              default_model: Path) -> None:
    """`localchat chat` starts the model's load before it imports and draws the app; the app takes
    the load over: its progress (which came before the app listened), the engine, closing it."""
    relay, loaded = ProgressRelay(), threading.Event()

    def progress(fraction: float) -> None:
        relay(fraction)
        if fraction == 1.0:
            loaded.set()

    loading = start_loading(str(default_model), settings, PlanRequest(n_ctx=2048), on_progress=progress)
    assert loaded.wait(60)
    app = ChatApp(settings, model=str(default_model), store=store, loading=loading, loading_progress=relay)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: not app.loading)
        assert isinstance(app.engine, Engine) and app.engine.model_plan is loading.model_plan
        assert app.query_one(ProgressBar).progress == 1.0 and app.query_one(StatusBar).state == "ready"
        await send(pilot, "What is the capital of Japan?")
        assert app.last_stats is not None and app.last_stats.completion_tokens > 0
        engine = app.engine
    assert engine.backend._model.pointer is None  # type: ignore[attr-defined]  # closed by the app that finished the load


def test_localchat_on_a_model_it_cannot_find_opens_the_app_and_says_why() -> None:
    """`localchat -m MISSING`: the load is started before the app, the missing model refused there and
    left to the app, which opens and says why, as for a model that fails inside it."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: localchat in a terminal of 100x30
        os.environ["TERM"] = "xterm-256color"
        os.execv(sys.executable, [sys.executable, "-m", "localchat", "-m", "/nowhere/model.gguf"])
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    screen, began = b"", time.monotonic()
    try:
        while b"does not exist" not in CONTROL_SEQUENCE.sub(b"", screen) and time.monotonic() - began < 60:
            if select.select([terminal], [], [], 1)[0]:
                screen += os.read(terminal, 1 << 16)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(terminal)
    text = CONTROL_SEQUENCE.sub(b"", screen).decode(errors="replace")
    assert "Could not load /nowhere/model.gguf" in text and "does not exist" in text and "Traceback" not in text


async def test_a_question_left_unanswered_by_a_kill(make_app: MakeApp, store: ConversationStore) -> None:
    conversation = store.create("Interrupted")
    store.add_message(conversation.id, "user", "Name a fruit.")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.query_one("#unanswered", Notice)
        await send(pilot, "Name a vegetable.")
        roles = [m.role for m in store.messages(conversation.id)]
        assert roles == ["user", "assistant", "user", "assistant"]  # an empty answer keeps roles alternating
        assert not app.query("#unanswered")


async def test_quitting_while_a_reply_is_written_keeps_what_was_written(make_app: MakeApp, store: ConversationStore) -> None:
    app = make_app(reply_settings=ENDLESS)
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.text = "Count from one to one thousand."
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.reply is not None and len(app.reply.parsed.content) > 20)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: app.return_code is not None, timeout=10)
        assert app.reply is None and app.last_stats is not None and app.last_stats.finish_reason == "cancelled"
    written = store.messages(store.conversations()[0].id)
    assert [m.role for m in written] == ["user", "assistant"]
    assert len(written[-1].content) > 20 and written[-1].content == app.chat.messages[-1].content  # type: ignore[union-attr]
