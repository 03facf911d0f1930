"""Drafters for speculative decoding: what the next tokens will likely be, cheaply, for the target
model to check in one evaluation (localchat.session.Decoder verifies and keeps what it agrees with).

Prompt lookup copies what followed the sequence's last n-gram earlier in it; a draft model is a
smaller model with the same vocabulary that decodes greedily a few tokens ahead.
"""

from __future__ import annotations

from collections.abc import Sequence

from localchat.backends.base import Backend
from localchat.errors import ModelError
from localchat.prefix_cache import common_prefix_length

# Prompt lookup tries the sequence's last n-gram for these n, longest first.
LOOKUP_NGRAMS = (3, 2, 1)
# The longest prompt-lookup draft the front ends (run, serve, the chat app) use unless told otherwise.
# On by default: a reply drafts only once its predictions come true, so one that never repeats (or
# whose sampler penalises repeats, as DRY does) pays nothing. Long, because llama.cpp's CPU kernels
# make each row of a draft cost about 5 ms after the first's 21 in an even count of rows (mostly the
# 262k-row output head; benchmarks/speculative.py --step-cost; see LlamaCppBackend.even_rows), so a
# copied run pays off more the longer it is drafted. benchmarks/speculative.py, AMD EPYC, greedy,
# default model, speedup in decode tok/s, drafts of 8 / 16 / 24 (first drafts of 2, before drafts
# were verified in even counts of rows): input-grounded 128 tokens 1.52 / 1.86 / 1.92x, 384 tokens
# 1.67 / 1.99 / 2.25x; open-ended 128 tokens 1.42 / 1.50 / 1.45x. The chat sampler takes no draft.
# Odd: with the token before it, a whole draft is an even count of rows.
DEFAULT_LOOKUP_DRAFT = 25
# Drafting goes on while the estimated share of first drafted tokens accepted stays at least this: a
# draft's first row costs most of a plain step more (one step of 2 rows with logits takes 1.8-1.9x one
# of 1 row: benchmarks/speculative.py --step-cost), so below it drafting loses. Under it the decoder
# only predicts, to see when drafts would be taken again.
DRAFT_MIN_ACCEPTANCE = 0.5
# The weight of the newest step in that estimate (an exponential moving average).
ACCEPTANCE_WEIGHT = 0.2
# A reply starts predicting only: one prediction come true lifts the estimate over the bar. So a
# reply that never repeats (or a sampler that penalises repeats, as DRY does) costs no draft rows.
INITIAL_ACCEPTANCE = DRAFT_MIN_ACCEPTANCE - ACCEPTANCE_WEIGHT / 4
# The first draft's length; each draft taken whole lengthens the next by DRAFT_GROWTH. Drafting
# starts only once a prediction came true, so the first draft is likely taken: input-grounded,
# 128 tokens, drafts up to 24, first drafts of 2 / 4 / 8: 1.89 / 1.86 / 2.05x (open-ended 1.57 /
# 1.68 / 1.74x).
INITIAL_DRAFT = 8
DRAFT_GROWTH = 2


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

    def draft(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the sequence's last
        n-gram (the longest n found): what a text quoting its prompt will likely say next."""
        tokens = self.tokens
        for n in LOOKUP_NGRAMS:
            start = self._latest.get(tuple(tokens[-n:])) if len(tokens) > n else None
            if start is not None:
                return tokens[start + n : start + n + limit]
        return []


# A draft model drafts at most this many tokens a step (fewer while its drafts are cut short).
DRAFT_MODEL_TOKENS = 8
# Drafting goes on only while it pays: while a token costs less with drafts (drafting, and the
# target's verification, per token kept) than a plain step does, both timed as moving averages
# weighing the newest step this much. A drafter that loses is tried again after DRAFT_RETRY plain
# steps, twice as many after each further loss; one that would lose even with every drafted token
# taken, twice running (one slow step may be the machine's), is not tried again. Measured with
# benchmarks/speculative.py (AMD EPYC, greedy) and a raw "Tell story number N about a dragon." on
# the default model (what benchmarks/vs_llama_server.py sends; the reply repeats the line with the
# next number, so drafts are cut at each number yet pay):
# - the Q4_K_M of Gemma 3 270M drafting for its Q8_0 is as fast as its target (both keep the
#   262k-row Q8_0 head): drafting every step 0.62x input-grounded and 0.60x open-ended, timed
#   1.01x and 0.98x (96 tokens);
# - prompt lookup on that Q8_0's open-ended story (43% of drafted tokens taken): 0.72x drafting on
#   acceptance alone, timed 0.99x;
# - weight 0.3 and retries after 16: that Q8_0 story 0.93-1.10x, but the dragon stories 1.0-1.1x
#   where drafting on acceptance alone gives 1.3x (one cut draft flipped the estimate, and each
#   flip cost 16 steps undrafted); weight 0.1 and retries after 4: 1.1-1.8x.
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


def _moving_average(average: float | None, value: float) -> float:
    return value if average is None else average + PACE_WEIGHT * (value - average)


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
