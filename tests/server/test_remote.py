"""A chat on a remote server: the real `localchat serve` on loopback as the remote, through the
real `openai` client, as a person would point `-m http://HOST:PORT/v1` at vLLM or llama.cpp."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from greedy_paths import assert_same_pieces_until_near_tie
from live_server import API_KEY, LiveServer, busy_gateway, serving, start_server
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from scripted_app import ScriptedBackend, scripted_app

from localchat.models import DEFAULT_MODEL_NAME, PACKAGED_MODELS
from localchat.backends.base import SamplerSettings
from localchat.remote import RemoteGeneration, RemoteServer
from localchat.remote_endpoint import RemoteEndpoint, RemoteError
from localchat.reply_parser import ParsedReply
from localchat.session import GenerationSettings
from localchat.templates import Message

GREEDY = GenerationSettings(max_tokens=12, sampler=SamplerSettings(temperature=0))
MODEL = DEFAULT_MODEL_NAME
QWEN3 = (Path(__file__).parent.parent / "data" / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")
QWEN3_THINKING_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture
def remote(server: LiveServer) -> Iterator[RemoteServer]:
    with RemoteServer(RemoteEndpoint(f"{server.url}/v1", api_key=API_KEY)) as connected:
        yield connected


def test_a_remote_chat_streams_the_reply_the_server_writes(remote: RemoteServer, server: LiveServer) -> None:
    assert remote.model == MODEL  # the model the server has loaded, picked without being named
    chat = remote.new_chat("You are brief.")
    generation = chat.send("What is the capital of Japan?", GREEDY)
    pieces = list(generation)
    chat.commit("".join(pieces))
    direct = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is the capital of Japan?"}],
        max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
    )
    # The direct request reuses the first one's KV cache: the same reply up to its first near tie.
    assert direct.choices[0].logprobs is not None and direct.choices[0].logprobs.content is not None
    assert_same_pieces_until_near_tie(direct.choices[0].logprobs.content, pieces, min_compared=3)
    stats = generation.stats
    assert stats is not None and stats.completion_tokens == direct.usage.completion_tokens == len(pieces)
    assert stats.prompt_tokens == direct.usage.prompt_tokens and stats.finish_reason == direct.choices[0].finish_reason
    assert 0 < stats.ttft_s < 60 and generation.first_token_at is not None
    assert [m.role for m in chat.messages] == ["system", "user", "assistant"]


def test_ignore_eos_reaches_the_server(remote: RemoteServer) -> None:
    """The reply goes on past its end to max_tokens, where without ignore_eos it ends by itself."""
    settings = GenerationSettings(max_tokens=60, sampler=SamplerSettings(temperature=0))
    short = remote.new_chat().send("Hi", settings)
    short.text()
    assert short.stats is not None and short.stats.finish_reason == "stop" and short.stats.completion_tokens < 60
    past_end = remote.new_chat().send("Hi", dataclasses.replace(settings, ignore_eos=True))
    past_end.text()
    assert past_end.stats is not None and past_end.stats.finish_reason == "length" and past_end.stats.completion_tokens == 60


def test_cancel_closes_the_stream_and_the_server_stops(remote: RemoteServer, server: LiveServer) -> None:
    generation = remote.new_chat().send("Tell me a long story.", GenerationSettings(max_tokens=2000, ignore_eos=True,
                                                                                   sampler=SamplerSettings(seed=1)))
    received = []
    for piece in generation:
        received.append(piece)
        if len(received) == 3:
            threading.Timer(0.0, generation.cancel).start()
    assert 3 <= len(received) < 100
    assert generation.stats is not None and generation.stats.finish_reason == "cancelled"
    assert server.idle_within(10)


def test_a_wrong_key_says_so(server: LiveServer) -> None:
    with pytest.raises(RemoteError, match="refused the API key.*--api-key"):
        RemoteServer(RemoteEndpoint(f"{server.url}/v1", api_key="wrong"))


def test_an_unknown_model_lists_what_the_server_has(server: LiveServer) -> None:
    with pytest.raises(RemoteError, match=f"no model 'llama-70b'; it serves: {', '.join(PACKAGED_MODELS)}"):
        RemoteServer(RemoteEndpoint(f"{server.url}/v1", "llama-70b", API_KEY))


def test_a_server_that_is_down_says_so() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RemoteError, match=f"cannot reach http://127.0.0.1:{port}/v1: is the server running"):
        RemoteServer(RemoteEndpoint(f"http://127.0.0.1:{port}/v1"))


def test_a_busy_server_passes_on_its_retry_after(remote: RemoteServer, server: LiveServer) -> None:
    from live_server import QUEUE, SLOTS

    with server.busy(SLOTS, QUEUE):
        with pytest.raises(RemoteError, match="busy") as refused:
            list(remote.new_chat().send("Hello", GREEDY))
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 0


def test_a_429_says_when_to_retry() -> None:
    with busy_gateway() as url, RemoteServer(RemoteEndpoint(url)) as remote:
        with pytest.raises(RemoteError, match="busy \\(429: too many requests\\): try again in 7 s") as refused:
            list(remote.new_chat().send("Hello", GREEDY))
    assert refused.value.retry_after_s == 7


def test_a_server_dying_mid_reply_is_one_error_and_keeps_what_came(localchat_home: Path, default_model: Path) -> None:
    dying = start_server(localchat_home)
    try:
        with RemoteServer(RemoteEndpoint(f"{dying.url}/v1", api_key=API_KEY)) as remote:
            generation = remote.new_chat().send("Tell me a long story.", GenerationSettings(max_tokens=2000, ignore_eos=True))
            received = []
            with pytest.raises(RemoteError, match=dying.url):
                for piece in generation:
                    received.append(piece)
                    if len(received) == 2:
                        dying.process.kill()
            assert len(received) >= 2 and generation.stats is not None and generation.stats.finish_reason == "cancelled"
    finally:
        dying.process.kill()
        dying.process.wait(timeout=30)


def test_localchat_run_on_a_remote(server: LiveServer, tmp_path: Path) -> None:
    """`localchat run -m URL#MODEL --json-schema` through the real CLI: the schema goes as response_format."""
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}')
    done = subprocess.run(
        [sys.executable, "-m", "localchat", "run", "-m", f"{server.url}/v1#{MODEL}", "--api-key", API_KEY, "--temperature", "0",
         "-n", "20", "--json-schema", str(schema), "--stats", "Is water wet? Answer in JSON."],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) in ({"ok": True}, {"ok": False})
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    assert stats["backend"] == "remote" and stats["model"] == MODEL and stats["completion_tokens"] > 0


def test_commands_without_remote_support_say_so() -> None:
    done = subprocess.run([sys.executable, "-m", "localchat", "serve", "-m", "http://127.0.0.1:1/v1"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "runs local models only" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def qwen3_remote(tmp_path: Path) -> Iterator[tuple[RemoteServer, ScriptedBackend]]:
    """localchat's app on loopback over a scripted model with Qwen 3's template: it writes the
    replies a test queues, so what the server streams as reasoning_content is known."""
    backend = ScriptedBackend(QWEN3)
    with serving(scripted_app(backend, tmp_path)) as url, RemoteServer(RemoteEndpoint(url)) as remote:
        yield remote, backend


def test_the_servers_reasoning_comes_inside_markers_the_chats_parser_reads_apart(
        qwen3_remote: tuple[RemoteServer, ScriptedBackend]) -> None:
    remote, backend = qwen3_remote
    backend.replies.append("<think>\nThe user greets me.\n</think>\n\nHello! How can I help?")
    chat = remote.open_chat([])
    generation = chat.send("Hello!")
    pieces = list(generation)
    # As a reasoning model writes it, so that `localchat run` prints it as a local one would.
    assert "".join(pieces) == "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"
    assert generation.chunks == len(pieces) > 30 and pieces[0].startswith("<think>\n")  # a chunk about a token
    parser, reply = chat.reply_parser(), ParsedReply()
    for part in [part for piece in pieces for part in parser.feed(piece)] + parser.finish():
        reply.add(part)
    assert (reply.reasoning, reply.content) == ("The user greets me.", "Hello! How can I help?")
    chat.commit(reply.content, reply.reasoning)
    assert chat.messages[-1] == Message("assistant", "Hello! How can I help?", reasoning="The user greets me.")


def test_reasoning_cut_at_the_length_limit_is_closed(qwen3_remote: tuple[RemoteServer, ScriptedBackend]) -> None:
    remote, backend = qwen3_remote
    backend.replies.append("<think>\nLet me think about this at length.")
    text = remote.open_chat([]).send("Hello!", GenerationSettings(max_tokens=len("<think>\nLet me"))).text()
    assert text == "<think>\nLet me\n</think>\n\n"


def test_thinking_off_reaches_the_servers_template_and_the_reasoning_stays_here(
        qwen3_remote: tuple[RemoteServer, ScriptedBackend]) -> None:
    remote, backend = qwen3_remote
    backend.replies.extend(["Hi.", "Hi again."])
    assert remote.can_switch_thinking and not remote.thinking_switch_checked
    earlier = [Message("user", "Hello!"), Message("assistant", "Hi.", reasoning="A SECRET THOUGHT")]
    assert remote.open_chat(list(earlier), thinking=False).send("And you?").text() == "Hi."
    assert backend.prompts[-1].endswith(QWEN3_THINKING_OFF)
    assert remote.open_chat(list(earlier)).send("And you?").text() == "Hi again."
    assert backend.prompts[-1].endswith("<|im_start|>assistant\n") and not backend.prompts[-1].endswith(QWEN3_THINKING_OFF)
    # Servers take no reasoning back: the earlier answer went as its content only.
    assert "Hi." in backend.prompts[-1] and "A SECRET THOUGHT" not in "".join(backend.prompts)


def test_reasoning_is_read_from_either_field_servers_use() -> None:
    """vLLM, llama.cpp and localchat send reasoning_content; newer vLLM and OpenRouter, reasoning."""
    generation = RemoteGeneration(None, [], GenerationSettings())  # type: ignore[arg-type]  # only reads deltas
    deltas = [{"reasoning": "Hmm"}, {"reasoning_content": ", sure."}, {"content": "Yes"}, {"content": "."},
              {"reasoning": "Again?"}, {"content": "No."}, {}]
    texts = [generation._text(ChoiceDelta.model_validate(delta)) for delta in deltas]
    assert texts == ["<think>\nHmm", ", sure.", "\n</think>\n\nYes", ".", "<think>\nAgain?", "\n</think>\n\nNo.", ""]


def test_run_on_a_remote_without_n_leaves_the_reply_length_to_the_server(tmp_path: Path) -> None:
    """`localchat run -m URL` without -n sends no max_tokens: the server's own limit holds (its model's
    num_predict, else its context), where a local run's default of 256 tokens cut a longer reply."""
    backend = ScriptedBackend(QWEN3)
    long_reply = "word " * 100  # 500 tokens of the scripted model (a character each)
    backend.replies.extend([long_reply, long_reply])
    with serving(scripted_app(backend, tmp_path)) as url:
        def run(*flags: str) -> str:
            done = subprocess.run([sys.executable, "-m", "localchat", "run", "-m", url, *flags, "Go on."],
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout.rstrip("\n")

        assert run() == long_reply
        assert run("-n", "20") == long_reply[:20]
