"""OpenAI's Responses API (POST /v1/responses) through the real app, scheduler and templates over a scripted
model (scripted_app.py) that writes what Qwen 3 writes, driven by the openai client: reasoning and calls
as output items whole and streamed, input items rendered as the chat messages they mean, and the
request's own field names in its errors. The real model's replies: test_responses_api.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from chat_format_cases import QWEN3, QWEN3_CALLS, TIME_TOOL, TOOLS, TOOLS_QUESTION, WEATHER_TOOL
from fastapi.testclient import TestClient
from scripted_app import ScriptedBackend, scripted_client

from localchat.server.settings import ServerSettings

# The Responses API's flat function tools.
FLAT_TOOLS: Any = [{"type": "function", **tool["function"]} for tool in TOOLS]
THINK_THEN_ANSWER = "<think>\nShort one.\n</think>\n\nSunny, 24 degrees."
Scripted = tuple[openai.OpenAI, TestClient, ScriptedBackend]


@pytest.fixture
def qwen3(tmp_path: Path) -> Iterator[Scripted]:
    backend = ScriptedBackend(QWEN3)
    with scripted_client(backend, tmp_path, ServerSettings(max_reply_tokens=200)) as (client, http):
        yield client, http, backend


def _items(response: Any) -> list[tuple[Any, ...]]:
    """Each output item's kind and what it says, ids left out (they differ from reply to reply)."""
    said = []
    for item in response.output:
        if item.type == "reasoning":
            said.append(("reasoning", item.status, [part.text for part in item.content or ()]))
        elif item.type == "message":
            said.append(("message", item.status, [part.text for part in item.content]))
        else:
            said.append(("function_call", item.status, item.name, json.loads(item.arguments), item.call_id.startswith("call_")))
    return said


def test_reasoning_and_calls_are_output_items_whole_and_streamed(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.extend([QWEN3_CALLS] * 2)
    whole = client.responses.create(model="scripted", input=TOOLS_QUESTION, tools=FLAT_TOOLS)
    assert _items(whole) == [("reasoning", "completed", ["The user wants both."]),
                             ("function_call", "completed", "get_weather", {"city": "Zürich"}, True),
                             ("function_call", "completed", "get_time", {"city": "Zürich"}, True)]
    assert whole.status == "completed" and whole.output_text == ""
    # The SDK's stream helper puts the same items together from the events.
    with client.responses.stream(model="scripted", input=TOOLS_QUESTION, tools=FLAT_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert _items(final) == _items(whole)
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds.count("response.function_call_arguments.done") == 2 and kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_a_reasoning_reply_streams_its_thinking_then_its_answer(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.append(THINK_THEN_ANSWER)
    events = list(client.responses.create(model="scripted", input="Weather?", stream=True, reasoning={"effort": "low"}))
    kinds = [event.type for event in events]
    reasoning, answer = kinds.index("response.reasoning_text.done"), kinds.index("response.output_text.done")
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[reasoning:reasoning + 3] == ["response.reasoning_text.done", "response.content_part.done",
                                              "response.output_item.done"]
    assert kinds[reasoning + 3:reasoning + 5] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[answer:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                              "response.completed"]
    deltas = {kind: "".join(e.delta for e in events if e.type == kind)  # type: ignore[union-attr]
              for kind in ("response.reasoning_text.delta", "response.output_text.delta")}
    assert deltas == {"response.reasoning_text.delta": "Short one.", "response.output_text.delta": "Sunny, 24 degrees."}
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == "Sunny, 24 degrees." and completed.reasoning.effort == "low"
    assert [item.type for item in completed.output] == ["reasoning", "message"]


@pytest.mark.parametrize("thoughts", [["Both tools."], ["Both ", "tools."]], ids=["one reasoning item", "one before the calls too"])
def test_input_items_render_the_chat_messages_they_mean(qwen3: Scripted, thoughts: list[str]) -> None:
    """An earlier reply fed back as its items (reasoning, text, two calls) and the calls' results give the
    prompt its chat messages give /v1/chat/completions; the reasoning of one reply is its message's, in the
    order written, wherever its items stand."""
    client, http, backend = qwen3
    backend.replies.extend(["Done.", "Done."])
    weather = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}
    time = {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Bern"}'}}
    chat = [{"role": "system", "content": "Be brief."}, *TOOLS_QUESTION,
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "Both tools.", "tool_calls": [weather, time]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
            {"role": "tool", "tool_call_id": "call_2", "content": "Noon."}]
    items: Any = [
        TOOLS_QUESTION[0],
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": thoughts[0]}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]},
        *({"type": "reasoning", "id": f"rs_{n}", "summary": [], "content": [{"type": "reasoning_text", "text": thought}]}
          for n, thought in enumerate(thoughts[1:], start=2)),
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Bern"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "get_time", "arguments": '{"city": "Bern"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Noon."}]},
    ]
    assert http.post("/v1/chat/completions", json={"messages": chat, "tools": TOOLS}).status_code == 200
    response = client.responses.create(model="scripted", instructions="Be brief.", input=items, tools=FLAT_TOOLS)
    assert response.output_text == "Done."
    assert backend.prompts[-1] == backend.prompts[-2] and "Noon." in backend.prompts[-1]


