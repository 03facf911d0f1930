"""The chat app on a remote engine: the real `localchat serve` on loopback, reached through the
real `openai` client, as a person would open `localchat -m http://HOST:PORT/v1`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from live_server import API_KEY, LiveServer, busy_gateway, serving, start_server
from openai import OpenAI
from pilot_steps import SHORT, press_and_wait_for_reply, send, wait_until
from scripted_app import ScriptedBackend, scripted_app

from localchat.backends.base import SamplerSettings
from localchat.engine import Engine
from localchat.history import ConversationStore
from localchat.models import DEFAULT_MODEL_NAME
from localchat.planner import PlanRequest
from localchat.remote_endpoint import RemoteEndpoint
from localchat.server.app import create_app
from localchat.server.settings import ServerSettings
from localchat.session import GenerationSettings
from localchat.settings import Settings
from localchat.templates import ChatTemplate
from localchat.tui.app import ChatApp
from localchat.tui.widgets.messages import AssistantMessage, Notice, Reasoning, UserMessage
from localchat.tui.widgets.status import StatusBar

pytestmark = pytest.mark.anyio
MODEL = DEFAULT_MODEL_NAME
TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
QWEN3_THINKING_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
SCRIPTED = GenerationSettings(max_tokens=100)  # the scripted model writes a character a token
# Sampled and past its end (ignore_eos), so that the reply runs long enough to be stopped: how soon a seed's story
# ends depends on the CPU's rounding (on an AMD EPYC with AVX2 only, seed 1's ended before the app could stop it).
LONG = GenerationSettings(max_tokens=2000, ignore_eos=True, sampler=SamplerSettings(seed=1))

MakeRemoteApp = Callable[..., ChatApp]


@pytest.fixture
def remote_app(settings: Settings, store: ConversationStore) -> MakeRemoteApp:
    def make(endpoint: RemoteEndpoint, reply_settings: GenerationSettings = SHORT) -> ChatApp:
        return ChatApp(settings, remote=endpoint, store=store, reply_settings=reply_settings)

    return make


def endpoint(server: LiveServer, api_key: str = API_KEY) -> RemoteEndpoint:
    return RemoteEndpoint(f"{server.url}/v1", api_key=api_key)


def settled_slots(server: LiveServer, within_s: float = 10.0) -> object:
    """The server's busy slots once they reach 0, or after `within_s`."""
    deadline = time.monotonic() + within_s
    while server.health()["slots_processing"] != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return server.health()["slots_processing"]


async def connected(pilot: object, app: ChatApp) -> None:
    await wait_until(pilot, lambda: not app.loading and app.status.state != "starting")  # type: ignore[arg-type]


async def test_a_remote_reply_streams_into_the_view_and_is_stored(remote_app: MakeRemoteApp, remote_server: LiveServer,
                                                                   store: ConversationStore) -> None:
    app = remote_app(endpoint(remote_server))
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        status = app.query_one(StatusBar)
        assert app.engine is not None and status.state == "ready" and status.model == MODEL
        assert status.backend == f"remote {remote_server.url.removeprefix('http://')}"
        await send(pilot, "Name a colour.")
        answer = app.query(AssistantMessage).last().text
        stats = app.last_stats
        assert stats is not None and stats.completion_tokens == SHORT.max_tokens  # the server's usage
        assert stats.prompt_tokens > 5 and stats.finish_reason == "length" and 0 < stats.ttft_s < 60
        assert status.tokens_per_s is not None and status.tokens_per_s > 0 and status.ttft_s == stats.ttft_s
        stored = store.messages(app.conversation.id)  # type: ignore[union-attr]
        assert [(m.role, m.content) for m in stored] == [("user", "Name a colour."), ("assistant", answer)] and answer
        assert store.get(app.conversation.id).title == "Name a colour."  # type: ignore[union-attr]
        # The second turn sends the whole conversation; the history stays in step.
        await send(pilot, "Another one.")
        assert [m.role for m in store.messages(app.conversation.id)] == ["user", "assistant"] * 2  # type: ignore[union-attr]


