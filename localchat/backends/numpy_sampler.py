"""Sampling on a numpy logits row, for a backend without a sampler of its own (onnxruntime):
logit bias, penalties, DRY, temperature, top-k, top-p and min-p as llama.cpp's chain does them."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from itertools import islice

import numpy as np

from localchat.backends.base import SamplerSettings, TokenGuide
from localchat.backends.logit_bias import LogitBias

# About ln(FLT_MAX): DRY's exponent is capped so that base^exponent stays a finite float32.
FLOAT_MAX_LOG = 88.7228391


class NumpySampler:
    """Logit bias, penalties, DRY, temperature, top-k, top-p and min-p over one logits row, as llama.cpp's
    chain does them, on a few candidates.

    Only tokens within the settings' far span (SamplerSettings.far_span) of the best logit are looked at, so
    after one pass over the vocabulary the work scales with the candidates, not the vocabulary."""

    def __init__(self, settings: SamplerSettings, dry_breakers: np.ndarray | None = None, guide: TokenGuide | None = None) -> None:
        """`dry_breakers`: a mask over the vocabulary of the tokens that hold a DRY sequence breaker;
        `guide`: the grammar the reply must follow."""
        self.settings = settings
        self.guide = guide
        self.bias = LogitBias.of(settings)
        self.rng = np.random.default_rng(settings.seed)
        window = settings.history_window
        self.history: deque[int] = deque(maxlen=None if window < 0 else window)
        # DRY's history: the reply alone (see SamplerSettings).
        self.reply: deque[int] = deque(maxlen=None if settings.dry_penalty_last_n < 0 else settings.dry_penalty_last_n)
        self.dry_breakers = dry_breakers
        if settings.dry and dry_breakers is None:
            raise ValueError("DRY needs the mask of the tokens that break a sequence")

    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None:
        if self.settings.penalized:
            self.history.extend(int(t) for t in tokens)
        if reply and self.settings.dry:
            self.reply.extend(int(t) for t in tokens)

    def reset(self) -> None:
        self.history.clear()
        self.reply.clear()

    def close(self) -> None:
        pass

    def _recent(self, n: int) -> list[int]:
        """The last `n` tokens seen (-1: all)."""
        start = 0 if n < 0 else max(len(self.history) - n, 0)
        return list(islice(self.history, start, None))

    def penalise(self, logits: np.ndarray) -> None:
        """The penalties and DRY, in place (the row is rewritten by the next run)."""
        if self.settings.repeat_penalized and self.history:
            self._repeat_penalties(logits)
        if self.settings.dry:
            self._dry(logits)

    def _repeat_penalties(self, logits: np.ndarray) -> None:
        counts = Counter(self._recent(self.settings.penalty_last_n))
        ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
        n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        values = logits[ids]
        s = self.settings
        values = np.where(values > 0, values / s.repeat_penalty, values * s.repeat_penalty)
        values -= n * s.frequency_penalty + s.presence_penalty
        logits[ids] = values

    def _dry(self, logits: np.ndarray) -> None:
        """DRY, as llama.cpp's `llama_sampler_dry_apply` does it, in place: a token that would
        extend a repeat of the text's end (since its last sequence breaker) by at least
        `dry_allowed_length` tokens loses multiplier * base^(length - allowed_length)."""
        s, breakers = self.settings, self.dry_breakers
        assert breakers is not None
        tail = np.asarray(self.reply, dtype=np.int64)
        n = len(tail)
        if n <= s.dry_allowed_length:
            return
        stops = np.flatnonzero(breakers[tail])
        limit = n - 1 - int(stops[-1]) if len(stops) else n
        if limit < s.dry_allowed_length:
            return
        if s.dry_base > 1.000001:
            # llama.cpp caps the exponent so that the penalty stays a finite float: longer
            # repeats than this are penalised alike and need not be measured.
            limit = min(limit, s.dry_allowed_length + int(FLOAT_MAX_LOG / np.log(s.dry_base)))
        # length[e]: how many tokens ending at e equal the tokens at the end (at most `limit`).
        # Ends still matching are compared a block of tokens at a time, the block doubling, so a
        # long periodic text costs a few numpy steps, not one per token.
        length = np.zeros(n - 1, dtype=np.int64)
        alive = np.flatnonzero(tail[:-1] == tail[-1])
        length[alive] = 1
        done, width = 1, 1
        while len(alive) and done < limit:
            width = min(width * 2, limit - done)
            back = done + np.arange(width)
            theirs = alive[:, None] - back
            same = (theirs >= 0) & (tail[np.maximum(theirs, 0)] == tail[n - 1 - back])
            run = np.where(same.all(axis=1), width, same.argmin(axis=1))
            length[alive] += run
            alive = alive[run == width]
            done += width
        ends = np.flatnonzero(length >= s.dry_allowed_length)
        if not len(ends):
            return
        ids, where = np.unique(tail[ends + 1], return_inverse=True)
        longest = np.zeros(len(ids), dtype=np.int64)
        np.maximum.at(longest, where, length[ends])
        keep = ~breakers[ids]
        exponent = longest[keep] - s.dry_allowed_length
        logits[ids[keep]] -= (s.dry_multiplier * s.dry_base ** exponent.astype(np.float64)).astype(np.float32)

    def pick(self, logits: np.ndarray) -> int:
        s = self.settings
        if self.bias is not None:
            self.bias.add_to(logits)
        if self.guide is not None:
            self.guide.mask(logits)
        if s.penalized:
            self.penalise(logits)
        if s.greedy:
            token = int(logits.argmax())
        else:
            token = self._sample(logits)
        if s.penalized:
            self.history.append(token)
        if s.dry:
            self.reply.append(token)
        if self.guide is not None:
            self.guide.consume(token)
        return token

    def _sample(self, logits: np.ndarray) -> int:
        s = self.settings
        best = float(logits.max())
        margin = s.far_span if s.min_p <= 0 else min(s.far_span, -float(np.log(s.min_p)))
        ids = np.flatnonzero(logits >= best - margin)
        values = logits[ids].astype(np.float64)
        if 0 < s.top_k < len(ids):
            keep = np.argpartition(-values, s.top_k - 1)[: s.top_k]
            ids, values = ids[keep], values[keep]
        order = np.argsort(-values, kind="stable")
        ids, values = ids[order], values[order]
        if s.top_p < 1.0:
            probs = np.exp(values - values[0])
            probs /= probs.sum()
            cut = int(np.searchsorted(np.cumsum(probs), s.top_p)) + 1
            ids, values = ids[:cut], values[:cut]
        weights = np.exp((values - values[0]) / s.temperature)
        cumulative = np.cumsum(weights)
        return int(ids[min(int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")), len(ids) - 1)])
