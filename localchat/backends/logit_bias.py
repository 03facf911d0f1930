"""OpenAI's logit_bias on a logits row, for both backends' samplers.

The bias is added to the row in place before the sampler reads it, so every stage after sees the biased
logits as the model's own: a grammar's mask, the penalties, the search for the tokens within reach of the
best (a token raised from far below the top-k is among them, a lowered one drops out), the draw or the
argmax. That is llama.cpp's chain with its logit-bias sampler first, on a few candidates instead of every
logit. Log-probabilities are read from a copy of the row taken before (Decoder.sample): they stay the raw
distribution's, as llama-server's and vLLM's by default.

A reply without a bias holds no LogitBias, and its pick costs what it did: 0.058-0.064 ms against 0.058-0.063
before on SmolLM2 (4 runs), 0.082-0.105 against 0.082-0.103 on Gemma 3 270M (2 runs): medians of 300 picks,
the two samplers taking turns inside one reply with the model's default chain (AMD EPYC with AVX-512, 2 cores). With
a bias on two tokens a pick took 0.021-0.024 ms more: three numpy calls on a row the decode left out of the caches.
"""

from __future__ import annotations

import numpy as np

from localchat.backends.base import SamplerSettings


class LogitBias:
    """A reply's logit_bias as arrays of ids and biases (each token once: SamplerSettings checks it)."""

    def __init__(self, biases: tuple[tuple[int, float], ...]) -> None:
        self.ids = np.array([token for token, _ in biases], dtype=np.intp)
        self.values = np.array([bias for _, bias in biases], dtype=np.float32)

    @classmethod
    def of(cls, settings: SamplerSettings) -> LogitBias | None:
        """The bias `settings` ask for; None when they ask for none."""
        return cls(settings.logit_bias) if settings.logit_bias else None

    def add_to(self, row: np.ndarray) -> None:
        """Add the biases to their tokens' logits in `row`, in place."""
        row[self.ids] += self.values
