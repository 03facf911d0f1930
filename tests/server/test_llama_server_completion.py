"""llama-server's /completion, /props and /slots (localchat.server.llama_server_api) on the real server with the default
model (SmolLM2-135M-Instruct, 4 slots, a 4096-token context), through a real HTTP client, as SillyTavern's llama.cpp
source and llama.cpp's examples call them.

The reference for a greedy reply is the same prompt sent to /v1/completions with log-probabilities, compared up to its
first near tie (greedy_paths.py)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests
from greedy_paths import first_near_tie
from live_server import CONTEXT, SLOTS, LiveServer

PROMPT = "The capital of France is Paris. The capital of Italy is"
# A chat turn written out in the model's control tokens: the reply ends with its end-of-turn token.
CHAT_TURN = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")
GREEDY: dict[str, Any] = {"temperature": 0}
# What SillyTavern's llama.cpp source sends with its default settings (public/scripts/textgen-settings.js): its whole
# sampler chain, the settings of the stages localchat lacks off, llama-server's logit_bias form, several stop strings.
SILLYTAVERN_FIELDS: dict[str, Any] = {
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
                 "adaptive_p"],
    "top_k": 40, "top_p": 0.5, "min_p": 0, "typical_p": 1, "typical": 1, "top_n_sigma": 0, "nsigma": 0,
    "xtc_probability": 0, "xtc_threshold": 0.1, "mirostat": 0, "mirostat_mode": 0, "adaptive_target": -0.01,
    "adaptive_decay": 0.9, "repeat_penalty": 1.2, "repeat_last_n": 0, "rep_pen": 1.2, "dry_multiplier": 0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 0, "min_keep": 0, "grammar": "",
    "logit_bias": [], "cache_prompt": True, "ignore_eos": False, "n": 1, "max_new_tokens": 16, "truncation_length": CONTEXT,
    "stop": ["\nUser:", "\n***"], "stopping_strings": ["\nUser:", "\n***"], "skip_special_tokens": True,
}


def _completion(server: LiveServer, *, path: str = "/completion", **fields: Any) -> requests.Response:
    return server.post(path, {"prompt": PROMPT, **fields}, stream=bool(fields.get("stream")))


def _events(response: requests.Response) -> list[dict[str, Any]]:
    """The stream's events, read as SillyTavern's EventSourceStream reads them: `data:` lines, no [DONE]."""
    lines = [line.decode() for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert "data: [DONE]" not in lines
    return [json.loads(line.removeprefix("data: ")) for line in lines]


@pytest.fixture(scope="module")
def reference(server: LiveServer) -> tuple[int, str]:
    """PROMPT's length in tokens and its greedy reply up to the first near tie, from /v1/completions."""
    client = server.client()
    answer = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=16,
                                       logprobs=2, temperature=0)
    logprobs = answer.choices[0].logprobs
    assert answer.usage is not None and logprobs is not None and logprobs.tokens is not None
    gaps = [float(a - b) for a, b in (sorted(top.values(), reverse=True)[:2] for top in logprobs.top_logprobs or [])]
    tie = first_near_tie(gaps)
    agreed = "".join(logprobs.tokens[:len(gaps) if tie is None else tie])
    assert len(agreed) >= 6, f"only {agreed!r} before a near tie"
    return answer.usage.prompt_tokens, agreed


def test_completion_continues_the_prompt_with_llama_servers_result(server: LiveServer,
                                                                   reference: tuple[int, str]) -> None:
    prompt_tokens, agreed = reference
    for path in ("/completion", "/completions"):
        answer = _completion(server, path=path, n_predict=16, **GREEDY)
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["content"].startswith(agreed) and result["tokens_evaluated"] == prompt_tokens
        assert result["stop"] is True and result["index"] == 0 and result["tokens"] == []
        assert result["stop_type"] in ("limit", "eos") and result["tokens_predicted"] <= 16
        assert result["prompt"] == PROMPT and result["stopping_word"] == "" and result["truncated"] is False
        settings = result["generation_settings"]
        assert settings["n_ctx"] == CONTEXT and settings["n_predict"] == 16 and settings["temperature"] == 0
        timings = result["timings"]
        assert timings["prompt_n"] + timings["cache_n"] == prompt_tokens
        assert timings["predicted_n"] == result["tokens_predicted"]


