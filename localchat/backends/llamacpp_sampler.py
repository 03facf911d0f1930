"""llama.cpp's sampler chain on a few candidates instead of the whole vocabulary.

`llama_sampler_sample` copies every logit of a row into a candidate array before its chain runs:
0.6 ms a token for a 262k vocabulary, most of a small model's step. Here numpy finds the tokens that
can still be picked (those near the best logit, and those a penalty may touch), and llama.cpp's own
samplers (penalties, DRY, top-k, top-p, min-p, temperature, the draw) run on those alone through
`llama_sampler_apply`. The pick follows the same distribution: see `candidates`.

What a pick costs is set by how many numpy calls it makes as much as by how many logits they read: a
decode streams the weights through every cache, so each call after it waits for its code and data (on
the AMD EPYC machine, four numpy calls on 10 numbers took 65 us after a decode and 4 us once warm; an
argmax of 262k logits 31-37 us). So the search is one call into C (`_logits_scan.near_best`), which finds
the best logit and writes the tokens near it straight into the candidate array that the chain reads, and
the draw is one more (`_logits_scan.draw`), which runs the chain over them and tells it the token: through
ctypes that took six calls (the array's four fields, the chain, the accept). With both, a pick inside a
reply took 0.051-0.057 ms against 0.070-0.077 on SmolLM2's 49k vocabulary and 0.080-0.096 against 0.104-0.118
on Gemma 3 270M's 262k, which also no longer searches its row twice where few tokens are near the best
(`_top_k_search`) (AMD EPYC with AVX-512, 4 alternating runs of benchmarks/as_shipped.py's sampling figure).
"""

from __future__ import annotations

import ctypes
import math
from collections import deque
from collections.abc import Callable, Sequence, Set as AbstractSet
from contextlib import ExitStack
from functools import partial
from itertools import islice

import llama_cpp
import numpy as np

from localchat.backends._logits_scan import draw, near_best
from localchat.backends.base import SamplerSettings, TokenGuide
from localchat.backends.logit_bias import LogitBias
from localchat.errors import ModelError

# llama_token_data as numpy lays it out: {int32 id; float logit; float p}.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# min-p's reach is computed here in float64 and in llama.cpp in float32: a little more keeps every
# token llama.cpp keeps.
REACH_MARGIN = 1e-3
# llama_sampler_apply and llama_sampler_accept, which `draw` calls from C.
APPLY = ctypes.cast(llama_cpp.llama_sampler_apply, ctypes.c_void_p).value
ACCEPT = ctypes.cast(llama_cpp.llama_sampler_accept, ctypes.c_void_p).value


