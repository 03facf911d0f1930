"""One KV sequence and the replies decoded on it: KV reuse across turns, stop rules, drafts
(localchat.chat renders a conversation onto a session).

Each generation keeps the longest common prefix of the new prompt already in the KV cache (or in
the prefix cache) and evaluates only the rest, so a chat turn costs its new tokens.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from localchat.backends.base import ROW_LIMIT, Backend, LoraScales, Sampler, SamplerSettings, TokenLogprob
from localchat.backends.logprobs import token_logprob
from localchat.constraints import Constraint, token_guide
from localchat.errors import ContextOverflowError, InferenceError, InvalidSettingError
from localchat.prefix_cache import MIN_MATCH_TOKENS, PrefixCache, common_prefix_length
from localchat.speculative import (
    DRAFT_GROWTH,
    DRAFT_MODEL_TOKENS,
    INITIAL_DRAFT,
    DraftModel,
    LookupDrafting,
    NgramIndex,
    StepCosts,
    verified_rows,
)

# Live KV tokens about to be overwritten (or left at exit) are saved to the prefix cache when at least as many
# as a match may be: a one-line question's chat is worth keeping for its head.
MIN_SAVE_TOKENS = MIN_MATCH_TOKENS
# Prompt tokens evaluated between checks for a cancel (about half a second on 2 CPU cores).
PREFILL_CHUNK = 256


class StopScope(Protocol):
    """Where in a reply its stop strings apply: outside its tool calls (localchat.reply_parser.CallScope)."""

    def feed(self, text: str) -> None:
        """Text the reply has released."""
        ...

    def applies(self, before: str) -> bool:
        """Whether a stop string that begins after `before` (text beyond what was fed) ends the reply."""
        ...


@dataclass(frozen=True)
class GenerationSettings:
    """How long to generate and when to stop; `max_tokens=None` means until the context is full."""

    max_tokens: int | None = 512
    stop: tuple[str, ...] = ()
    # Where the stop strings apply (None: anywhere); a reply held to a `constraint` matches none.
    stop_scope: Callable[[], StopScope] | None = None
    # None: the model's defaults (localchat.sampling_defaults), filled in when the reply starts.
    sampler: SamplerSettings | None = None
    ignore_eos: bool = False
    # Control tokens the reply's text shows (they print nothing otherwise): the tool-call and
    # reasoning markers a reply parser reads (localchat.chat_formats).
    shown_tokens: frozenset[int] = frozenset()
    # The grammar the reply must follow (a JSON schema, a tool call's shape), by constrained decoding.
    constraint: Constraint | None = None
    # None: no log-probabilities (none computed); k: each token's and its k most likely alternatives'.
    logprobs: int | None = None
    # Prompt-lookup speculative decoding: at most this many tokens drafted per step by matching
    # the sequence's last n-gram earlier in it (0: off; the front ends give DEFAULT_LOOKUP_DRAFT).
    # A server's reply drafts while it decodes alone.
    lookup_draft: int = 0
    # The LoRA adapters to compute the reply with; None: the engine's defaults (its --lora scales).
    loras: LoraScales | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidSettingError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and self.logprobs < 0:
            raise InvalidSettingError(f"logprobs must be >= 0, got {self.logprobs}")
        if not 0 <= self.lookup_draft <= ROW_LIMIT - 1:
            raise InvalidSettingError(f"lookup_draft must be in [0, {ROW_LIMIT - 1}], got {self.lookup_draft}")
        if any(not s for s in self.stop):
            raise InvalidSettingError("stop strings must not be empty")


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was reused (live cache or prefix cache)
    prefix_cache_tokens: int  # of those, restored from the prefix cache
    completion_tokens: int
    completion_ids: tuple[int, ...]
    ttft_s: float
    prefill_s: float
    decode_s: float
    finish_reason: str  # "stop", "length" or "cancelled"
    drafted_tokens: int = 0  # speculative decoding: tokens drafted, and of those accepted
    accepted_tokens: int = 0
    sampler: SamplerSettings | None = None  # the settings the reply was sampled with
    queued_s: float = 0.0  # of prefill_s, waiting for a slot (a server's queue) before the prompt was evaluated
    text_tokens: int | None = None  # of completion_ids, those whose text was returned (None: all; a stop string's are not)

    @property
    def text_ids(self) -> tuple[int, ...]:
        """The completion's tokens whose text was returned: a matched stop string's left out."""
        return self.completion_ids if self.text_tokens is None else self.completion_ids[: self.text_tokens]

    @property
    def prefill_tok_s(self) -> float:
        evaluated = self.prompt_tokens - self.cached_tokens
        return evaluated / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first, per second of decoding them."""
        return (self.completion_tokens - 1) / self.decode_s if self.completion_tokens > 1 and self.decode_s > 0 else 0.0


