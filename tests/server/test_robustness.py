"""Bad requests get OpenAI-style 4xx errors, busy servers 503, gone clients cancel; nothing is lost."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests
from live_server import CONTEXT, QUEUE, SLOTS, LiveServer, start_server

from localchat.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
USER = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"messages": "hello"}, 400, None),
        ({"messages": []}, 400, None),
        ({"messages": [{"role": "pirate", "content": "arr"}]}, 400, None),
        ({"messages": USER, "temperature": "hot"}, 400, None),
        ({"messages": USER, "max_tokens": 0}, 400, None),
        ({"messages": USER, "n": 129}, 400, None),
        ({"messages": USER, "stop": [""]}, 400, None),
        ({"messages": USER, "model": "gpt-4o"}, 404, "model_not_found"),
        ({"messages": [{"role": "user", "content": "word " * CONTEXT}]}, 400, "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, 400, None),
    ],
)
def test_bad_chat_requests_get_a_4xx_with_an_openai_error(server: LiveServer, body: dict[str, object], status: int,
                                                          code: str | None) -> None:
    response = server.post("/v1/chat/completions", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code


def test_serve_s_max_reply_tokens_bounds_every_reply(tmp_path: Path, default_model: Path) -> None:
    """`--max-reply-tokens N`: OpenAI's limits over N are refused by name, a reply that names none ends at N,
    Ollama's num_predict is cut to N."""
    bounded = start_server(tmp_path, "-m", str(default_model), "--max-reply-tokens", "8")
    try:
        client = bounded.client()
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=9)
        assert refused.value.body["param"] == "max_completion_tokens"  # type: ignore[index]
        reply = client.chat.completions.create(model=MODEL, messages=USER, extra_body={"ignore_eos": True})
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        cut = bounded.post("/api/generate", {"model": MODEL, "prompt": "Hello", "stream": False,
                                             "options": {"num_predict": 50}}).json()
        assert cut["eval_count"] <= 8 and cut["done_reason"] in ("stop", "length")
    finally:
        bounded.stop()


def test_malformed_json_and_bad_tokens(server: LiveServer) -> None:
    headers = {**server.auth, "Content-Type": "application/json"}
    bad_json = requests.post(f"{server.url}/v1/chat/completions", data=b'{"messages": [', headers=headers, timeout=10)
    assert bad_json.status_code == 400 and bad_json.json()["error"]["message"]
    bad_token = server.post("/v1/completions", {"prompt": [10**9]})
    assert bad_token.status_code == 400
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x " * CONTEXT}])


def test_errors_name_what_was_wrong_and_where(server: LiveServer) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    refused = server.post("/v1/chat/completions", {"messages": parts}).json()["error"]
    assert refused["param"] == "messages.0.content" and "image parts are not supported" in refused["message"], refused
    for kind in (["image_url"], {"image_url": 1}):  # a type no part has: a 400, not a TypeError's 500
        odd = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": kind}]}]})
        assert odd.status_code == 400, odd.text
    headers = {**server.auth, "Content-Type": "application/json"}
    bad_json = requests.post(f"{server.url}/v1/chat/completions", data=b'{"messages": [', headers=headers, timeout=10).json()["error"]
    assert bad_json["param"] is None and "not valid JSON" in bad_json["message"] and "14" in bad_json["message"], bad_json
    too_long = server.post("/v1/completions", {"prompt": "word " * CONTEXT, "max_tokens": 1}).json()["error"]
    assert (too_long["code"], too_long["param"]) == ("context_length_exceeded", "prompt"), too_long


def test_a_client_that_disconnects_mid_stream_cancels_its_reply(server: LiveServer) -> None:
    cancelled = server.metric('localchat_replies_total{finish_reason="cancelled"}')
    body = {"prompt": "Tell me a very long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with server.post("/v1/completions", body, stream=True) as response:
        lines = response.iter_lines()
        for _ in range(5):
            next(lines)
    assert server.idle_within(20)  # 2000 tokens would have taken a minute
    assert server.metric('localchat_replies_total{finish_reason="cancelled"}') == cancelled + 1
    answer = server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=3)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_many_clients_are_each_answered_or_refused_with_503(server: LiveServer) -> None:
    """16 concurrent clients, 32 requests, against 4 slots and a queue of 4: none lost or hung."""
    client = server.client()

    def ask(i: int) -> str:
        try:
            if i % 2:
                stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Count to {i}."}],
                                                        max_tokens=12, stream=True, extra_body={"ignore_eos": True})
                return "ok" if sum(1 for c in stream if c.choices and c.choices[0].delta.content) > 0 else "empty"
            reply = client.completions.create(model=MODEL, prompt=f"Number {i} is", max_tokens=12, extra_body={"ignore_eos": True})
            return "ok" if reply.usage is not None and reply.usage.completion_tokens == 12 else "short"
        except openai.APIStatusError as error:
            assert error.status_code == 503 and error.response.headers["retry-after"].isdigit()
            return "busy"

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(ask, range(32), timeout=240))
    assert len(outcomes) == 32 and set(outcomes) <= {"ok", "busy"}, outcomes
    assert outcomes.count("ok") >= 8
    assert server.health() == {"status": "ok", "slots_idle": 4, "slots_processing": 0, "requests_waiting": 0}


