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
    # Ollama's "random" seed and "no limit" are none, a preset's seed and limit notwithstanding.
    assert sampling_fields({"seed": -1, "num_predict": -1}, REPLY_LIMIT) == ({"seed": None, "max_tokens": None}, None)
    # More than the server allows is cut to it, as Ollama bounds num_predict; a server without a bound keeps it.
    assert sampling_fields({"num_predict": 8192}, REPLY_LIMIT) == ({"max_tokens": REPLY_LIMIT}, None)
    assert sampling_fields({"num_predict": 8192}, None) == ({"max_tokens": 8192}, None)


@pytest.mark.parametrize(("options", "fields"), [
    # llama.cpp's meanings, which Ollama hands the options to: greedy at 0 or below, no top-k cut at 0 or below
    # (nor past any vocabulary), no top-p cut at 1 or above, no min-p cut at 0 or below.
    ({"temperature": 3.5, "top_k": -1}, {"temperature": 3.5, "top_k": 0}),
    ({"temperature": -1, "top_k": 2**40, "top_p": 1.5, "min_p": -0.5}, {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}),
    # top_p 0 or min_p 1 keeps the likeliest token alone: greedy.
    ({"temperature": 0.8, "top_p": 0}, {"temperature": 0.0}),
    ({"min_p": 1.0, "top_p": 0.9}, {"temperature": 0.0}),
    # A seed is 32 bits in llama.cpp, as OpenAI's 64-bit one is taken here.
    ({"seed": 2**32 + 7}, {"seed": 7}),
    ({"seed": 2**70 + 3}, {"seed": 3}),
    # Options today's Ollama no longer knows are ignored, as it ignores them (it logs them).
    ({"mirostat": 2, "mirostat_tau": 5.0, "tfs_z": 0.5, "penalize_newline": False}, {}),
])
def test_options_mean_what_llama_cpp_makes_of_them(options: dict[str, Any], fields: dict[str, Any]) -> None:
    assert sampling_fields(options, REPLY_LIMIT) == (fields, None)


@pytest.mark.parametrize(("options", "message"), [
    ({"typical_p": 0.7}, "options.typical_p: locally typical sampling is not supported by localchat; leave it out"),
    ({"top_k": "40"}, 'option "top_k" must be of type integer'),
    ({"temperature": True}, 'option "temperature" must be of type float'),
    ({"seed": float("inf")}, 'option "seed" must be a finite number'),
    ({"seed": 10**400}, 'option "seed" must be a finite number'),  # past any float: was an OverflowError
    ({"stop": "END"}, 'option "stop" must be of an array of strings'),
    ({"repeat_penalty": 0}, r"options.repeat_penalty: 0 must be > 0 \(1 turns it off\)"),
    ({"repeat_last_n": -2}, r"options.repeat_last_n: -2 must be >= -1"),
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
