"""Ollama's /api/chat and /api/generate through the real app, scheduler and templates over a
scripted model (scripted_app.py), driven by the `ollama` client: tool calls and thinking in
Ollama's shapes, a history in Ollama's shape rendered as the OpenAI one is, errors as Ollama
gives them, keep_alive and the debug render. In milliseconds; tests/server/test_ollama_api.py
runs the real model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from chat_format_cases import QWEN3, QWEN3_CALLS, TOOLS, TOOLS_QUESTION
from live_server import serving
from scripted_app import N_VOCAB, ScriptedBackend, scripted_app



@pytest.fixture
def qwen3(tmp_path: Path) -> Iterator[tuple[ollama.Client, ScriptedBackend, httpx.Client]]:
    """The app over a scripted Qwen 3 on loopback, the ollama client and a plain HTTP client."""
    backend = ScriptedBackend(QWEN3)
    with serving(scripted_app(backend, tmp_path)) as root:
        url = root.removesuffix("/v1")
        with httpx.Client(base_url=url, timeout=60) as http:
            yield ollama.Client(host=url, timeout=60), backend, http


def _calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(call.function.name, dict(call.function.arguments)) for call in message.tool_calls or ()]


def test_calls_and_thinking_come_back_in_ollamas_shape(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    client, backend, _ = qwen3
    backend.replies.extend([QWEN3_CALLS] * 2)
    whole = client.chat(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, think=True)
    assert whole.message.thinking == "The user wants both." and whole.message.content == ""
    assert _calls(whole.message) == [("get_weather", {"city": "Zürich"}), ("get_time", {"city": "Zürich"})]
    assert whole.done and whole.done_reason == "stop"
    assert "<tools>" in backend.prompts[-1] and '"name": "get_time"' in backend.prompts[-1]

    chunks = list(client.chat(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, think=True, stream=True))
    assert "".join(chunk.message.thinking or "" for chunk in chunks) == "The user wants both."
    assert [chunk.done for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    assert _calls(chunks[-1].message) == _calls(whole.message)
    assert chunks[-1].eval_count == whole.eval_count and (chunks[-1].total_duration or 0) > 0


def test_a_history_in_ollamas_shape_renders_as_the_openai_one(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    """Ollama's calls carry no ids and their arguments as objects, and its tool results name the
    tool: the prompt is the one the same history in OpenAI's shape gives (both sent as plain JSON:
    the ollama client would reorder the tools' schema keys)."""
    _, backend, http = qwen3
    backend.replies.extend(["Sunny, and it is noon.", "Sunny, and it is noon."])
    history: Any = [*TOOLS_QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        {"function": {"name": "get_time", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny"}]
    reply = http.post("/api/chat", json={"model": "scripted", "messages": history, "tools": TOOLS, "stream": False})
    assert reply.json()["message"] == {"role": "assistant", "content": "Sunny, and it is noon."}
    openai_history: Any = [*TOOLS_QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}},
        {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Zürich"}'}}]},
        {"role": "tool", "tool_call_id": "b", "content": "12:00"},
        {"role": "tool", "tool_call_id": "a", "content": "Sunny"}]
    assert http.post("/v1/chat/completions", json={"messages": openai_history, "tools": TOOLS}).status_code == 200
    assert backend.prompts[-2] == backend.prompts[-1]
    assert "<tool_response>\n12:00\n</tool_response>" in backend.prompts[-1]


def test_think_false_turns_the_templates_thinking_off(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    client, backend, _ = qwen3
    backend.replies.append("Hello.")
    assert client.chat(model="scripted", messages=TOOLS_QUESTION, think=False).message.content == "Hello."
    assert backend.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_format_holds_the_reply_to_json(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    """The stand-in model writes prose; the grammar holds it to the schema, as for response_format."""
    client, backend, _ = qwen3
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    backend.replies.extend(["Not JSON at all."] * 2)
    assert json.loads(client.chat(model="scripted", messages=TOOLS_QUESTION, format=schema).message.content or "") == {"city": ""}
    assert isinstance(json.loads(client.generate(model="scripted", prompt="x", format="json").response), dict)


def test_generate_is_a_chat_of_one_message_or_raw(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    client, backend, _ = qwen3
    backend.replies.extend(["Paris.", "Paris."])
    reply = client.generate(model="scripted", prompt="Capital of France?", system="Be brief.")
    assert reply.response == "Paris." and reply.done_reason == "stop"
    assert backend.prompts[-1].endswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
                                        "<|im_start|>assistant\n")
    streamed = list(client.generate(model="scripted", prompt="<raw>", raw=True, stream=True))
    assert "".join(part.response or "" for part in streamed) == "Paris." and backend.prompts[-1] == "<raw>"


def test_generate_goes_on_from_an_earlier_replys_context(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    """Ollama's deprecated context: the tokens of an exchange (prompt and reply), which a later generate
    goes on from (Ollama prepends them to its prompt); on the last line only, and never for a raw prompt."""
    client, backend, http = qwen3
    backend.replies.extend(["Ada.", "You are Ada.", "Who?", "Ada."])
    first = client.generate(model="scripted", prompt="I am Ada.")
    assert first.context is not None and len(first.context) == first.prompt_eval_count + (first.eval_count or 0)
    lines = list(client.generate(model="scripted", prompt="Who am I?", context=first.context, stream=True))
    assert [line.context is None for line in lines] == [True] * (len(lines) - 1) + [False]
    client.generate(model="scripted", prompt="Who am I?")  # the same turn alone
    # The first exchange, then the new turn as it renders alone.
    assert backend.prompts[1] == backend.prompts[0] + "Ada." + backend.prompts[2]
    second = lines[-1].context or []
    assert second[:len(first.context)] == first.context and len(second) > len(first.context)
    rendered = http.post("/api/generate", json={"model": "scripted", "prompt": "Who am I?", "context": first.context,
                                                "_debug_render_only": True}).json()["_debug_info"]["rendered_template"]
    assert rendered == backend.prompts[1]
    assert client.generate(model="scripted", prompt="x", raw=True).context is None


@pytest.mark.parametrize(("path", "body", "status", "error"), [
    ("/api/chat", {"model": "nope", "messages": TOOLS_QUESTION}, 404, "model 'nope' not found"),
    ("/api/chat", {"messages": TOOLS_QUESTION}, 400, "model is required"),
    ("/api/chat", {"model": "scripted", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400,
     "messages.0.images: localchat serves text models, which cannot read images; send text only"),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "options": {"typical_p": 0.5}}, 400,
     "options.typical_p: locally typical sampling is not supported by localchat; leave it out"),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "options": {"top_k": "many"}}, 400,
     'option "top_k" must be of type integer'),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "options": {"repeat_penalty": 0}}, 400,
     "options.repeat_penalty: 0 must be > 0 (1 turns it off)"),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "keep_alive": "soon"}, 400,
     'keep_alive: invalid duration "soon": give seconds or a duration such as "5m" or "1h30m"'),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "stream": "yes"}, 400, "stream: must be true or false"),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "format": "yaml"}, 400,
     'format: should be "json" or a JSON schema object'),
    ("/api/chat", {"model": "scripted", "messages": TOOLS_QUESTION, "think": "very"}, 400,
     'think: should be true, false, "low", "medium", "high" or "max"'),
    ("/api/embed", {"model": "scripted", "input": 5}, 400, "input: should be a string or a list of strings"),
    ("/api/chat", [1, 2], 400, "the body must be a JSON object"),
    ("/api/show", None, 400, "missing request body"),
    ("/api/copy", {"source": "scripted"}, 400, "destination is required"),
    ("/api/generate", {"model": "scripted", "prompt": "x", "suffix": "y"}, 400,
     "suffix: scripted has no fill-in-the-middle tokens (a code model such as Qwen2.5-Coder or CodeLlama has them); "
     "send the text before the gap alone as the prompt"),
    ("/api/generate", {"model": "scripted", "prompt": "x", "raw": True, "system": "s"}, 400,
     "raw mode does not support template, system, or context"),
    ("/api/generate", {"model": "scripted", "prompt": "x", "raw": True, "context": [1, 2]}, 400,
     "raw mode does not support template, system, or context"),
    ("/api/generate", {"model": "scripted", "prompt": "x", "context": [1, 10**9]}, 400,
     f"context: token ids must be in [0, {N_VOCAB}): send the context an earlier reply of this model gave"),
])
def test_errors_come_as_ollama_gives_them(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client], path: str,
                                          body: Any, status: int, error: str) -> None:
    _, _, http = qwen3
    response = http.post(path, json=body)
    assert (response.status_code, response.json()) == (status, {"error": error})


