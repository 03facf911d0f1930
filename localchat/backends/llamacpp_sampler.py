"""llama.cpp's sampler chain on a few candidates instead of the whole vocabulary.

`llama_sampler_sample` copies every logit of a row into a candidate array before its chain runs:
0.6 ms a token for a 262k vocabulary, most of a small model's step. Here one numpy pass finds the
tokens that can still be picked (those near the best logit, and those a penalty may touch), and
llama.cpp's own samplers (penalties, DRY, top-k, top-p, min-p, temperature, the draw) run on those
alone through `llama_sampler_apply`. The pick follows the same distribution: see `candidates`.
"""

from __future__ import annotations

import ctypes
from collections import deque
from collections.abc import Sequence
from contextlib import ExitStack
from itertools import islice

import llama_cpp
import numpy as np

from localchat.backends.base import SamplerSettings, TokenGuide

# llama_token_data as numpy lays it out: {int32 id; float logit; float p}.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# A first look for candidates: the tokens within this many logits of the best. When that finds fewer
# than top-k of them, the top-k reaches below it and the look widens to FAR_SPAN, under which a token's
# weight beside the best one's is below e^-30 (1e-13): top-p's sums do not see it in float32.
NEAR_SPAN = 8.0
FAR_SPAN = 30.0
# More candidates than this are first narrowed to those within the first of these spans of the best
# that still holds top-k's reach (see _among_best).
NARROWED = 256
NARROWING_SPANS = (1.0, 2.0, 4.0)


