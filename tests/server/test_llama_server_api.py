"""llama-server's own routes (localchat.server.llama_server_api): /infill as llama.vim and llama.vscode call it,
/tokenize and /detokenize. The stops, the picking of fields and the sampler stages as pure logic first, then the
real server with the FIM copy of the default model (fim_model.py), through a real HTTP client.

The reference for a reply is the same prompt spelled out with the tokens' text, sent raw to /v1/completions with
log-probabilities: greedy replies are compared up to its first near tie (greedy_paths.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import requests
from fim_model import FIM_TEXT
from greedy_paths import first_near_tie
from live_server import LiveServer
from pydantic import ValidationError

from localchat.backends.base import SamplerSettings
from localchat.server.llama_server_api import (
    EditorStops,
    InfillRequest,
    response_fields,
    run_stages,
    with_stages,
)

GREEDY_STAGES: dict[str, Any] = {"samplers": ["temperature"], "temperature": 0}
PREFIX = "user\nWhat is the capital of France?"
SUFFIX = "\n"
# llama-server's layout with no input_extra: the repository header and the gap's file name first.
HEADER = f"{FIM_TEXT['rep']}myproject\n{FIM_TEXT['sep']}filename\n"
SPELLED = f"{HEADER}{FIM_TEXT['pre']}{PREFIX}{FIM_TEXT['suf']}{SUFFIX}{FIM_TEXT['mid']}"


# -- pure logic -------------------------------------------------------------------------------------------------


def test_n_indent_ends_the_reply_before_a_less_indented_line() -> None:
    stops = EditorStops(n_indent=4, t_max_predict_s=None)
    assert stops.feed("x = 1\n    y = 2\n", now=0.0) == "x = 1\n    y = 2\n" and not stops.ended
    # The new line's indentation is held until its text shows it short, then kept as llama-server keeps it.
    assert stops.feed("  ", now=0.0) == ""
    assert stops.feed("return y", now=0.0) == "  " and stops.ended
    blank = EditorStops(n_indent=4, t_max_predict_s=None)
    assert blank.feed("a\n\n    b", now=0.0) == "a\n" and blank.ended  # a blank line counts as unindented
    first = EditorStops(n_indent=4, t_max_predict_s=None)
    assert first.feed("a", now=0.0) == "a" and not first.ended  # the cursor's line is never checked
    tail = EditorStops(n_indent=4, t_max_predict_s=None)
    assert tail.feed("a\n    ", now=0.0) == "a\n" and tail.finish() == "    "


def test_t_max_predict_ms_ends_the_reply_at_the_next_newline_once_past() -> None:
    stops = EditorStops(n_indent=0, t_max_predict_s=0.5)
    assert stops.feed("a\n", now=10.0) == "a\n" and not stops.ended  # the clock starts at the first piece
    assert stops.feed("b", now=11.0) == "b" and not stops.ended
    assert stops.feed("c\nd\n", now=11.0) == "c\n" and stops.ended


def test_response_fields_picks_paths_as_llama_server() -> None:
    result = {"content": "x", "timings": {"prompt_n": 3}, "stop": True}
    assert response_fields(result, ["content", "timings/prompt_n", "timings/none", "nothing"]) == {
        "content": "x", "timings/prompt_n": 3}
    assert response_fields(result, [""]) == {}


def test_samplers_turn_off_the_stages_they_leave_out() -> None:
    base = SamplerSettings(temperature=0.2, top_k=20, top_p=0.8, min_p=0.1, repeat_penalty=1.3, dry_multiplier=0.8)
    kept = with_stages(base, ["top_k", "top_p", "infill"])
    assert (kept.top_k, kept.top_p, kept.min_p, kept.temperature) == (20, 0.8, 0.0, 1.0)
    assert (kept.repeat_penalty, kept.dry_multiplier) == (1.0, 0.0)
    assert run_stages(kept) == ["top_k", "top_p"]
    assert run_stages(with_stages(base, ["temperature"])) == ["temperature"]


@pytest.mark.parametrize(("samplers", "message"), [
    (["top_k", "xtc"], "localchat has no xtc stage"),
    (["top_k", "bogus"], "'bogus' is not a stage localchat runs"),
    (["temperature", "top_k"], "localchat runs its stages in the order"),
    ("kx", "'x' is not a stage localchat runs"),
])
def test_samplers_localchat_cannot_run_are_refused(samplers: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        InfillRequest.model_validate({"input_prefix": "", "input_suffix": "", "samplers": samplers})
    assert InfillRequest.model_validate({"input_prefix": "", "input_suffix": "", "samplers": "kpt"}).samplers == "kpt"


# -- the real server --------------------------------------------------------------------------------------------


def _infill(server: LiveServer, **fields: Any) -> requests.Response:
    """/infill of the chat turn's gap, with `fields`; a streamed one is read as it comes."""
    return server.post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, **fields},
                       stream=bool(fields.get("stream")))