def test_a_stream_read_as_sillytavern_reads_it(server: LiveServer) -> None:
    """SillyTavern's default request, streamed with token probabilities: its text is the whole reply's, each event's
    completion_probabilities[0].top_logprobs give its Token Probabilities panel, the last event has the timings."""
    body = {**SILLYTAVERN_FIELDS, **GREEDY, "n_predict": 16}
    whole = _completion(server, **body).json()
    with _completion(server, **body, stream=True, n_probs=10) as answer:
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = _events(answer)
    *pieces, last = events
    text = ""
    for data in pieces:
        assert data["index"] == 0 and data["stop"] is False
        text += data.get("content") or ""
        [probabilities] = data["completion_probabilities"]
        candidates = [(top["token"], math.exp(top["logprob"])) for top in probabilities["top_logprobs"]]
        assert len(candidates) == 10 and all(0 < p <= 1 for _, p in candidates)
        # Greedy: the token drawn is the likeliest.
        assert probabilities["id"] == probabilities["top_logprobs"][0]["id"] == data["tokens"][0]
    assert text == whole["content"] and text
    assert last["stop"] is True and last["content"] == "" and last["timings"]["predicted_n"] == whole["tokens_predicted"]
    # Greedy runs the temperature stage alone; the penalties look back over repeat_last_n 0 tokens: none.
    assert last["generation_settings"]["samplers"] == ["temperature"]


def test_a_list_of_prompts_answers_a_list_of_results(server: LiveServer) -> None:
    prompts = [PROMPT, "One, two, three,"]
    alone = [_completion(server, prompt=prompt, n_predict=6, **GREEDY).json()["content"] for prompt in prompts]
    results = _completion(server, prompt=prompts, n_predict=6, **GREEDY).json()
    assert isinstance(results, list) and [result["index"] for result in results] == [0, 1]
    assert [result["content"] for result in results] == alone
    several = _completion(server, prompt=prompts, n_predict=2, n_cmpl=2, response_fields=["index", "prompt"]).json()
    assert [(result["index"], result["prompt"]) for result in several] == [(0, prompts[0]), (1, prompts[0]),
                                                                            (2, prompts[1]), (3, prompts[1])]


def test_token_ids_and_mixed_prompts(server: LiveServer, reference: tuple[int, str]) -> None:
    prompt_tokens, agreed = reference
    ids = server.post("/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"]
    assert len(ids) == prompt_tokens
    by_ids = _completion(server, prompt=ids, n_predict=16, **GREEDY).json()
    assert by_ids["tokens_evaluated"] == prompt_tokens and by_ids["content"].startswith(agreed)
    head, tail = "The capital of France is", " Paris. The capital of Italy is"
    tail_ids = server.post("/tokenize", {"content": tail}).json()["tokens"]
    mixed = _completion(server, prompt=[head, *tail_ids], n_predict=2, **GREEDY).json()
    head_ids = server.post("/tokenize", {"content": head, "add_special": True}).json()["tokens"]
    assert mixed["tokens_evaluated"] == len(head_ids) + len(tail_ids) and mixed["prompt"] == PROMPT


def test_stop_words_end_the_reply_before_them(server: LiveServer, reference: tuple[int, str]) -> None:
    _, agreed = reference
    word = agreed.split()[-1]
    result = _completion(server, n_predict=16, stop=["never said", word], **GREEDY).json()
    assert result["content"] == agreed[:agreed.index(word)]
    assert result["stop_type"] == "word" and result["stopping_word"] == word


def test_n_predict_0_gives_one_token_and_minus_1_no_limit(server: LiveServer) -> None:
    one = _completion(server, n_predict=0, return_tokens=True).json()
    assert one["tokens_predicted"] == 1 and len(one["tokens"]) == 1 and one["stop_type"] == "limit"
    # No limit: the chat turn's reply runs to the model's end of turn (its control tokens read as such).
    whole = _completion(server, prompt=CHAT_TURN, n_predict=-1, **GREEDY).json()
    assert whole["stop_type"] == "eos" and whole["truncated"] is False and whole["content"].strip()
    assert whole["generation_settings"]["n_predict"] == -1 and "<|im_end|>" not in whole["content"]


def test_return_tokens_whole_and_streamed(server: LiveServer) -> None:
    whole = _completion(server, n_predict=8, ignore_eos=True, return_tokens=True, **GREEDY).json()
    assert len(whole["tokens"]) == 8
    assert server.post("/detokenize", {"tokens": whole["tokens"]}).json()["content"] == whole["content"]
    with _completion(server, n_predict=8, ignore_eos=True, return_tokens=True, stream=True, **GREEDY) as answer:
        *pieces, last = _events(answer)
    assert [token for piece in pieces for token in piece["tokens"]] == whole["tokens"] and last["tokens"] == []


