"""Drafters for speculative decoding: what the next tokens will likely be, cheaply, for the target
model to check in one evaluation (localchat.session.Decoder verifies and keeps what it agrees with).

Prompt lookup copies what followed the sequence's last n-gram earlier in it; a draft model is a
smaller model with the same vocabulary that decodes greedily a few tokens ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localchat.backends.base import Backend
from localchat.errors import ModelError
from localchat.prefix_cache import common_prefix_length

# Prompt lookup tries the sequence's last n-gram for these n, longest first.
LOOKUP_NGRAMS = (3, 2, 1)
# A drafting step costs a plain step and FIXED + PER_ROW * k plain steps more for k drafted rows, fit
# to the session's timed steps; until then this line, measured with benchmarks/speculative.py
# --step-cost on AMD EPYC (2 threads): SmolLM2-135M 0.31 + 0.57k (0.88 for k = 1, 14.5 for k = 25),
# Gemma 3 270M 0.38 + 0.27k. The dearer of the two: a wrong guess there costs only a late start. SmolLM2's
# drafted rows cost so much because its file is Q4_1, for which this llama.cpp has no batched CPU kernel
# (llamafile's sgemm and the repacked layouts take Q4_0, Q4_K, Q5_0, Q8_0, IQ4_NL and others): each row pays
# its dot products in full. On an AVX2 EPYC a step of 10 and of 18 tokens took 5.32 and 9.65 plain steps, so
# drafting tops out at 1.88x there with every drafted token taken, where Gemma's 18 took 6.64 (2.71x).
PRIOR_FIXED = 0.31
PRIOR_PER_ROW = 0.57
# The counts of rows the prior line was measured at, its two points in the fit.
PRIOR_ROWS = (1, 25)
# The weight of the newest step in the timed figures (moving averages).
COST_WEIGHT = 0.1
# The plain steps right after a drafting step that are charged to it: the batch's shape changed, so
# llama.cpp builds its graph again for the first, and on a GPU re-captures its CUDA graph in the second
# (ggml-cuda executes a changed graph directly, then captures it once it is seen unchanged). On an H200
# (a random 1.5B model) the two after a draft of 2 to 17 rows took 1.47 and 1.57 ms against 1.12 steady;
# on AMD EPYC the first after a 6-row step cost 5% (SmolLM2-135M) and 18% (1 ms steps) more than a steady one.
RECOVERY_STEPS = 2
# The weight each of the prior line's two points keeps in the fit for good: a twentieth of the first
# drafting step's, against the moving average's 1 once steps have been timed.
PRIOR_WEIGHT = 0.005
# How far predictions come true weighs each ended prediction 1 - TAKEN_WEIGHT as much as the next.
TAKEN_WEIGHT = 0.3
# A step drafts only where its expected tokens per second beat a plain step's by this factor: the
# best of many lengths, each estimated, is picked, so its estimate is more often high than low.
DRAFT_MARGIN = 1.05
# The first draft model's draft length; each draft taken whole lengthens the next by DRAFT_GROWTH.
INITIAL_DRAFT = 8
DRAFT_GROWTH = 2


class StepCosts:
    """What steps cost on one session's model, timed: a plain step (one token in, one sampled), and
    a drafting step's extra cost over it, a line in the count of drafted rows fit by least squares to
    recent drafting steps and, lightly, the prior line's two points. A drafting step's cost includes
    what the RECOVERY_STEPS plain steps after it take over a steady one. The first step of a count of
    rows the context has not evaluated yet costs `first_shape` plain steps more (`Backend.new_shapes`):
    the backend's figure until the session has timed such a step, then the mean of those timed. Kept
    across the session's replies."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.plain_s: float | None = None
        # (fixed, per row): a step drafting k rows costs 1 + fixed + per_row * k plain steps.
        self.line = (PRIOR_FIXED, PRIOR_PER_ROW)
        # Only where a new count of rows costs more (a GPU) are steps told apart by it: elsewhere every
        # drafting step goes into the line.
        self._shapes = backend if backend is not None and backend.first_shape_steps > 0 else None
        self.first_shape = backend.first_shape_steps if self._shapes is not None else 0.0
        self._first_shapes_timed = 0
        # Moving averages of 1, k, k^2, u and k*u over drafting steps of k rows costing u plain steps more.
        self._observed = np.zeros(5)
        # The last drafting step while the plain steps after it are charged to it.
        self._recovering: _RecoveringStep | None = None

    def plain(self, seconds: float) -> None:
        recovering = self._recovering
        if recovering is None:
            self.plain_s = _moving_average(self.plain_s, seconds, COST_WEIGHT)
            return
        assert self.plain_s is not None
        recovering.seconds += seconds - self.plain_s
        recovering.plain_steps += 1
        if recovering.plain_steps == RECOVERY_STEPS:
            self._fit(recovering)

    def extra(self, rows: np.ndarray) -> np.ndarray:
        """What a drafting step of each count of `rows` drafted rows costs over a plain step, in plain steps."""
        fixed, per_row = self.line
        cost = fixed + per_row * rows
        # The step evaluates the pending token's row with the drafted ones.
        return cost if self._shapes is None else cost + self.first_shape * self._shapes.new_shapes(rows + 1)

    def new_shape(self, rows: int) -> bool:
        """Whether a drafting step of `rows` drafted rows would be the context's first of its count of rows,
        where that costs more (ask before the step)."""
        return self._shapes is not None and bool(self._shapes.new_shapes(np.array([rows + 1]))[0])

    def drafted(self, seconds: float, rows: int, new_shape: bool = False) -> None:
        """A drafting step of `rows` drafted rows took `seconds`; `new_shape`: it was the context's first of its
        count of rows."""
        if self.plain_s is None:
            return
        if self._recovering is not None:  # drafting again at once: this step's own time holds the change back
            self._fit(self._recovering)
        self._recovering = _RecoveringStep(seconds, rows, new_shape)

    def _fit(self, step: _RecoveringStep) -> None:
        assert self.plain_s is not None
        self._recovering = None
        extra = step.seconds / self.plain_s - 1
        if step.new_shape:  # what it cost over the line is the shape's first time, not the line's
            fixed, per_row = self.line
            self._first_shapes_timed += 1
            self.first_shape += (max(extra - fixed - per_row * step.rows, 0.0) - self.first_shape) / self._first_shapes_timed
            return
        self._observed += COST_WEIGHT * (_line_terms(step.rows, extra) - self._observed)
        # The prior's two points stay in the fit at a fixed weight: steps all of one length (a long
        # copy drafts as long as it may every step) fix the line's height there, the prior its slope.
        n, k, kk, u, ku = (float(total) for total in self._observed + _PRIOR_SUMS)
        per_row = max((n * ku - k * u) / (n * kk - k * k), 0.01)
        self.line = (max((u - per_row * k) / n, 0.0), per_row)


