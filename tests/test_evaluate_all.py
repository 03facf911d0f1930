"""`evaluate_all` (every position's logits in one call, for verifying drafts) and KV rollback on
the real default model in llama.cpp; tests/onnx runs the same check on the ONNX backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localchat.backends.base import ARGMAX, Backend
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.settings import Settings

TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
# Batched and one-token kernels round differently (Q4_K: up to 0.16 in a logprob measured on
# AMD); a wrong row or position is off by whole units.
ATOL = 0.5


def log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    peak = rows.max(axis=-1, keepdims=True)
    return rows - peak - np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True))


def check_evaluate_all(backend: Backend, seq: int) -> None:
    tokens = backend.tokenize(TEXT, add_bos=True, special=False)
    prompt, rest = tokens[:6], tokens[6:]
    backend.truncate(seq, 0)
    backend.evaluate(seq, prompt, 0)
    together = log_softmax(np.array(backend.evaluate_all(seq, rest, len(prompt))))
    assert together.shape == (len(rest), backend.info.n_vocab)
    # Sampling reads the rows: the model's argmax at each.
    sampler = backend.make_sampler(ARGMAX)
    picks = [backend.sample(seq, sampler, row=i) for i in range(len(rest))]
    sampler.close()
    assert picks == list(together.argmax(axis=1))

    # Roll back past the first 3 and evaluate the rest one token at a time.
    backend.truncate(seq, len(prompt) + 3)
    alone = []
    for i, token in enumerate(rest[3:], start=3):
        backend.evaluate(seq, [token], len(prompt) + i)
        alone.append(log_softmax(np.array(backend.logits(seq))))
    for one, many in zip(alone, together[3:], strict=True):
        # The likely tokens' logprobs agree (the far tail, below e^-15, rounds more loosely).
        likely = np.argsort(many)[-10:]
        np.testing.assert_allclose(one[likely], many[likely], atol=ATOL)
        # The argmax agrees wherever the best leads the second by more than the rounding.
        second, best = np.sort(many)[-2:]
        if best - second > ATOL:
            assert one.argmax() == many.argmax()
    backend.truncate(seq, 0)


def test_evaluate_all_equals_one_token_at_a_time(engine: Engine) -> None:
    engine.sessions[0].reset()
    check_evaluate_all(engine.backend, engine.sessions[0].seq)


def test_an_odd_batch_made_even_by_a_filler_row_gives_the_same_logits(settings: Settings, default_model: Path) -> None:
    """llama.cpp evaluates an odd batch faster with one more row (`even_rows`): with a spare cell,
    `evaluate_batch` adds a throwaway row. Each sequence's logits are the ones without it, and the
    KV cache keeps none of it: the next tokens' logits are the same too."""
    texts = [TEXT, "Once upon a time there was a dragon", "def add(a, b):\n    return a +"]
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=1024, n_seq=3)) as engine:
        backend = engine.backend
        assert backend.even_rows
        prompts = [backend.tokenize(text, add_bos=True, special=False) for text in texts]

        def decode(spare_cell: bool) -> list[np.ndarray]:
            """The logits of one batched step of the three sequences, then of 4 more tokens each."""
            for seq, tokens in enumerate(prompts):
                backend.truncate(seq, 0)
                backend.evaluate(seq, tokens[:-5], 0)
            backend.evaluate_batch([(seq, tokens[-5], len(tokens) - 5) for seq, tokens in enumerate(prompts)],
                                   spare_cell=spare_cell)
            rows = [log_softmax(np.array(backend.logits(seq))) for seq in range(len(prompts))]
            for seq, tokens in enumerate(prompts):
                backend.evaluate(seq, tokens[-4:], len(tokens) - 4)
                rows.append(log_softmax(np.array(backend.logits(seq))))
            return rows

        for plain, filled in zip(decode(spare_cell=False), decode(spare_cell=True), strict=True):
            likely = np.argsort(plain)[-10:]
            np.testing.assert_allclose(filled[likely], plain[likely], atol=ATOL)


def test_a_count_of_rows_is_new_until_a_step_of_it_keeps_every_row_s_logits(engine: Engine) -> None:
    """`new_shapes`: what lookup drafting charges the first step of a shape for where that costs more (a GPU)."""
    backend, seq = engine.backend, engine.sessions[0].seq
    engine.sessions[0].reset()
    counts = np.array([1, 5, 6, 7])
    before = backend.new_shapes(counts)
    tokens = backend.tokenize(TEXT, add_bos=True, special=False)
    backend.evaluate(seq, tokens[:7], 0)  # a prompt's step: 7 tokens, one row of logits
    assert list(backend.new_shapes(counts)) == list(before)
    backend.evaluate_all(seq, tokens[7:13], 7)
    backend.evaluate(seq, tokens[13:14], 13)
    assert not backend.new_shapes(counts)[[0, 2]].any() and list(backend.new_shapes(counts)[[1, 3]]) == list(before[[1, 3]])
    assert backend.first_shape_steps == 0.0  # a CPU plan
    backend.truncate(seq, 0)