class LlamaSampler:
    """A reply's sampler: llama.cpp's samplers in llama.cpp's order, in one chain owned and freed here.

    Stages: the logit bias (added to the row before the chain: LogitBias), the repeat/frequency/presence
    penalties (which see the prompt and the reply), DRY (the reply alone: see SamplerSettings), then the
    truncations, temperature and the draw, or greedy. One chain, so that a pick is one call into llama.cpp
    and one to tell it the token (each call is slow after a decode)."""

    def __init__(self, settings: SamplerSettings, n_vocab: int, n_ctx: int, dry: llama_cpp.llama_sampler_p | None = None,
                 guide: TokenGuide | None = None) -> None:
        """`n_ctx`: the context's size, the window of a penalty over all of it (-1); `dry`: a DRY sampler with
        `settings`' parameters to copy (see `LlamaCppBackend.make_sampler`); `guide`: the grammar the reply must follow."""
        if settings.dry and dry is None:
            raise ValueError("DRY is on but no DRY sampler was given")
        self.settings = settings
        self.guide = guide
        self._bias = LogitBias.of(settings)
        self._natives = ExitStack()
        self.chain = _new_chain()
        self._natives.callback(llama_cpp.llama_sampler_free, self.chain)
        add = partial(llama_cpp.llama_sampler_chain_add, self.chain)  # the chain owns what it holds
        # The penalties are also shown the prompt, alone (`accept`); the chain holds them.
        self.penalties = llama_cpp.llama_sampler_init_penalties(
            # This build's C API still takes n_vocab first (see its include/llama.h); it reads a window of -1 as 0,
            # which turns the penalties off, so the whole context is given as its size.
            n_vocab, n_ctx if settings.penalty_last_n < 0 else settings.penalty_last_n, settings.repeat_penalty,
            settings.frequency_penalty, settings.presence_penalty,
        ) if settings.repeat_penalized else None
        if self.penalties is not None:
            add(self.penalties)
        if settings.dry and dry is not None:
            add(llama_cpp.llama_sampler_clone(dry))
        _add_truncations_and_draw(settings, add)
        # The tokens a penalty may lower at the next pick.
        self._touchable = TouchableTokens(settings)
        # Whether every penalty on lowers the logits of the tokens it touches (see `candidates`).
        self._penalties_lower = (settings.repeat_penalty >= 1 and settings.frequency_penalty >= 0
                                 and settings.presence_penalty >= 0)
        self._candidates = np.zeros(n_vocab, dtype=TOKEN_DATA)
        # The candidates `near_best` last wrote to `_candidates`: what `_draw` need not write again.
        self._scanned: np.ndarray | None = None
        self._candidate_ids = self._candidates["id"]
        self._chain_address = ctypes.cast(self.chain, ctypes.c_void_p).value
        self._all_ids = np.arange(n_vocab, dtype=np.int64)
        # Without a truncation the draw may land anywhere: every token is a candidate.
        self._whole_row = not settings.greedy and settings.top_k <= 0 and (settings.min_p <= 0 or settings.top_p < 1)
        self._top_k = settings.top_k if settings.top_k > 0 and not settings.greedy else 0
        # Greedy and min-p alone pick within a fixed reach of the best logit (see `candidates`).
        self._reach = 0.0 if settings.greedy else -math.log(settings.min_p) + REACH_MARGIN if settings.min_p > 0 else math.inf
        # Top-k's candidates reach no lower (a row masked by a grammar or a flat one would otherwise hand the
        # chain most of the vocabulary).
        self._far_span = settings.far_span
        # Flags of the settings that every pick reads, kept here: right after a decode each property call
        # waits for its code and data.
        self._penalized = settings.penalized
        self._argmax_only = settings.greedy and not settings.penalized

    @property
    def argmax_only(self) -> bool:
        """Greedy with no penalties: the pick is the row's argmax (ties: the lowest id, as llama.cpp's)."""
        return self._argmax_only

    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None:
        """Show the penalties tokens the sampler did not pick: the prompt, or (`reply`) tokens of the reply, which
        DRY sees too (through the chain, whose other stages keep nothing)."""
        target = self.chain if reply else self.penalties
        if target is None or not self._penalized:
            return
        window = self.settings.history_window if reply else self.settings.penalty_last_n
        for token in tokens if window < 0 else islice(tokens, max(len(tokens) - window, 0), None):
            llama_cpp.llama_sampler_accept(target, token)
            self._touchable.append(token, reply=reply)

    def pick(self, row: np.ndarray) -> int:
        """The next token from a logits row (which the logit bias and the grammar's mask rewrite in place)."""
        bias = self._bias
        if bias is not None:
            bias.add_to(row)
        guide = self.guide
        if guide is not None:
            guide.mask(row)
        if self.argmax_only:
            token = int(row.argmax())
        else:
            token = self._draw(row)
            if self._penalized:
                self._touchable.append(token, reply=True)
        if guide is not None:
            guide.consume(token)
        return token

    def candidates(self, row: np.ndarray) -> np.ndarray:
        """The ids the chain can pick from `row`, ascending.

        Penalties only lower the logits of the tokens they touch (a negative one can raise them), so an
        untouched token the chain may pick lies within the chain's reach of the best untouched logit, its logit
        unchanged: greedy's 0, top-k's k best untouched ones, or min-p's -ln(min_p) when top-p keeps all; and a
        touched token it may pick lies there too, its logit lowered from at least that. So the tokens at least
        that far under the best untouched one will do, touched ones among them. When a penalty may raise a
        logit, the reach is taken from the untouched tokens alone and every touchable token is a candidate
        (`_candidates_apart_from_touchable`)."""
        touchable = self._touchable
        if touchable and not self._penalties_lower:
            return self._candidates_apart_from_touchable(row)
        ids = self._search(row, touchable)
        return self._candidates_apart_from_touchable(row) if ids is None else ids

    def _search(self, row: np.ndarray, touchable: TouchableTokens | None) -> np.ndarray | None:
        """The ids within the chain's reach (see `candidates`), judged by the untouched tokens; None if that
        cannot be told from the tokens near the best."""
        if self._top_k:
            return self._top_k_search(row, touchable)
        ids, best_id, _ = self._near_best(row, self._reach)
        if not touchable or best_id not in touchable:
            return ids
        untouched = [token for token in ids.tolist() if token not in touchable]
        if not untouched:
            return None
        return (row >= float(row[untouched].max()) - self._reach).nonzero()[0]

    def _top_k_search(self, row: np.ndarray, touchable: TouchableTokens | None) -> np.ndarray | None:
        """The ids at least as high as the k-th best untouched logit: the k best logits and as many more as
        tokens are touchable, without looking which are, prove it; where fewer lie within the far span, the
        untouched among them are counted."""
        k = self._top_k
        bound = touchable.bound() if touchable else 0
        ids, best_id, floor = self._near_best(row, self._far_span, k + bound)
        if len(ids) >= k + bound:
            return ids
        if touchable and len(ids) >= k:
            if len(ids) - int(np.count_nonzero(row[touchable.ids()] >= floor)) >= k:
                return ids
        # Too few within it: the rest weigh nothing beside the best, if the best is untouched (a penalty cannot
        # lower it, so it stays the best and the far span's floor stays where it is).
        return None if touchable and best_id in touchable else ids

    def _near_best(self, row: np.ndarray, span: float, least: int = 0) -> tuple[np.ndarray, int, float]:
        """The ids at least the best logit less `span`, or at least the least-th best logit if higher (a view
        of `_candidates`, which holds their logits too), the best logit's id, and the floor they reach."""
        count, best_id, floor = near_best(row, span, least, self._candidates)
        ids = self._scanned = self._candidate_ids[:count]
        return ids, best_id, floor

    def _candidates_apart_from_touchable(self, row: np.ndarray) -> np.ndarray:
        """The untouched tokens within reach of the best untouched ones, and every touchable token."""
        touchable = self._touchable.ids()
        held = row[touchable].copy()
        row[touchable] = -np.inf
        ids = self._search(row, None)
        row[touchable] = held
        assert ids is not None  # searched with none touchable
        return _sorted_union(ids, touchable)

    def _draw(self, row: np.ndarray) -> int:
        """The chain's pick among the candidates, which the chain is told of."""
        self._scanned = None
        ids = self._all_ids if self._whole_row else self.candidates(row)
        n = len(ids)
        if n == 0 and np.isnan(row).any():  # NaN compares above no cut
            raise ModelError("the model's output is not a number (NaN): its weights are broken, or a LoRA adapter's "
                             "scale is too large")
        if ids is not self._scanned:  # the whole row, or ids the search did not write (touchable ones among them)
            candidates = self._candidates[:n]
            candidates["id"] = ids
            candidates["logit"] = row[ids]
        return draw(self._candidates, n, self._chain_address, APPLY, ACCEPT)

    def reset(self) -> None:
        llama_cpp.llama_sampler_reset(self.chain)
        self._touchable.clear()

    def close(self) -> None:
        self._natives.close()