@dataclass
class _RecoveringStep:
    seconds: float  # the drafting step's, plus what the plain steps after it took over a steady one
    rows: int
    new_shape: bool  # the context's first step of that count of rows
    plain_steps: int = 0  # plain steps since


def _line_terms(k: int, u: float) -> np.ndarray:
    """1, k, k^2, u and k*u: a point's terms in the sums a least-squares line is solved from."""
    return np.array([1.0, k, k * k, u, k * u])


_PRIOR_SUMS = PRIOR_WEIGHT * sum(_line_terms(rows, PRIOR_FIXED + PRIOR_PER_ROW * rows) for rows in PRIOR_ROWS)


def verified_rows(drafted: int | np.ndarray, room: int, even_rows: bool) -> int | np.ndarray:
    """The rows a draft of `drafted` tokens takes to verify, beside the pending token's: one more (a filler)
    where the backend's even counts of rows are cheaper (`Backend.even_rows`), the draft's count with the
    pending token is odd, and the reply has room for it. For one count or an array of them."""
    return drafted + (even_rows & (drafted % 2 == 0) & (drafted < room))


class LookupDrafting:
    """How many prompt-lookup tokens a step of one reply drafts: the count expected to give tokens
    fastest, from the session's step costs and how far this reply's predictions came true, or 0 where
    a plain step is expected to be faster.

    Every step predicts: the tokens lookup finds are followed as the reply goes on, drafted or not, to
    see how many come true (a run of r). Per n-gram length of the match (a 3-gram match is a better
    guide than a 1-gram one), a draft of k's expected tokens kept, E[min(r, k)], is the sum of the
    chances that a run reaches 1..k tokens, estimated from how many predictions reached each position and
    how many ended there (Kaplan-Meier's estimator, the older predictions weighing less): the predictions
    still coming true count too, for the positions they have reached. While a reply copies its prompt, its
    predictions end only when they have come true whole, up to `limit` tokens later, so an average over the
    ended ones alone stays that long at the short runs before the copy (on Gemma 3 270M, a reply copying its
    prompt drafted 3 to 5 tokens a step over its first 50 tokens, all kept); counting those still alive, it
    drafts as far as they have come true. A reply that stops repeating its prompt stops drafting at once,
    and one that starts copying drafts as soon as a prediction has come true, without a draft paid to find
    out. No run is expected longer than the longest seen.

    This runs on every token, drafting or not, between one decode and the next, so the common case (a
    prediction that did not come true, a step that will not draft) builds no array: each numpy call
    after a decode waits for its code to come back into the caches (tens of microseconds on the AMD
    EPYC machine), which on a GPU is a few percent of a step."""

    def __init__(self, limit: int, costs: StepCosts, even_rows: bool) -> None:
        self.limit = limit
        self.costs = costs
        self.even_rows = even_rows
        self._runs: dict[int, _RunCounts] = {}  # per n
        self._open: list[_Prediction] = []  # predictions still coming true
        self._ks = np.arange(limit + 1)

    def length(self, draft: list[int], n: int, room: int) -> int:
        """How many of `draft` (lookup's prediction, at most `limit` tokens, from a match of an `n`-gram) to
        draft now, with room for `room` more tokens; predicts it, drafted or not."""
        self._open.append(_Prediction(n, draft))
        if self.costs.plain_s is None:
            return 0
        runs = self._runs_of(n)
        alive = [p.kept for p in self._open if p.n == n and p.kept]
        reach = min(max([runs.reach, *alive]), len(draft))
        if not reach:
            return 0
        fixed, per_row = self.costs.line
        # Not even the longest draft's tokens at the shortest one's cost would pay (an upper bound of them, cheaply).
        if (1 + runs.kept_at_most(alive, reach)) / (1 + fixed + per_row) < DRAFT_MARGIN:
            return 0
        taken = runs.expected_kept(alive)[1 : len(draft) + 1]
        ks = self._ks[1 : len(draft) + 1]
        speed = (1 + taken) / (1 + self.costs.extra(verified_rows(ks, room, self.even_rows)))
        best = int(speed.argmax())
        return int(ks[best]) if speed[best] >= DRAFT_MARGIN else 0

    def append(self, token: int) -> None:
        """The reply's next token: the open predictions that it ends are resolved."""
        still: list[_Prediction] = []
        for prediction in self._open:
            if prediction.kept < len(prediction.tokens) and prediction.tokens[prediction.kept] == token:
                prediction.kept += 1
                if prediction.kept < len(prediction.tokens):
                    still.append(prediction)
                    continue
            self._runs_of(prediction.n).ended(prediction.kept, whole=prediction.kept == len(prediction.tokens))
        self._open = still

    def _runs_of(self, n: int) -> _RunCounts:
        runs = self._runs.get(n)
        if runs is None:
            runs = self._runs[n] = _RunCounts(self.limit)
        return runs