def _events(response: requests.Response) -> list[dict[str, Any]]:
    lines = [line for line in response.iter_lines(decode_unicode=True) if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line.removeprefix("data: ")) for line in lines]


def _reference(server: LiveServer, spelled: str) -> tuple[int, str]:
    """The raw spelled-out prompt's length in tokens and its greedy reply up to the first near tie."""
    model = server.client().models.list().data[0].id
    answer = server.client().completions.create(model=model, prompt=spelled, max_tokens=16, logprobs=2, temperature=0)
    logprobs = answer.choices[0].logprobs
    assert answer.usage is not None and logprobs is not None and logprobs.tokens is not None
    gaps = [float(a - b) for a, b in (sorted(top.values(), reverse=True)[:2] for top in logprobs.top_logprobs or [])]
    tie = first_near_tie(gaps)
    agreed = logprobs.tokens[:len(gaps) if tie is None else tie]
    assert len(agreed) >= 3, f"only {len(agreed)} tokens before a near tie"
    return answer.usage.prompt_tokens, "".join(agreed)


@pytest.fixture(scope="module")
def reference(fim_server: LiveServer) -> tuple[int, str]:
    return _reference(fim_server, SPELLED)


def test_infill_lays_out_llama_servers_prompt_and_answers_as_it(fim_server: LiveServer,
                                                                reference: tuple[int, str]) -> None:
    """The greedy reply is the spelled-out prompt's (header first: no input_extra), with llama-server's result."""
    prompt_tokens, agreed = reference
    answer = _infill(fim_server, n_predict=16, **GREEDY_STAGES)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["tokens_evaluated"] == prompt_tokens and result["content"].startswith(agreed)
    assert result["stop"] is True and result["tokens_predicted"] <= 16 and result["index"] == 0
    assert result["tokens_cached"] == prompt_tokens + result["tokens_predicted"] - 1
    assert result["generation_settings"]["n_ctx"] == 4096 and result["generation_settings"]["samplers"] == ["temperature"]
    timings = result["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == prompt_tokens and timings["predicted_n"] == result["tokens_predicted"]


def test_a_streamed_infill_sends_its_text_then_its_result(fim_server: LiveServer, reference: tuple[int, str]) -> None:
    _, agreed = reference
    with _infill(fim_server, n_predict=16, stream=True, **GREEDY_STAGES) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = _events(answer)
    *pieces, last = events
    assert all(event["stop"] is False and event["index"] == 0 for event in pieces)
    assert "".join(event["content"] for event in pieces).startswith(agreed)
    assert last["stop"] is True and last["content"] == "" and "timings" in last  # no [DONE]: llama-server's end


def test_input_extra_goes_first_as_llama_server_lays_it_out(fim_server: LiveServer) -> None:
    """Other files' chunks, each after FIM_SEP and its name, before the gap's file name and the gap."""
    extra = [{"filename": "notes.txt", "text": "Paris is in France.\n"}, {"text": "Rome is in Italy.\n", "time": 3}]
    spelled = (f"{FIM_TEXT['rep']}myproject\n{FIM_TEXT['sep']}notes.txt\nParis is in France.\n"
               f"{FIM_TEXT['sep']}tmp\nRome is in Italy.\n{FIM_TEXT['sep']}filename\n"
               f"{FIM_TEXT['pre']}{PREFIX}{FIM_TEXT['suf']}{SUFFIX}{FIM_TEXT['mid']}")
    prompt_tokens, agreed = _reference(fim_server, spelled)
    result = _infill(fim_server, input_extra=extra, n_predict=16, **GREEDY_STAGES).json()
    assert result["tokens_evaluated"] == prompt_tokens and result["content"].startswith(agreed)


def test_response_fields_answer_those_fields_alone(fim_server: LiveServer) -> None:
    """As llama.vim asks: nested fields under their path; its raw check wants compact JSON ("content":")."""
    fields = ["content", "timings/prompt_n", "timings/predicted_ms", "truncated", "tokens_cached", "timings/nothing"]
    answer = _infill(fim_server, n_predict=2, response_fields=fields)
    assert set(answer.json()) == {"content", "timings/prompt_n", "timings/predicted_ms", "truncated", "tokens_cached"}
    assert '"content":"' in answer.text
    # llama.vim's cache warm-up: no tokens wanted, nothing read.
    warm = _infill(fim_server, n_predict=0, samplers=[], response_fields=[""])
    assert warm.status_code == 200 and warm.json() == {}


def test_n_indent_ends_the_reply_at_a_less_indented_line(fim_server: LiveServer) -> None:
    """The chat turn's reply is "assistant\n" then an unindented line: with n_indent it ends before it. The line
    is the same infill's without n_indent: the reference reply's second line can start at a near tie (its first
    token 0.36 ahead of the next on an AMD EPYC without AVX-512), where the two paths may part."""
    plain = _infill(fim_server, n_predict=16, **GREEDY_STAGES).json()["content"]
    unindented = re.search(r"\n(?=\S)", plain)
    assert unindented is not None, plain
    first_line = plain[: unindented.start()]
    whole = _infill(fim_server, n_predict=16, n_indent=1, **GREEDY_STAGES).json()
    assert whole["content"] == first_line + "\n" and whole["stop_type"] == "limit"
    with _infill(fim_server, n_predict=16, n_indent=1, stream=True, **GREEDY_STAGES) as answer:
        *pieces, last = _events(answer)
    assert "".join(event["content"] for event in pieces) == first_line + "\n" and last["stop_type"] == "limit"


def test_t_max_predict_ms_ends_the_reply_at_the_next_newline(fim_server: LiveServer, reference: tuple[int, str]) -> None:
    _, agreed = reference
    first_line = agreed.split("\n", 1)[0]
    result = _infill(fim_server, n_predict=16, t_max_predict_ms=1, **GREEDY_STAGES).json()
    assert result["content"] == first_line + "\n" and result["stop_type"] == "limit"


def test_stop_strings_n_predict_and_n_cmpl(fim_server: LiveServer, reference: tuple[int, str]) -> None:
    _, agreed = reference
    word = agreed.split()[-1]
    stopped = _infill(fim_server, n_predict=16, stop=[word], **GREEDY_STAGES).json()
    assert stopped["content"] == agreed[:agreed.index(word)] and stopped["stop_type"] == "word"
    assert _infill(fim_server, n_predict=0).json()["tokens_predicted"] == 1  # llama-server's: the prompt and a token
    limited = _infill(fim_server, n_predict=3, ignore_eos=True).json()
    assert limited["tokens_predicted"] == 3 and limited["stop_type"] == "limit" and limited["truncated"] is False
    several = _infill(fim_server, n_predict=2, n_cmpl=2, response_fields=["index", "content"]).json()
    assert isinstance(several, list) and [result["index"] for result in several] == [0, 1]


def test_samplers_left_out_are_off(fim_server: LiveServer, reference: tuple[int, str]) -> None:
    """llama.vscode's samplers with top_k 1: no temperature stage (1, whatever the request says), the argmax drawn."""
    _, agreed = reference
    result = _infill(fim_server, n_predict=16, samplers=["top_k", "top_p", "infill"], top_k=1, top_p=0.99,
                     temperature=0.3).json()
    settings = result["generation_settings"]
    assert settings["samplers"] == ["top_k", "top_p"] and settings["temperature"] == 1.0
    assert settings["min_p"] == 0.0 and settings["dry_multiplier"] == 0.0
    assert result["content"].startswith(agreed)


@pytest.mark.parametrize(("fields", "param"), [
    ({"n_probs": 3}, "n_probs"),
    ({"input_extra": "notes"}, "input_extra"),
    ({"input_extra": [{"filename": "a.py"}]}, "input_extra.0.text"),
    ({"samplers": ["top_k", "xtc"]}, "samplers"),
    ({"input_suffix": None}, "input_suffix"),
    ({"n_predict": -2}, "n_predict"),
])
def test_what_infill_cannot_honour_is_a_400_naming_the_field(fim_server: LiveServer, fields: dict[str, Any],
                                                             param: str) -> None:
    answer = _infill(fim_server, **fields)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]


def test_a_model_without_fim_tokens_refuses_infill_in_one_line(server: LiveServer) -> None:
    answer = _infill(server, model="smollm2-135m-instruct")
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert "smollm2-135m-instruct has not" in message and "\n" not in message


def test_tokenize_and_detokenize_round_trip(fim_server: LiveServer) -> None:
    text = f"{FIM_TEXT['pre']}héllo wörld"
    tokens = fim_server.post("/tokenize", {"content": text}).json()["tokens"]
    assert tokens[0] == 1  # control tokens' text is read as them, as llama-server's default
    assert fim_server.post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"][0] != 1
    pieces = fim_server.post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == tokens
    assert "".join(piece["piece"] for piece in pieces if isinstance(piece["piece"], str)) == text
    assert fim_server.post("/detokenize", {"tokens": tokens}).json() == {"content": text}
    outside = fim_server.post("/detokenize", {"tokens": [1, 10**9]})
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"
