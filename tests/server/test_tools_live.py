"""Tools through the real server and the default model (Gemma 3 270M, a base model with Gemma's
turn template, which knows no tools: the server writes them into the prompt and reads bare JSON
calls). The model may not call a tool by itself, so `auto` is checked for shape; a named function
or `required` is forced (the call's opening written, the rest constrained to its grammar), so a
valid call is certain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from live_server import LiveServer, start_server

from localchat.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
GREEDY = {"temperature": 0, "seed": 1}
WEATHER_TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}
TIME_TOOL: Any = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLED: Any = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]
ANSWERED: Any = [*CALLED, {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees."}]


def _call_finish(choice: Any) -> str:
    """How OpenAI's chat completions end a reply that is the call `choice` forced: "stop" for a named function."""
    return "stop" if isinstance(choice, dict) else "tool_calls"


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_call_is_valid_whole_and_streamed(server: LiveServer, choice: Any) -> None:
    client = server.client()
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[TIME_TOOL, WEATHER_TOOL], tool_choice=choice,
                                           max_tokens=60, **GREEDY)
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) == 1 and whole.choices[0].finish_reason == _call_finish(choice), whole
    name, arguments = calls[0].function.name, json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    assert name == "get_weather" if isinstance(choice, dict) else name in ("get_weather", "get_time")
    assert list(arguments) == ["city"] and isinstance(arguments["city"], str)
    assert calls[0].id.startswith("call_")
    # The SDK's stream helper adds the streamed pieces up to the same call.
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[TIME_TOOL, WEATHER_TOOL], tool_choice=choice,
                                        max_tokens=60, **GREEDY) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in streamed] == [(name, calls[0].function.arguments)]  # type: ignore[union-attr]


CHOICES = [{"type": "function", "function": {"name": "get_weather"}}, "required"]


def _streamed_calls(chunks: list[Any]) -> tuple[str, list[tuple[str, str]], str | None]:
    """A stream's content, its calls (name, arguments) put together, and its finish reason."""
    content, calls = "", {}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            name, arguments = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
    return content, list(calls.values()), chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("choice", CHOICES)
def test_a_stop_string_never_cuts_a_forced_call(server: LiveServer, choice: Any) -> None:
    """A forced call is held to its grammar: a stop string such as "}" would cut its arguments."""
    client = server.client()
    asked = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL], "tool_choice": choice, "max_tokens": 60,
             "stop": ["}", '"'], **GREEDY}
    whole = client.chat.completions.create(**asked)
    calls = whole.choices[0].message.tool_calls or []
    assert whole.choices[0].finish_reason == _call_finish(choice) and len(calls) == 1, whole
    assert list(json.loads(calls[0].function.arguments)) == ["city"]  # type: ignore[union-attr]
    content, streamed, finish = _streamed_calls(list(client.chat.completions.create(**asked, stream=True)))
    assert (content, streamed, finish) == ("", [("get_weather", calls[0].function.arguments)], _call_finish(choice))  # type: ignore[union-attr]


