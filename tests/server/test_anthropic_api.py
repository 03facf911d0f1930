"""Anthropic's Messages API (POST /v1/messages) on the real server and default model, driven by the anthropic client
as Claude Code drives it: the reply /v1/chat/completions gives the same conversation, whole and streamed as the
events the SDK reads, max_tokens and stop sequences, a forced tool call and its result fed back, count_tokens, the
key as x-api-key, and what the server refuses, each named in Anthropic's error shape."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
import requests
from greedy_paths import assert_same_text_until_near_tie
from live_server import API_KEY, LiveServer

from localchat.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
SYSTEM = "You answer in one short sentence."
QUESTION = "What is the capital of Japan?"  # no near tie in the chat model's answer (test_api.py)
ASK: Any = [{"role": "user", "content": QUESTION}]
CHAT = [{"role": "system", "content": SYSTEM}, *ASK]
WEATHER: Any = {"name": "get_weather", "description": "The current weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                                 "additionalProperties": False}}
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
# The anthropic package (2.x) has no sampler arguments; Claude Code and other clients send them in the body.
GREEDY = {"temperature": 0}
# The events of a reply that is one text block, runs of deltas written once.
TEXT_EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
               "message_stop"]


def _client(server: LiveServer) -> anthropic.Anthropic:
    # No retries: a 5xx must reach the test as it reached the client.
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def _prompt_tokens(usage: Any) -> int:
    """The prompt's tokens, as Anthropic splits them: evaluated, and read from the cache."""
    return int(usage.input_tokens + (usage.cache_read_input_tokens or 0))


def _collapsed(kinds: list[str]) -> list[str]:
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def test_a_message_is_the_chat_reply_whole_and_streamed(server: LiveServer) -> None:
    """Same prompt (its token count), same sampler, same path through the scheduler: the same text up to the chat
    reply's first near tie (a later request reuses an earlier one's KV cache: tests/greedy_paths.py)."""
    chat = server.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0, logprobs=True,
                                                   top_logprobs=2)
    assert chat.usage is not None and chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content is not None
    reference = chat.choices[0].logprobs.content
    client = _client(server)
    whole = client.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=24, extra_body=GREEDY,
                                   metadata={"user_id": "test"})
    assert whole.type == "message" and whole.id.startswith("msg_") and whole.model == MODEL and whole.role == "assistant"
    assert _prompt_tokens(whole.usage) == chat.usage.prompt_tokens
    assert [block.type for block in whole.content] == ["text"]
    text = whole.content[0].text  # type: ignore[union-attr]
    compared = assert_same_text_until_near_tie(reference, text, min_compared=4)
    if compared == len(reference) and whole.usage.output_tokens == chat.usage.completion_tokens:  # no near tie: the same reply
        assert text == chat.choices[0].message.content
        assert whole.stop_reason == ("max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn")

    with client.messages.stream(model=MODEL, system=[{"type": "text", "text": SYSTEM}], messages=ASK, max_tokens=24,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert_same_text_until_near_tie(reference, streamed, min_compared=4)
    assert final.content[0].text == streamed and _prompt_tokens(final.usage) == chat.usage.prompt_tokens  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_a_stream_is_the_event_sequence_the_sdk_reads(server: LiveServer) -> None:
    events = list(_client(server).messages.create(model=MODEL, messages=ASK, max_tokens=64, extra_body=GREEDY, stream=True))
    assert _collapsed([event.type for event in events]) == TEXT_EVENTS
    start, delta = events[0], events[-2]
    assert start.type == "message_start" and start.message.content == [] and start.message.stop_reason is None
    assert delta.type == "message_delta" and delta.delta.stop_reason == "end_turn" and delta.usage.output_tokens > 0
    # Server-sent events as Anthropic writes them: each names its type.
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, "temperature": 0, "stream": True}
    with server.post("/v1/messages", body, stream=True) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines(decode_unicode=True) if line]
    names, data = lines[0::2], lines[1::2]
    assert all(name.startswith("event: ") for name in names) and all(line.startswith("data: ") for line in data)
    assert [name[7:] for name in names] == [json.loads(line[6:])["type"] for line in data]
    assert json.loads(data[-2][6:])["delta"]["stop_reason"] == "max_tokens"