NO_FOLLOWERS: frozenset[int] = frozenset()


class TouchableTokens:
    """The tokens the penalties may lower at the next pick, kept as tokens come: those in the repeat penalties'
    window (prompt and reply), and for DRY the tokens that followed the reply's last token earlier in the reply.
    DRY lowers a token only where it would extend a repeat of the reply's end at least `dry_allowed_length` (>= 1)
    long (llama.cpp's `llama_sampler_dry_apply`): the repeat ends with that last token, and the token followed it.

    Counting every token seen instead, the top-k search would look past hundreds of them rather than a few dozen:
    a pick took 0.92x the time that way on SmolLM2-135M (0.26 against 0.29 ms) and 0.96x on Gemma 3 270M (AMD
    EPYC without AVX-512, 1000 steps of a reply taking turns, a short prompt and a 2k-token one alike)."""

    def __init__(self, settings: SamplerSettings) -> None:
        window = settings.penalty_last_n if settings.repeat_penalized else 0
        self._window = None if window < 0 else window
        self._dry = settings.dry
        self._recent: deque[int] = deque()
        self._counts: dict[int, int] = {}
        # DRY: each reply token and the tokens that followed it (from the whole reply: more than DRY's window
        # may hold, which only widens the search).
        self._followers: dict[int, set[int]] = {}
        self._last: int | None = None
        self._next: AbstractSet[int] = NO_FOLLOWERS

    def __bool__(self) -> bool:
        return bool(self._counts) or bool(self._next)

    def __contains__(self, token: int) -> bool:
        return token in self._counts or token in self._next

    def bound(self) -> int:
        """At most how many tokens are touchable (a token in both sets counts twice)."""
        return len(self._counts) + len(self._next)

    def append(self, token: int, *, reply: bool) -> None:
        """A token seen: in the prompt, or in the reply (which DRY sees)."""
        if self._window != 0:
            if self._window is not None and len(self._recent) == self._window:
                gone = self._recent.popleft()
                if self._counts[gone] == 1:
                    del self._counts[gone]
                else:
                    self._counts[gone] -= 1
            self._recent.append(token)
            self._counts[token] = self._counts.get(token, 0) + 1
        if reply and self._dry:
            if self._last is not None:
                self._followers.setdefault(self._last, set()).add(token)
            self._last = token
            self._next = self._followers.get(token, NO_FOLLOWERS)

    def ids(self) -> np.ndarray:
        """The touchable ids, distinct, in no order."""
        return np.fromiter(self._counts.keys() | self._next, dtype=np.int64)

    def clear(self) -> None:
        self._recent.clear()
        self._counts.clear()
        self._followers.clear()
        self._last = None
        self._next = NO_FOLLOWERS