class _StopMatcher:
    """Cuts text at the first stop string (where `scope` says stop strings apply), holding back a
    tail that may begin one."""

    def __init__(self, stops: Sequence[str], scope: StopScope | None = None) -> None:
        self.stops = tuple(stops)
        self.scope = scope
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was reached."""
        if not self.stops:
            return text, False
        self.pending += text
        found = self._first_stop()
        if found is not None:
            out, self.pending = self.pending[:found], ""
            return out, True
        safe = len(self.pending) - self._hold
        # Only hold back a tail that really is the start of some stop string.
        while safe < len(self.pending) and not any(s.startswith(self.pending[safe:]) for s in self.stops):
            safe += 1
        out, self.pending = self.pending[: max(safe, 0)], self.pending[max(safe, 0) :]
        if self.scope is not None:
            self.scope.feed(out)
        return out, False

    def _first_stop(self) -> int | None:
        """Where the first stop string in the pending text that ends the reply begins."""
        if self.scope is None:
            return min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=None)
        starts = sorted({i for stop in self.stops for i in range(len(self.pending)) if self.pending.startswith(stop, i)})
        return next((i for i in starts if self.scope.applies(self.pending[:i])), None)

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Session:
    """One sequence of a backend's KV cache and the tokens it holds."""

    def __init__(self, backend: Backend, *, seq: int = 0, prefix_cache: PrefixCache | None = None,
                 sampler_defaults: SamplerSettings | None = None) -> None:
        self.backend = backend
        self.seq = seq
        self.prefix_cache = prefix_cache
        # The sampler a reply gets when its settings name none: the model's defaults.
        self.sampler_defaults = sampler_defaults or SamplerSettings()
        self.tokens: list[int] = []
        # The adapters `tokens`' KV was computed with, and those a request that names none gets.
        self.loras: LoraScales = ()
        self.default_loras: LoraScales = ()
        self.lock = threading.Lock()
        # Speculative decoding by a smaller model (its own KV sequence kept in step) where prompt lookup has no draft.
        self.draft_model: DraftModel | None = None
        # What plain and drafting steps cost here, timed: how long prompt lookup drafts.
        self.step_costs = StepCosts(backend)

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    @property
    def _variant(self) -> str:
        """The prefix cache's key for what besides the tokens the KV depends on: the adapters."""
        return " ".join(f"lora{i}x{scale!r}" for i, scale in self.loras)

    def save_live_state(self) -> None:
        """Keep what the sequence holds in the prefix cache (when long enough and not there yet)."""
        cache, variant, rewinds = self.prefix_cache, self._variant, self.backend.saved_states_rewind
        if cache is not None and len(self.tokens) >= MIN_SAVE_TOKENS and not cache.covers(self.tokens, variant, exactly=not rewinds):
            # An evaluation interrupted after llama_decode (Ctrl-C) leaves positions that
            # `tokens` does not list; a state saved with them would not restore.
            self.backend.truncate(self.seq, len(self.tokens))
            cache.put(self.tokens, self.backend.save_state(self.seq), variant, supersede=rewinds)

    def share(self, length: int) -> None:
        """Save what the sequence holds to the prefix cache for other sequences to restore its first
        `length` tokens from, unless an entry holds those already."""
        if self.prefix_cache is not None and not self.prefix_cache.covers(self.tokens[:length], self._variant):
            self.save_live_state()

    def use_loras(self, loras: LoraScales | None) -> None:
        """Compute with `loras` (None: the defaults) from now on. The KV computed with other
        adapters is theirs: it goes to the prefix cache under their key and the sequence starts afresh."""
        wanted = self.default_loras if loras is None else loras
        if wanted != self.loras:
            self.release()
            self.loras = wanted
        self.backend.use_loras(wanted)

    def prepare(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Make the KV cache hold `prompt[:-1]` or more of it, reusing what it can.
        Returns (tokens reused, of which from the prefix cache)."""
        live = common_prefix_length(self.tokens, prompt)
        if not self.backend.rewinds and live < len(self.tokens):
            live = 0  # a recurrent state cannot go back to the part it shares
        restored = 0
        cache = self.prefix_cache
        whole = not self.backend.saved_states_rewind  # taken whole, short of the prompt's last token, or not at all
        match = cache.longest_match(prompt, self._variant, whole=whole) if cache is not None else None
        if cache is not None and match is not None and match.length > live \
                and not cache.costs.restore_pays(match.state_bytes, match.length - live):
            cache.skipped += 1
            match = None
        if cache is not None and match is not None and match.length > live:
            started = time.perf_counter()
            state = cache.load(match.key)
            if state is not None:
                self.save_live_state()
                try:
                    self.backend.restore_state(self.seq, state)
                    cache.costs.restored(len(state), time.perf_counter() - started)
                    self.tokens = [int(t) for t in match.tokens]
                    live = restored = match.length
                except InferenceError:
                    # A state saved under another build or context: forget it, compute afresh.
                    cache.discard(match.key)
                    self.reset()
                    live = 0
        elif len(self.tokens) - live >= MIN_SAVE_TOKENS:
            self.save_live_state()
        # The last prompt token is always evaluated: its logits pick the first new token.
        keep = min(live, len(prompt) - 1)
        if keep < len(self.tokens) and not self.backend.rewinds:
            self.reset()  # a recurrent state cannot go back: the prompt is evaluated whole
            keep = 0
        elif keep < len(self.tokens):
            self.backend.truncate(self.seq, keep)
            del self.tokens[keep:]
        return keep, min(restored, keep)

    def prefill(self, prompt: Sequence[int], cancelled: Callable[[], bool] = lambda: False,
                loras: LoraScales | None = None) -> tuple[int, int]:
        """Put `prompt` in the KV cache computed with `loras` (None: the defaults), evaluating only
        what `prepare` cannot reuse; the backend then holds the logits of its last token. Returns
        what `prepare` returns.

        Evaluates in chunks so that `cancelled` can stop a long prompt part way; the tokens
        evaluated by then stay in the KV cache."""
        self.use_loras(loras)
        reused, restored = self.prepare(prompt)
        start = reused
        for stop in self._saves_on_the_way(prompt, reused):
            if not self._evaluate(prompt, start, stop, cancelled):
                return reused, restored
            self.save_live_state()
            start = stop
        self._evaluate(prompt, start, len(prompt), cancelled)
        return reused, restored

    def _saves_on_the_way(self, prompt: Sequence[int], reused: int) -> list[int]:
        """Where the evaluation of `prompt` (from `reused`) stops to save the state, for a model whose saved states
        are restored whole alone (Backend.saved_states_rewind), ascending:

        - where the prompt parts from the saved ones sharing the most with it, unless it takes more from elsewhere:
          a second chat with an earlier one's system prompt saves what they share (computed, restored or kept from
          the live sequence), and the chats after it restore that whole (llama-server makes such checkpoints at the
          starts of user messages; where prompts part needs no template);
        - for a recurrent state, which cannot go back once the reply is written, short of the last token: the next
          prompt often parts from the reply as sampled (a template that drops its thinking, text that tokenizes
          otherwise) or asks the same again, and then evaluates only what follows."""
        if self.backend.saved_states_rewind:
            return []
        last = len(prompt) - 1
        stops = []
        cache = self.prefix_cache
        if cache is not None and (match := cache.sharing_most(prompt[:last], self._variant)) is not None:
            # Unless the state, as large as the match's for as many tokens, would not fit in the cache's RAM (on
            # disk, a large model's is seconds to write).
            fits = match.state_bytes * match.length <= len(match.tokens) * cache.ram_budget_bytes
            if match.length >= max(reused, MIN_SAVE_TOKENS) and fits:
                stops.append(match.length)
        if not self.backend.rewinds and last not in stops:
            stops.append(last)
        return stops

    def _evaluate(self, prompt: Sequence[int], start: int, end: int, cancelled: Callable[[], bool]) -> bool:
        """Evaluate `prompt[start:end]` in chunks, unless `cancelled` says to stop between two; whether it
        got to `end`."""
        for begin in range(start, end, PREFILL_CHUNK):
            if cancelled():
                return False
            chunk = prompt[begin : min(begin + PREFILL_CHUNK, end)]
            started = time.perf_counter()
            self.backend.evaluate(self.seq, chunk, begin)
            if self.prefix_cache is not None:
                self.prefix_cache.costs.prefilled(len(chunk), time.perf_counter() - started)
            self.tokens.extend(chunk)
        return True

    def reset(self) -> None:
        self.backend.truncate(self.seq, 0)
        self.tokens = []

    def release(self) -> None:
        """Free the sequence's KV cells, keeping what it held in the prefix cache."""
        self.save_live_state()
        self.reset()

    def generate(self, prompt: Sequence[int], settings: GenerationSettings = GenerationSettings()) -> Generation:
        if not prompt:
            raise InvalidSettingError("the prompt is empty")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx}; "
                "shorten it or raise the context size (--ctx)"
            )
        return Generation(self, list(prompt), self.with_sampler(settings))

    def with_sampler(self, settings: GenerationSettings) -> GenerationSettings:
        """`settings` with the model's default sampler where they name none; raises InvalidSettingError where
        the sampler's logit_bias names a token the model does not have."""
        if settings.sampler is None:
            return replace(settings, sampler=self.sampler_defaults)
        settings.sampler.check_vocabulary(self.backend.info.n_vocab)
        return settings


