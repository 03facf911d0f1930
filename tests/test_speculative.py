"""Prompt-lookup speculative decoding: the draft rule (pure logic), and on the real default model
greedy replies equal token for token with and without drafting."""

from __future__ import annotations

from test_evaluate_all import ATOL

from localchat.backends.base import ARGMAX
from localchat.engine import Engine
from localchat.session import GenerationSettings, lookup_draft

PASSAGE = ("The lighthouse keeper climbed the narrow stairs every evening at dusk. He trimmed the wick, "
           "polished the great lens and wrote the weather in a small leather book. Ships passed far out "
           "at sea, and none of them ever knew his name.")
PROMPTS = [
    f"Text: {PASSAGE}\nThe same text, copied exactly:\nText: The lighthouse keeper",  # the reply copies the prompt
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 4, 5, 6, 7,",
]


def test_the_draft_follows_the_latest_earlier_match_of_the_longest_ngram() -> None:
    assert lookup_draft([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3], 2) == [7, 8]
    assert lookup_draft([5, 6, 7, 1, 2, 8, 2], 3) == [8, 2]  # no 3- or 2-gram match: the last token
    assert lookup_draft([4, 1, 2, 3], 5) == [] and lookup_draft([], 4) == []


def test_greedy_replies_are_the_same_with_drafting(engine: Engine) -> None:
    """Token for token, up to the kernels' rounding: a draft is verified by one batched evaluation,
    whose logits differ from one-token evaluations by up to 0.2 (tests/test_evaluate_all.py), so
    a reply may part from the plain one only where the model's two best tokens were that close."""
    session = engine.sessions[0]
    for text in PROMPTS:
        prompt = engine.backend.tokenize(text, add_bos=True, special=False)
        runs = []
        for draft in (0, 8):
            session.reset()
            generation = session.generate(prompt, GenerationSettings(max_tokens=32, sampler=ARGMAX, lookup_draft=draft, logprobs=2))
            generation.text()
            assert generation.stats is not None
            runs.append(generation)
            # The session knows exactly what the KV cache holds: the next turn can reuse it.
            held = [*prompt, *generation.stats.completion_ids]
            assert session.tokens == held[: len(session.tokens)] and len(session.tokens) >= len(held) - 1
        plain, drafted = (run.stats.completion_ids for run in runs)  # type: ignore[union-attr]
        parted = next((i for i in range(max(len(plain), len(drafted))) if plain[i : i + 1] != drafted[i : i + 1]), None)
        if parted is not None:
            assert parted < len(plain), (text, parted)  # the plain reply did not end first
            (_, best), (_, second) = runs[0].logprobs[parted].top
            assert best - second < ATOL, (text, parted)
        if text is PROMPTS[0]:  # the reply copies the prompt: most drafted tokens are kept
            stats = runs[1].stats
            assert stats is not None and stats.accepted_tokens >= stats.completion_tokens // 2
    session.reset()
