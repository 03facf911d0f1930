"""A model with a recurrent state (a tiny random Qwen 3.5: gated delta-net layers, every 4th attending),
in real llama.cpp: its state cannot go back to an earlier position, so it drafts nothing, a prompt
that leaves what its sequence holds is evaluated again whole, a saved state is taken whole, and the
batch scheduler adds no throwaway row. Its replies are noise; what they are compared with is the same
computation made another way, token for token."""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kv_layout_models import qwen35_hybrid, write_tiny_model

from localchat.backends.base import ARGMAX
from localchat.bench import measure_prefix_cache
from localchat.engine import Engine
from localchat.errors import ModelError
from localchat.planner import PlanRequest
from localchat.prefix_cache import RestoreCosts
from localchat.scheduler import ReplyDone, ReplyEvent, ReplyFailed, Scheduler
from localchat.session import GenerationSettings
from localchat.settings import DEFAULT_LOOKUP_DRAFT, Settings

# Drafting on, as shipped: the session must turn it off.
GREEDY = GenerationSettings(max_tokens=12, sampler=ARGMAX, lookup_draft=DEFAULT_LOOKUP_DRAFT)
# Long enough to be saved in the prefix cache (MIN_SAVE_TOKENS), repeating itself as a reply to draft from would.
PROMPT = list(range(100, 140)) * 2