def test_a_request_beyond_the_slots_and_the_queue_gets_503_with_retry_after(server: LiveServer) -> None:
    with server.busy(SLOTS, waiting=QUEUE):
        for prompt in ("One more", ["One more", "And another"]):  # a request's choices are queued whole or not at all
            with pytest.raises(openai.APIStatusError) as refused:
                server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=3)
            assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"].isdigit()
        assert server.health()["requests_waiting"] == QUEUE
    answer = server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=3)  # room again
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_a_resent_history_costs_only_its_new_tokens_whichever_slot_serves_it(server: LiveServer) -> None:
    client = server.client()
    history = [{"role": "system", "content": "You are a patient geography teacher. " * 10},
               {"role": "user", "content": "Name a river in Europe."}]
    first = client.chat.completions.create(model=MODEL, messages=history, max_tokens=16, temperature=0)
    assert first.usage is not None
    history += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                {"role": "user", "content": "And one in Asia?"}]
    # Other replies take every slot, the one holding this history included: it must come back from the prefix cache.
    with server.busy(SLOTS):
        pass
    hits = server.metric("localchat_prefix_cache_hits_total")
    second = client.chat.completions.create(model=MODEL, messages=history, max_tokens=16, temperature=0)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage, second.usage)
    assert second.usage.prompt_tokens - cached < 30
    assert server.metric("localchat_prefix_cache_hits_total") == hits + 1


def test_a_stopped_server_ends_the_replies_in_flight_and_keeps_its_prefix_cache(tmp_path: Path, default_model: Path) -> None:
    """The replies in flight end at once, each stream with an error its client raises (OpenAI's and Ollama's): a
    finish reason would make the text so far pass for the whole reply."""
    stopping = start_server(tmp_path, "-m", str(default_model))
    system = "You are the keeper of a lighthouse and answer questions about its history. " * 8  # over 64 tokens
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Tell a long story."}]
    openai_body = {"messages": messages, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    # Ollama has no ignore_eos: a schema holds its reply open for as long (llguidance keeps minLength).
    story = {"type": "object", "properties": {"story": {"type": "string", "minLength": 8000}}, "required": ["story"]}
    ollama_body = {"model": MODEL, "messages": messages, "options": {"num_predict": 2000}, "format": story}

    def stream(path: str, body: dict[str, object]) -> list[str]:
        with stopping.post(path, body, stream=True) as response:
            return [line.decode() for line in response.iter_lines() if line]

    with ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(stream, "/v1/chat/completions", openai_body), pool.submit(stream, "/api/chat", ollama_body)]
        while stopping.health()["slots_processing"] != 2:
            time.sleep(0.1)
        time.sleep(1)
        stopping.process.send_signal(signal.SIGTERM)  # what `kill` or a service manager sends
        openai_lines, ollama_lines = [future.result(timeout=30) for future in streams]
    assert stopping.process.wait(timeout=30) == 143  # 128 + SIGTERM, as a shell reports a killed command
    # Well before 2000 tokens: an error event (the openai client raises it), then [DONE]; no finish reason.
    assert openai_lines[-1] == "data: [DONE]" and len(openai_lines) < 1000
    error = json.loads(openai_lines[-2].removeprefix("data: "))["error"]
    assert "stopped before the reply ended" in error["message"] and error["type"] == "server_error"
    assert not any('"finish_reason":"' in line for line in openai_lines)
    # Ollama's stream: an error line (its client raises ResponseError), never a done one.
    assert "stopped before the reply ended" in json.loads(ollama_lines[-1])["error"] and len(ollama_lines) < 1000
    assert not any('"done":true' in line for line in ollama_lines)
    log = next(tmp_path.glob("serve-*.log")).read_text()
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log
    assert list((tmp_path / "cache" / "prefix-cache").glob("*.kv"))  # both conversations saved for later


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/api/embed"])
def test_half_a_surrogate_pair_is_read_as_the_replacement_character(server: LiveServer, path: str) -> None:
    """A JavaScript string cut through an emoji reaches JSON as a lone "\\ud83d", which no UTF-8
    encoder takes (llama.cpp's tokenizer wants UTF-8): read as U+FFFD, as Go's decoder reads it."""
    text = "Hi \\ud83d and \\ude00"
    body = {"/v1/chat/completions": f'{{"model": "{MODEL}", "max_tokens": 1, "messages": [{{"role": "user", "content": "{text}"}}]}}',
            "/api/chat": f'{{"model": "{MODEL}", "stream": false, "options": {{"num_predict": 1}}, '
                         f'"messages": [{{"role": "user", "content": "{text}"}}]}}',
            "/api/embed": f'{{"model": "{MODEL}", "input": "{text}"}}'}[path]
    response = requests.post(f"{server.url}{path}", data=body.encode(), headers=server.auth, timeout=60)
    assert response.status_code == 200, response.text