def test_forced_and_single_calls(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.extend([QWEN3_CALLS, '{"city": "Bern"}'])
    single = client.responses.create(model="scripted", input=TOOLS_QUESTION, tools=FLAT_TOOLS, parallel_tool_calls=False)
    assert [item[:3] for item in _items(single)] == [("reasoning", "completed", ["The user wants both."]),
                                                     ("function_call", "completed", "get_weather")]
    named = client.responses.create(model="scripted", input=TOOLS_QUESTION, tools=FLAT_TOOLS,
                                    tool_choice={"type": "function", "name": "get_time"})
    assert _items(named) == [("function_call", "completed", "get_time", {"city": "Bern"}, True)]
    assert named.tool_choice.name == "get_time"  # type: ignore[union-attr]
    assert [tool.name for tool in named.tools] == ["get_weather", "get_time"]  # type: ignore[union-attr]


def test_max_output_tokens_cuts_the_reply_short(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.extend(["Sunny, 24 degrees."] * 2)
    cut = client.responses.create(model="scripted", input="Weather?", max_output_tokens=5)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == "Sunny" and _items(cut) == [("message", "incomplete", ["Sunny"])]
    assert cut.usage is not None and cut.usage.output_tokens == 5 and cut.max_output_tokens == 5
    events = list(client.responses.create(model="scripted", input="Weather?", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == "Sunny"  # type: ignore[union-attr]


def test_truncation_auto_drops_the_oldest_turns_and_disabled_refuses_in_the_requests_terms(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3, n_ctx=400)
    turns: Any = [{"role": role, "content": f"Turn {number}: " + "words " * 20}
                  for number in range(8) for role in ("user", "assistant")] + [{"role": "user", "content": "And now?"}]
    with scripted_client(backend, tmp_path) as (client, http):
        refused = http.post("/v1/responses", json={"input": turns})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "input", refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        backend.replies.append("Fine.")
        kept = client.responses.create(model="scripted", input=turns, truncation="auto")
    assert kept.output_text == "Fine." and "And now?" in backend.prompts[-1] and "Turn 0:" not in backend.prompts[-1]


def test_errors_name_the_responses_fields(qwen3: Scripted) -> None:
    """A field the chat path refuses is named as the Responses request has it."""
    _, http, _ = qwen3
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"max_output_tokens": 500}, "max_output_tokens", "max_output_tokens is 500 but this server allows at most 200"),
        ({"tools": FLAT_TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format",
         "text.format cannot constrain"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format",
         "text.format: "),
        ({"tools": [{"type": "function", **WEATHER_TOOL["function"]},
                    {"type": "function", **TIME_TOOL["function"], "name": "get_weather"}]},
         "tools", "two tools have the same name"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "get_time", "arguments": "[1]"}]}, "input.0.arguments",
         "input.0.arguments must be a JSON object"),
        ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Hm."}]}]}, "input",
         "no message to answer"),
    ]
    for body, param, message in cases:
        refused = http.post("/v1/responses", json={"input": "Hi", **body})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == param and message in error["message"], (body, refused.text)