@pytest.fixture(scope="module")
def hybrid_model(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    keys, tensors = qwen35_hybrid()
    return write_tiny_model("qwen35", keys, tensors, default_model, tmp_path_factory.mktemp("hybrid") / "qwen35.gguf")


@pytest.fixture
def hybrid(hybrid_model: Path, settings: Settings) -> Iterator[Engine]:
    """With a prefix cache in memory alone: each test's own."""
    with Engine.load(str(hybrid_model), dataclasses.replace(settings, prefix_cache_disk_bytes=0), PlanRequest(n_ctx=512, n_seq=3, n_threads=2)) as engine:
        yield engine


def greedy(engine: Engine, prompt: list[int], *, seq: int = 0) -> list[int]:
    generation = engine.sessions[seq].generate(prompt, GREEDY)
    generation.text()
    assert generation.stats is not None and generation.stats.drafted_tokens == 0
    return list(generation.completion_ids)


def test_the_backend_says_it_cannot_rewind(hybrid: Engine) -> None:
    assert not hybrid.backend.rewinds and not hybrid.backend.even_rows


def test_a_prompt_that_leaves_the_sequence_is_evaluated_again_whole(hybrid: Engine) -> None:
    """The second prompt shares the first's first 60 tokens, then parts: the sequence is cleared and the
    second prompt evaluated from its start, as on a fresh sequence."""
    other = PROMPT[:60] + list(range(500, 530))
    greedy(hybrid, PROMPT)
    after = greedy(hybrid, other)
    assert hybrid.sessions[0].tokens[: len(other)] == other
    fresh = greedy(hybrid, other, seq=1)
    assert after == fresh


def test_a_saved_state_is_taken_whole(hybrid: Engine) -> None:
    """What a sequence held is saved when it moves on; a prompt that continues it restores it whole and
    evaluates the rest, as the sequence that made the same steps and went on does."""
    greedy(hybrid, PROMPT)
    held = list(hybrid.sessions[0].tokens)
    hybrid.sessions[0].release()  # saves what it holds: PROMPT and the reply
    cache = hybrid.sessions[0].prefix_cache
    assert cache is not None and (match := cache.longest_match(held)) is not None and list(match.tokens) == held
    continued = held + [7, 8, 9]
    restored = hybrid.sessions[0].generate(continued, GREEDY)
    restored.text()
    assert restored.stats is not None and restored.stats.prefix_cache_tokens == len(held)
    greedy(hybrid, PROMPT, seq=1)
    assert hybrid.sessions[1].tokens == held
    assert greedy(hybrid, continued, seq=1) == list(restored.completion_ids)


def test_the_next_turn_goes_on_from_the_last_prompt(hybrid: Engine) -> None:
    """The state short of each prompt's last token is kept: a next prompt that parts from the reply as
    sampled (a template that drops the thinking, text that tokenizes otherwise) evaluates only what follows
    it, to the logits of a sequence that evaluates it all."""
    greedy(hybrid, PROMPT)
    cache = hybrid.sessions[0].prefix_cache
    assert cache is not None and cache.covers(PROMPT[:-1], exactly=True)
    # The tiny model computes faster than it restores, which the cache would learn: measured afresh, as a
    # real model's restores pay.
    cache.costs = RestoreCosts()
    next_turn = PROMPT + list(range(700, 720))
    assert hybrid.sessions[0].prefill(next_turn) == (len(PROMPT) - 1, len(PROMPT) - 1)
    going_on = hybrid.backend.logits(0).copy()
    whole = hybrid.sessions[1]
    whole.prefix_cache = None
    assert whole.prefill(next_turn) == (0, 0)
    np.testing.assert_allclose(going_on, hybrid.backend.logits(1), atol=1e-3)


def test_a_longer_state_sharing_more_does_not_hide_the_one_held_whole(hybrid: Engine) -> None:
    """The reply saved with its prompt shares the next prompt's first reply token too, but parts after it:
    the state short of the prompt's last token is the one restored."""
    greedy(hybrid, PROMPT)
    held = list(hybrid.sessions[0].tokens)
    hybrid.sessions[0].release()  # saves PROMPT and the reply
    cache = hybrid.sessions[0].prefix_cache
    assert cache is not None
    cache.costs = RestoreCosts()  # as in test_the_next_turn_goes_on_from_the_last_prompt
    parting = held[: len(PROMPT) + 1] + [7, 8, 9]
    assert hybrid.sessions[0].prefill(parting) == (len(PROMPT) - 1, len(PROMPT) - 1)


def test_a_third_chat_restores_what_the_first_two_share(hybrid: Engine) -> None:
    """A second prompt sharing an earlier one's first 40 tokens alone (a system prompt) saves the state there
    on its way; a third prompt sharing them restores it whole and evaluates only what follows, to the logits
    of a sequence that evaluates it all."""
    shared = PROMPT[:40]
    greedy(hybrid, shared + list(range(500, 520)))
    cache = hybrid.sessions[0].prefix_cache
    assert cache is not None and not cache.covers(shared, exactly=True)
    greedy(hybrid, shared + list(range(600, 620)))
    assert cache.covers(shared, exactly=True)
    cache.costs = RestoreCosts()  # as in test_the_next_turn_goes_on_from_the_last_prompt
    third = shared + list(range(700, 720))
    assert hybrid.sessions[1].prefill(third) == (len(shared), len(shared))
    restored = hybrid.backend.logits(1).copy()
    whole = hybrid.sessions[2]
    whole.prefix_cache = None
    assert whole.prefill(third) == (0, 0)
    np.testing.assert_allclose(restored, hybrid.backend.logits(2), atol=1e-3)


def test_no_state_is_saved_on_the_way_that_the_cache_s_ram_cannot_hold(hybrid_model: Path, settings: Settings) -> None:
    """With RAM for no state, the first prompt's go to disk; the second does not stop to save what it shares
    with them, which would be written to disk before its reply (seconds for a large model's)."""
    with Engine.load(str(hybrid_model), dataclasses.replace(settings, prefix_cache_ram_bytes=1),
                     PlanRequest(n_ctx=512, n_threads=2)) as engine:
        shared = PROMPT[:40]
        greedy(engine, shared + list(range(500, 520)))
        cache = engine.sessions[0].prefix_cache
        assert cache is not None and cache.sharing_most(shared) is not None
        greedy(engine, shared + list(range(600, 620)))
        assert not cache.covers(shared, exactly=True)


def test_the_benchmark_measures_a_new_chat_restoring_its_system_prompt(hybrid_model: Path, settings: Settings) -> None:
    """`localchat bench`'s prefix-cache hit: a chat sharing a 1k-token system prompt with two earlier ones."""
    with Engine.load(str(hybrid_model), dataclasses.replace(settings, prefix_cache_disk_bytes=0),
                     PlanRequest(n_ctx=2048, n_threads=2)) as engine:
        _, _, restored = measure_prefix_cache(engine)
    assert restored


def test_the_same_prompt_asked_again_is_answered_again(hybrid: Engine) -> None:
    """Asked again (the chat app's regenerate), the prompt's state short of its last token is restored:
    the reply is the first one, token for token."""
    first = greedy(hybrid, PROMPT)
    again = hybrid.sessions[0].generate(PROMPT, GREEDY)
    again.text()
    assert again.stats is not None and again.stats.prefix_cache_tokens == len(PROMPT) - 1
    assert list(again.completion_ids) == first


def test_batched_replies_take_no_throwaway_row(hybrid: Engine) -> None:
    """Three slots make an odd batch, which a KV cache evens out with a row it then drops."""
    scheduler = Scheduler(hybrid, max_waiting=0)
    scheduler.start()
    try:
        sinks: list[queue.SimpleQueue[ReplyEvent]] = [queue.SimpleQueue() for _ in range(3)]
        for offset, sink in enumerate(sinks):
            scheduler.submit([offset + 1, *PROMPT[:30]], GREEDY, sink.put)
        ends = []
        for sink in sinks:
            while not isinstance(event := sink.get(timeout=60), (ReplyDone, ReplyFailed)):
                pass
            ends.append(event)
    finally:
        scheduler.close()
    assert [end.stats.finish_reason if isinstance(end, ReplyDone) else end.message for end in ends] == ["length"] * 3


def test_a_request_leaves_a_slot_it_shares_a_part_with(hybrid: Engine) -> None:
    """Slot 0 holds a reply to PROMPT; a prompt sharing its first 60 tokens alone cannot go on from it, and
    takes an empty slot, leaving slot 0's state for a prompt that continues it."""
    greedy(hybrid, PROMPT)
    held = list(hybrid.sessions[0].tokens)
    scheduler = Scheduler(hybrid, max_waiting=0)
    scheduler.start()
    try:
        sink: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()
        scheduler.submit(PROMPT[:60] + list(range(800, 830)), GREEDY, sink.put)
        while not isinstance(sink.get(timeout=60), (ReplyDone, ReplyFailed)):
            pass
    finally:
        scheduler.close()
    assert hybrid.sessions[0].tokens == held


def test_a_draft_model_is_refused_in_one_line(hybrid_model: Path, default_model: Path, settings: Settings) -> None:
    with pytest.raises(ModelError, match="keeps a recurrent state, which cannot take back drafted tokens"):
        Engine.load(str(hybrid_model), settings, PlanRequest(n_ctx=256, n_threads=2), draft_model=str(default_model))
    with pytest.raises(ModelError, match="keeps a recurrent state, which cannot take back the tokens it drafts"):
        Engine.load(str(default_model), settings, PlanRequest(n_ctx=256, n_threads=2), draft_model=str(hybrid_model))
