"""Log-probabilities of sampled tokens: the log-softmax/top-k helper (pure logic), how they travel
with the text pieces, and on the real default model against llama.cpp's own scoring."""

from __future__ import annotations

import numpy as np
import pytest
from test_generation_logic import PIECES, ScriptedBackend

from localchat.backends.base import ARGMAX, SamplerSettings, TokenLogprob
from localchat.backends.logprobs import token_logprob
from localchat.engine import Engine
from localchat.session import GenerationSettings, Reply


def test_token_logprob_is_the_log_softmax_with_the_best_first() -> None:
    logits = np.random.default_rng(0).normal(0, 4, 1000).astype(np.float32)
    entry = token_logprob(logits, 7, 5)
    exact = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert entry.token == 7 and entry.logprob == pytest.approx(exact[7], abs=1e-5)
    assert [t for t, _ in entry.top] == list(np.argsort(-exact)[:5])
    assert [lp for _, lp in entry.top] == pytest.approx(sorted(exact, reverse=True)[:5], abs=1e-5)


def test_ties_list_the_lowest_id_first_as_greedy_picks() -> None:
    logits = np.array([0.0, 3.0, 1.0, 3.0, 3.0], dtype=np.float32)
    assert [t for t, _ in token_logprob(logits, 1, 4).top] == [1, 3, 4, 2]
    assert len(token_logprob(logits, 1, 20).top) == 5 and token_logprob(logits, 1, 0).top == ()


def test_a_held_back_token_s_logprob_travels_with_the_text_that_releases_it() -> None:
    reply = Reply(ScriptedBackend(PIECES, []), GenerationSettings(stop=(" ENDX",), logprobs=0), 2)  # type: ignore[arg-type]
    pieces = []
    for token in [1, 2, 3, 4, 5, 6, 7]:  # "a", the snake in four bytes, " END" (held: it may start the stop), "b"
        text = reply.add(token, TokenLogprob(token, -0.5))
        pieces.append((text, [entry.token for entry in reply.unsent_logprobs()] if text else []))
    assert pieces == [("a", [1]), ("", []), ("", []), ("", []), ("🐍", [2, 3, 4, 5]), ("", []), (" ENDb", [6, 7])]
    assert reply.unsent_logprobs() == ()


def test_a_stop_string_s_tokens_have_no_logprobs_handed_on() -> None:
    """The logprobs cover the text returned: a token the stop string begins in stays (part of its
    text is returned), the ones after go with the stop string."""
    reply = Reply(ScriptedBackend(PIECES, []), GenerationSettings(stop=("NDb",), logprobs=0), 2)  # type: ignore[arg-type]
    pieces = []
    for token in [1, 6, 7]:  # "a", " END" (" E" released, "ND" held: it may start the stop), "b" (the stop is whole)
        text = reply.add(token, TokenLogprob(token, -0.5))
        pieces.append((text, [entry.token for entry in reply.unsent_logprobs()]))
    assert pieces == [("a", [1]), (" E", [6]), ("", [])] and reply.finish_reason == "stop"
    assert reply.tail() == "" and reply.unsent_logprobs() == ()


def test_logprobs_are_the_raw_model_s_and_the_greedy_pick_is_the_top_one(engine: Engine) -> None:
    session = engine.sessions[0]
    prompt = engine.backend.tokenize("The capital of France is", add_bos=True, special=False)
    runs = []
    # The model's own argmax, and greedy with the penalties on.
    for sampler in (ARGMAX, SamplerSettings(temperature=0, repeat_penalty=1.1, dry_multiplier=0.8)):
        session.reset()
        generation = session.generate(prompt, GenerationSettings(max_tokens=8, sampler=sampler, logprobs=3))
        generation.text()
        assert generation.stats is not None
        assert [entry.token for entry in generation.logprobs] == list(generation.stats.completion_ids)
        for entry in generation.logprobs:
            assert entry.logprob <= 0 and len(entry.top) == 3
            assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        runs.append(generation.logprobs)
    plain, penalised = runs
    assert all(entry.top[0] == (entry.token, entry.logprob) for entry in plain)
    # Penalties change the pick, not the numbers reported: while both replies agree, so do their logprobs.
    same = next((i for i, (a, b) in enumerate(zip(plain, penalised)) if a.token != b.token), len(plain))
    assert same >= 1 and plain[:same] == penalised[:same]
    # The row is the right one: scoring the text in one pass agrees (loosely: batched kernels
    # round differently, by up to 0.16 measured on this model).
    ids = [entry.token for entry in plain]
    scored = engine.backend.score(session.seq, [*prompt, *ids]).logprobs[len(prompt) - 1 :]
    np.testing.assert_allclose([entry.logprob for entry in plain], scored, atol=0.5)
    session.reset()