class _RunCounts:
    """Per position j = 1..limit of a prediction, the ended predictions that reached it (their j-th token was
    compared with the reply's) and of those the ones that ended there (it differed), weighed by TAKEN_WEIGHT.
    Kept as `scale` times two arrays, so that weighing the older ones down is one multiplication. Index 0 is
    unused; the one past the limit stays 0, for `kept_at_most` to read a second position where the limit is 1."""

    def __init__(self, limit: int) -> None:
        self.reached = np.zeros(limit + 2)
        self.failed = np.zeros(limit + 2)
        self.scale = 1.0
        self.reach = 0  # the farthest position any ended prediction reached

    def ended(self, kept: int, whole: bool) -> None:
        """A prediction ended with `kept` tokens come true: all of it (`whole`), or followed by one that did not."""
        self.scale *= 1 - TAKEN_WEIGHT
        if self.scale < RESCALE_BELOW:
            self.reached *= self.scale
            self.failed *= self.scale
            self.scale = 1.0
        weight = 1 / self.scale
        last = kept if whole else kept + 1
        if last == 1:  # the common case, a prediction whose first token did not come true: no array built
            self.reached[1] += weight
        else:
            self.reached[1 : last + 1] += weight
        if not whole:
            self.failed[last] += weight
        self.reach = max(self.reach, last if whole else kept)

    def kept_at_most(self, alive: list[int], reach: int) -> float:
        """An upper bound of E[min(r, reach)] (`alive` as in `expected_kept`) from the first two positions'
        counts, without an array: the chance of reaching the first, then the second and every one after."""
        first = self._survives(1, alive)
        return first + first * self._survives(2, alive) * (reach - 1)

    def _survives(self, position: int, alive: list[int]) -> float:
        """The chance that a prediction reaching `position` comes true there (0 where none reached it)."""
        reached = self.reached.item(position) * self.scale + sum(kept >= position for kept in alive)
        return 1 - self.failed.item(position) * self.scale / reached if reached else 0.0

    def expected_kept(self, alive: list[int]) -> np.ndarray:
        """E[min(r, k)] for k = 0..limit, the predictions still coming true (`alive`: how far each has) counted
        as reaching their positions, at the weight of the newest."""
        reached = self.reached * self.scale
        if alive:
            counts = np.bincount(alive, minlength=len(reached))
            reached = reached + counts[::-1].cumsum()[::-1]  # those alive past j reached j
        with np.errstate(divide="ignore", invalid="ignore"):
            survives = np.where(reached > 0, 1 - self.failed * self.scale / reached, 0.0)
        survives[0] = 1.0
        expected = np.cumprod(survives)
        expected[0] = 0.0
        return expected.cumsum()


