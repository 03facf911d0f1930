"""Anthropic's Messages API (POST /v1/messages) through the real app, scheduler and templates over a scripted model
(scripted_app.py) that writes what Qwen 3 writes, on loopback, driven by the anthropic client: thinking and calls
as content blocks whole and streamed, in the event order the SDK reads, a conversation's blocks rendered as the
chat messages they mean, stop sequences, the server's reply bound, and errors in Anthropic's shape naming the
request's own fields. The real model's replies: test_anthropic_api.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from chat_format_cases import QWEN3, QWEN3_CALLS, TOOLS, TOOLS_QUESTION
from live_server import serving
from scripted_app import ScriptedBackend, scripted_app

from localchat.server.settings import ServerSettings

REPLY_BOUND = 200
# Anthropic's custom tools: name, description, input_schema.
CUSTOM_TOOLS: Any = [{"name": tool["function"]["name"], "description": tool["function"]["description"],
                      "input_schema": tool["function"]["parameters"]} for tool in TOOLS]
THINK_THEN_ANSWER = "<think>\nShort one.\n</think>\n\nSunny, 24 degrees."
Scripted = tuple[anthropic.Anthropic, httpx.Client, ScriptedBackend]


@pytest.fixture
def qwen3(tmp_path: Path) -> Iterator[Scripted]:
    backend = ScriptedBackend(QWEN3)
    with serving(scripted_app(backend, tmp_path, ServerSettings(max_reply_tokens=REPLY_BOUND))) as root:
        url = root.removesuffix("/v1")
        with httpx.Client(base_url=url, timeout=60) as http:
            yield anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=60), http, backend


def _blocks(message: Any) -> list[tuple[Any, ...]]:
    """Each content block's kind and what it says, call ids left out (they differ from reply to reply)."""
    said = []
    for block in message.content:
        if block.type == "thinking":
            said.append(("thinking", block.thinking))
        elif block.type == "text":
            said.append(("text", block.text))
        else:
            said.append(("tool_use", block.name, block.input, block.id.startswith("call_")))
    return said


def test_thinking_and_calls_are_content_blocks_whole_and_streamed(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.extend([QWEN3_CALLS] * 2)
    whole = client.messages.create(model="scripted", max_tokens=1000, messages=TOOLS_QUESTION, tools=CUSTOM_TOOLS)
    assert _blocks(whole) == [("thinking", "The user wants both."), ("tool_use", "get_weather", {"city": "Zürich"}, True),
                              ("tool_use", "get_time", {"city": "Zürich"}, True)]
    assert whole.stop_reason == "tool_use" and whole.stop_sequence is None and whole.id.startswith("msg_")
    assert whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) == len(backend.prompts[-1])
    # The SDK's stream helper puts the same blocks together from the events, each block's events by its index.
    with client.messages.stream(model="scripted", max_tokens=1000, messages=TOOLS_QUESTION, tools=CUSTOM_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(whole) and final.stop_reason == "tool_use"
    assert final.usage.output_tokens == whole.usage.output_tokens
    kinds = [event.type for event in events if not event.type.endswith(("thinking", "input_json"))]  # the SDK's own
    collapsed = [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]
    assert collapsed == ["message_start", *["content_block_start", "content_block_delta", "content_block_stop"] * 3,
                         "message_delta", "message_stop"]
    starts = [event.index for event in events if event.type == "content_block_start"]  # type: ignore[union-attr]
    stops = [event.index for event in events if event.type == "content_block_stop"]  # type: ignore[union-attr]
    assert starts == stops == [0, 1, 2]


def test_a_thinking_reply_streams_its_thinking_then_its_text(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.append(THINK_THEN_ANSWER)
    events = list(client.messages.create(model="scripted", max_tokens=100, messages=[{"role": "user", "content": "Weather?"}],
                                         stream=True))
    deltas = [(event.index, event.delta.type) for event in events if event.type == "content_block_delta"]  # type: ignore[union-attr]
    assert sorted(set(deltas)) == [(0, "thinking_delta"), (1, "text_delta")]
    texts = {kind: "".join(getattr(e.delta, kind) for e in events if e.type == "content_block_delta"  # type: ignore[union-attr]
                           and e.delta.type == f"{kind}_delta") for kind in ("thinking", "text")}  # type: ignore[union-attr]
    assert texts == {"thinking": "Short one.", "text": "Sunny, 24 degrees."}
    assert events[-2].type == "message_delta" and events[-2].delta.stop_reason == "end_turn"  # type: ignore[union-attr]


def test_a_conversations_blocks_render_the_chat_messages_they_mean(qwen3: Scripted) -> None:
    """An earlier reply fed back as its blocks (thinking, text, two calls) and the calls' results give the prompt
    its chat messages give /v1/chat/completions; system blocks and a list of text blocks read as text parts."""
    client, http, backend = qwen3
    backend.replies.extend(["Done.", "Done."])
    weather = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}
    time = {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Bern"}'}}
    chat = [{"role": "system", "content": "Be brief. Be kind."}, *TOOLS_QUESTION,
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "Both tools.", "tool_calls": [weather, time]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
            {"role": "tool", "tool_call_id": "call_2", "content": "Noon."},
            {"role": "user", "content": "Thanks. And tomorrow?"}]
    messages: Any = [
        TOOLS_QUESTION[0],
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Both tools.", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Bern"}},
            {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {"city": "Bern"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "Sunny.", "cache_control": {"type": "ephemeral"}},
            {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "Noon."}]},
            {"type": "text", "text": "Thanks."}, {"type": "text", "text": " And tomorrow?"}]},
    ]
    assert http.post("/v1/chat/completions", json={"messages": chat, "tools": TOOLS}).status_code == 200
    system: Any = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Be kind.", "cache_control": {"type": "ephemeral"}}]
    reply = client.messages.create(model="scripted", max_tokens=100, system=system, messages=messages, tools=CUSTOM_TOOLS,
                                   metadata={"user_id": "someone"})
    assert _blocks(reply) == [("text", "Done.")] and reply.stop_reason == "end_turn"
    assert backend.prompts[-1] == backend.prompts[-2] and "Noon." in backend.prompts[-1]
    counted = client.messages.count_tokens(model="scripted", system=system, messages=messages, tools=CUSTOM_TOOLS)
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)


