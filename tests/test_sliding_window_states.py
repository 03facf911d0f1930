"""Gemma 3's saved states in real llama.cpp: a sliding-window layer's saved state holds its last 512
positions alone, so a state restored and cut back would attend to nothing of the positions before its
cut. Such a state is restored whole or not at all; the live sequence keeps every position and is cut back."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.prefix_cache import RestoreCosts
from localchat.settings import Settings

TEXT = " ".join(f"Item {i} is a line about cats, dogs and the weather today." for i in range(200))


@pytest.fixture
def gemma(gemma_model: Path, settings: Settings) -> Iterator[Engine]:
    """With a prefix cache in memory alone: each test's own."""
    with Engine.load(str(gemma_model), dataclasses.replace(settings, prefix_cache_disk_bytes=0),
                     PlanRequest(n_ctx=2048, n_seq=2, n_threads=2)) as engine:
        yield engine


def test_a_state_is_not_cut_back_past_its_window(gemma: Engine) -> None:
    """1,500 tokens saved; a prompt sharing their first 1,000 is computed, not restored and cut back
    (which put Gemma 3 270M's next logits up to 27 apart from computing them, its top token another)."""
    assert gemma.backend.rewinds and not gemma.backend.saved_states_rewind
    tokens = gemma.backend.tokenize(TEXT, add_bos=True, special=False)[:1500]
    saved = gemma.sessions[0]
    saved.prefill(tokens)
    saved.release()
    cache = saved.prefix_cache
    assert cache is not None and cache.covers(tokens, exactly=True)
    cache.costs = RestoreCosts()  # restoring is tried where it may be
    shared = tokens[:1000] + gemma.backend.tokenize(" And then", add_bos=False, special=False)
    assert saved.prefill(shared) == (0, 0)
    computed = gemma.backend.logits(0).copy()
    fresh = gemma.sessions[1]
    fresh.prefix_cache = None
    fresh.prefill(shared)
    # Two sequences' cells lie apart in the cache, which rounds their logits apart by tenths (0.22 here); the
    # state cut back put them 10 to 27 apart.
    assert float(np.max(np.abs(computed - gemma.backend.logits(1)))) < 2.0


def test_the_live_sequence_is_cut_back(gemma: Engine) -> None:
    """With every position in the cache (swa_full), a prompt that parts from the live sequence keeps
    what they share."""
    tokens = gemma.backend.tokenize(TEXT, add_bos=True, special=False)[:1500]
    session = gemma.sessions[0]
    session.prefill(tokens)
    reused, restored = session.prefill(tokens[:1000] + [tokens[5]])
    assert (reused, restored) == (1000, 0)


@pytest.mark.parametrize("displaced", [True, False], ids=["saved", "live"])
def test_a_third_chat_restores_what_the_first_two_share(gemma: Engine, displaced: bool) -> None:
    """A second prompt sharing an earlier one's first 300 tokens alone (a system prompt) saves the state
    there on its way, held whole, whether it computes them again (the first was saved and displaced) or keeps
    them from the live sequence; a third prompt sharing them restores it, to the logits of computing it all."""
    tokenize = gemma.backend.tokenize
    shared = tokenize(TEXT, add_bos=True, special=False)[:300]

    def chat(question: str) -> list[int]:
        return shared + tokenize(question, add_bos=False, special=False)

    first, second = gemma.sessions
    # Its question is long enough to be saved when the second parts from it (MIN_SAVE_TOKENS), as a reply is.
    first.prefill(chat(" Which animal is it, and what do the lines say about the weather on that day and the next?"))
    if displaced:
        first.release()
    cache = first.prefix_cache
    assert cache is not None and not cache.covers(shared, exactly=True)
    assert first.prefill(chat(" What is the weather?")) == ((0, 0) if displaced else (300, 0))
    assert cache.covers(shared, exactly=True)
    cache.costs = RestoreCosts()  # restoring is tried where it may be
    third = chat(" Who wrote these lines?")
    assert second.prefill(third) == (300, 300)
    restored = second.backend.logits(1).copy()
    first.prefix_cache = None
    first.reset()
    assert first.prefill(third) == (0, 0)
    # As in test_a_state_is_not_cut_back_past_its_window: apart by tenths, as two sequences' cells are.
    assert float(np.max(np.abs(restored - gemma.backend.logits(0)))) < 2.0
