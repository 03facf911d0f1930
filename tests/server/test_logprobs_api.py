"""Log-probabilities through the real `openai` client: chat's `logprobs.content` and the legacy
completions' lists, whole and streamed, on the real server and model."""

from __future__ import annotations

import math

import pytest
from live_server import LiveServer

from localchat.models import DEFAULT_MODEL_NAME

GREEDY = {"temperature": 0, "seed": 1}
MODEL = DEFAULT_MODEL_NAME
QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


def test_chat_logprobs_whole_and_streamed_agree(server: LiveServer) -> None:
    client = server.client()
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "logprobs": True, "top_logprobs": 3, **GREEDY}
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert whole.usage is not None and len(content) == whole.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes is not None and len(entry.top_logprobs) == 3
        assert bytes(entry.bytes).decode(errors="replace") == entry.token
        tops = [top.logprob for top in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and entry.logprob <= tops[0] + 1e-6
    # The tokens spell the reply.
    assert "".join(entry.token for entry in content) == choice.message.content

    chunks = list(client.chat.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in content]
    # The first reply evaluated the whole prompt in one batch; the stream found it in the KV cache and
    # evaluated only its last token, which llama.cpp rounds differently (by up to ~0.1 here). A whole
    # reply asked again takes the stream's path: the figures are then the same.
    again = client.chat.completions.create(**ask).choices[0].logprobs  # type: ignore[call-overload]
    assert again is not None and again.content is not None
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in again.content], abs=1e-4)
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=0.3)
    # Each chunk carries the logprobs of the tokens whose text it carries.
    for c in chunks:
        if c.choices and c.choices[0].logprobs and c.choices[0].delta.content:
            assert "".join(e.token for e in c.choices[0].logprobs.content or []) == c.choices[0].delta.content


def test_logprobs_cover_the_text_a_stop_string_leaves(server: LiveServer) -> None:
    """A stop string's tokens (" the" for the stop " ") are not the reply's: content and logprobs agree."""
    client = server.client()
    ask = {"model": MODEL, "messages": QUESTION, "max_tokens": 16, "logprobs": True, "stop": [" ", "\n"], **GREEDY}
    whole = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    choice = whole.choices[0]
    assert choice.finish_reason == "stop" and choice.logprobs is not None and choice.logprobs.content is not None
    assert "".join(entry.token for entry in choice.logprobs.content) == choice.message.content
    chunks = list(client.chat.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert chunks[-1].choices[0].finish_reason == "stop" and "".join(tokens) == content

    legacy = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 16, "logprobs": 1, "stop": ["\n", ". "], **GREEDY}
    completion = client.completions.create(**legacy)  # type: ignore[call-overload]
    text, logprobs = completion.choices[0].text, completion.choices[0].logprobs
    assert completion.choices[0].finish_reason == "stop" and logprobs is not None and text
    assert "".join(logprobs.tokens or []) == text and len(logprobs.token_logprobs or []) == len(logprobs.tokens or [])
    pieces = list(client.completions.create(**legacy, stream=True))  # type: ignore[call-overload]
    streamed = [t for c in pieces if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []]
    assert "".join(streamed) == "".join(c.choices[0].text for c in pieces if c.choices)


def test_without_top_logprobs_each_token_has_no_alternatives(server: LiveServer) -> None:
    whole = server.client().chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, logprobs=True, **GREEDY)
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(entry.top_logprobs == [] for entry in content)
    plain = server.client().chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, **GREEDY)
    assert plain.choices[0].logprobs is None


def test_top_logprobs_without_logprobs_is_refused(server: LiveServer) -> None:
    response = server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2, "top_logprobs": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"
    response = server.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2, "logprobs": True, "top_logprobs": 21})
    assert response.status_code == 400


def test_text_completion_legacy_logprobs_whole_and_streamed(server: LiveServer) -> None:
    client = server.client()
    ask = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "logprobs": 2, **GREEDY}
    whole = client.completions.create(**ask)  # type: ignore[call-overload]
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and whole.usage is not None
    n = whole.usage.completion_tokens
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(logprobs.text_offset) == n
    assert "".join(logprobs.tokens) == whole.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(n)]
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen <= 0 and 1 <= len(top) <= 2 and all(math.isfinite(v) and v <= 0 for v in top.values())
        assert chosen <= max(top.values()) + 1e-6

    chunks = list(client.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == logprobs.tokens and offsets == logprobs.text_offset
    assert server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logprobs": 6}).status_code == 400
