"""What any HTTP client meets before a model answers, through the real app over a scripted model
(scripted_app.py), in process: bodies read as JSON whatever their Content-Type (as `curl -d` sends
them), which web pages may call the server, Ollama's liveness checks, model names as apps write them,
the body bound, the reply bound, and Ollama's way with a history too long for the context."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_format_cases import QWEN3
from fastapi.testclient import TestClient
from scripted_app import N_VOCAB, ScriptedBackend, scripted_client

from localchat.hardware import MIB
from localchat.server.settings import ServerSettings

HELLO = [{"role": "user", "content": "Hello"}]
OLLAMA_CHAT = {"model": "scripted", "messages": HELLO, "stream": False}
OPENAI_CHAT = {"model": "scripted", "messages": HELLO}


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[tuple[ScriptedBackend, TestClient]]:
    backend = ScriptedBackend(QWEN3)
    with scripted_client(backend, tmp_path, ServerSettings(cors_origins=("https://chat.example.org",))) as (_, http):
        yield backend, http


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
@pytest.mark.parametrize(("path", "body"), [("/api/chat", OLLAMA_CHAT), ("/v1/chat/completions", OPENAI_CHAT)])
def test_a_body_is_read_as_json_whatever_its_content_type(scripted: tuple[ScriptedBackend, TestClient], path: str,
                                                           body: dict[str, Any], content_type: str | None) -> None:
    backend, http = scripted
    backend.replies.append("Hi.")
    headers = {"Content-Type": content_type} if content_type else {}
    response = http.post(path, content=json.dumps(body).encode(), headers=headers)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert (reply["message"]["content"] if path.startswith("/api/") else reply["choices"][0]["message"]["content"]) == "Hi."


EMBEDDING_INPUTS = "input: should be a string, a list of strings, a list of token ids (integers >= 0) or a list of such lists, none empty"


@pytest.mark.parametrize(("path", "body", "param", "message"), [
    ("/v1/chat/completions", {**OPENAI_CHAT, "stop": list("abcde")}, "stop",
     "stop: should be a string or a list of at most 4 strings, none empty"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": [{"role": "user", "content": 5}]}, "messages.0.content",
     'messages.0.content: should be a string or a list of text parts ({"type": "text", "text": ...})'),
    # Content is required but on an assistant message that calls tools, as OpenAI has it (null or left out alike).
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": [{"role": "user", "content": None}]}, "messages.0.content",
     "messages.0.content: user messages need content (a string or a list of text parts)"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": [{"role": "system"}, *HELLO]}, "messages.0.content",
     "messages.0.content: system messages need content (a string or a list of text parts)"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": [{"role": "developer", "content": None}, *HELLO]},
     "messages.0.content", "messages.0.content: developer messages need content (a string or a list of text parts)"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": [*HELLO, {"role": "assistant", "content": None}, *HELLO]},
     "messages.1.content", "messages.1.content: assistant messages need content or tool_calls"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": [*HELLO, {"role": "tool", "content": None, "tool_call_id": "call_1"}]},
     "messages.1.content", "messages.1.content: tool messages need content (a string or a list of text parts)"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "tool_choice": "maybe"}, "tool_choice",
     'tool_choice: should be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'),
    ("/v1/embeddings", {"model": "scripted", "input": []}, "input", EMBEDDING_INPUTS),
    ("/v1/embeddings", {"model": "scripted", "input": [[-5]]}, "input", EMBEDDING_INPUTS),
    ("/infill", {"input_prefix": "def", "stop": [""]}, "stop", "stop: should be a string or a list of strings, none empty"),
    ("/v1/chat/completions", {"model": "scripted"}, "messages", "messages is required"),
    # Bounds, lengths and types in the words of the refusals above, not pydantic's ("Input should be ...").
    ("/v1/chat/completions", {**OPENAI_CHAT, "max_tokens": 0}, "max_tokens", "max_tokens: must be at least 1"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "n": 129}, "n", "n: must be at most 128"),
    ("/v1/chat/completions", {**OPENAI_CHAT, "messages": []}, "messages", "messages: must not be empty"),
    ("/detokenize", {"tokens": "abc"}, "tokens", "tokens: must be a list"),
    ("/v1/chat/completions", None, None, "missing request body"),
    ("/v1/chat/completions", [1, 2], None, "the body must be a JSON object"),
])
def test_a_refused_field_is_named_with_what_it_takes(scripted: tuple[ScriptedBackend, TestClient], path: str, body: Any,
                                                     param: str | None, message: str) -> None:
    """What pydantic refused, in the API's words: no union's branch tags ("constrained-str", "list[int]")."""
    _, http = scripted
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {"message": message, "type": "invalid_request_error", "param": param, "code": None}


def test_pages_of_other_sites_are_refused_and_local_ones_allowed(scripted: tuple[ScriptedBackend, TestClient]) -> None:
    backend, http = scripted
    backend.replies.extend(["One.", "Two."])
    # A form posted from another site's page, which a browser sends without asking first.
    refused = http.post("/api/chat", json=OLLAMA_CHAT, headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403 and "--cors-origin https://evil.example" in refused.json()["error"]
    assert backend.prompts == []
    openai_refused = http.post("/v1/chat/completions", json=OPENAI_CHAT, headers={"Origin": "https://evil.example"})
    assert openai_refused.status_code == 403 and openai_refused.json()["error"]["code"] == "origin_not_allowed"
    for origin in ("http://localhost:3000", "https://chat.example.org"):  # a local page; one --cors-origin allows
        answered = http.post("/api/chat", json=OLLAMA_CHAT, headers={"Origin": origin})
        assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == origin
    # The preflight of a DELETE with the headers OpenAI's JavaScript client adds, from a desktop app's shell.
    preflight = http.options("/api/delete", headers={"Origin": "tauri://localhost", "Access-Control-Request-Method": "DELETE",
                                                     "Access-Control-Request-Headers": "content-type, x-stainless-os"})
    assert preflight.status_code == 200 and "DELETE" in preflight.headers["access-control-allow-methods"]
    assert "x-stainless-os" in preflight.headers["access-control-allow-headers"]
    other = http.options("/api/chat", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # The server's own pages (its host, as on a LAN address) are no other site.
    own = http.get("/api/version", headers={"Origin": "http://testserver"})
    assert own.status_code == 200


def test_cors_origin_star_lets_any_page_call(tmp_path: Path) -> None:
    with scripted_client(ScriptedBackend(QWEN3), tmp_path, ServerSettings(cors_origins=("*",))) as (_, http):
        answered = http.get("/api/version", headers={"Origin": "https://any.example"})
        assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == "https://any.example"


def test_ollamas_liveness_checks_are_answered(scripted: tuple[ScriptedBackend, TestClient]) -> None:
    _, http = scripted
    root = http.get("/")
    assert (root.status_code, root.text) == (200, "Ollama is running")
    for path in ("/", "/api/version", "/api/tags"):  # Ollama's command-line client sends HEAD / first
        assert http.head(path).status_code == 200


def test_model_names_are_read_as_apps_write_them(scripted: tuple[ScriptedBackend, TestClient]) -> None:
    backend, http = scripted
    backend.replies.extend(["One.", "Two.", "Three."])
    for path, body in [("/api/chat", {**OLLAMA_CHAT, "model": "Scripted"}),
                       ("/v1/chat/completions", {**OPENAI_CHAT, "model": "scripted:latest"}),
                       ("/api/generate", {"model": "SCRIPTED:latest", "prompt": "Hello", "stream": False})]:
        assert http.post(path, json=body).status_code == 200, (path, body)
    card = http.get("/v1/models/Scripted:latest")
    assert card.status_code == 200 and card.json()["id"] == "scripted" and card.json()["object"] == "model"
    missing = http.get("/v1/models/gpt-4o")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_ollamas_nulls_durations_and_reply_lengths_are_read_as_ollama_reads_them(
        scripted: tuple[ScriptedBackend, TestClient]) -> None:
    backend, http = scripted
    backend.replies.extend(["Called.", "Long."])
    # null is unset, as Go's decoder leaves it: an assistant message of calls converted from OpenAI's shape.
    history = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
               {"role": "tool", "content": "42"}]
    called = http.post("/api/chat", json={**OLLAMA_CHAT, "messages": history, "stream": None, "keep_alive": None})
    assert called.status_code == 200 and called.text.count("\n") > 1  # stream: null streams, as Ollama's default
    # More tokens than the server allows are cut to its bound, and a keep_alive past any date is for ever.
    long = http.post("/api/chat", json={**OLLAMA_CHAT, "options": {"num_predict": 10**6}, "keep_alive": "100000000h"})
    assert long.status_code == 200 and long.json()["message"]["content"] == "Long."
    running = http.get("/api/ps")
    assert running.status_code == 200 and running.json()["models"][0]["expires_at"].startswith("9999")  # never


def test_openais_nulls_and_seeds_are_read_as_openai_and_llama_server_read_them(
        scripted: tuple[ScriptedBackend, TestClient]) -> None:
    backend, http = scripted
    backend.replies.extend(["One.", "Two.", "Three."])
    # The openai client sends null for an argument given as None: the default, as OpenAI reads it.
    nulls = {"presence_penalty": None, "frequency_penalty": None, "n": None, "logprobs": None, "stream": None, "seed": None}
    for body in (nulls, {"seed": -1}, {"seed": 2**40 + 7}):  # llama-server's random seed; OpenAI's 64-bit ones
        answered = http.post("/v1/chat/completions", json={**OPENAI_CHAT, **body})
        assert answered.status_code == 200, (body, answered.text)
    huge = http.post("/v1/chat/completions", json={**OPENAI_CHAT, "top_k": 2**63})
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "top_k"


def test_logit_bias_reaches_the_sampler_by_token_id_and_a_bad_one_is_a_400_naming_it(
        scripted: tuple[ScriptedBackend, TestClient]) -> None:
    """OpenAI's form alone: token ids as keys, biases in [-100, 100]; llama-server's list form, text keys and
    false (a ban) are refused, as are ids the model does not have. Ollama's API has no logit_bias."""
    backend, http = scripted
    backend.replies.extend(["One.", "Two.", "Three."])
    asked = {"logit_bias": {"105": -100, "0": 2.5, "200": 100}}
    for path, body in (("/v1/chat/completions", OPENAI_CHAT), ("/v1/completions", {"model": "scripted", "prompt": "Go"})):
        assert http.post(path, json={**body, **asked}).status_code == 200
        assert backend.samplers[-1].logit_bias == ((0, 2.5), (105, -100.0), (200, 100.0))
    assert http.post("/v1/chat/completions", json={**OPENAI_CHAT, "logit_bias": {}}).status_code == 200
    assert backend.samplers[-1].logit_bias == ()
    for bias, param, message in (
        ({"105": 101}, "logit_bias.105", "must be at most 100"),
        ({"105": -100.5}, "logit_bias.105", "must be at least -100"),
        ({"105": False}, "logit_bias.105", "must be a number"),
        ({"Hello": -100}, "logit_bias", 'keys must be token ids, e.g. "50256", not "Hello"'),
        ({"-1": 5}, "logit_bias", 'keys must be token ids, e.g. "50256", not "-1"'),
        ([[105, -100]], "logit_bias", 'must be an object from token ids to biases, e.g. {"50256": -100}'),
        ({str(N_VOCAB): 5}, "logit_bias", f"token {N_VOCAB} is not in the model's vocabulary (ids 0 to {N_VOCAB - 1})"),
    ):
        for path, body in (("/v1/chat/completions", OPENAI_CHAT), ("/v1/completions", {"model": "scripted", "prompt": "Go"})):
            refused = http.post(path, json={**body, "logit_bias": bias})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
            assert refused.json()["error"]["message"] == f"{param}: {message}"
    assert len(backend.replies) == 0


