"""`evaluate_all` (every position's logits in one call, for verifying drafts) and KV rollback on
the real default model in llama.cpp; tests/onnx runs the same check on the ONNX backend."""

from __future__ import annotations

import numpy as np

from localchat.backends.base import ARGMAX, Backend
from localchat.engine import Engine

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
