"""Continuous batching: several replies decoded together, one backend batch per step.

The scheduler's thread waits for requests, then runs its steps where the backend evaluates
(`Backend.hold_compute`: llama.cpp's compute thread), so that no decode hops between threads. Each
step admits waiting requests into free slots (a slot is one KV sequence and its Session) and
prefills them, then decodes one token for every active slot in a single `evaluate_batch`. A
finished or cancelled reply frees its slot for a waiting request at the next step.

A request's several replies (an API request's choices, up to the server's bound) are queued whole, and
a request counts once against the bound on requests, however many replies it asks for: past the slots
and the queue's size, `submit_all` refuses it (Ollama's OLLAMA_MAX_QUEUE counts requests too). A
freed slot goes to the waiting request with the fewest replies in slots, the earliest of those: a
client asking for 128 choices shares the slots with the others and takes what they leave, while taken
first-come-first-served by reply (as llama-server's task queue and vLLM's waiting queue take a
request's children) its choices would hold every slot until all 128 had started.

Slots share the context's cells (llama.cpp's unified KV cache). An idle slot keeps the KV of its
last reply, so a client resending its history is best served by the slot that holds it; any other
slot restores it from the prefix cache, where a slot's KV is saved before it is overwritten, and as soon
as it is prefilled when a waiting request starts the same way (a request's other choices).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from localchat.backends.base import Backend, LoraScales, TokenLogprob
from localchat.engine import Engine
from localchat.errors import ContextOverflowError, InvalidSettingError, LocalchatError
from localchat.prefix_cache import INDEX_BLOCK, MAX_COMPARED, BlockIndex, common_prefix_length, prefix_hashes
from localchat.session import MIN_SAVE_TOKENS, Decoder, GenerationSettings, GenerationStats, Reply, Session

logger = logging.getLogger(__name__)
# Tokens by which a continued conversation may part from its last prompt before its end without a
# rewrite: the prompt's last tokens may merge with the reply's first when the history is retokenized.
REWRITE_SLACK_TOKENS = 4
# The last tokens of a slot's reply that its next prompt must hold to be taken for the conversation sent on (its very last
# token left out: an end of turn, or a token retokenized with the text after it). Requests that only share a system prompt
# part from each other inside too, and are no rewritten conversation.
REPLY_END_TOKENS = 8


@dataclass(frozen=True)
class TextDelta:
    """A piece of the reply's text, with the log-probabilities of the tokens it comes from when asked for."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReplyDone:
    """The reply ended (finish reason in its stats: stop, length or cancelled)."""

    stats: GenerationStats


@dataclass(frozen=True)
class ReplyFailed:
    """The backend failed while producing the reply; the scheduler goes on with the others."""

    message: str


ReplyEvent = TextDelta | ReplyDone | ReplyFailed
# Called where the scheduler steps (the backend's compute thread): it must only hand the event over, never block.
EventSink = Callable[[ReplyEvent], None]


class QueueFullError(LocalchatError):
    """Every slot is busy and the waiting queue is full."""


class ScheduledReply:
    """A reply handed to the scheduler: its events go to `sink`; `cancel()` from any thread."""

    def __init__(self, prompt: list[int], settings: GenerationSettings, reply: Reply, sink: EventSink,
                 prompt_hashes: list[int]) -> None:
        """`prompt_hashes`: the prompt's `prefix_hashes`, by which the waiting replies are indexed."""
        self.prompt = prompt
        self.settings = settings
        self.reply = reply
        self.sink = sink
        self.prompt_hashes = prompt_hashes
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass(eq=False)
class _Submission:
    """The replies one `submit_all` queued (an API request's choices): those waiting, and how many hold a slot."""

    waiting: deque[ScheduledReply] = field(default_factory=deque)
    running: int = 0

    @property
    def withdrawn(self) -> bool:
        """Nothing in a slot and every waiting reply cancelled (its client gone): it holds no place in the queue,
        though its replies end only when a slot frees for them (an editor cancels a completion at each keystroke)."""
        return not self.running and all(request.cancelled for request in self.waiting)