def test_logit_bias_pairs_ban_a_token(server: LiveServer) -> None:
    """llama-server's [id, false] pair, as SillyTavern sends its banned tokens: the greedy first token is not drawn."""
    first = _completion(server, n_predict=1, return_tokens=True, **GREEDY).json()["tokens"][0]
    banned = _completion(server, n_predict=1, return_tokens=True, logit_bias=[[first, False]], **GREEDY).json()
    assert banned["tokens"][0] != first


def test_the_model_field_picks_the_model(server: LiveServer) -> None:
    named = _completion(server, model="smollm2-135m-instruct", n_predict=1)
    assert named.status_code == 200 and named.json()["model"] == "smollm2-135m-instruct"
    unknown = _completion(server, model="no-such-model", n_predict=1)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


@pytest.mark.parametrize(("fields", "param"), [
    ({"prompt": {"text": "hi"}}, "prompt"),
    ({"prompt": [1, [2, 3]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": [{"prompt_string": "hi", "multimodal_data": ["aGk="]}]}, "prompt"),
    ({"n_predict": -2}, "n_predict"),
    ({"n_probs": -1}, "n_probs"),
    ({"typical_p": 0.5}, "typical_p"),
    ({"mirostat": 2}, "mirostat"),
    ({"top_n_sigma": 1.5}, "top_n_sigma"),
    ({"grammar": "root ::= \"a\""}, "grammar"),
    ({"post_sampling_probs": True}, "post_sampling_probs"),
    ({"samplers": ["temperature", "top_k"]}, "samplers"),
    ({"logit_bias": [["hello", 1]]}, "logit_bias"),
])
def test_what_completion_cannot_honour_is_a_400_in_one_line(server: LiveServer, fields: dict[str, Any],
                                                            param: str) -> None:
    answer = _completion(server, **{"n_predict": 1, **fields})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and "\n" not in error["message"] and "Traceback" not in error["message"]


def test_props_tell_the_context_slots_defaults_and_template(server: LiveServer) -> None:
    props = server.request("GET", "/props").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == CONTEXT and props["total_slots"] == SLOTS
    reply = _completion(server, n_predict=1).json()["generation_settings"]  # the defaults, no sampler field sent
    assert settings["params"]["n_ctx"] == reply["n_ctx"] == CONTEXT
    assert {key: settings["params"][key] for key in ("temperature", "top_k", "top_p", "min_p")} == {
        key: reply[key] for key in ("temperature", "top_k", "top_p", "min_p")}
    assert props["model_path"].endswith(".gguf") and props["model_alias"] == "smollm2-135m-instruct"
    assert "<|im_start|>" in props["chat_template"] and props["endpoint_slots"] is True
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert server.request("GET", "/props", params={"model": "smollm2-135m-instruct"}).json()["model_alias"] == props["model_alias"]
    assert server.request("GET", "/props", params={"model": "no-such-model"}).status_code == 404


@contextmanager
def _running_completion(server: LiveServer) -> Iterator[None]:
    """A streamed /completion decoding until the block ends (the client then closes it and the server cancels it)."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _completion(server, n_predict=2000, ignore_eos=True, stream=True) as response:
            for _ in response.iter_lines():
                started.set()
                if release.is_set():
                    return

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert started.wait(120), "the completion never streamed"
        yield
    finally:
        release.set()
        thread.join(120)


def test_slots_show_a_running_reply_processing(server: LiveServer) -> None:
    assert server.idle_within(30)
    idle = server.request("GET", "/slots").json()
    assert len(idle) == SLOTS and [slot["id"] for slot in idle] == list(range(SLOTS))
    assert all(slot["n_ctx"] == CONTEXT and slot["is_processing"] is False for slot in idle)
    with _running_completion(server):
        slots = server.request("GET", "/slots").json()
        assert sum(slot["is_processing"] for slot in slots) == 1
        assert server.request("GET", "/slots", params={"fail_on_no_slot": "1"}).status_code == 200
    deadline = time.monotonic() + 30
    while any(slot["is_processing"] for slot in server.request("GET", "/slots").json()):
        assert time.monotonic() < deadline, "the cancelled reply never left its slot"
        time.sleep(0.1)
    with server.busy(SLOTS):
        full = server.request("GET", "/slots", params={"fail_on_no_slot": "1"})
        assert full.status_code == 503, full.text