def test_a_body_over_the_bound_is_refused_and_the_bound_fits_a_batch_of_documents(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3)
    with scripted_client(backend, tmp_path, ServerSettings(max_body_bytes=MIB)) as (_, http):
        huge = http.post("/v1/completions", content=b'{"prompt": "' + b"a" * (2 * MIB) + b'"}')
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
    assert ServerSettings().max_body_bytes >= 32 * MIB  # LangChain embeds a document set in one request


def test_a_reply_ends_where_the_context_does_unless_the_server_sets_a_bound(tmp_path: Path) -> None:
    """llama-server's n_predict and Ollama's num_predict are -1 unless set: a reply that names no limit goes
    on to the end of the context (here its end of text comes first, after 5000 tokens)."""
    backend = ScriptedBackend(QWEN3, n_ctx=6000)  # characters are tokens
    with scripted_client(backend, tmp_path) as (_, http):
        backend.replies.extend(["x" * 5000, "x" * 5000])
        completion = http.post("/v1/completions", json={"model": "scripted", "prompt": "Go"}).json()
        assert (completion["usage"]["completion_tokens"], completion["choices"][0]["finish_reason"]) == (5000, "stop")
        chat = http.post("/api/chat", json={**OLLAMA_CHAT, "options": {"num_predict": -1}}).json()
        assert (chat["eval_count"], chat["done_reason"]) == (5000, "stop")