def test_tool_choice_and_thinking_reach_the_prompt(qwen3: Scripted) -> None:
    client, _, backend = qwen3
    backend.replies.extend([QWEN3_CALLS, '{"city": "Bern"}', "Fine.", "Fine."])
    single = client.messages.create(model="scripted", max_tokens=1000, messages=TOOLS_QUESTION, tools=CUSTOM_TOOLS,
                                    tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [block[:2] for block in _blocks(single)] == [("thinking", "The user wants both."), ("tool_use", "get_weather")]
    named = client.messages.create(model="scripted", max_tokens=1000, messages=TOOLS_QUESTION, tools=CUSTOM_TOOLS,
                                   tool_choice={"type": "tool", "name": "get_time"})
    assert _blocks(named) == [("tool_use", "get_time", {"city": "Bern"}, True)] and named.stop_reason == "tool_use"
    client.messages.create(model="scripted", max_tokens=100, messages=TOOLS_QUESTION, tools=CUSTOM_TOOLS,
                           tool_choice={"type": "none"}, thinking={"type": "disabled"})
    assert "<tools>" not in backend.prompts[-1] and backend.prompts[-1].endswith("<think>\n\n</think>\n\n")
    client.messages.create(model="scripted", max_tokens=100, messages=TOOLS_QUESTION,
                           thinking={"type": "enabled", "budget_tokens": 2048})
    assert backend.prompts[-1].endswith("<|im_start|>assistant\n")


def test_stop_sequences_and_the_servers_reply_bound(qwen3: Scripted) -> None:
    """Stop sequences stop the reply and are named (more than OpenAI's four); a max_tokens over the server's bound
    is cut to it, as Ollama cuts num_predict."""
    client, _, backend = qwen3
    backend.replies.extend(["Sunny, 24 degrees. STOP Rain later."] * 2 + ["word " * REPLY_BOUND])
    stops = ["never", "nor this", "nor that", "no", "STOP"]
    ask: Any = {"model": "scripted", "max_tokens": 100, "messages": [{"role": "user", "content": "Weather?"}]}
    stopped = client.messages.create(**ask, stop_sequences=stops)
    assert (stopped.stop_reason, stopped.stop_sequence, _blocks(stopped)) == ("stop_sequence", "STOP",
                                                                               [("text", "Sunny, 24 degrees. ")])
    with client.messages.stream(**ask, stop_sequences=stops) as stream:
        assert "".join(stream.text_stream) == "Sunny, 24 degrees. "
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "STOP")
    cut = client.messages.create(**{**ask, "max_tokens": 64000})
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == REPLY_BOUND


def test_a_prompt_longer_than_the_context_is_too_long(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3, n_ctx=200)
    with serving(scripted_app(backend, tmp_path)) as root:
        refused = httpx.post(f"{root.removesuffix('/v1')}/v1/messages", timeout=60, json={
            "model": "scripted", "max_tokens": 10, "messages": [{"role": "user", "content": "words " * 100}]})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"].startswith("prompt is too long: ")


def test_errors_name_the_messages_fields(qwen3: Scripted) -> None:
    """A field the chat path refuses is named as the Messages request has it, in Anthropic's error shape."""
    _, http, _ = qwen3
    cases: list[tuple[dict[str, Any], str]] = [
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}}, "output_config.format: "),
        ({"tools": CUSTOM_TOOLS, "tool_choice": {"type": "any"},
          "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
         "output_config.format cannot constrain"),
        ({"tools": [CUSTOM_TOOLS[0], {**CUSTOM_TOOLS[1], "name": "get_weather"}]}, "tools: two tools have the same name"),
        ({"tools": CUSTOM_TOOLS, "tool_choice": {"type": "tool", "name": "get_news"}}, "tool_choice names the function 'get_news'"),
        ({"tool_choice": {"type": "any"}}, "tool_choice asks for a tool call but the request has no tools"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "c", "name": "get_time", "input": {}}]}]},
         "messages.0.content.0: a tool_use block goes in an assistant message, not the user's"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "1"}]},
                       {"role": "user", "content": "Hi"}]},
         "messages.0.content.0: a tool_result block goes in a user message, not the assistant's"),
    ]
    for body, message in cases:
        refused = http.post("/v1/messages", json={"model": "scripted", "max_tokens": 10,
                                                  "messages": [{"role": "user", "content": "Hi"}], **body})
        error = refused.json()
        assert refused.status_code == 400 and error["type"] == "error", (body, refused.text)
        assert error["error"]["type"] == "invalid_request_error" and message in error["error"]["message"], (body, error)