class Reply:
    """One reply being produced: sampled tokens -> text (UTF-8 characters split across tokens,
    stop strings, end-of-generation tokens, max_tokens) and the timings of its stats.

    Shared by `Generation` (one sequence) and the batch scheduler (several at once).
    """

    def __init__(self, backend: Backend, settings: GenerationSettings, prompt_tokens: int) -> None:
        self._token_bytes = backend.token_bytes
        self._token_text = backend.token_text
        self._shown = settings.shown_tokens
        self._eog = frozenset() if settings.ignore_eos else backend.info.eog_ids
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # A grammar holds the whole reply (a forced tool call, JSON): a stop string matched in it would
        # cut it into text the grammar does not allow (a call's arguments that do not parse), so none
        # applies there. With tools and no grammar, the scope keeps them to the text outside calls.
        stops = () if settings.constraint is not None else settings.stop
        self._stops = _StopMatcher(stops, settings.stop_scope() if stops and settings.stop_scope is not None else None)
        self._limit = settings.max_tokens if settings.max_tokens is not None else backend.n_ctx
        self.sampler = settings.sampler
        self._stopped_by_string = False
        self.prompt_tokens = prompt_tokens
        self.token_ids: list[int] = []
        self.top_logprobs = settings.logprobs
        # One per token of `token_ids` when asked for; `unsent_logprobs` hands them on with the text.
        self.logprobs: list[TokenLogprob] = []
        self._logprobs_sent = 0
        # Where each token's text begins in the reply's text (kept with log-probabilities or stop strings),
        # and how much of it was handed on: the tokens of a stop string (whose text never is) have no
        # log-probabilities handed on, and are not among the tokens of the text returned.
        self._token_starts: list[int] = []
        self._decoded_chars = 0
        self._released_chars = 0
        self._tail_taken = False
        self.finish_reason: str | None = None  # set when the reply has ended
        self.cached_tokens = 0
        self.prefix_cache_tokens = 0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.started_at = time.perf_counter()
        self.admitted_at = self.started_at
        self.prefilled_at = self.started_at
        self.first_token_at: float | None = None
        # The sampler consumes tokens into it; once its grammar is complete only an end token is allowed.
        self.guide = token_guide(backend, settings.constraint)

    def admitted(self) -> None:
        """The prompt's evaluation starts (a server's reply has waited for a slot until now)."""
        self.admitted_at = time.perf_counter()

    def prefilled(self, cached_tokens: int, prefix_cache_tokens: int) -> None:
        """The prompt is in the KV cache, `cached_tokens` of it reused."""
        self.cached_tokens = cached_tokens
        self.prefix_cache_tokens = prefix_cache_tokens
        self.prefilled_at = time.perf_counter()

    def add(self, token: int, logprob: TokenLogprob | None = None) -> str:
        """The text `token` releases; sets `finish_reason` when the reply ends with it."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if token in self._eog:
            self.finish_reason = "stop"
            return ""
        self.token_ids.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
        if logprob is not None or self._stops.stops:
            self._token_starts.append(self._decoded_chars)
        decoded = self._decoder.decode(self.piece(token))
        self._decoded_chars += len(decoded)
        text, self._stopped_by_string = self._stops.feed(decoded)
        self._released_chars += len(text)
        if self._stopped_by_string:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self._limit:
            self.finish_reason = "length"
        return text

    @property
    def remaining(self) -> int:
        """Tokens the reply may still add before max_tokens ends it."""
        return self._limit - len(self.token_ids)

    def piece(self, token: int) -> bytes:
        """The bytes `token` adds to the text."""
        return self._token_text(token).encode() if token in self._shown else self._token_bytes(token)

    def unsent_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The log-probabilities not handed on yet of the tokens whose text the reply has released:
        a text piece carries those of the tokens it begins (a token whose text is held back, a
        partial character or a possible stop string's start, goes with the piece that releases
        it). Those of a stop string's tokens never go: the logprobs cover the text returned."""
        sent = self._logprobs_sent
        while sent < len(self.logprobs) and (self._tail_taken or self._token_starts[sent] < self._released_chars):
            sent += 1
        new = tuple(self.logprobs[self._logprobs_sent : sent])
        self._logprobs_sent = sent
        return new

    def end(self, finish_reason: str) -> None:
        """End the reply for a reason its tokens do not show (a full context, a cancel)."""
        self.finish_reason = finish_reason

    def tail(self) -> str:
        """The text held back until the end: a possible stop string's start. A character whose first bytes
        end the reply (max_tokens cut it) is left out, not written as U+FFFD: the reply is the characters
        its tokens completed."""
        if self._stopped_by_string:
            return ""
        self._tail_taken = True  # with the tokens that print nothing at its end
        self._decoder.reset()
        return self._stops.flush()

    def stats(self) -> GenerationStats:
        end = time.perf_counter()
        return GenerationStats(
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            prefix_cache_tokens=self.prefix_cache_tokens,
            completion_tokens=len(self.token_ids),
            completion_ids=tuple(self.token_ids),
            ttft_s=(self.first_token_at or end) - self.started_at,
            prefill_s=self.prefilled_at - self.started_at,
            decode_s=end - (self.first_token_at or self.started_at),
            finish_reason=self.finish_reason or "cancelled",
            drafted_tokens=self.drafted_tokens,
            accepted_tokens=self.accepted_tokens,
            sampler=self.sampler,
            queued_s=self.admitted_at - self.started_at,
            text_tokens=sum(start < self._released_chars for start in self._token_starts) if self._stopped_by_string else None,
        )


