"""The OpenAI-compatible API driven by the real `openai` client against a real server and model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import pytest
import requests
from greedy_paths import assert_same_completion_until_near_tie, assert_same_pieces_until_near_tie
from live_server import API_KEY, SLOTS, LiveServer

from localchat.models import DEFAULT_MODEL_NAME, PACKAGED_MODELS

GREEDY = {"temperature": 0, "seed": 1}
MODEL = DEFAULT_MODEL_NAME
QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]  # no near tie in the chat model's answer


def test_chat_completion_answers_with_usage(server: LiveServer) -> None:
    completion = server.client().chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, **GREEDY)
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 16
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_streamed_chat_matches_the_whole_reply_and_reports_usage(server: LiveServer) -> None:
    """The second request reuses the first's KV cache and may draft: another evaluation path, so the two replies
    are the same up to the whole one's first near tie (tests/greedy_paths.py)."""
    client = server.client()
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, logprobs=True, top_logprobs=2,
                                           **GREEDY)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, stream=True,
                                                 stream_options={"include_usage": True}, logprobs=True, **GREEDY))
    pieces = [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert "".join(pieces) == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content is not None
    compared = assert_same_pieces_until_near_tie(whole.choices[0].logprobs.content, pieces, min_compared=4)
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == len(pieces)
    if compared == len(pieces) == len(whole.choices[0].logprobs.content):  # no near tie: the same reply
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks[:-1])


def test_a_stream_is_server_sent_events_ending_with_done(server: LiveServer) -> None:
    body = {"messages": QUESTION, "max_tokens": 4, "stream": True, **GREEDY}
    with server.post("/v1/chat/completions", body, stream=True) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines(decode_unicode=True) if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["usage"] is None for line in events[:-1])  # no include_usage asked


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; uvloop has no Windows build")
def test_the_server_runs_on_uvloop_and_httptools(server: LiveServer) -> None:
    """uvicorn's C event loop and HTTP parser (pyproject's dependencies), which it picks once they are installed:
    `localchat serve`'s process has both libraries' extension modules loaded."""
    loaded = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "/uvloop/loop." in loaded
    assert "/httptools/parser/parser." in loaded


def test_text_completion_whole_and_streamed(server: LiveServer) -> None:
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, logprobs=2, **GREEDY)
    assert whole.object == "text_completion" and whole.choices[0].text.strip()
    assert whole.usage is not None and whole.usage.completion_tokens <= 6
    pieces = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, stream=True,
                                            logprobs=1, **GREEDY))
    streamed = [t for p in pieces if p.choices and p.choices[0].logprobs for t in p.choices[0].logprobs.tokens or []]
    assert "".join(streamed) == "".join(p.choices[0].text for p in pieces if p.choices)
    # The stream reuses the first request's KV cache: the same pieces up to the whole reply's first near tie.
    assert whole.choices[0].logprobs is not None
    assert_same_completion_until_near_tie(whole.choices[0].logprobs, streamed, min_compared=2)


def test_a_list_of_one_prompt_is_that_prompt(server: LiveServer) -> None:
    """LangChain's OpenAI LLM sends its prompt in a list (several prompts: tests/server/test_choices.py)."""
    client = server.client()
    prompt = "The capital of France is"
    counted = []
    for given in ([prompt], prompt):
        reply = client.completions.create(model=MODEL, prompt=given, max_tokens=1, temperature=0)
        assert reply.usage is not None and reply.choices[0].text and len(reply.choices) == 1
        counted.append(reply.usage.prompt_tokens)
    assert counted[0] == counted[1]