def _sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.union1d without its checks: the distinct ids of both, ascending (4 µs against 10)."""
    both = np.concatenate((a, b))
    both.sort()
    distinct = np.empty(len(both), dtype=bool)
    distinct[:1] = True
    np.not_equal(both[1:], both[:-1], out=distinct[1:])
    return both[distinct]


def device_chain(settings: SamplerSettings) -> llama_cpp.llama_sampler_p:
    """The chain llama.cpp runs inside the model's graph (backend sampling): truncations, temperature and the
    draw, or greedy; none of its samplers keeps a history, so it needs no penalties."""
    chain = _new_chain()
    _add_truncations_and_draw(settings, partial(llama_cpp.llama_sampler_chain_add, chain))
    return chain


def _new_chain() -> llama_cpp.llama_sampler_p:
    params = llama_cpp.llama_sampler_chain_default_params()
    params.no_perf = True
    return llama_cpp.llama_sampler_chain_init(params)


def _add_truncations_and_draw(settings: SamplerSettings, add: Callable[[llama_cpp.llama_sampler_p], None]) -> None:
    """llama.cpp's truncations, temperature and draw for `settings`, or greedy, each given to `add`."""
    if settings.greedy:
        add(llama_cpp.llama_sampler_init_greedy())
        return
    if settings.top_k > 0:
        add(llama_cpp.llama_sampler_init_top_k(settings.top_k))
    if settings.top_p < 1.0:
        add(llama_cpp.llama_sampler_init_top_p(settings.top_p, 1))
    if settings.min_p > 0.0:
        add(llama_cpp.llama_sampler_init_min_p(settings.min_p, 1))
    add(llama_cpp.llama_sampler_init_temp(settings.temperature))
    add(llama_cpp.llama_sampler_init_dist(llama_cpp.LLAMA_DEFAULT_SEED if settings.seed is None else settings.seed))


def device_sampleable(settings: SamplerSettings, guide: TokenGuide | None, raw_logits: bool, n_seq: int) -> bool:
    """Whether llama.cpp samples a reply inside its graph: no penalties (llama.cpp samples every row of a
    draft from one history, so a drafted row would miss the drafted tokens before it), no grammar, no logit
    bias (added to the row on the host: LogitBias), no raw logits read back (logprobs), and, in a context of
    several sequences (`serve`'s slots), greedy alone: there the default chain was drawn faster on the host
    (H200, `serve` as shipped with 4 slots: 0.96-0.97x `llama-server` with 4 streams against 0.78-0.82x;
    benchmarks/gpu/README.md, fourth day)."""
    return (guide is None and not raw_logits and not settings.penalized and not settings.logit_bias
            and (n_seq == 1 or settings.greedy))


class DeviceSampler:
    """A reply sampled by llama.cpp inside the model's graph (llama_set_sampler), on the device that
    computes the output layer: the logits row never leaves it. The chain is attached to the reply's
    sequence by the backend, which owns it; `pick` reads the token the last decode drew for a row and
    commits it (llama.cpp draws every row of a draft, and keeps those committed)."""

    guide = None

    def __init__(self, settings: SamplerSettings, chain: llama_cpp.llama_sampler_p, context: llama_cpp.llama_context_p,
                 release: Callable[[], None] | None = None) -> None:
        """`release`: what `close` calls to take the chain off its sequence (None: it stays)."""
        self.settings = settings
        self.chain = chain
        self._context = context
        self._release = release

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
        """The reply has ended: its chain is released, or stays attached to its sequence for the next reply
        with the same settings (LlamaCppBackend.make_sampler decides)."""
        if self._release is not None:
            self._release()
            self._release = None
