"""The batch scheduler on the real model: batched replies equal lone ones, the queue is bounded,
cancelled replies free their slots."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from greedy_paths import assert_same_until_near_tie
from localchat.backends.base import ARGMAX
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.scheduler import QueueFullError, ReplyDone, ReplyEvent, Scheduler, TextDelta
from localchat.chat import tokenize_chat
from localchat.session import GenerationSettings, GenerationStats
from localchat.settings import Settings
from localchat.templates import Message

GREEDY = GenerationSettings(max_tokens=16, sampler=ARGMAX)
# The reference replies also say how close each step's two best tokens were.
GREEDY_WITH_MARGINS = GenerationSettings(max_tokens=16, sampler=ARGMAX, logprobs=2)


@pytest.fixture(scope="module")
def two_slots(settings: Settings, default_model: Path) -> Iterator[Engine]:
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=1024, n_seq=2)) as engine:
        yield engine


@pytest.fixture(scope="module")
def three_slots(settings: Settings, default_model: Path) -> Iterator[Engine]:
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=1024, n_seq=3)) as engine:
        yield engine


def prompt(engine: Engine, text: str) -> list[int]:
    return tokenize_chat(engine.backend, engine.template, [Message("user", text)])


def collect(events: queue.SimpleQueue[ReplyEvent]) -> tuple[str, GenerationStats]:
    pieces = []
    while True:
        event = events.get(timeout=60)
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        else:
            assert isinstance(event, ReplyDone), event
            return "".join(pieces), event.stats


@pytest.mark.slow  # its engine is asked for by name (getfixturevalue), which the tier marking does not see
@pytest.mark.parametrize("slots", ["two_slots", "three_slots"])
def test_replies_decoded_together_equal_replies_decoded_alone(slots: str, request: pytest.FixtureRequest,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With three slots the batch is odd, and llama.cpp evaluates it with a throwaway row added. A batch
    rounds apart from a lone sequence: each reply equals its lone one up to the lone one's first near tie."""
    engine: Engine = request.getfixturevalue(slots)
    # Questions the chat model answers without a near tie in its first tokens (a colour or a fruit of its
    # choosing has one at the first or third token).
    questions = ["What is the capital of Japan?", "How many days are in a week?",
                 f"Copy this text exactly: {COPY_PASSAGE}"][: engine.backend.n_seq]
    alone = []
    for question in questions:
        engine.sessions[0].reset()
        generation = engine.sessions[0].generate(prompt(engine, question), GREEDY_WITH_MARGINS)
        generation.text()
        alone.append(generation)
    engine.sessions[0].reset()
    batches: list[tuple[int, bool]] = []
    evaluate_batch = engine.backend.evaluate_batch

    def recorded(batch: list[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        batches.append((len(batch), spare_cell))
        evaluate_batch(batch, spare_cell=spare_cell)

    monkeypatch.setattr(engine.backend, "evaluate_batch", recorded)
    scheduler = Scheduler(engine, max_waiting=0)
    scheduler.start()
    try:
        sinks: list[queue.SimpleQueue[ReplyEvent]] = [queue.SimpleQueue() for _ in questions]
        for question, sink in zip(questions, sinks, strict=True):
            scheduler.submit(prompt(engine, question), GREEDY, sink.put)
        with pytest.raises(QueueFullError):
            scheduler.submit(prompt(engine, "One too many."), GREEDY, queue.SimpleQueue().put)
        together = [collect(sink) for sink in sinks]
    finally:
        scheduler.close()
    # Enough of the batched steps are compared to catch a wrong row or a lost throwaway row.
    compared = [assert_same_until_near_tie(lone.completion_ids, lone.logprobs, stats.completion_ids, min_compared=6)
                for lone, (_, stats) in zip(alone, together, strict=True)]
    assert sum(compared) >= 6 * len(questions), compared
    assert (len(questions), True) in batches  # the replies really shared decode steps, with cells to spare
    assert all(stats.finish_reason in ("stop", "length") for _, stats in together)


def test_replies_decoded_together_each_keep_their_own_logit_bias(two_slots: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch, two samplers: the same question asked twice, its greedy first token banned in one reply and
    " banana" forced in the other; each row is biased by its own reply's bias alone."""
    engine = two_slots
    question = prompt(engine, "What is the capital of Japan?")
    engine.sessions[0].reset()
    first = engine.sessions[0].generate(question, GREEDY)
    first.text()
    engine.sessions[0].reset()
    banned, (banana,) = first.completion_ids[0], engine.backend.tokenize(" banana", add_bos=False, special=False)
    batches: list[int] = []
    evaluate_batch = engine.backend.evaluate_batch

    def recorded(batch: list[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        batches.append(len(batch))
        evaluate_batch(batch, spare_cell=spare_cell)

    monkeypatch.setattr(engine.backend, "evaluate_batch", recorded)
    scheduler = Scheduler(engine, max_waiting=0)
    scheduler.start()
    try:
        sinks: list[queue.SimpleQueue[ReplyEvent]] = [queue.SimpleQueue(), queue.SimpleQueue()]
        for biases, sink in zip((((banned, -100.0),), ((banana, 100.0),)), sinks, strict=True):
            settings = dataclasses.replace(GREEDY, sampler=dataclasses.replace(ARGMAX, logit_bias=biases), ignore_eos=True)
            scheduler.submit(question, settings, sink.put)
        (_, without), (_, forced) = (collect(sink) for sink in sinks)
    finally:
        scheduler.close()
    assert 2 in batches  # the replies shared decode steps
    assert banned not in without.completion_ids and forced.completion_ids == (banana,) * GREEDY.max_tokens  # type: ignore[operator]


def test_a_cancelled_reply_frees_its_slot_for_the_next(two_slots: Engine) -> None:
    scheduler = Scheduler(two_slots, max_waiting=1)
    scheduler.start()
    try:
        long = GenerationSettings(max_tokens=500, ignore_eos=True)
        sinks: list[queue.SimpleQueue[ReplyEvent]] = [queue.SimpleQueue() for _ in range(3)]
        handles = [scheduler.submit(prompt(two_slots, f"Story {i}."), long, sink.put) for i, sink in enumerate(sinks)]
        assert isinstance(sinks[0].get(timeout=60), TextDelta)
        assert isinstance(sinks[1].get(timeout=60), TextDelta)
        assert scheduler.busy_slots == 2 and scheduler.waiting == 1  # both slots taken, the third waits
        handles[0].cancel()
        assert collect(sinks[0])[1].finish_reason == "cancelled"
        # The waiting request gets the freed slot and writes text while the second still runs.
        assert isinstance(sinks[2].get(timeout=60), TextDelta)
        assert scheduler.waiting == 0
        handles[1].cancel()
        handles[2].cancel()
        assert collect(sinks[1])[1].finish_reason == "cancelled"
        assert collect(sinks[2])[1].finish_reason == "cancelled"
        assert scheduler.busy_slots == 0 and scheduler.waiting == 0
    finally:
        scheduler.close()


def test_a_reply_s_decodes_picks_and_text_all_run_on_the_compute_thread(two_slots: Engine,
                                                                      decoding_threads: set[int]) -> None:
    """The scheduler's steps run where llama.cpp decodes: no decode is handed from one thread to another."""
    text_threads: set[int] = set()
    events: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()

    def sink(event: ReplyEvent) -> None:
        text_threads.add(threading.get_ident())
        events.put(event)

    scheduler = Scheduler(two_slots, max_waiting=0)
    scheduler.start()
    try:
        scheduler.submit(prompt(two_slots, "What is the capital of Japan?"), GREEDY, sink)
        text, _ = collect(events)
    finally:
        scheduler.close()
    assert text and len(decoding_threads) == 1 and text_threads == decoding_threads


def test_a_busy_scheduler_lets_another_model_decode_before_its_reply_ends(two_slots: Engine, engine: Engine) -> None:
    """A scheduler holds the compute thread while its replies run, and gives it up after a step when a
    decode asked for by another thread waits: a second model's reply is not held back until the first's ends."""
    events: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()
    scheduler = Scheduler(two_slots, max_waiting=0)
    scheduler.start()
    try:
        long = GenerationSettings(max_tokens=400, sampler=ARGMAX, ignore_eos=True)
        handle = scheduler.submit(prompt(two_slots, "Write a story about a dragon."), long, events.put)
        assert isinstance(events.get(timeout=60), TextDelta)
        engine.sessions[0].reset()
        other = engine.sessions[0].generate(prompt(engine, "What is the capital of Japan?"), GREEDY)
        assert other.text()
        assert scheduler.busy_slots == 1, "the other model's reply waited for the first one's end"
        handle.cancel()
        assert collect(events)[1].finish_reason == "cancelled"
    finally:
        scheduler.close()


def test_a_history_rewritten_inside_is_logged_once(two_slots: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """A template that renders earlier turns differently (Qwen 3 dropping thinking) makes each turn
    recompute its last reply: said once in the log; a plain continuation says nothing, nor does another
    question that only shares the system prompt."""
    system = Message("system", "You keep the ledger of a lighthouse and answer questions about it. " * 4)
    turns = [system, Message("user", "Who kept the ledger?")]

    def ask(messages: list[Message]) -> tuple[str, GenerationStats]:
        sink: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()
        scheduler.submit(tokenize_chat(two_slots.backend, two_slots.template, messages), GREEDY, sink.put)
        return collect(sink)

    scheduler = Scheduler(two_slots, max_waiting=0)
    scheduler.start()
    try:
        with caplog.at_level("WARNING", logger="localchat.scheduler"):
            first, _ = ask(turns)
            other, _ = ask([system, Message("user", "What colour is the lamp, and who lights it every night of the year?")])
            assert not caplog.records and other  # a longer prompt parting from the last inside, but no reply of it in it
            first_again, _ = ask(turns)
            assert first_again == first
            turns += [Message("assistant", first), Message("user", "For how long?")]
            second, continued = ask(turns)
            assert not caplog.records and continued.cached_tokens > continued.prompt_tokens - 24
            # The first answer comes back as another text, as a template dropping its thinking writes it.
            turns[2] = Message("assistant", "It was the keeper. " + first)
            rewritten_prompt = tokenize_chat(two_slots.backend, two_slots.template, turns)
            _, rewritten = ask(turns + [Message("assistant", second), Message("user", "Why?")])
            ask(turns + [Message("assistant", second + " No more."), Message("user", "Why?")])
    finally:
        scheduler.close()
    assert rewritten.cached_tokens < len(rewritten_prompt) - 10
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["a conversation's new prompt rewrites its earlier turns"]


COPY_PASSAGE = ("The keeper climbed the narrow stairs at dusk, trimmed the wick, polished the great lens and wrote "
                "the weather in a small leather book.")


def test_a_reply_decoding_alone_drafts_and_two_together_do_not(two_slots: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alone, a reply drafts by prompt lookup and is the reply a lone session gives with drafting;
    with another reply in the step it does not draft (the batch holds one token per reply)."""
    drafting = GenerationSettings(max_tokens=24, sampler=ARGMAX, lookup_draft=8)
    copy = prompt(two_slots, f"Copy this text exactly: {COPY_PASSAGE}")
    two_slots.sessions[0].reset()
    lone = two_slots.sessions[0].generate(copy, dataclasses.replace(drafting, logprobs=2))
    lone.text()
    two_slots.sessions[0].reset()
    busy_when_drafting: list[int] = []
    evaluate_all = two_slots.backend.evaluate_all
    scheduler = Scheduler(two_slots, max_waiting=1)

    def recorded(seq: int, tokens: list[int], start: int) -> object:
        busy_when_drafting.append(scheduler.busy_slots)
        return evaluate_all(seq, tokens, start)

    monkeypatch.setattr(two_slots.backend, "evaluate_all", recorded)
    scheduler.start()
    try:
        sink: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()
        scheduler.submit(copy, drafting, sink.put)
        _, stats = collect(sink)
        # Whether a step drafts, and how long, is timed (DraftPace): the steps may fall otherwise, and
        # round apart at a near tie.
        assert_same_until_near_tie(lone.completion_ids, lone.logprobs, stats.completion_ids, min_compared=12)
        assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
        assert busy_when_drafting and set(busy_when_drafting) == {1}
        busy_when_drafting.clear()
        sinks: list[queue.SimpleQueue[ReplyEvent]] = [queue.SimpleQueue() for _ in range(2)]
        for max_tokens, sink in zip((40, 12), sinks, strict=True):
            settings = GenerationSettings(max_tokens=max_tokens, sampler=ARGMAX, lookup_draft=8, ignore_eos=True)
            scheduler.submit(copy, settings, sink.put)
        (_, longer), (_, shorter) = (collect(sink) for sink in sinks)
    finally:
        scheduler.close()
    # The shorter reply never decoded alone; the longer drafted once it did.
    assert shorter.drafted_tokens == 0 and longer.drafted_tokens > 0 and set(busy_when_drafting) == {1}


def test_a_full_context_ends_the_reply_that_wrote_the_most(two_slots: Engine) -> None:
    """Two replies without a bound share the context; when it fills, the one that has written the most ends,
    not the later one whose long prompt holds more cells (a client's runaway reply ends, not another's)."""
    unbounded = GenerationSettings(max_tokens=None, sampler=ARGMAX, ignore_eos=True)
    scheduler = Scheduler(two_slots, max_waiting=0)
    scheduler.start()
    try:
        runaway: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()
        scheduler.submit(prompt(two_slots, "Count to a thousand."), unbounded, runaway.put)
        pieces = 0
        while pieces < 100:  # it writes before the other comes
            assert isinstance(runaway.get(timeout=60), TextDelta)
            pieces += 1
        long_prompt: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()
        scheduler.submit(prompt(two_slots, f"Summarize: {COPY_PASSAGE * 8}"[:1500]), unbounded, long_prompt.put)
        (_, first), (_, second) = collect(runaway), collect(long_prompt)
    finally:
        scheduler.close()
    assert first.finish_reason == second.finish_reason == "length"
    # The runaway ended when the context first filled; the other went on alone until it filled again.
    assert second.prompt_tokens > first.prompt_tokens + 200 and second.completion_tokens > first.completion_tokens