@pytest.mark.parametrize("choice", CHOICES)
def test_a_forced_call_cut_by_max_tokens_ends_with_length_and_the_arguments_written(server: LiveServer, choice: Any) -> None:
    """As OpenAI answers it: the call, with the arguments written so far (they may not parse), never
    the call's markup as content nor arguments the model did not write."""
    client = server.client()
    asked = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL], "tool_choice": choice, **GREEDY}
    uncut = client.chat.completions.create(**asked, max_tokens=60)
    assert uncut.choices[0].finish_reason == _call_finish(choice) and uncut.usage is not None
    full = (uncut.choices[0].message.tool_calls or [])[0].function.arguments  # type: ignore[union-attr]
    written = uncut.usage.completion_tokens
    for max_tokens in sorted({1, written // 2, written - 1}):
        whole = client.chat.completions.create(**asked, max_tokens=max_tokens).choices[0]
        calls = [(call.function.name, call.function.arguments) for call in whole.message.tool_calls or ()]  # type: ignore[union-attr]
        assert whole.finish_reason == "length" and not whole.message.content, (max_tokens, whole)
        assert len(calls) == 1 and calls[0][0] == "get_weather" and full.startswith(calls[0][1]), (max_tokens, calls)
        streamed = _streamed_calls(list(client.chat.completions.create(**asked, max_tokens=max_tokens, stream=True)))
        assert streamed == ("", calls, "length"), max_tokens


def test_a_forced_call_of_a_function_without_parameters_has_none(server: LiveServer) -> None:
    """OpenAI: a function defined without parameters takes an empty parameter list."""
    now = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        reply = server.client().chat.completions.create(model=MODEL, messages=ASK, tools=[now], tool_choice=choice,  # type: ignore[arg-type]
                                                        max_tokens=60, **GREEDY)
        calls = reply.choices[0].message.tool_calls or []
        assert [(call.function.name, call.function.arguments) for call in calls] == [("get_time", "{}")]  # type: ignore[union-attr]
        assert reply.choices[0].finish_reason == _call_finish(choice)


def test_no_tools_with_auto_choice_is_no_tools(server: LiveServer) -> None:
    """As llama-server, vLLM and Ollama read it; a call asked for with no tools stays a 400."""
    for tools in ([], None):
        body = {"messages": ASK, "tool_choice": "auto", "max_tokens": 4, **GREEDY} | ({} if tools is None else {"tools": tools})
        answered = server.post("/v1/chat/completions", body)
        assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"], answered.text
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        refused = server.post("/v1/chat/completions", {"messages": ASK, "tools": [], "tool_choice": choice})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice", refused.text
        assert "tools" in refused.json()["error"]["message"]


def test_tools_with_auto_choice_answer_in_shape(server: LiveServer) -> None:
    reply = server.client().chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], max_tokens=40, **GREEDY)
    choice = reply.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason in ("tool_calls", "length")
        assert all(call.type == "function" and call.function.name for call in choice.message.tool_calls)  # type: ignore[union-attr]
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content is not None


def test_a_tool_result_is_rendered_and_answered(server: LiveServer) -> None:
    client = server.client()
    answered = client.chat.completions.create(model=MODEL, messages=ANSWERED, tools=[WEATHER_TOOL], max_tokens=24, **GREEDY)
    asked = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], max_tokens=1, **GREEDY)
    assert answered.usage is not None and asked.usage is not None
    # The call and its result are in the prompt (the call's JSON and the result add well over 10 tokens).
    assert answered.usage.prompt_tokens > asked.usage.prompt_tokens + 10
    message = answered.choices[0].message
    assert message.content or message.tool_calls


@pytest.mark.parametrize(("field", "value"), [("audio", {"voice": "alloy", "format": "wav"}), ("top_logprobs", 2),
                                              ("functions", [{"name": "f", "parameters": {}}])])
def test_fields_localchat_does_not_implement_get_400(server: LiveServer, field: str, value: object) -> None:
    response = server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 2, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field
    assert field in response.json()["error"]["message"]


def test_harmless_fields_are_accepted(server: LiveServer) -> None:
    body = {"messages": ASK, "max_tokens": 2, "user": "u1", "store": False, "metadata": {"a": "b"}, "logprobs": False}
    response = server.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert json.loads(response.text)["choices"][0]["message"]["role"] == "assistant"


def test_an_unknown_named_function_is_refused(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL],
                                                tool_choice={"type": "function", "function": {"name": "get_time"}})


def test_serve_takes_no_think(tmp_path: Path, default_model: Path) -> None:
    """`serve --no-think` starts a server whose replies pass enable_thinking=false (what that does
    to a prompt: tests/server/test_tool_calls.py); Gemma's template has no thinking to turn off."""
    running = start_server(tmp_path, "-m", str(default_model), "--no-think")
    try:
        reply = running.client().chat.completions.create(model=default_model.stem, messages=ASK, max_tokens=2)
        assert reply.choices[0].message.role == "assistant"
    finally:
        running.stop()