def test_max_tokens_and_stop_sequences_say_why_the_reply_stopped(server: LiveServer) -> None:
    client = _client(server)
    asked: Any = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
                  "extra_body": GREEDY}
    free = client.messages.create(**asked, max_tokens=30)
    assert free.stop_reason == "max_tokens" and free.usage.output_tokens == 30 and free.stop_sequence is None
    text = free.content[0].text  # type: ignore[union-attr]
    stop = text.split()[3]  # a word the greedy reply writes early
    stopped = client.messages.create(**asked, max_tokens=30, stop_sequences=["never written", stop])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    cut = stopped.content[0].text  # type: ignore[union-attr]
    assert text.startswith(cut) and stop not in cut
    with client.messages.stream(**asked, max_tokens=30, stop_sequences=[stop]) as stream:
        assert "".join(stream.text_stream) == cut
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_a_client_that_leaves_mid_stream_cancels_its_reply(server: LiveServer) -> None:
    cancelled = server.metric('localchat_replies_total{finish_reason="cancelled"}')
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}], "max_tokens": 2000,
            "stream": True}
    with server.post("/v1/messages", body, stream=True) as response:
        lines = response.iter_lines()
        for _ in range(8):  # message_start, the block's start, a few deltas
            next(lines)
    assert server.idle_within(20)
    assert server.metric('localchat_replies_total{finish_reason="cancelled"}') == cancelled + 1


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_a_tool_call_and_its_result_round_trip(server: LiveServer, choice: Any) -> None:
    """The model calls the tool (forced); its tool_use block and the tool's result go back as messages, and the
    server renders them as the chat messages they mean: the prompt /v1/chat/completions gets from those."""
    client = _client(server)
    first = client.messages.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice=choice, max_tokens=60,
                                   extra_body=GREEDY)
    assert first.stop_reason == "tool_use" and [block.type for block in first.content] == ["tool_use"], first
    call = first.content[0]
    assert call.type == "tool_use" and call.name == "get_weather" and list(call.input) == ["city"] and call.id
    with client.messages.stream(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice=choice, max_tokens=60,
                                extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream if event.type not in ("input_json", "text")]  # the SDK's own events
        streamed = stream.get_final_message()
    assert [(block.name, block.input) for block in streamed.content] == [(call.name, call.input)]  # type: ignore[union-attr]
    assert _collapsed(kinds) == TEXT_EVENTS and streamed.stop_reason == "tool_use"

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 degrees."}
    history: Any = [*ASK_WEATHER, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    second = client.messages.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=24, extra_body=GREEDY)
    tool_calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}}]
    chat_messages: Any = [*ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": tool_calls},
                          {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."}]
    chat_tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                  "parameters": WEATHER["input_schema"]}}
    chat = server.client().chat.completions.create(model=MODEL, messages=chat_messages, tools=[chat_tool], max_tokens=24,
                                                   temperature=0)
    assert chat.usage is not None and _prompt_tokens(second.usage) == chat.usage.prompt_tokens
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content
    counted = client.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_the_key_may_come_as_x_api_key(server: LiveServer) -> None:
    """Claude Code and older anthropic packages send the key as x-api-key; this package sends it as a bearer token."""
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    url = f"{server.url}/v1/messages"
    answered = requests.post(url, json=body, headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}, timeout=120)
    assert answered.status_code == 200 and answered.json()["type"] == "message"
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
        refused = requests.post(url, json=body, headers=headers, timeout=120)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, auth_token="wrong", max_retries=0).messages.create(
            model=MODEL, messages=ASK, max_tokens=2)


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": None}, "max_tokens is required"),
    ({"temperature": 1.5}, "temperature: must be at most 1"),
    ({"container": "container_123"}, "container is not supported by localchat (code execution containers are Anthropic's"),
    ({"mcp_servers": [{"type": "url", "url": "https://example.com/sse", "name": "x"}]}, "mcp_servers is not supported"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]},
     "web_search_20250305 is one of Anthropic's server tools"),
    ({"tool_choice": {"type": "auto_x"}}, "auto_x is not a choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                               "data": "iVBORw0KGgo="}}]}]},
     "image blocks are not supported: this server reads text only"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                                                  "data": "Hi"}}]}]},
     "document blocks are not supported"),
    ({"messages": [*ASK, {"role": "assistant", "content": "The capital is"}]},
     "messages.1: the conversation ends with the assistant's message"),
    ({"system": [{"type": "image", "source": {}}]}, "system: block 0: image blocks are not supported"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content: a message needs content"),
]


@pytest.mark.parametrize(("body", "message"), REFUSED, ids=[case[1].split(":")[0].split(" ")[0] for case in REFUSED])
def test_what_the_server_cannot_honour_is_refused_by_name(server: LiveServer, body: dict[str, Any], message: str) -> None:
    request = {"model": MODEL, "messages": ASK, "max_tokens": 8, **body}
    refused = server.post("/v1/messages", {key: value for key, value in request.items() if value is not None})
    error = refused.json()
    assert refused.status_code == 400 and error["type"] == "error", refused.text
    assert error["error"]["type"] == "invalid_request_error" and message in error["error"]["message"], error
    assert "\n" not in error["error"]["message"]


def test_the_sdk_raises_the_errors_it_knows(server: LiveServer) -> None:
    client = _client(server)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", messages=ASK, max_tokens=8)
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="conversation ends with the assistant's message"):
        client.messages.create(model=MODEL, messages=[*ASK, {"role": "assistant", "content": "Tokyo"}], max_tokens=8)


def test_the_routes_are_counted_in_the_metrics(server: LiveServer) -> None:
    paths = ("/v1/messages", "/v1/messages/count_tokens")
    before = [server.metric(f'localchat_http_requests_total{{path="{path}",status="200"}}') for path in paths]
    client = _client(server)
    client.messages.create(model=MODEL, messages=ASK, max_tokens=2)
    assert client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens > 0
    after = [server.metric(f'localchat_http_requests_total{{path="{path}",status="200"}}') for path in paths]
    assert after == [count + 1 for count in before]
