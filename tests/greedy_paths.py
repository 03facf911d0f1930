"""Comparing the greedy tokens of two evaluation paths of one model, up to the first near tie.

llama.cpp does not promise the same bits for different batch shapes (a batch of sequences against one,
a drafted step of several rows against single rows, a prompt evaluated in other chunks): the kernels sum
in other orders, and which way the CPU's kernels round differs between machines. Where the reference's
two best tokens lie within that rounding, either may be picked, and the two replies part for good.
So two paths are compared token for token up to the reference's first near tie, and the comparison must
still cover enough tokens to mean something: a wrong row or a wrong position moves logits by whole units
and parts the replies long before that.
"""

from __future__ import annotations

from collections.abc import Sequence

from localchat.backends.base import TokenLogprob

# Logits (log-probabilities: the same gap) within which two tokens are a near tie. Batched and
# one-token kernels round a logprob apart by up to 0.16 (Q4_K, AMD: tests/test_evaluate_all.py)
# on each side of the gap; the margin holds both with room to spare, as `convert --verify` at 4 bits.
NEAR_TIE = 0.5


def first_near_tie(gaps: Sequence[float], margin: float = NEAR_TIE) -> int | None:
    """The first position whose two best tokens lie within `margin` (`gaps`: best minus second, per position)."""
    return next((position for position, gap in enumerate(gaps) if gap < margin), None)


def assert_same_until_gap(reference: Sequence[object], gaps: Sequence[float], other: Sequence[object],
                          *, min_compared: int, margin: float = NEAR_TIE) -> int:
    """`other` equals `reference` (tokens or token pieces, with the gap between the two best at each) up to the
    reference's first near tie; returns how many were compared, which must be at least `min_compared`. `other`
    may run on past a reference that ended (the end token's own margin is not known), never end before it."""
    assert len(gaps) == len(reference), "one gap per reference token"
    tie = first_near_tie(gaps, margin)
    compared = len(reference) if tie is None else tie
    assert list(other[:compared]) == list(reference[:compared]), (
        f"parted before the first near tie (position {tie}): {list(reference[:compared + 1])} != {list(other[:compared + 1])}")
    assert compared >= min_compared, (
        f"only {compared} tokens compared before a near tie (at {tie}); need {min_compared}: pick a prompt the model is surer of")
    return compared


def top_two_gap(logprob: TokenLogprob) -> float:
    assert len(logprob.top) >= 2, "the reference needs its top two logprobs (GenerationSettings.logprobs >= 2)"
    (_, best), (_, second) = logprob.top[:2]
    return best - second


def assert_same_until_near_tie(reference: Sequence[int], logprobs: Sequence[TokenLogprob], other: Sequence[int],
                               *, min_compared: int, margin: float = NEAR_TIE) -> int:
    """A reply's tokens against a reference reply's, with the reference's logprobs (top >= 2) for its gaps."""
    return assert_same_until_gap(reference, [top_two_gap(lp) for lp in logprobs], other, min_compared=min_compared,
                                 margin=margin)


def assert_same_pieces_until_near_tie(reference: Sequence[object], other: Sequence[str], *, min_compared: int,
                                      margin: float = NEAR_TIE) -> int:
    """The same over a server's chat replies: `reference` is the OpenAI API's logprobs content of the reference
    reply (asked with top_logprobs >= 2: each entry has `token` and `top_logprobs`), `other` the other reply's pieces."""
    tokens = [entry.token for entry in reference]  # type: ignore[attr-defined]
    gaps = [entry.top_logprobs[0].logprob - entry.top_logprobs[1].logprob for entry in reference]  # type: ignore[attr-defined]
    return assert_same_until_gap(tokens, gaps, other, min_compared=min_compared, margin=margin)


def assert_same_completion_until_near_tie(reference: object, other: Sequence[str], *, min_compared: int,
                                          margin: float = NEAR_TIE) -> int:
    """The same over text completions: `reference` is a completion choice's `logprobs` (asked with logprobs >= 2:
    `tokens` and `top_logprobs`, a dict per token), `other` the other completion's pieces."""
    gaps = [float(a - b) for a, b in (sorted(top.values(), reverse=True)[:2] for top in reference.top_logprobs)]  # type: ignore[attr-defined]
    return assert_same_until_gap(reference.tokens, gaps, other, min_compared=min_compared, margin=margin)  # type: ignore[attr-defined]


def assert_same_text_until_near_tie(reference: Sequence[object], other: str, *, min_compared: int,
                                    margin: float = NEAR_TIE) -> int:
    """The same over a reply known by its text alone (`other`: an API that gives no log-probabilities): it
    starts with the reference's pieces up to the reference's first near tie (`reference` as in
    assert_same_pieces_until_near_tie); returns how many pieces that covers."""
    tokens = [entry.token for entry in reference]  # type: ignore[attr-defined]
    gaps = [entry.top_logprobs[0].logprob - entry.top_logprobs[1].logprob for entry in reference]  # type: ignore[attr-defined]
    tie = first_near_tie(gaps, margin)
    compared = len(tokens) if tie is None else tie
    expected = "".join(tokens[:compared])
    assert other.startswith(expected), (
        f"parted before the first near tie (position {tie}): {expected!r} is not the start of {other!r}")
    assert compared >= min_compared, (
        f"only {compared} tokens compared before a near tie (at {tie}); need {min_compared}: pick a prompt the model is surer of")
    return compared