# _RunCounts keeps its weights as a scale times its arrays; below this scale the arrays take it over.
RESCALE_BELOW = 1e-100


@dataclass
class _Prediction:
    n: int  # the length of the n-gram lookup matched
    tokens: list[int]
    kept: int = 0  # how many came true so far


class NgramIndex:
    """A growing token sequence and, for each of its n-grams (n in LOOKUP_NGRAMS), where it last
    occurred with a token after it: the prompt-lookup draft in constant time per token, however
    long the conversation."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        tokens, end = self.tokens, len(self.tokens)
        # The n-grams ending with the current last token now have a token after them.
        for n in LOOKUP_NGRAMS:
            if end >= n:
                self._latest[tuple(tokens[end - n :])] = end - n
        tokens.append(token)

    def draft(self, limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the sequence's last
        n-gram (the longest n found), and that n: what a text quoting its prompt will likely say next."""
        tokens = self.tokens
        for n in LOOKUP_NGRAMS:
            start = self._latest.get(tuple(tokens[-n:])) if len(tokens) > n else None
            if start is not None:
                return tokens[start + n : start + n + limit], n
        return [], 0


# A draft model drafts at most this many tokens a step (fewer while its drafts are cut short).
DRAFT_MODEL_TOKENS = 8
# A draft model drafts only while it pays: while a token costs less with drafts (drafting, and the
# target's verification, per token kept) than a plain step does, both timed as moving averages
# weighing the newest step this much. A drafter that loses is tried again after DRAFT_RETRY plain
# steps, twice as many after each further loss; one that would lose even with every drafted token
# taken, twice running (one slow step may be the machine's), is not tried again. Measured with
# benchmarks/speculative.py (AMD EPYC, greedy): the Q4_K_M of Gemma 3 270M drafting for its Q8_0 is
# as fast as its target (both keep the 262k-row Q8_0 head): drafting every step 0.62x input-grounded
# and 0.60x open-ended, timed 1.01x and 0.98x (96 tokens). Weight 0.1 and retries after 4, as weight
# 0.3 and retries after 16 flipped to plain steps on one cut draft and stayed there too long.
PACE_WEIGHT = 0.1
DRAFT_RETRY = 4
# Token ids compared to tell whether two vocabularies are the same: every this-many-th id, and the last.
VOCABULARY_STRIDE = 97