class Decoder:
    """The decode loop's step for one reply on one session, shared by `Generation` and the batch
    scheduler: sample a token into the reply, end it, feed the token back. The one place that
    keeps `session.tokens` equal to what the KV cache holds while a reply is decoded."""

    def __init__(self, session: Session, reply: Reply, settings: SamplerSettings | None, prompt: Sequence[int],
                 lookup_draft: int = 0) -> None:
        """Call before `prompt` is evaluated, or once it is: the sampler's penalties see it, and a backend that
        samples on the device draws the first token with the prompt's last one. `lookup_draft`:
        see GenerationSettings (the session's draft model, if it has one, drafts where lookup has
        no draft, while it pays: DraftPace); only `advance` drafts."""
        self.session = session
        self.reply = reply
        self.sampler: Sampler = session.backend.make_sampler(settings or session.sampler_defaults, reply.guide,
                                                             seq=session.seq, raw_logits=reply.top_logprobs is not None)
        self.sampler.accept(prompt)
        self.draft_model = session.draft_model
        if self.draft_model is not None and prompt:
            self.draft_model.follow(prompt)
        # Prompt lookup drafts as long as is expected to be fastest (0: off); a draft model's draft grows
        # while its drafts are taken whole and shrinks when one is cut short, up to DRAFT_MODEL_TOKENS.
        # A recurrent state cannot drop the drafted tokens the sampler does not pick: such a model drafts nothing.
        if not session.backend.rewinds:
            lookup_draft = 0
        self.lookup = LookupDrafting(lookup_draft, session.step_costs, session.backend.even_rows)
        self.model_draft_length = min(INITIAL_DRAFT, DRAFT_MODEL_TOKENS)
        # Prompt lookup searches the prompt and the reply so far; a draft model follows them. Neither: no index.
        self.ngrams = NgramIndex(prompt) if lookup_draft or self.draft_model is not None else None

    def sample(self, row: int = -1) -> str:
        """Sample the next token into the reply from the logits of the last evaluated one (or of
        row `row` of the last `evaluate_all`); the text it releases. Ends the reply when the
        context has no room left to evaluate it."""
        session, reply = self.session, self.reply
        backend, seq = session.backend, session.seq
        # Rows are only named when verifying a draft: a backend that never drafts need not take them.
        rows = () if row < 0 else (row,)
        if reply.top_logprobs is None:
            token = backend.sample(seq, self.sampler, *rows)
            text = reply.add(token)
        else:
            # The raw row is copied first: the grammar's mask and the penalties rewrite it in place.
            logits = backend.logits(seq, *rows).copy()
            token = backend.sample(seq, self.sampler, *rows)
            text = reply.add(token, token_logprob(logits, token, reply.top_logprobs))
        if self.ngrams is not None:  # lookup predicts only from an index
            self.ngrams.append(token)
            self.lookup.append(token)
        if reply.finish_reason is None and len(session.tokens) >= session.n_ctx:
            reply.end("length")
        return text

    @property
    def pending(self) -> tuple[int, int, int]:
        """`(seq, token, position)`: the token just sampled, to evaluate before the next `sample`."""
        return self.session.seq, self.reply.token_ids[-1], len(self.session.tokens)

    def evaluated(self) -> None:
        """The pending token is in the KV cache now (evaluated alone or in a batch)."""
        self.session.tokens.append(self.reply.token_ids[-1])

    def feed(self) -> None:
        """Evaluate the pending token alone (the batch scheduler evaluates several at once)."""
        seq, token, position = self.pending
        self.session.backend.evaluate(seq, [token], position)
        self.evaluated()

    def advance(self, cancelled: Callable[[], bool], emit: Callable[[str], None]) -> bool:
        """Feed the pending token and sample what follows, passing each sampled token's text (it
        may be empty) to `emit`; False, with nothing done, if `cancelled` first. When drafting, a
        draft goes into the same evaluation and every drafted token the sampler picks too is
        kept, so one step may add several tokens (one `emit` each, as a stream shows tokens).

        The reply stays the one decoding without a draft gives: each drafted position is sampled
        from its own row and the first that differs from the draft ends the step. For a sampler
        that draws at random this is speculative sampling's rule for a draft that is one token for
        sure: the drafted token is kept with the target's probability of it, and otherwise the
        token drawn follows the target's distribution without it, so the target's distribution is
        kept exactly (tests/test_speculative.py checks it statistically)."""
        session, reply = self.session, self.reply
        room = min(session.n_ctx - len(session.tokens) - 1, reply.remaining - 1)
        costs = session.step_costs
        # Prompt lookup first, as drafting costs nothing but the rows; else the draft model while it pays.
        ngrams, limit = self.ngrams, min(room, self.lookup.limit)
        lookup, n = ngrams.draft(limit) if limit > 0 and ngrams is not None else ([], 0)
        length = self.lookup.length(lookup, n, room) if lookup else 0
        started = time.perf_counter()
        if length:
            draft = lookup[:length]
            rows = self._rows(draft, room)
            new_shape = costs.new_shape(rows)
            accepted = self._verify(draft, room, cancelled, emit)
            if accepted is None:
                return False
            costs.drafted(time.perf_counter() - started, rows, new_shape)
            return True
        draft_model = self.draft_model
        if room > 0 and draft_model is not None and draft_model.pace.use_drafts():
            assert ngrams is not None
            draft = draft_model.draft(ngrams.tokens, min(room, self.model_draft_length))
            accepted = self._verify(draft, room, cancelled, emit)
            if accepted is None:
                return False
            draft_model.pace.drafted(time.perf_counter() - started, len(draft), accepted + 1)
            self.model_draft_length = self._next_length(self.model_draft_length, DRAFT_MODEL_TOKENS, accepted >= len(draft))
            return True
        self.feed()
        if cancelled():
            return False
        emit(self.sample())
        elapsed = time.perf_counter() - started
        costs.plain(elapsed)
        if draft_model is not None:
            draft_model.pace.plain(elapsed)
        return True

    @property
    def longest_draft(self) -> int:
        """The most tokens the next step may draft (0: this reply never drafts), a filler included."""
        longest = max(self.lookup.limit, self.model_draft_length if self.draft_model is not None else 0)
        return longest + 1 if longest and self.session.backend.even_rows else longest

    def _verify(self, draft: list[int], room: int, cancelled: Callable[[], bool],
                emit: Callable[[str], None]) -> int | None:
        """Evaluate the pending token and `draft` in one step and keep the drafted tokens the sampler
        picks too; how many it kept (None, with nothing done, if `cancelled` first). On a backend
        whose even counts of rows are cheaper (`even_rows`), an odd count gets a filler token:
        the last drafted one again, kept like any drafted token if the sampler picks it."""
        session, reply = self.session, self.reply
        if cancelled():
            return None
        if self._rows(draft, room) > len(draft):
            draft = [*draft, draft[-1]]
        seq, token, position = self.pending
        session.backend.evaluate_all(seq, [token, *draft], position)
        session.tokens.append(token)
        reply.drafted_tokens += len(draft)
        emit(self.sample(0))
        accepted = 0
        for row, drafted in enumerate(draft, start=1):
            if reply.finish_reason is not None or reply.token_ids[-1] != drafted:
                break
            session.tokens.append(drafted)
            accepted += 1
            emit(self.sample(row))
        reply.accepted_tokens += accepted
        # The KV cache drops the drafted tokens past the first the sampler did not pick.
        session.backend.truncate(seq, len(session.tokens))
        return accepted

    def _rows(self, draft: Sequence[int], room: int) -> int:
        """The rows `draft` takes to verify: one more where a filler makes the count even."""
        return int(verified_rows(len(draft), room, self.session.backend.even_rows))

    @staticmethod
    def _next_length(length: int, limit: int, whole: bool) -> int:
        """A drafter's next draft length: longer after a draft taken whole, one shorter after a cut one."""
        return min(limit, length + DRAFT_GROWTH) if whole else max(1, length - 1)

    def close(self) -> None:
        self.sampler.close()