async def test_escape_stops_a_remote_reply_and_the_server_stops_too(remote_app: MakeRemoteApp, remote_server: LiveServer,
                                                                    store: ConversationStore) -> None:
    app = remote_app(endpoint(remote_server), LONG)
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        app.prompt.text = "Tell me a long story."
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.reply is not None and len(app.reply.parsed.content) > 20)
        assert remote_server.health()["slots_processing"] == 1
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.reply is None, timeout=10)
        assert app.last_stats is not None and app.last_stats.finish_reason == "cancelled"
        written = store.messages(app.conversation.id)[-1]  # type: ignore[union-attr]
        assert written.role == "assistant" and len(written.content) > 20 and written.content == app.chat.messages[-1].content  # type: ignore[union-attr]
    assert settled_slots(remote_server) == 0  # the closed request stopped the server's generation


async def test_a_server_that_is_down_says_so_keeps_the_message_and_ctrl_r_tries_again(remote_app: MakeRemoteApp) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    app = remote_app(RemoteEndpoint(f"http://127.0.0.1:{port}/v1"))
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        error = str(app.query_one(".error", Notice).render())
        assert f"cannot reach http://127.0.0.1:{port}/v1: is the server running" in error and "Ctrl+R to try again" in error
        assert app.engine is None and app.status.state == "no model"
        app.prompt.text = "A question typed while the server is down"
        await pilot.press("enter")
        assert app.reply is None and app.prompt.text == "A question typed while the server is down"  # kept, not sent
        await pilot.press("ctrl+r")  # tries to connect again: still down, a second notice
        await wait_until(pilot, lambda: not app.loading and len(app.query(".error")) == 2)
        assert app.prompt.text == "A question typed while the server is down"


async def test_a_wrong_api_key_says_so(remote_app: MakeRemoteApp, remote_server: LiveServer) -> None:
    app = remote_app(endpoint(remote_server, api_key="wrong"))
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        error = str(app.query_one(".error", Notice).render())
        assert "refused the API key" in error and "--api-key" in error and app.engine is None


async def test_a_server_dying_mid_reply_keeps_what_came_and_says_so(remote_app: MakeRemoteApp, localchat_home: Path,
                                                                    default_model: Path, store: ConversationStore) -> None:
    dying = start_server(localchat_home)
    try:
        app = remote_app(endpoint(dying), LONG)
        async with app.run_test(size=(100, 24)) as pilot:
            await connected(pilot, app)
            app.prompt.text = "Tell me a long story."
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.reply is not None and len(app.reply.parsed.content) > 10)
            dying.process.kill()
            await wait_until(pilot, lambda: app.reply is None, timeout=30)
            answer = app.query(AssistantMessage).last()
            assert f"{dying.url}/v1 broke off the reply" in answer.source and "Ctrl+R tries again" in answer.source
            stored = store.messages(app.conversation.id)  # type: ignore[union-attr]
            assert [m.role for m in stored] == ["user", "assistant"] and len(stored[-1].content) > 10  # what came is kept
            assert answer.source.startswith(stored[-1].content)
    finally:
        dying.process.kill()
        dying.process.wait(timeout=30)


async def test_a_busy_remote_is_one_line_and_ctrl_r_retries_the_kept_question(remote_app: MakeRemoteApp,
                                                                               store: ConversationStore) -> None:
    with busy_gateway() as url:
        await _busy_remote_retried(remote_app(RemoteEndpoint(url)), store)


async def _busy_remote_retried(app: ChatApp, store: ConversationStore) -> None:
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        await send(pilot, "Is anyone there?")
        note = app.query(AssistantMessage).last().source
        assert "busy (429: too many requests): try again in 7 s" in note and "Ctrl+R tries again" in note
        assert [m.text for m in app.query(UserMessage)] == ["Is anyone there?"]
        await press_and_wait_for_reply(pilot, "ctrl+r")  # the person's retry: busy again, nothing doubled
        stored = store.messages(app.conversation.id)  # type: ignore[union-attr]
        assert [(m.role, m.content) for m in stored] == [("user", "Is anyone there?"), ("assistant", "")]
        assert len(app.query(AssistantMessage)) == 1


@pytest.fixture
def qwen3_remote(tmp_path: Path) -> Iterator[tuple[RemoteEndpoint, ScriptedBackend]]:
    """localchat's app on loopback over a scripted model with Qwen 3's template: the server's
    reasoning and the prompts it renders are known."""
    backend = ScriptedBackend((TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8"))
    with serving(scripted_app(backend, tmp_path)) as url:
        yield RemoteEndpoint(url), backend


@pytest.fixture
def deepseek_r1_remote(settings: Settings, default_model: Path) -> Iterator[RemoteEndpoint]:
    """localchat's app on loopback over the real default model with DeepSeek R1's template, whose
    prompt ends with `<think>`: what the model writes comes back as reasoning_content."""
    engine = Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048))  # the app frees it when it stops
    source = (TEMPLATES / "deepseek_r1_distill.jinja").read_text(encoding="utf-8")
    engine.template = ChatTemplate(source, bos_token=engine.template.bos_token, eos_token=engine.template.eos_token)
    with serving(create_app(engine, ServerSettings())) as url:
        yield RemoteEndpoint(url)


