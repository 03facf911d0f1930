"""Ollama's request fields in localchat's terms (pure logic): options as sampler fields, keep_alive
as seconds, a history's calls and results as OpenAI's."""

from __future__ import annotations

from typing import Any

import pytest

from localchat.server.errors import APIError
from localchat.server.ollama import _messages, keep_alive_seconds, sampling_fields
from localchat.server.ollama_schemas import Message

REPLY_LIMIT = 4096


@pytest.mark.parametrize(("given", "seconds"), [
    (None, None), (0, 0.0), (1.5, 1.5), (-1, None), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25),
    ("-1s", None), ("2.5s", 2.5), (1e12, None), ("100000000h", None), (float("inf"), None),
])
def test_keep_alive_reads_seconds_and_gos_durations(given: Any, seconds: float | None) -> None:
    assert keep_alive_seconds(given) == seconds


@pytest.mark.parametrize("given", ["5", "soon", "5 m", "m5", ""])
def test_a_duration_go_would_refuse_is_refused(given: str) -> None:
    with pytest.raises(APIError, match=f'keep_alive: invalid duration "{given}"'):
        keep_alive_seconds(given)


def test_options_become_sampler_fields() -> None:
    fields, stop = sampling_fields({
        "temperature": 0, "top_k": 20.0, "top_p": 0.9, "min_p": 0.1, "seed": 7, "num_predict": 64, "repeat_penalty": 1.2,
        "repeat_last_n": -1, "presence_penalty": 0.5, "frequency_penalty": 0.25, "dry_multiplier": 0, "stop": ["\n\n", "END"],
        "num_ctx": 8192, "num_gpu": 99, "typical_p": 1.0, "mirostat": 0, "unknown": "ignored", "top_a": None,
    }, REPLY_LIMIT)
    assert fields == {"temperature": 0.0, "top_k": 20, "top_p": 0.9, "min_p": 0.1, "seed": 7, "max_tokens": 64,
                      "repeat_penalty": 1.2, "repeat_last_n": -1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
                      "dry_multiplier": 0.0}
    assert stop == ("\n\n", "END")
    # Ollama's "random" seed and "no limit" leave localchat's defaults.
    assert sampling_fields({"seed": -1, "num_predict": -1}, REPLY_LIMIT) == ({}, None)
    # More than the server allows is cut to it, as Ollama bounds num_predict; a server without a bound keeps it.
    assert sampling_fields({"num_predict": 8192}, REPLY_LIMIT) == ({"max_tokens": REPLY_LIMIT}, None)
    assert sampling_fields({"num_predict": 8192}, None) == ({"max_tokens": 8192}, None)


@pytest.mark.parametrize(("options", "message"), [
    ({"mirostat": 2}, "options.mirostat: Mirostat sampling is not supported by localchat; leave it out"),
    ({"typical_p": 0.7}, "options.typical_p: locally typical sampling is not supported by localchat; leave it out"),
    ({"tfs_z": 0.5}, "options.tfs_z: tail-free sampling is not supported by localchat; leave it out"),
    ({"penalize_newline": False}, "options.penalize_newline: sparing newlines from the repeat penalty is not supported"),
    ({"top_k": "40"}, 'option "top_k" must be of type integer'),
    ({"temperature": True}, 'option "temperature" must be of type float'),
    ({"stop": "END"}, 'option "stop" must be of an array of strings'),
])
def test_options_localchat_cannot_honour_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(APIError, match=message):
        sampling_fields(options, REPLY_LIMIT)


def test_calls_without_ids_are_answered_by_their_tools_results() -> None:
    history = [Message.model_validate(m) for m in [
        {"role": "USER", "content": "Weather and time?"},
        {"role": "assistant", "content": "", "thinking": "Both.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Bern"}}},
            {"id": "t1", "function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
        {"role": "tool", "content": "Sunny"},
    ]]
    converted = _messages(history)
    assert converted[0] == {"role": "user", "content": "Weather and time?"}
    assert converted[1]["reasoning_content"] == "Both."
    assert [call["id"] for call in converted[1]["tool_calls"]] == ["call_1_0", "t1"]
    assert converted[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Bern"}'}
    assert [message["tool_call_id"] for message in converted[2:]] == ["t1", "call_1_0"]
