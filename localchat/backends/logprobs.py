"""Log-probabilities from a model's raw logits: of every position of a scored text, or of one sampled
token with the best alternatives to it."""

from __future__ import annotations

import numpy as np

from localchat.backends.base import TokenLogprob


def score_rows(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-probability of `targets[i]` under row i of `logits`, and each row's top-1 token."""
    logits = logits.astype(np.float64)
    peak = logits.max(axis=1, keepdims=True)
    log_norm = peak[:, 0] + np.log(np.exp(logits - peak).sum(axis=1))
    return logits[np.arange(len(targets)), targets] - log_norm, logits.argmax(axis=1)


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """The log-softmax of one logits row at `token`, and its `top` best entries (ties: lowest id
    first, as greedy picks). Costs two passes over the vocabulary: only done when asked."""
    peak = float(logits.max())
    log_norm = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(-logits, top - 1)[:top] if top < len(logits) else np.arange(len(logits))
        ids = ids[np.lexsort((ids, -logits[ids]))]
        best = tuple((int(i), float(logits[i]) - log_norm) for i in ids)
    return TokenLogprob(token, float(logits[token]) - log_norm, best)