@dataclass
class _Slot:
    session: Session
    request: ScheduledReply | None = None
    submission: _Submission | None = None  # the request its reply belongs to
    decoder: Decoder | None = None
    last_used: int = 0  # the step it last finished a reply, to pick the least recently used
    prompt_length: int = 0  # its last request's prompt: a continuation that parts from it inside was rewritten

    @property
    def seq(self) -> int:
        return self.session.seq


class Scheduler:
    """N slots decoded together on the engine's backend, fed from a queue of at most `max_waiting` requests.

    While it runs, the scheduler's steps are the only ones to touch the engine's sessions and
    backend (tokenizing aside, which reads only the vocabulary).
    """

    def __init__(self, engine: Engine, *, max_waiting: int) -> None:
        if max_waiting < 0:
            raise InvalidSettingError(f"the queue size must be >= 0, got {max_waiting}")
        self._backend: Backend = engine.backend
        self._slots = [_Slot(session) for session in engine.sessions]
        self._max_waiting = max_waiting
        # Requests with a reply waiting or in a slot, in the order they came.
        self._submissions: list[_Submission] = []
        self._waiting_prompts: BlockIndex[ScheduledReply] = BlockIndex()
        self._wake = threading.Condition()
        self._stopping = False
        self._step = 0
        self._rewrite_logged = False
        self._thread = threading.Thread(target=self._run, name="localchat-scheduler", daemon=True)

    # -- the front side (any thread) ------------------------------------------------

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def busy_slots(self) -> int:
        return sum(slot.request is not None for slot in self._slots)

    @property
    def waiting(self) -> int:
        """Replies waiting for a slot."""
        with self._wake:
            return sum(len(submission.waiting) for submission in self._submissions)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt: Sequence[int], settings: GenerationSettings, sink: EventSink) -> ScheduledReply:
        """Queue a reply to `prompt`; raises QueueFullError when the queue is full, and
        ContextOverflowError for a prompt the context cannot hold."""
        return self.submit_all([(prompt, settings, sink)])[0]

    def submit_all(self, replies: Sequence[tuple[Sequence[int], GenerationSettings, EventSink]]) -> list[ScheduledReply]:
        """Queue one request's replies, each `(prompt, settings, sink)`, all or none: QueueFullError when the
        slots and the queue hold as many requests as they may; ContextOverflowError if the context cannot hold a prompt."""
        n_ctx = self._backend.n_ctx
        requests = []
        hashed: dict[int, list[int]] = {}  # by prompt object: a request's choices share their prompt's
        for prompt, settings, sink in replies:
            if not prompt:
                raise InvalidSettingError("the prompt is empty")
            if len(prompt) >= n_ctx:
                raise ContextOverflowError(
                    f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}; shorten it or raise the context size (--ctx)"
                )
            settings = self._slots[0].session.with_sampler(settings)
            if id(prompt) not in hashed:
                hashed[id(prompt)] = prefix_hashes(np.asarray(prompt, dtype=np.int32), "")
            requests.append(ScheduledReply(list(prompt), settings, Reply(self._backend, settings, len(prompt)), sink,
                                           hashed[id(prompt)]))
        with self._wake:
            if self._stopping:
                raise QueueFullError("the scheduler is shutting down")
            held = sum(1 for submission in self._submissions if not submission.withdrawn)
            if held >= self.n_slots + self._max_waiting:
                raise QueueFullError(f"{held} requests hold its {self.n_slots} slots or wait for one")
            self._submissions.append(_Submission(deque(requests)))
            for request in requests:
                self._waiting_prompts.add(request, request.prompt_hashes)
            self._wake.notify()
        return requests

    def close(self) -> None:
        """Stop after the current step; replies still running or waiting end as cancelled."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    # -- the scheduler's thread -------------------------------------------------------

    def _run(self) -> None:
        crashed = True
        try:
            while True:
                with self._wake:
                    while not self._stopping and self._idle():
                        self._wake.wait()
                    if self._stopping:
                        break
                self._backend.hold_compute(self._take_step)
            crashed = False
        finally:
            # After a bug too, no request is left waiting for an answer that will not come.
            with self._wake:
                self._stopping = True
                waiting = [request for submission in self._submissions for request in submission.waiting]
                for submission in self._submissions:
                    submission.waiting.clear()
                self._submissions = [submission for submission in self._submissions if submission.running]
                self._waiting_prompts = BlockIndex()
            for slot in self._slots:
                if slot.request is not None and crashed:
                    self._fail(slot, "the scheduler failed")
                elif slot.request is not None:
                    self._finish(slot)
            for request in waiting:
                request.sink(ReplyFailed("the scheduler failed") if crashed else ReplyDone(request.reply.stats()))

    def _idle(self) -> bool:
        """No reply runs or waits (read under `_wake`)."""
        return not self._submissions

    def _take_step(self) -> bool:
        """One step (admit, then decode every active slot); whether there is another to take."""
        self._step += 1
        self._admit()
        self._decode_step()
        with self._wake:
            return not self._stopping and not self._idle()

    def _admit(self) -> None:
        """Move waiting replies into free slots, the next from the request with the fewest in slots (the
        earliest of those); prefill each and sample its first token."""
        while True:
            with self._wake:
                free = [slot for slot in self._slots if slot.request is None]
                waiting = [submission for submission in self._submissions if submission.waiting]
                if not free or not waiting:
                    return
                submission = min(waiting, key=lambda submission: submission.running)
                request = submission.waiting.popleft()
                self._waiting_prompts.remove(request, request.prompt_hashes)
                submission.running += 1
            if request.cancelled:
                self._ended(submission)
                request.sink(ReplyDone(request.reply.stats()))
                continue
            slot = self._slot_for(free, request)
            slot.submission = submission
            if not self._start(slot, request):
                with self._wake:  # it waits for active replies to free cells
                    slot.submission = None
                    submission.running -= 1
                    submission.waiting.appendleft(request)
                    self._waiting_prompts.add(request, request.prompt_hashes)
                return
            self._share_with_waiting(slot)

    def _ended(self, submission: _Submission) -> None:
        """One of `submission`'s replies has ended: a request with none left waiting or running is gone."""
        with self._wake:
            submission.running -= 1
            if not submission.running and not submission.waiting:
                self._submissions.remove(submission)

    def _share_with_waiting(self, slot: _Slot) -> None:
        """Share the prompt `slot` has just prefilled through the prefix cache when a waiting reply starts
        with half of it or more (a request's other choices, prompts sharing long instructions): each restores
        it, not computes it. Saving copies the whole prompt's KV, which costs far less than computing half
        of it (SmolLM2 on 2 CPU threads: 7 ms a token computed, 6 us restored: prefix_cache.MIN_MATCH_TOKENS).

        The waiting prompts sharing the most whole blocks are found by their blocks' hashes, and the next block of
        at most MAX_COMPARED of them compared, whatever the prompts' length and number: comparing every one's
        tokens took 19 ms a slot with 128 choices of 4,000 tokens. A hash collision costs no more than a save
        nobody restores: the prefix cache compares the tokens of what it restores."""
        with self._wake:
            if not self._waiting_prompts:  # nothing waits: no prompt to hash (a chat's every admission)
                return
        tokens = slot.session.tokens
        hashes = prefix_hashes(np.asarray(tokens, dtype=np.int32), "")
        with self._wake:
            blocks, sharing = self._waiting_prompts.sharing_most_blocks(hashes)
            start, end = blocks * INDEX_BLOCK, (blocks + 1) * INDEX_BLOCK
            compared = [other.prompt[start:end] for other in islice(sharing, MAX_COMPARED)]
        if not compared:
            return
        shared = start + max(common_prefix_length(tokens[start:end], other) for other in compared)
        if shared >= max(MIN_SAVE_TOKENS, len(tokens) / 2):
            slot.session.share(shared)

    def _slot_for(self, free: list[_Slot], request: ScheduledReply) -> _Slot:
        """The free slot already holding the longest start of the prompt computed with the request's
        adapters (a recurrent state: all it holds, Backend.rewinds); else an empty one; else the least
        recently used (its KV is saved to the prefix cache before it is overwritten)."""
        rewinds = self._backend.rewinds

        def reuse(slot: _Slot) -> int:
            session = slot.session
            wanted = session.default_loras if request.settings.loras is None else request.settings.loras
            shared = common_prefix_length(session.tokens, request.prompt) if session.loras == wanted else 0
            return shared if rewinds or shared == len(session.tokens) else 0

        return max(free, key=lambda slot: (reuse(slot), not slot.session.tokens, -slot.last_used))

    def _cells_free(self) -> int:
        return self._backend.n_ctx - sum(len(slot.session.tokens) for slot in self._slots)

    def _release_idle(self, needed: int, keep: _Slot | None = None) -> bool:
        """Free KV cells held by idle slots, least recently used first, until `needed` are free."""
        idle = sorted(
            (s for s in self._slots if s.request is None and s is not keep and s.session.tokens), key=lambda s: s.last_used
        )
        for slot in idle:
            if self._cells_free() >= needed:
                break
            slot.session.release()
        return self._cells_free() >= needed

    def _start(self, slot: _Slot, request: ScheduledReply) -> bool:
        """Prefill `request` in `slot` and emit its first token; False if the cells it needs are
        held by active replies (it must wait)."""
        session, reply = slot.session, request.reply
        # The slot will hold the prompt and, soon, the first token after it.
        if not self._release_idle(len(request.prompt) + 1 - len(session.tokens), keep=slot):
            return False
        slot.request = request
        reply.admitted()
        try:
            # The sampler first: a backend that samples on the device draws the first token when the
            # prompt's last token is evaluated.
            slot.decoder = Decoder(session, reply, request.settings.sampler, request.prompt, request.settings.lookup_draft)
            held = session.tokens  # the slot's last prompt and reply, unless released
            reply_end = held[max(slot.prompt_length, len(held) - REPLY_END_TOKENS - 1) : len(held) - 1]
            try:
                reply.prefilled(*session.prefill(request.prompt, loras=request.settings.loras))
            except ContextOverflowError:
                # No room where llama.cpp looked (cells freed by a restore, fragmentation):
                # free every idle slot and try once more, unless active replies hold the cells.
                session.reset()
                self._release_idle(self._backend.n_ctx)
                if self.busy_slots > 1:
                    slot.decoder.close()
                    slot.request = slot.decoder = None
                    return False
                reply.prefilled(*session.prefill(request.prompt, loras=request.settings.loras))
            self._note_rewritten_history(slot, request.prompt, reply.cached_tokens, reply_end)
            self._emit(slot, slot.decoder.sample())
        except Exception as error:
            # One request's failure (a backend error, a bug its settings reach) must not stop the others.
            logger.exception("a reply failed while starting")
            self._fail(slot, str(error) or type(error).__name__)
        return True

    def _note_rewritten_history(self, slot: _Slot, prompt: list[int], cached: int, reply_end: Sequence[int]) -> None:
        """Say once why a conversation's turns recompute more than their new tokens: its new prompt
        continues the slot's last one, holding the end of its reply, but parts from it inside (by more than a
        few tokens of retokenization where the reply began), so the template rewrote an earlier turn."""
        previous, slot.prompt_length = slot.prompt_length, len(prompt)
        if (self._rewrite_logged or not previous // 2 <= cached < previous - REWRITE_SLACK_TOKENS or len(prompt) <= previous
                or not _holds(prompt, reply_end, cached)):
            return
        self._rewrite_logged = True
        logger.warning(
            "a conversation's new prompt rewrites its earlier turns: it matches the %d tokens of the last prompt only "
            "for %d, so %d tokens were computed instead of its %d new ones. The chat template renders earlier turns "
            "differently from how they were written (Qwen 3 and DeepSeek R1 drop their thinking, or the empty block "
            "of enable_thinking=false). Each reply's usage.prompt_tokens_details.cached_tokens shows what was reused. "
            "Logged once for each model load.", previous, cached, len(prompt) - cached, len(prompt) - previous)

    def _decode_step(self) -> None:
        """One token for every active slot: one batch per set of LoRA adapters the slots compute
        with (llama.cpp applies adapters to a whole batch), most often one."""
        for slot in self._slots:
            if slot.request is not None and slot.request.cancelled:
                self._finish(slot)
        active = [slot for slot in self._slots if slot.request is not None]
        if not active:
            return
        while active and not self._release_idle(len(active)):
            self._end_longest(active)
        groups: dict[LoraScales, list[_Slot]] = {}
        for slot in active:
            groups.setdefault(slot.session.loras, []).append(slot)
        for loras, group in groups.items():
            self._backend.use_loras(loras)
            self._decode_group(group)

    def _decode_group(self, active: list[_Slot]) -> None:
        """One token for each of `active`, slots computing with the adapters set, in one batch."""
        if len(active) == 1 and self._advance_alone(active[0]):
            return
        batch = []
        for slot in active:
            assert slot.decoder is not None
            batch.append(slot.decoder.pending)
        try:
            self._backend.evaluate_batch(batch, spare_cell=self._cells_free() > len(batch))
        except ContextOverflowError:
            self._end_longest(active)  # the others try again at the next step
            return
        except Exception as error:
            logger.exception("a batch of %d replies failed", len(active))
            for slot in active:
                self._fail(slot, str(error) or type(error).__name__)
            return
        for slot in active:
            assert slot.decoder is not None
            slot.decoder.evaluated()
            try:
                self._emit(slot, slot.decoder.sample())
            except Exception as error:
                logger.exception("a reply failed while sampling")
                self._fail(slot, str(error) or type(error).__name__)

    def _end_longest(self, active: list[_Slot]) -> None:
        """The context is full: the reply that has written the most ends ("length", as a lone reply
        would), then the one holding the most cells: a reply running on without a bound ends, not
        another client's with a long prompt."""
        def written_then_held(slot: _Slot) -> tuple[int, int]:
            assert slot.request is not None
            return len(slot.request.reply.token_ids), len(slot.session.tokens)

        longest = max(active, key=written_then_held)
        assert longest.request is not None
        longest.request.reply.end("length")
        self._finish(longest)
        active.remove(longest)

    def _advance_alone(self, slot: _Slot) -> bool:
        """A reply decoding alone drafts (`Decoder.advance`); False, with nothing
        done, when it does not draft or idle slots hold the cells a draft needs. With two replies
        or more in the step it does not: their batch already takes the spare compute a draft's
        rows would use (benchmarks/speculative.py --step-cost measures it)."""
        decoder = slot.decoder
        assert decoder is not None
        longest = decoder.longest_draft
        if not longest or not self._release_idle(1 + longest):
            return False
        try:
            decoder.advance(lambda: False, lambda text: self._send(slot, text))
        except ContextOverflowError:
            self._end_longest([slot])
            return True
        except Exception as error:
            logger.exception("a reply failed while decoding")
            self._fail(slot, str(error) or type(error).__name__)
            return True
        self._end_if_done(slot)
        return True

    def _send(self, slot: _Slot, text: str) -> None:
        """Pass on the text of the token just sampled, with its log-probabilities when asked for."""
        assert slot.request is not None
        if text:
            slot.request.sink(TextDelta(text, slot.request.reply.unsent_logprobs()))

    def _emit(self, slot: _Slot, text: str) -> None:
        """Pass on the text of the token just sampled; end the reply if it ended it."""
        self._send(slot, text)
        self._end_if_done(slot)

    def _end_if_done(self, slot: _Slot) -> None:
        assert slot.request is not None
        if slot.request.reply.finish_reason is not None:
            self._finish(slot)

    def _finish(self, slot: _Slot) -> None:
        assert slot.request is not None
        request, reply = slot.request, slot.request.reply
        tail, logprobs = reply.tail(), reply.unsent_logprobs()
        if tail or logprobs:
            request.sink(TextDelta(tail, logprobs))
        self._free(slot)
        request.sink(ReplyDone(reply.stats()))

    def _fail(self, slot: _Slot, message: str) -> None:
        assert slot.request is not None
        request = slot.request
        # The KV cache may hold part of a failed evaluation: start the sequence afresh.
        slot.session.reset()
        self._free(slot)
        request.sink(ReplyFailed(message))

    def _free(self, slot: _Slot) -> None:
        if slot.decoder is not None:
            slot.decoder.close()
        if slot.submission is not None:
            self._ended(slot.submission)
        slot.request, slot.submission, slot.decoder, slot.last_used = None, None, None, self._step


def _holds(tokens: Sequence[int], part: Sequence[int], start: int) -> bool:
    """Whether `part`, of two tokens or more, lies in tokens[start:]."""
    if len(part) < 2:
        return False
    part = list(part)
    return any(tokens[i] == part[0] and list(tokens[i : i + len(part)]) == part for i in range(start, len(tokens) - len(part) + 1))