def test_sampling_parameters_are_honoured(server: LiveServer) -> None:
    client = server.client()

    def reply(**options: object) -> openai.types.Completion:
        return client.completions.create(model=MODEL, prompt="Once upon a time", **options)  # type: ignore[call-overload, no-any-return]

    sampled = dict(max_tokens=12, temperature=1.0, top_p=0.9, seed=7, presence_penalty=0.5, frequency_penalty=0.5)
    assert reply(**sampled).choices[0].text == reply(**sampled).choices[0].text  # same seed, same sample
    free = reply(max_tokens=40, temperature=0).choices[0].text
    stop = free.split()[2]
    stopped = reply(max_tokens=40, temperature=0, stop=[stop, "\u00a7"])
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text
    assert free.startswith(stopped.choices[0].text)
    # llama.cpp's ignore_eos extension: exactly max_tokens tokens, whatever the model wants.
    long = reply(max_tokens=20, temperature=0, extra_body={"ignore_eos": True, "unknown_field": 1})
    assert long.usage is not None and long.usage.completion_tokens == 20 and long.choices[0].finish_reason == "length"


def test_models_and_health(server: LiveServer) -> None:
    models = server.client().models.list()
    # Every model localchat installs; the server started with the default one.
    assert [m.id for m in models.data] == list(PACKAGED_MODELS)
    assert [m.id for m in models.data if m.model_extra["status"] == "loaded"] == [MODEL]  # type: ignore[index]
    health = requests.get(f"{server.url}/health", timeout=10)  # no key needed
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/responses"),
                                              ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/nowhere")])
def test_every_endpoint_but_health_needs_the_key(server: LiveServer, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = requests.request(method, f"{server.url}{path}", headers=headers, timeout=10)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_no_cors_headers_for_pages_of_other_sites(server: LiveServer) -> None:
    preflight = requests.options(f"{server.url}/v1/models", timeout=10, headers={
        "Origin": "https://example.com", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in preflight.headers


def test_metrics_count_requests_tokens_and_latency(server: LiveServer) -> None:
    counted = ('localchat_http_requests_total{path="/v1/completions",status="200"}', "localchat_completion_tokens_total",
               "localchat_prompt_tokens_total", "localchat_time_to_first_token_seconds_count",
               "localchat_time_per_output_token_seconds_count")
    shipped = 'localchat_sampler_replies_total{sampler="dry=1.2 top_k=40 top_p=0.9 min_p=0.05 temp=0.2"}'  # SmolLM2's defaults
    counted = (*counted, shipped)
    before = {name: server.metric(name) for name in counted}
    reply = server.client().completions.create(model=MODEL, prompt="Hello", max_tokens=5, extra_body={"ignore_eos": True})
    assert reply.usage is not None
    expected_increase = (1, 5, reply.usage.prompt_tokens, 1, 1, 1)
    assert [server.metric(name) - before[name] for name in counted] == list(expected_increase)
    assert server.metric("localchat_slots") == SLOTS
    text = requests.get(f"{server.url}/metrics", headers=server.auth, timeout=10).text
    assert "localchat_prefix_cache_hits_total" in text and "localchat_time_to_first_token_seconds_bucket" in text


def test_a_reply_copying_its_prompt_is_drafted_and_metrics_count_the_drafts(server: LiveServer) -> None:
    """Prompt lookup is on by default; llama.cpp's `repeat_penalty` and `dry_multiplier` turn the
    penalties off, which would otherwise push down the very tokens a copy repeats."""
    passage = "The keeper climbed the narrow stairs at dusk, trimmed the wick and polished the great lens."
    counted = ("localchat_draft_tokens_total", "localchat_draft_tokens_accepted_total")
    before = [server.metric(name) for name in counted]
    body = {"temperature": 0, "repeat_penalty": 1, "dry_multiplier": 0, "ignore_eos": True}
    reply = server.client().completions.create(model=MODEL, prompt=f"{passage}\n{passage}\n{passage}\nThe keeper",
                                               max_tokens=24, extra_body=body)
    assert reply.usage is not None and reply.usage.completion_tokens == 24
    drafted, accepted = (server.metric(name) - was for name, was in zip(counted, before, strict=True))
    assert drafted > 0 and 0 < accepted <= drafted