class Generation:
    """A reply being generated: iterate for text pieces; `stats` is set when it ends.

    Ending the iteration early (break, `cancel()` from another thread) stops it cleanly: the KV
    cache keeps every token evaluated so far and the session knows them.
    """

    def __init__(self, session: Session, prompt: list[int], settings: GenerationSettings) -> None:
        self.session = session
        self.prompt = prompt
        self.settings = settings
        self.stats: GenerationStats | None = None
        self._reply = Reply(session.backend, settings, len(prompt))
        self.completion_ids = self._reply.token_ids
        self.logprobs = self._reply.logprobs  # with settings.logprobs: one per completion token
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def started_at(self) -> float:
        return self._reply.started_at

    @property
    def first_token_at(self) -> float | None:
        return self._reply.first_token_at

    @property
    def tokens_per_second(self) -> float:
        """Live decode rate, for status bars."""
        if self.first_token_at is None or len(self.completion_ids) < 2:
            return 0.0
        return (len(self.completion_ids) - 1) / max(time.perf_counter() - self.first_token_at, 1e-9)

    def __iter__(self) -> Iterator[str]:
        with self.session.lock:
            yield from self._run()

    def _run(self) -> Iterator[str]:
        session, reply = self.session, self._reply
        decoder: Decoder | None = None
        try:
            # The sampler first: a backend that samples on the device draws the first token when the
            # prompt's last token is evaluated.
            decoder = Decoder(session, reply, self.settings.sampler, self.prompt, self.settings.lookup_draft)
            reply.prefilled(*session.prefill(self.prompt, self._cancelled.is_set, self.settings.loras))
            if not self._cancelled.is_set():
                pieces = [decoder.sample()]
                while True:
                    yield from (text for text in pieces if text)
                    if reply.finish_reason is not None:
                        break
                    pieces = []
                    if not decoder.advance(self._cancelled.is_set, pieces.append):
                        break
            tail = reply.tail()
            if tail:
                yield tail
        except Exception:
            # The KV cache may hold part of a failed evaluation: start the sequence afresh.
            session.reset()
            raise
        finally:
            if decoder is not None:
                decoder.close()
            self.stats = reply.stats()

    def stream(self, emit: Callable[[str], None]) -> None:
        """Run to the end, passing each text piece to `emit`, where the backend evaluates (llama.cpp's compute
        thread: Backend.hold_compute): a token's decode then makes no hop between threads, and `emit` runs
        there too. The loop steps aside while an evaluation asked for by another thread runs (a model
        warming up, embeddings), then goes on."""
        pieces = iter(self)

        def step() -> bool:
            piece = next(pieces, None)
            if piece is None:
                return False
            try:
                emit(piece)
            except BaseException:
                pieces.close()  # `emit` failed: the reply ends here, its KV cache and stats kept as after a break
                raise
            return True

        self.session.backend.hold_compute(step)

    def text(self) -> str:
        """Run to the end and return the whole reply."""
        return "".join(self)