class DraftModel:
    """A smaller model with the target's vocabulary (a Q4_K_M draft for a Q8_0 or F16 target of the
    same checkpoint, or the small model of the same family) that drafts by greedy decoding. Its KV
    cache (sequence `seq` of its backend) follows the target's sequence: before each draft it keeps
    the part still shared with it and evaluates the rest."""

    def __init__(self, backend: Backend, seq: int = 0) -> None:
        self.backend = backend
        self.seq = seq
        self.tokens: list[int] = []  # what its KV cache holds
        # Whether it pays is kept across replies: a draft model as costly as its target is
        # found out once per session, not once per reply (DraftPace).
        self.pace = DraftPace()

    def follow(self, sequence: Sequence[int]) -> None:
        """Make the KV cache hold `sequence`, keeping what it shares with it (the last token is
        always evaluated again: its logits give the first drafted token). Called with the prompt
        before the first token, so the prompt's prefill counts in the time to first token."""
        keep = min(common_prefix_length(self.tokens, sequence), len(sequence) - 1)
        self.backend.truncate(self.seq, keep)
        del self.tokens[keep:]
        self.backend.evaluate(self.seq, sequence[keep:], keep)
        self.tokens.extend(sequence[keep:])

    def draft(self, sequence: Sequence[int], limit: int) -> list[int]:
        """`limit` tokens the draft model writes after `sequence` (greedy)."""
        backend, seq = self.backend, self.seq
        self.follow(sequence)
        drafted: list[int] = []
        while True:
            drafted.append(int(backend.logits(seq).argmax()))
            if len(drafted) == limit:
                return drafted
            backend.evaluate(seq, drafted[-1:], len(self.tokens))
            self.tokens.append(drafted[-1])


class DraftPace:
    """Whether a drafter's next step drafts, from timed steps: after a plain step (the yardstick),
    while drafting gives tokens faster than plain steps do, and again now and then after it did
    not (the text may have become easier to draft), unless it cannot pay at all."""

    def __init__(self) -> None:
        self.plain_s: float | None = None  # seconds a plain step takes
        # Seconds and tokens kept of a drafting step: their ratio weighs each step by its length,
        # so one long draft cut early does not outweigh the whole drafts before it.
        self._draft_s: float | None = None
        self._kept: float | None = None
        self.hopeless = False  # slower than plain steps even with every drafted token taken
        self._hopeless_steps = 0  # losing steps in a row that would have lost with every token taken
        self._wait = 0  # plain steps before drafting is tried again
        self._retry = DRAFT_RETRY

    @property
    def drafting_s(self) -> float | None:
        """Seconds a token kept takes when drafting."""
        return None if self._draft_s is None or self._kept is None else self._draft_s / self._kept

    @property
    def pays(self) -> bool:
        return self.drafting_s is not None and self.plain_s is not None and self.drafting_s < self.plain_s

    def use_drafts(self) -> bool:
        if self.plain_s is None or self.hopeless:
            return False
        return self.drafting_s is None or self.pays or self._wait <= 0

    def plain(self, seconds: float) -> None:
        self.plain_s = _moving_average(self.plain_s, seconds)
        self._wait -= 1

    def drafted(self, seconds: float, drafted: int, kept: int) -> None:
        """A drafting step took `seconds` (drafting and verifying) for `drafted` tokens, and kept
        `kept` tokens (the one sampled after them included)."""
        assert self.plain_s is not None
        if not self.pays:  # a retry after a loss measures afresh: the old figures are of a text now behind
            self._draft_s = self._kept = None
        self._draft_s = _moving_average(self._draft_s, seconds)
        self._kept = _moving_average(self._kept, kept)
        if self.pays:
            self._retry, self._hopeless_steps = DRAFT_RETRY, 0
            return
        self._hopeless_steps = self._hopeless_steps + 1 if seconds / (drafted + 1) >= self.plain_s else 0
        self.hopeless = self._hopeless_steps >= 2
        self._wait, self._retry = self._retry, 2 * self._retry


def _moving_average(average: float | None, value: float, weight: float = PACE_WEIGHT) -> float:
    return value if average is None else average + weight * (value - average)


def check_same_vocabulary(target: Backend, draft: Backend) -> None:
    """Raise ModelError unless the draft model spells tokens as the target does (spot-checked)."""
    n_vocab = target.info.n_vocab
    if draft.info.n_vocab != n_vocab:
        raise ModelError(f"the draft model has {draft.info.n_vocab} tokens but the model has {n_vocab}: "
                         "a draft model must share the model's vocabulary (the same family or checkpoint)")
    for token in [*range(0, n_vocab, VOCABULARY_STRIDE), n_vocab - 1]:
        if target.token_text(token) != draft.token_text(token):
            raise ModelError(f"the draft model spells token {token} {draft.token_text(token)!r}, the model "
                             f"{target.token_text(token)!r}: a draft model must share the model's vocabulary")
