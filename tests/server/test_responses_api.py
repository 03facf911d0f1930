"""OpenAI's Responses API (POST /v1/responses) on the real server and default model, driven by the openai
client's `responses` surface: the reply /v1/chat/completions gives the same conversation, whole and
streamed as the events the SDK reads, max_output_tokens, a function call and its result fed back,
JSON-schema output, and the fields a stateless server refuses, each named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from greedy_paths import assert_same_text_until_near_tie
from live_server import LiveServer
from pydantic import BaseModel, Field

from localchat.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
INSTRUCTIONS = "You answer in one short sentence."
QUESTION = "What is the capital of Japan?"  # no near tie in the chat model's answer (test_api.py)
CHAT = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                               "additionalProperties": False}}
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
# The event sequence of a reply that is one message, as the SDK's stream helper reads it.
MESSAGE_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
                  "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                  "response.output_item.done", "response.completed"]


def _collapsed(kinds: list[str]) -> list[str]:
    """The event types with runs of one type (deltas) written once."""
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def test_a_response_is_the_chat_reply_whole_and_streamed(server: LiveServer) -> None:
    """Same prompt (its token count), same sampler, same path through the scheduler: the same text up to the chat
    reply's first near tie (a later request reuses an earlier one's KV cache: tests/greedy_paths.py)."""
    client = server.client()
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2)
    assert chat.usage is not None and chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content is not None
    reference = chat.choices[0].logprobs.content
    whole = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=24, temperature=0,
                                    store=True, metadata={"run": "test"})
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.model == MODEL
    assert whole.store is False and whole.metadata == {"run": "test"} and whole.temperature == 0
    assert whole.usage is not None and whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    assert [item.type for item in whole.output] == ["message"] and whole.output_text
    compared = assert_same_text_until_near_tie(reference, whole.output_text, min_compared=4)
    if compared == len(reference) and whole.usage.output_tokens == chat.usage.completion_tokens:  # no near tie: the same reply
        assert whole.output_text == chat.choices[0].message.content
        assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")

    with client.responses.stream(model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=24,
                                 temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        if whole.status == "completed":
            streamed = stream.get_final_response()
            assert streamed.output_text == "".join(deltas) and streamed.usage is not None
            assert streamed.usage.input_tokens == chat.usage.prompt_tokens
    assert_same_text_until_near_tie(reference, "".join(deltas), min_compared=4)


def test_a_stream_is_the_event_sequence_the_sdk_reads(server: LiveServer) -> None:
    client = server.client()
    events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=64, temperature=0, stream=True))
    assert _collapsed([event.type for event in events]) == MESSAGE_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    done = next(event for event in events if event.type == "response.output_text.done")
    item_ids = {getattr(event, "item_id", None) or event.item.id for event in events[2:-1]}  # type: ignore[union-attr]
    assert item_ids == {done.item_id}  # type: ignore[union-attr]
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")  # type: ignore[union-attr]
    completed = events[-1].response  # type: ignore[union-attr]
    assert deltas == done.text == completed.output_text and completed.status == "completed"  # type: ignore[union-attr]
    assert events[0].response.status == "in_progress" and events[0].response.output == []  # type: ignore[union-attr]
    # Server-sent events as OpenAI writes them: each names its type, and no [DONE] ends them.
    body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 4, "temperature": 0, "stream": True}
    with server.post("/v1/responses", body, stream=True) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines(decode_unicode=True) if line]
    names, data = lines[0::2], lines[1::2]
    assert all(name.startswith("event: ") for name in names) and all(line.startswith("data: ") for line in data)
    assert [name[7:] for name in names] == [json.loads(line[6:])["type"] for line in data]


def test_max_output_tokens_gives_an_incomplete_response(server: LiveServer) -> None:
    client = server.client()
    asked: Any = {"model": MODEL, "input": "Tell me a long story about a dragon.", "max_output_tokens": 5, "temperature": 0}
    cut = client.responses.create(**asked)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.completed_at is None
    assert cut.usage is not None and cut.usage.output_tokens == 5
    assert [(item.type, item.status) for item in cut.output] == [("message", "incomplete")] and cut.output_text
    events = list(client.responses.create(**asked, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == cut.output_text  # type: ignore[union-attr]


def test_a_client_that_leaves_mid_stream_cancels_its_reply(server: LiveServer) -> None:
    cancelled = server.metric('localchat_replies_total{finish_reason="cancelled"}')
    body = {"model": MODEL, "input": "Tell me a very long story.", "max_output_tokens": 2000, "stream": True}
    with server.post("/v1/responses", body, stream=True) as response:
        lines = response.iter_lines()
        for _ in range(12):  # the lifecycle events, the item's opening, a few deltas
            next(lines)
    assert server.idle_within(20)
    assert server.metric('localchat_replies_total{finish_reason="cancelled"}') == cancelled + 1


@pytest.mark.parametrize("choice", [{"type": "function", "name": "get_weather"}, "required"])
def test_a_function_call_and_its_output_round_trip(server: LiveServer, choice: Any) -> None:
    """The model calls the function (forced); its output item and the function's result go back as input, and
    the server renders them as the chat messages they mean: the prompt /v1/chat/completions gets from those."""
    client = server.client()
    first = client.responses.create(model=MODEL, input=ASK_WEATHER, tools=[WEATHER], tool_choice=choice, max_output_tokens=60,
                                    temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1 and first.output_text == "", first
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    assert list(json.loads(call.arguments)) == ["city"]
    with client.responses.stream(model=MODEL, input=ASK_WEATHER, tools=[WEATHER], tool_choice=choice, max_output_tokens=60,
                                 temperature=0) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    streamed_calls = [(item.name, item.arguments) for item in streamed.output if item.type == "function_call"]
    assert streamed_calls == [(call.name, call.arguments)]
    assert _collapsed(kinds) == ["response.created", "response.in_progress", "response.output_item.added",
                                 "response.function_call_arguments.delta", "response.function_call_arguments.done",
                                 "response.output_item.done", "response.completed"]

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}
    history: Any = [*ASK_WEATHER, *first.output, result]
    second = client.responses.create(model=MODEL, input=history, tools=[WEATHER], max_output_tokens=24, temperature=0)
    tool_calls = [{"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]
    chat_messages: Any = [*ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": tool_calls},
                          {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 degrees."}]
    chat_tool = {"type": "function", "function": {key: value for key, value in WEATHER.items() if key != "type"}}
    chat = client.chat.completions.create(model=MODEL, messages=chat_messages, tools=[chat_tool], max_tokens=24, temperature=0)
    assert chat.usage is not None and second.usage is not None and second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.status in ("completed", "incomplete") and second.output


class City(BaseModel):
    name: str = Field(max_length=12)
    country: str = Field(max_length=12)


def test_json_schema_output_parses(server: LiveServer) -> None:
    client = server.client()
    parsed = client.responses.parse(model=MODEL, input="Name a large city and its country, as JSON.", text_format=City,
                                    max_output_tokens=60, temperature=0)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    assert parsed.text is not None and parsed.text.format is not None and parsed.text.format.type == "json_schema"
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    text: Any = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    answered = client.responses.create(model=MODEL, input="Is Paris in France?", max_output_tokens=20, temperature=0, text=text)
    assert json.loads(answered.output_text)["answer"] in ("yes", "no")


REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"previous_response_id": "resp_123"}, "previous_response_id", "keeps no responses"),
    ({"conversation": "conv_123"}, "conversation", "keeps no conversations"),
    ({"background": True}, "background", "keeps no responses to poll"),
    ({"prompt": {"id": "pmpt_123"}}, "prompt", "stored prompts"),
    ({"top_logprobs": 2}, "top_logprobs", "top_logprobs"),
    ({"include": ["message.output_text.logprobs"]}, "include", "message.output_text.logprobs"),
    ({"tools": [{"type": "web_search"}]}, "tools.0", "web_search tools are not supported"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools.0", "file_search tools are not supported"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "web_search_preview is not a choice"),
    ({"input": [{"type": "item_reference", "id": "msg_123"}]}, "input", "item_reference"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
     "input.0.message.content", "image parts are not supported"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs its name and schema"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "reasoning.effort"),
]


@pytest.mark.parametrize(("body", "param", "message"), REFUSED, ids=[case[1] for case in REFUSED])
def test_a_field_a_stateless_server_cannot_honour_is_refused_by_name(server: LiveServer, body: dict[str, Any], param: str,
                                                                     message: str) -> None:
    refused = server.post("/v1/responses", {"model": MODEL, "input": QUESTION, **body})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["type"] == "invalid_request_error", refused.text
    assert error["param"] == param and message in error["message"] and "\n" not in error["message"], error


def test_the_route_is_counted_in_the_metrics(server: LiveServer) -> None:
    before = server.metric('localchat_http_requests_total{path="/v1/responses",status="200"}')
    assert server.post("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 2}).status_code == 200
    assert server.metric('localchat_http_requests_total{path="/v1/responses",status="200"}') == before + 1