def test_unknown_fields_and_load_time_options_are_accepted_as_ollama_does(
        qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    client, backend, http = qwen3
    backend.replies.append("Fine.")
    body = {"model": "scripted", "messages": TOOLS_QUESTION, "stream": False, "some_future_field": 1,
            "options": {"num_ctx": 8192, "num_gpu": 99, "num_thread": 2, "typical_p": 1.0, "not_an_option": True}}
    assert http.post("/api/chat", json=body).json()["message"]["content"] == "Fine."
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="scripted", messages=TOOLS_QUESTION, options={"typical_p": 0.5})
    assert refused.value.status_code == 400 and "typical_p" in refused.value.error


def test_options_are_read_as_ollamas_llama_cpp_reads_them(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    """Past OpenAI's bounds: a temperature of 3, top_k -1 (no cut), a 64-bit seed (modulo 2**32), and the
    options today's Ollama ignores (it logs them); through chat, generate and raw generate alike."""
    client, backend, _ = qwen3
    options = {"temperature": 3, "top_k": -1, "seed": 2**40 + 9, "mirostat": 2, "tfs_z": 0.5, "penalize_newline": False}
    backend.replies.extend(["Fine."] * 3)
    assert client.chat(model="scripted", messages=TOOLS_QUESTION, options=options).message.content == "Fine."
    assert client.generate(model="scripted", prompt="Hi", options=options).response == "Fine."
    assert client.generate(model="scripted", prompt="Hi", raw=True, options=options).response == "Fine."
    assert [(s.temperature, s.top_k, s.seed) for s in backend.samplers] == [(3.0, 0, 9)] * 3


def test_empty_requests_load_and_keep_alive_0_unloads(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    client, _, http = qwen3
    loaded = client.chat(model="scripted:latest", messages=[])  # Ollama's name for a model without a tag
    assert loaded.done and loaded.done_reason == "load" and loaded.model == "scripted:latest"
    assert [model.model for model in client.ps().models] == ["scripted"]
    client.chat(model="scripted", messages=[], keep_alive=600)
    expires = client.ps().models[0].expires_at
    assert expires is not None and expires.year < 9999  # in ten minutes, not never
    unloaded = client.generate(model="scripted", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and client.ps().models == []
    assert http.get("/health").json()["slots_idle"] == 0  # no scheduler left


def test_the_debug_render_answers_the_prompt_only(qwen3: tuple[ollama.Client, ScriptedBackend, httpx.Client]) -> None:
    _, backend, http = qwen3
    body = {"model": "scripted", "messages": TOOLS_QUESTION, "_debug_render_only": True, "think": False}
    rendered = http.post("/api/chat", json=body).json()["_debug_info"]["rendered_template"]
    assert rendered.startswith("<|im_start|>user\nWeather and time in Zürich?") and backend.prompts == []