def test_the_server_s_reply_bound_refuses_openai_s_limits_over_it_by_their_names_and_cuts_ollama_s(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3)
    with scripted_client(backend, tmp_path, ServerSettings(max_reply_tokens=8)) as (_, http):
        for field in ("max_tokens", "max_completion_tokens"):
            refused = http.post("/v1/chat/completions", json={**OPENAI_CHAT, field: 9})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field
            assert refused.json()["error"]["message"] == f"{field} is 9 but this server allows at most 8"
        backend.replies.extend(["x" * 20, "x" * 20])
        unnamed = http.post("/v1/chat/completions", json=OPENAI_CHAT).json()
        assert (unnamed["usage"]["completion_tokens"], unnamed["choices"][0]["finish_reason"]) == (8, "length")
        cut = http.post("/api/chat", json={**OLLAMA_CHAT, "options": {"num_predict": 50}}).json()
        assert (cut["eval_count"], cut["done_reason"]) == (8, "length")
    assert backend.replies == deque()  # each refused request reached no model


def test_a_history_too_long_for_the_context_loses_its_oldest_turns_on_ollamas_api(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3, n_ctx=400)  # characters are tokens
    turns: list[dict[str, Any]] = []
    for number in range(6):
        turns += [{"role": "user", "content": f"Question {number}: " + "x" * 40},
                  {"role": "assistant", "content": f"Answer {number}."}]
    history = [{"role": "system", "content": "Be brief."}, *turns, {"role": "user", "content": "Last question?"}]
    with scripted_client(backend, tmp_path) as (_, http):
        backend.replies.append("Fine.")
        answered = http.post("/api/chat", json={**OLLAMA_CHAT, "messages": history, "options": {"num_predict": 20}})
        assert answered.status_code == 200, answered.text
        prompt = backend.prompts[-1]
        assert len(prompt) + 20 <= 400 and "Be brief." in prompt and "Last question?" in prompt
        assert "Question 0" not in prompt and "Question 5" in prompt
        kept = prompt[prompt.index("Be brief."):]
        assert kept.index("<|im_start|>user") < kept.index("<|im_start|>assistant")  # it starts with a user turn
        refused = http.post("/api/chat", json={**OLLAMA_CHAT, "messages": history, "truncate": False,
                                               "options": {"num_predict": 20}})
        assert refused.status_code == 400 and "context" in refused.json()["error"]
        openai = http.post("/v1/chat/completions", json={**OPENAI_CHAT, "messages": history, "max_tokens": 20})
        assert openai.status_code == 400  # OpenAI's API and llama-server refuse it whole