def above(app: ChatApp, widget: object) -> object:
    """The widget just above `widget` in the conversation view."""
    children = list(app.conversation_view.children)
    return children[children.index(widget) - 1]  # type: ignore[arg-type]


async def test_a_remotes_reasoning_folds_above_its_answer_and_is_stored_with_it(
        remote_app: MakeRemoteApp, qwen3_remote: tuple[RemoteEndpoint, ScriptedBackend], store: ConversationStore) -> None:
    remote, backend = qwen3_remote
    backend.replies.append("<think>\nThe user greets me.\n</think>\n\nHello! How can I help?")
    app = remote_app(remote, SCRIPTED)
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        await send(pilot, "Hello!")
        answer, thinking = app.query(AssistantMessage).last(), app.query_one(Reasoning)
        assert answer.text == "Hello! How can I help?" and above(app, answer) is thinking
        assert thinking.collapsed and thinking.text == "The user greets me." and thinking.title == "Thought"  # no tokenizer here
        stored = store.messages(app.conversation.id)[-1]  # type: ignore[union-attr]
        assert (stored.content, stored.reasoning) == ("Hello! How can I help?", "The user greets me.")
        assert app.chat is not None and app.chat.messages[-1].reasoning == "The user greets me."


async def test_f3_asks_the_remotes_template_to_turn_thinking_off(
        remote_app: MakeRemoteApp, qwen3_remote: tuple[RemoteEndpoint, ScriptedBackend], store: ConversationStore) -> None:
    remote, backend = qwen3_remote
    backend.replies.extend(["Hi.", "Hi again."])
    app = remote_app(remote, SCRIPTED)
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        await pilot.press("f3")
        assert not app.thinking and store.preference("thinking") == "off"
        said = [notification.message for notification in app._notifications][-1]
        assert said == (f"Thinking off: asked of the server (remote {remote.base_url.split('/')[2]}); a chat template "
                        "without the switch ignores it")
        await send(pilot, "Hello!")
        assert backend.prompts[-1].endswith(QWEN3_THINKING_OFF)  # Qwen 3's "no thinking"
        await pilot.press("f3")
        assert app.thinking
        await send(pilot, "And you?")
        assert backend.prompts[-1].endswith("<|im_start|>assistant\n") and not backend.prompts[-1].endswith(QWEN3_THINKING_OFF)
        assert [m.content for m in store.messages(app.conversation.id)][1::2] == ["Hi.", "Hi again."]  # type: ignore[union-attr]


async def test_a_real_models_reasoning_from_localchat_serve_folds_and_is_stored(
        remote_app: MakeRemoteApp, deepseek_r1_remote: RemoteEndpoint, store: ConversationStore) -> None:
    app = remote_app(deepseek_r1_remote)
    async with app.run_test(size=(100, 24)) as pilot:
        await connected(pilot, app)
        await send(pilot, "What is two plus two?")
        stored = store.messages(app.conversation.id)[-1]  # type: ignore[union-attr]
        thinking = app.query_one(Reasoning)
        assert thinking.collapsed and thinking.title == "Thought" and above(app, app.query(AssistantMessage).last()) is thinking
        assert stored.reasoning and thinking.text == stored.reasoning == app.chat.messages[-1].reasoning  # type: ignore[union-attr]
        assert stored.content == app.query(AssistantMessage).last().text
        model = app.engine.model_name  # type: ignore[union-attr]
    # What the server answers the same question whole, apart from the app.
    with OpenAI(base_url=deepseek_r1_remote.base_url, api_key="none", max_retries=0) as client:
        whole = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is two plus two?"}],
                                               max_tokens=SHORT.max_tokens, temperature=0)
    message = whole.choices[0].message
    assert (stored.reasoning, stored.content) == (message.reasoning_content, message.content or "")  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", [["chat"], []])
def test_localchat_and_localchat_chat_take_a_remote_url_and_its_options(command: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "localchat", *command, "-m", "http://127.0.0.1:1/v1", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "usage: localchat chat" in done.stdout
    assert "--remote-model" in done.stdout and "--api-key" in done.stdout