class LlamaSampler:
    """A reply's sampler: llama.cpp's samplers in llama.cpp's order, each owned and freed here.

    Stages: the repeat/frequency/presence penalties (which see the prompt and the reply), DRY (the reply
    alone: see SamplerSettings), then the truncations, temperature and the draw, or greedy."""

    def __init__(self, settings: SamplerSettings, n_vocab: int, dry: llama_cpp.llama_sampler_p | None = None,
                 guide: TokenGuide | None = None) -> None:
        """`dry`: a DRY sampler with `settings`' parameters to copy (see `LlamaCppBackend.make_sampler`);
        `guide`: the grammar the reply must follow."""
        self.settings = settings
        self.guide = guide
        self._natives = ExitStack()
        self.penalties = self._own(llama_cpp.llama_sampler_init_penalties(
            # This build's C API still takes n_vocab first (see its include/llama.h).
            n_vocab, settings.penalty_last_n, settings.repeat_penalty, settings.frequency_penalty, settings.presence_penalty,
        )) if settings.repeat_penalized else None
        if settings.dry and dry is None:
            raise ValueError("DRY is on but no DRY sampler was given")
        self.dry = self._own(llama_cpp.llama_sampler_clone(dry)) if settings.dry and dry is not None else None
        self.rest = self._own(self._truncate_and_draw(settings))
        self.stages = [stage for stage in (self.penalties, self.dry, self.rest) if stage is not None]
        # The tokens a penalty may touch: the last of those seen, as far back as a penalty looks.
        window = settings.history_window
        self._seen: deque[int] = deque(maxlen=None if window < 0 else window)
        self._candidates = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._array = llama_cpp.llama_token_data_array()
        self._all_ids = np.arange(n_vocab, dtype=np.int64)
        # Without a truncation the draw may land anywhere: every token is a candidate.
        self._whole_row = not settings.greedy and settings.top_k <= 0 and (settings.min_p <= 0 or settings.top_p < 1)

    def _own(self, sampler: llama_cpp.llama_sampler_p) -> llama_cpp.llama_sampler_p:
        self._natives.callback(llama_cpp.llama_sampler_free, sampler)
        return sampler

    @staticmethod
    def _truncate_and_draw(settings: SamplerSettings) -> llama_cpp.llama_sampler_p:
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = llama_cpp.llama_sampler_chain_init(params)
        add = lambda sampler: llama_cpp.llama_sampler_chain_add(chain, sampler)  # the chain owns them
        if settings.greedy:
            add(llama_cpp.llama_sampler_init_greedy())
            return chain
        if settings.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(settings.top_k))
        if settings.top_p < 1.0:
            add(llama_cpp.llama_sampler_init_top_p(settings.top_p, 1))
        if settings.min_p > 0.0:
            add(llama_cpp.llama_sampler_init_min_p(settings.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(settings.temperature))
        add(llama_cpp.llama_sampler_init_dist(llama_cpp.LLAMA_DEFAULT_SEED if settings.seed is None else settings.seed))
        return chain

    @property
    def argmax_only(self) -> bool:
        """Greedy with no penalties: the pick is the row's argmax (ties: the lowest id, as llama.cpp's)."""
        return self.settings.greedy and not self.settings.penalized

    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None:
        """Show the penalties tokens the sampler did not pick: the prompt, or (`reply`) tokens of the reply, which
        DRY sees too."""
        stages = [stage for stage in (self.penalties, self.dry if reply else None) if stage is not None]
        if stages:
            window = self._seen.maxlen
            for token in tokens if window is None else islice(tokens, max(len(tokens) - window, 0), None):
                for stage in stages:
                    llama_cpp.llama_sampler_accept(stage, token)
                self._seen.append(token)

    def pick(self, row: np.ndarray) -> int:
        """The next token from a logits row (which the grammar's mask may rewrite in place)."""
        if self.guide is not None:
            self.guide.mask(row)
        if self.argmax_only:
            token = int(row.argmax())
        else:
            token = self._draw(row)
            for stage in self.stages:
                llama_cpp.llama_sampler_accept(stage, token)
            if self.penalties is not None or self.dry is not None:
                self._seen.append(token)
        if self.guide is not None:
            self.guide.consume(token)
        return token

    def candidates(self, row: np.ndarray) -> np.ndarray:
        """The ids the chain can pick from `row`, ascending.

        Penalties only lower the logits of tokens seen (a negative one can raise them: those are
        always candidates), so the best logit after them is at least the best unseen one's, `best`.
        A token the chain may pick lies within the chain's reach of that: greedy's 0, or top-k's k
        best (all within NEAR_SPAN of it, or else FAR_SPAN catches every one that weighs), or min-p's
        -ln(min_p) when top-p keeps all. A seen token is a candidate wherever it lies."""
        seen = self._seen_ids()
        if seen.size:
            held = row[seen].copy()
            row[seen] = -np.inf
            best = float(row.max())
            row[seen] = held
        else:
            best = float(row.max())
        s = self.settings
        if s.greedy:
            ids = np.flatnonzero(row >= best)
        elif s.top_k > 0:
            ids = np.flatnonzero(row >= best - NEAR_SPAN)
            if ids.size < s.top_k:
                ids = np.flatnonzero(row >= best - FAR_SPAN)
            # Top-k keeps k of them: the k best unseen ones (their logits stay as they are) or seen ones.
            ids = _among_best(row, ids, s.top_k + seen.size, best)
        else:  # min-p alone truncates
            ids = np.flatnonzero(row >= best + np.log(s.min_p))
        return np.union1d(ids, seen) if seen.size else ids

    def _seen_ids(self) -> np.ndarray:
        if not self._seen:
            return np.empty(0, dtype=np.int64)
        unique = set(self._seen)
        return np.fromiter(unique, dtype=np.int64, count=len(unique))

    def _draw(self, row: np.ndarray) -> int:
        ids = self._all_ids if self._whole_row else self.candidates(row)
        n = len(ids)
        candidates = self._candidates[:n]
        candidates["id"] = ids
        candidates["logit"] = row[ids]
        array = self._array
        array.data = candidates.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        array.size = n
        array.selected = -1
        array.sorted = False
        pointer = ctypes.byref(array)
        for stage in self.stages:
            llama_cpp.llama_sampler_apply(stage, pointer)
        return int(array.data[array.selected].id)

    def reset(self) -> None:
        for stage in self.stages:
            llama_cpp.llama_sampler_reset(stage)
        self._seen.clear()

    def close(self) -> None:
        self._natives.close()
        self.stages = []


def _among_best(row: np.ndarray, ids: np.ndarray, n: int, best: float) -> np.ndarray:
    """Those of `ids` (ascending, all within reach of `best`) whose logits are among their `n` best,
    ties at the n-th kept. A flat row puts most of the vocabulary within reach: a few passes narrowing
    it to the tokens within 1, 2 or 4 logits of `best` cost less than partitioning them all."""
    if ids.size <= n:
        return ids
    values = row[ids]
    for span in NARROWING_SPANS:
        if values.size <= NARROWED:
            break
        near = values >= best - span
        if np.count_nonzero(near) >= n:
            ids, values = ids[near], values[near]
            break
    nth = np.partition(values, values.size - n)[values.size - n]
    return ids[values >= nth]


def device_chain(settings: SamplerSettings) -> llama_cpp.llama_sampler_p:
    """The chain llama.cpp runs inside the model's graph (backend sampling): truncations, temperature and the
    draw, or greedy; none of its samplers keeps a history, so it needs no penalties."""
    return LlamaSampler._truncate_and_draw(settings)


def device_sampleable(settings: SamplerSettings, guide: TokenGuide | None, raw_logits: bool) -> bool:
    """Whether llama.cpp can sample a reply inside its graph: no penalties (llama.cpp samples every row of a
    draft from one history, so a drafted row would miss the drafted tokens before it), no grammar, and no
    raw logits read back (logprobs)."""
    return guide is None and not raw_logits and not settings.penalized


class DeviceSampler:
    """A reply sampled by llama.cpp inside the model's graph (llama_set_sampler), on the device that
    computes the output layer: the logits row never leaves it. The chain is attached to the reply's
    sequence by the backend, which owns it; `pick` reads the token the last decode drew for a row and
    commits it (llama.cpp draws every row of a draft, and keeps those committed)."""

    guide = None

    def __init__(self, settings: SamplerSettings, chain: llama_cpp.llama_sampler_p, context: llama_cpp.llama_context_p) -> None:
        self.settings = settings
        self.chain = chain
        self._context = context

    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None:
        """The prompt: nothing to remember (no penalties)."""

    def pick_output(self, index: int) -> int:
        token = int(llama_cpp.llama_get_sampled_token_ith(self._context, index))
        if token < 0:
            raise RuntimeError(f"llama.cpp drew no token for output {index}")
        llama_cpp.llama_sampler_accept(self.chain, token)
        return token

    def reset(self) -> None:
        llama_cpp.llama_sampler_reset(self.chain)

    def close(self) -> None:
        """The chain stays attached to its sequence for the next reply with the same settings."""
