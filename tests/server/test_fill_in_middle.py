"""Fill-in-the-middle on the real server: Ollama's `suffix` on /api/generate and OpenAI's on /v1/completions.

The server serves the FIM copy of the default model (conftest.py's fim_model). The reference is the same prompt
spelled out with the tokens' text, sent raw; these APIs put no repository header first, as Ollama's templates."""

from __future__ import annotations

from typing import Any

import ollama
import pytest
from fim_model import FIM_TEXT
from greedy_paths import assert_same_completion_until_near_tie, first_near_tie
from live_server import LiveServer

GREEDY: dict[str, Any] = {"temperature": 0, "seed": 1}
PREFIX = "user\nWhat is the capital of France?"
SUFFIX = "\n"
SPELLED = f"{FIM_TEXT['pre']}{PREFIX}{FIM_TEXT['suf']}{SUFFIX}{FIM_TEXT['mid']}"


@pytest.fixture(scope="module")
def model_id(fim_server: LiveServer) -> str:
    return fim_server.client().models.list().data[0].id


def test_openai_suffix_is_the_fim_prompt_spelled_out(fim_server: LiveServer, model_id: str) -> None:
    """The prompt is FIM_PRE prefix FIM_SUF suffix FIM_MID (no BOS: SmolLM2 adds none), and its greedy reply
    is the raw spelled-out prompt's, up to the first near tie (the second request reuses the first's cache)."""
    client = fim_server.client()
    filled = client.completions.create(model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=12, logprobs=2, **GREEDY)
    spelled = client.completions.create(model=model_id, prompt=SPELLED, max_tokens=12, logprobs=2, **GREEDY)
    assert filled.usage is not None and spelled.usage is not None
    assert filled.usage.prompt_tokens == spelled.usage.prompt_tokens
    assert filled.choices[0].logprobs is not None and spelled.choices[0].logprobs is not None
    assert_same_completion_until_near_tie(spelled.choices[0].logprobs, filled.choices[0].logprobs.tokens or [], min_compared=3)


def test_ollama_suffix_takes_the_same_path(fim_server: LiveServer, model_id: str) -> None:
    client = ollama.Client(host=fim_server.url, headers=fim_server.auth, timeout=120)
    reference = fim_server.client().completions.create(model=model_id, prompt=SPELLED, max_tokens=12, logprobs=2, **GREEDY)
    filled = client.generate(model_id, prompt=PREFIX, suffix=SUFFIX, options={**GREEDY, "num_predict": 12})
    assert reference.usage is not None and filled.prompt_eval_count == reference.usage.prompt_tokens
    assert filled.context is None  # as for a raw prompt: no chat exchange to go on from
    logprobs = reference.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    gaps = [float(a - b) for a, b in (sorted(top.values(), reverse=True)[:2] for top in logprobs.top_logprobs or [])]
    tie = first_near_tie(gaps)
    agreed = "".join(logprobs.tokens[:len(gaps) if tie is None else tie])
    assert filled.response.startswith(agreed)
    # The prompt it renders, the FIM tokens by their text; raw changes nothing (no template either way).
    for raw in (False, True):
        shown = fim_server.post("/api/generate", {"model": model_id, "prompt": PREFIX, "suffix": SUFFIX, "raw": raw,
                                                 "_debug_render_only": True})
        assert shown.status_code == 200 and shown.json()["_debug_info"]["rendered_template"] == SPELLED


def test_code_that_spells_a_fim_token_stays_text(fim_server: LiveServer, model_id: str) -> None:
    """The prefix and suffix are read as text: only the FIM tokens localchat places are control tokens."""
    client = fim_server.client()
    plain = client.completions.create(model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=1, **GREEDY)
    spelling = client.completions.create(model=model_id, prompt=PREFIX + FIM_TEXT["mid"], suffix=SUFFIX, max_tokens=1, **GREEDY)
    assert plain.usage is not None and spelling.usage is not None
    assert spelling.usage.prompt_tokens > plain.usage.prompt_tokens + 1


def test_show_lists_insert_for_a_model_with_fim_tokens(fim_server: LiveServer, model_id: str, server: LiveServer) -> None:
    assert "insert" in fim_server.post("/api/show", {"model": model_id}).json()["capabilities"]
    assert "insert" not in server.post("/api/show", {"model": "smollm2-135m-instruct"}).json()["capabilities"]


def test_a_model_without_fim_tokens_refuses_a_suffix_in_one_line(server: LiveServer) -> None:
    for path, body in [("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": PREFIX, "suffix": SUFFIX}),
                       ("/api/generate", {"model": "smollm2-135m-instruct", "prompt": PREFIX, "suffix": SUFFIX})]:
        answer = server.post(path, body)
        assert answer.status_code == 400, answer.text
        assert "suffix: smollm2-135m-instruct has no fill-in-the-middle tokens" in _message(answer.json())
        assert "\n" not in _message(answer.json())


def test_suffix_refusals_name_the_field(fim_server: LiveServer, model_id: str) -> None:
    for path, body in [("/v1/completions", {"prompt": [5, 6, 7], "suffix": SUFFIX}),
                       ("/api/generate", {"prompt": PREFIX, "suffix": SUFFIX, "system": "You write code."}),
                       ("/api/generate", {"prompt": PREFIX, "suffix": SUFFIX, "context": [1, 2]})]:
        answer = fim_server.post(path, {"model": model_id, **body})
        assert answer.status_code == 400, answer.text
        assert _message(answer.json()).startswith("suffix: ")


def _message(error: dict[str, Any]) -> str:
    """An error's line: OpenAI's {"error": {"message": ...}} or Ollama's {"error": "..."}."""
    return error["error"] if isinstance(error["error"], str) else error["error"]["message"]
