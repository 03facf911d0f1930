"""Prompt-lookup speculative decoding: the draft rule and its adaptation (pure logic), sampled
replies keeping the target's distribution (a statistical test over a stand-in model with known
probabilities and the real numpy sampler), and on the real default model greedy replies equal
token for token with and without drafting."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from greedy_paths import assert_same_until_near_tie

from localchat.backends.base import ARGMAX, ModelInfo, SamplerSettings
from localchat.backends.onnx import NumpySampler
from localchat.bench import measure_speculation
from localchat.engine import Engine
from localchat.errors import ModelError
from localchat.planner import PlanRequest
from localchat.session import Decoder, Generation, GenerationSettings, Reply, Session
from localchat.settings import Settings
from localchat.speculative import (
    DRAFT_RETRY,
    PRIOR_FIXED,
    PRIOR_PER_ROW,
    RECOVERY_STEPS,
    DraftModel,
    DraftPace,
    LookupDrafting,
    NgramIndex,
    StepCosts,
    check_same_vocabulary,
)

PASSAGE = ("The lighthouse keeper climbed the narrow stairs every evening at dusk. He trimmed the wick, "
           "polished the great lens and wrote the weather in a small leather book. Ships passed far out "
           "at sea, and none of them ever knew his name.")
PROMPTS = [
    f"Text: {PASSAGE}\nThe same text, copied exactly:\nText: The lighthouse keeper",  # the reply copies the prompt
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 4, 5, 6, 7,",
]


def draft_by_search(sequence: Sequence[int], limit: int) -> tuple[list[int], int]:
    """The rule written out: the tokens after the latest earlier occurrence of the last 3-, 2- or 1-gram, and n."""
    for n in (3, 2, 1):
        for start in range(len(sequence) - n - 1, -1, -1):
            if len(sequence) > n and list(sequence[start : start + n]) == list(sequence[-n:]):
                return list(sequence[start + n : start + n + limit]), n
    return [], 0


def test_the_draft_follows_the_latest_earlier_match_of_the_longest_ngram() -> None:
    assert NgramIndex([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]).draft(2) == ([7, 8], 3)
    assert NgramIndex([5, 6, 7, 1, 2, 8, 2]).draft(3) == ([8, 2], 1)  # no 3- or 2-gram match: the last token
    assert NgramIndex([4, 1, 2, 3]).draft(5) == ([], 0) and NgramIndex().draft(4) == ([], 0)
    # Grown token by token, the index drafts what searching the whole sequence finds.
    rng = random.Random(0)
    for _ in range(50):
        index, sequence = NgramIndex(), []
        for _ in range(60):
            sequence.append(rng.randrange(4))
            index.append(sequence[-1])
            assert index.draft(5) == draft_by_search(sequence, 5), sequence


VOCAB = 4
EOS = VOCAB  # never sampled: its logit is -inf


class MarkovBackend:
    """A stand-in model whose next-token logits depend on the last two tokens only (a fixed random
    table), so the probability of any reply is known exactly; sampling is the real NumpySampler."""

    name = "markov"
    even_rows = False
    rewinds = True
    saved_states_rewind = True
    first_shape_steps = 0.0
    n_seq = 1
    n_ctx = 256

    def __init__(self) -> None:
        self.table = np.random.default_rng(7).normal(0.0, 1.0, size=(VOCAB + 1, VOCAB + 1, VOCAB + 1)).astype(np.float32)
        self.table[..., EOS] = -np.inf
        self.info = ModelInfo(path=Path("markov"), name="markov", architecture="markov", n_vocab=VOCAB + 1, n_ctx_train=256,
                              n_layers=1, bos_id=None, eos_id=EOS, add_bos=False, eog_ids=frozenset({EOS}),
                              chat_template=None, size_bytes=0)
        self.held: list[int] = []
        self.rows = np.zeros((1, VOCAB + 1), dtype=np.float32)
        self.rows_evaluated = 0

    def _row(self, context: Sequence[int]) -> np.ndarray:
        padded = [EOS, EOS, *context]  # the start of the sequence reads as EOS
        return self.table[padded[-2], padded[-1]].copy()

    def evaluate(self, seq: int, tokens: Sequence[int], start: int) -> None:
        self.evaluate_all(seq, tokens, start)

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        assert start == len(self.held), "evaluated where the KV cache does not end"
        self.held.extend(tokens)
        self.rows = np.stack([self._row(self.held[: start + i + 1]) for i in range(len(tokens))])
        self.rows_evaluated += len(tokens)
        return self.rows

    def truncate(self, seq: int, start: int) -> None:
        del self.held[start:]

    def make_sampler(self, settings: SamplerSettings, guide: object = None, *, seq: int | None = None, raw_logits: bool = False) -> NumpySampler:
        return NumpySampler(settings)

    def logits(self, seq: int, row: int = -1) -> np.ndarray:
        return self.rows[row]

    def sample(self, seq: int, sampler: NumpySampler, row: int = -1) -> int:
        return sampler.pick(self.rows[row])

    def token_bytes(self, token: int) -> bytes:
        return b"abcd"[token : token + 1]

    def token_text(self, token: int) -> str:
        return self.token_bytes(token).decode()

    def use_loras(self, scales: tuple) -> None:
        assert scales == (), "no adapters on this stand-in"


class AlwaysDraft(DraftPace):
    """A draft model drafting every step, paying or not: what is checked is the reply, not the pace."""

    def use_drafts(self) -> bool:
        return True

    def drafted(self, seconds: float, drafted: int, kept: int) -> None:
        pass


class AlwaysDraftLookup(LookupDrafting):
    """Prompt lookup drafting all it finds every step: what is checked is the reply, not the length."""

    def length(self, draft: list[int], n: int, room: int) -> int:
        super().length(draft, n, room)
        return len(draft)


def start_reply(session: Session, prompt: list[int], settings: GenerationSettings) -> Decoder:
    """A reply begun the way `Generation` begins it: the prompt prefilled, its first token sampled."""
    session.reset()
    session.prefill(prompt)
    reply = Reply(session.backend, settings, len(prompt))
    decoder = Decoder(session, reply, settings.sampler, prompt, settings.lookup_draft)
    decoder.sample()
    return decoder


def markov_session(backend: MarkovBackend, draft_model: DraftModel | None = None) -> Session:
    session = Session(backend)  # type: ignore[arg-type]
    session.draft_model = draft_model
    return session


def finish_reply(decoder: Decoder) -> int:
    """`advance` to the reply's end; how many steps it took."""
    steps = 0
    while decoder.reply.finish_reason is None:
        decoder.advance(lambda: False, lambda _: None)
        steps += 1
    return steps


def decode(backend: MarkovBackend, prompt: list[int], settings: GenerationSettings) -> Reply:
    """One reply the way `Generation` makes it, drafting at every step that has a draft."""
    decoder = start_reply(markov_session(backend), prompt, settings)
    # Drafting from the first step, whatever the predictions so far and the stand-in's steps take.
    decoder.lookup = AlwaysDraftLookup(settings.lookup_draft, decoder.session.step_costs, backend.even_rows)
    finish_reply(decoder)
    session = decoder.session
    assert backend.held[: len(session.tokens)] == session.tokens and len(backend.held) == len(session.tokens)
    return decoder.reply


def chi_square_p_value(statistic: float, degrees: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty's normal approximation)."""
    z = ((statistic / degrees) ** (1 / 3) - (1 - 2 / (9 * degrees))) / math.sqrt(2 / (9 * degrees))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("biases", [(), ((1, -100.0), (3, 1.5))], ids=["unbiased", "logit-bias"])
def test_sampled_replies_keep_the_target_distribution_exactly(biases: tuple[tuple[int, float], ...]) -> None:
    """3-token replies sampled at temperature 1 with drafting on, against the exact probabilities
    of every reply: Pearson's chi-square must not reject them (p > 1e-3), while the same counts do
    reject the distribution at temperature 1.15, so the test sees a shift that small. With a logit bias
    the target is the biased distribution: the prompt's lookup drafts the banned token 1 again and again,
    and no reply holds it."""
    backend = MarkovBackend()
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # lookup finds drafts all along
    replies: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    samples = 6000
    for seed in range(samples):
        sampler = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, dry_multiplier=0.0,
                                  seed=seed, logit_bias=biases)
        reply = decode(backend, prompt, GenerationSettings(max_tokens=3, sampler=sampler, lookup_draft=3))
        replies[tuple(reply.token_ids)] += 1
        drafted, accepted = drafted + reply.drafted_tokens, accepted + reply.accepted_tokens
    # Every reply had a token decided by a draft, many kept and many not.
    assert drafted >= samples and min(accepted, drafted - accepted) > samples // 10
    assert not biases or all(1 not in reply for reply in replies)
    added = np.zeros(VOCAB)
    for token, bias in biases:
        added[token] = bias

    def exact(temperature: float) -> dict[tuple[int, ...], float]:
        probabilities = {}
        for reply in itertools.product(range(VOCAB), repeat=3):
            context, p = list(prompt), 1.0
            for token in reply:
                logits = (backend._row(context)[:VOCAB].astype(np.float64) + added) / temperature
                weights = np.exp(logits - logits.max())
                p *= weights[token] / weights.sum()
                context.append(token)
            probabilities[reply] = p
        return probabilities

    def p_value(probabilities: dict[tuple[int, ...], float]) -> float:
        """Replies expected fewer than 5 times are counted together, as the approximation needs."""
        rare = [r for r, p in probabilities.items() if samples * p < 5]
        cells = [(replies[r], samples * p) for r, p in probabilities.items() if r not in rare]
        cells.append((sum(replies[r] for r in rare), samples * sum(probabilities[r] for r in rare)))
        statistic = sum((seen - expected) ** 2 / expected for seen, expected in cells)
        return chi_square_p_value(statistic, len(cells) - 1)

    assert p_value(exact(1.0)) > 1e-3
    assert p_value(exact(1.15)) < 1e-6


class RowCountingMarkovBackend(MarkovBackend):
    """The stand-in model, saying whether even counts of rows are cheaper and recording the
    `(rows, start)` of each evaluation of several tokens."""

    def __init__(self, even_rows: bool) -> None:
        super().__init__()
        self.even_rows = even_rows
        self.steps: list[tuple[int, int]] = []

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        if len(tokens) > 1:
            self.steps.append((len(tokens), start))
        return super().evaluate_all(seq, tokens, start)


@pytest.mark.parametrize("even_rows", [True, False])
def test_drafts_are_verified_in_even_counts_of_rows_where_those_are_cheaper(even_rows: bool) -> None:
    """On a backend whose even counts of rows cost less (llama.cpp's), a draft is verified in an
    even count of rows unless the reply has no room for one more: an odd one gets a filler token.
    Replies, greedy or sampled, stay the ones plain decoding gives with the same seed (the
    sampler draws once per token kept, drafts or not)."""
    prompt, tokens = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1], 40
    for seed in range(20):
        sampler = ARGMAX if seed == 0 else SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                                           repeat_penalty=1.0, dry_multiplier=0.0, seed=seed)
        backend = RowCountingMarkovBackend(even_rows)
        drafted = decode(backend, prompt, GenerationSettings(max_tokens=tokens, sampler=sampler, lookup_draft=8))
        plain = decode(MarkovBackend(), prompt, GenerationSettings(max_tokens=tokens, sampler=sampler, lookup_draft=0))
        assert drafted.token_ids == plain.token_ids
        # A step at `start` evaluates the reply's token number start - len(prompt) + 1 and its draft.
        odd = [rows for rows, start in backend.steps if rows % 2 and rows - 1 < tokens - (start - len(prompt) + 1) - 1]
        if seed == 0:  # greedy decoding of this table repeats a 5-token cycle: drafts of up to 8, taken
            assert drafted.accepted_tokens > tokens // 2
            assert (odd == []) if even_rows else (odd != [])
        elif even_rows:
            assert odd == []


def costs_of(plain_s: float, fixed: float, per_row: float, steps: int = 60, backend: object = None) -> StepCosts:
    """Step costs timed on a model whose drafting step of k rows costs `fixed + per_row * k` plain steps more."""
    costs = StepCosts(backend)  # type: ignore[arg-type]
    for rows in [1, 3, 9, 25] * (steps // 4):
        costs.plain(plain_s)
        costs.drafted(plain_s * (1 + fixed + per_row * rows), rows)
    return costs


def test_step_costs_fit_the_line_of_drafting_steps() -> None:
    """Before any drafting step, the prior line; after drafting steps of several lengths, theirs (the prior
    keeps a light weight); after steps of one length alone, a line through their cost there."""
    assert StepCosts().line == pytest.approx((PRIOR_FIXED, PRIOR_PER_ROW))
    assert costs_of(0.01, 0.8, 0.25).line == pytest.approx((0.8, 0.25), rel=0.05)
    assert costs_of(0.01, 0.0, 1.5).line == pytest.approx((0.0, 1.5), abs=0.1)
    costs = StepCosts()
    costs.plain(0.01)
    for _ in range(5000):  # a long copy, drafting 25 every step: the fit stays determined
        costs.drafted(0.01 * (1 + 0.2 + 0.4 * 25), 25)
    fixed, per_row = costs.line
    assert fixed + per_row * 25 == pytest.approx(0.2 + 0.4 * 25, rel=0.01) and 0.2 < per_row < PRIOR_PER_ROW


def test_a_drafting_step_is_charged_what_the_plain_steps_after_it_take_over_steady_ones() -> None:
    """A batch of another shape makes llama.cpp build its graph again (and a GPU capture its CUDA graph
    again): the plain steps right after a drafting step are dearer, and that is the drafting step's cost."""
    costs = StepCosts()
    for rows in [1, 3, 9, 25] * 15:
        for extra in (0.5, 0.3, 0.0, 0.0):  # the two after a drafting step take 0.5 and 0.3 plain steps more
            costs.plain(0.01 * (1 + extra))
        costs.drafted(0.01 * (1 + 0.2 + 0.25 * rows), rows)
    assert costs.plain_s == pytest.approx(0.01, rel=1e-3)
    assert costs.line == pytest.approx((0.2 + 0.5 + 0.3, 0.25), rel=0.05)


class ShapeLog:
    """What StepCosts asks a backend of shapes: a GPU-like one whose first step of a count of rows costs more."""

    first_shape_steps = 4.0

    def __init__(self) -> None:
        self.seen = np.zeros(70, dtype=bool)

    def new_shapes(self, rows: np.ndarray) -> np.ndarray:
        return ~self.seen[rows]


def test_a_shape_s_first_step_is_charged_its_own_cost_where_that_costs_more() -> None:
    """On a GPU a count of rows the context has not evaluated yet loads its kernels first: that step is
    charged the backend's figure until one has been timed, then what such steps took over the line, which
    they leave alone. Lookup then drafts a new shape only for a gain that covers it. On a CPU (no such
    cost) every drafting step goes into the line, as before."""
    shapes = ShapeLog()
    costs = StepCosts(shapes)  # type: ignore[arg-type]
    assert list(costs.extra(np.array([2, 4]))) == pytest.approx([PRIOR_FIXED + PRIOR_PER_ROW * k + 4.0 for k in (2, 4)])
    shapes.seen[5] = True  # a step of 4 drafted rows and the pending token's
    assert costs.extra(np.array([4]))[0] == pytest.approx(PRIOR_FIXED + PRIOR_PER_ROW * 4)
    assert costs.new_shape(2) and not costs.new_shape(4)
    costs.plain(0.01)
    line = costs.line
    costs.drafted(0.01 * (1 + PRIOR_FIXED + PRIOR_PER_ROW * 2 + 7.0), 2, new_shape=True)  # 7 steps more the first time
    for _ in range(RECOVERY_STEPS):
        costs.plain(0.01)
    assert costs.first_shape == pytest.approx(7.0) and costs.line == line
    costs.drafted(0.01 * (1 + PRIOR_FIXED + PRIOR_PER_ROW * 3 + 5.0), 3, new_shape=True)
    costs.plain(0.01)
    costs.drafted(0.01 * (1 + 0.1 + 0.01 * 4), 4)  # drafting again at once resolves the last step
    assert costs.first_shape == pytest.approx(6.0) and costs.line == line
    # Predictions of 3 tokens come true: worth a step of a seen count of rows, not of a new one.
    draft = list(range(20))
    shapes.seen[:] = False
    drafting = LookupDrafting(20, costs_of(0.01, 0.1, 0.02, backend=shapes), even_rows=False)
    assert run_predictions(drafting, 3, 5, draft) == 0
    shapes.seen[:] = True
    assert run_predictions(drafting, 3, 5, draft) == 3
    # Where a first step costs nothing more, none is told apart.
    cpu = StepCosts(MarkovBackend())  # type: ignore[arg-type]
    assert not cpu.new_shape(2) and cpu.first_shape == 0.0


class ShapeCountingMarkovBackend(RowCountingMarkovBackend):
    """The stand-in model as a GPU: the first step of a count of rows costs more, and it knows which it has run."""

    first_shape_steps = 4.0

    def new_shapes(self, rows: np.ndarray) -> np.ndarray:
        return np.array([count not in {steps for steps, _ in self.steps} for count in np.atleast_1d(rows)])


def test_a_drafting_step_is_told_new_by_the_rows_it_evaluates() -> None:
    """A step verifying k drafted tokens evaluates k + 1 rows (the pending token's first): it is charged as the
    context's first of a count exactly when no earlier step evaluated that many rows."""
    backend = ShapeCountingMarkovBackend(even_rows=False)
    decoder = start_reply(markov_session(backend), [0, 1, 2, 3, 0, 1, 2, 3, 0, 1], GenerationSettings(max_tokens=40, sampler=ARGMAX,
                                                                                       lookup_draft=8))
    decoder.lookup = AlwaysDraftLookup(8, decoder.session.step_costs, backend.even_rows)
    told: list[tuple[int, bool, bool]] = []
    costs = decoder.session.step_costs
    drafted = costs.drafted

    def record(seconds: float, rows: int, new_shape: bool = False) -> None:
        evaluated_before = {steps for steps, _ in backend.steps[:-1]}
        told.append((rows, new_shape, backend.steps[-1][0] not in evaluated_before))
        drafted(seconds, rows, new_shape)

    costs.drafted = record  # type: ignore[method-assign]
    finish_reply(decoder)
    assert len(told) > 3 and any(new for _, new, _ in told) and not all(new for _, new, _ in told)
    assert all(new == first for _, new, first in told), told


def run_predictions(drafting: LookupDrafting, taken: int, rounds: int, draft: list[int], n: int = 3) -> int:
    """Predict `draft` `rounds` times, the reply taking its first `taken` tokens then another; the last length asked."""
    length = 0
    for _ in range(rounds):
        length = drafting.length(draft, n, room=100)
        for token in [*draft[:taken], -1]:
            drafting.append(token)
    return length


def test_lookup_drafts_as_far_as_predictions_come_true_where_rows_are_cheap_enough() -> None:
    """Predictions are followed whether drafted or not: no draft before any came true; then the
    length expected fastest, all of it where every prediction comes true whole, none where none
    does, and none where rows cost too much for the runs predicted."""
    draft = list(range(20))
    cheap, dear = costs_of(0.01, 0.3, 0.2), costs_of(0.01, 0.3, 1.2)
    drafting = LookupDrafting(20, cheap, even_rows=True)
    assert drafting.length(draft, 3, room=100) == 0  # no evidence yet
    for token in draft[:4]:
        drafting.append(token)
    assert drafting.length(draft[4:], 3, room=100) == 4  # the first prediction is 4 tokens true so far
    assert LookupDrafting(20, cheap, even_rows=False).length(draft, 3, room=100) == 0
    assert run_predictions(LookupDrafting(20, cheap, even_rows=False), 20, 5, draft) == 20
    assert run_predictions(LookupDrafting(20, cheap, even_rows=False), 6, 5, draft) == 6
    assert run_predictions(LookupDrafting(20, cheap, even_rows=False), 0, 5, draft) == 0
    assert run_predictions(LookupDrafting(20, dear, even_rows=False), 6, 5, draft) == 0
    assert run_predictions(LookupDrafting(1, cheap, even_rows=False), 1, 5, draft[:1]) == 1
    # Per n-gram length: 1-gram predictions failing do not stop 3-gram ones that come true.
    drafting = LookupDrafting(20, cheap, even_rows=False)
    run_predictions(drafting, 0, 10, draft, n=1)
    assert run_predictions(drafting, 8, 3, draft, n=3) == 8 and drafting.length(draft, 1, room=100) == 0
    # A reply that stops repeating stops drafting within a few predictions.
    drafting = LookupDrafting(20, cheap, even_rows=False)
    run_predictions(drafting, 20, 10, draft)
    assert run_predictions(drafting, 0, 6, draft) == 0
    # However long nothing came true (the average shrinks to nothing), one prediction coming true whole counts at once.
    run_predictions(drafting, 0, 3000, draft)
    run_predictions(drafting, 20, 1, draft)
    assert drafting.length(draft, 3, room=100) > 0


def test_lookup_drafts_far_while_a_copy_goes_on_though_the_runs_before_it_were_short() -> None:
    """Predictions still coming true count for the positions they have reached: a reply copying its prompt, whose
    predictions all stay alive (none ends), drafts about as far as they have come true, though the predictions
    that ended before the copy came true for 5 tokens each."""
    source = list(range(1000))
    drafting = LookupDrafting(60, costs_of(0.01, 0.36, 0.41), even_rows=False)
    run_predictions(drafting, 5, 4, source[:60])
    lengths = []
    for position in range(100, 140):
        lengths.append(drafting.length(source[position : position + 60], 3, room=100))
        drafting.append(source[position])
    assert lengths[0] <= 5 and lengths[-1] >= 30, lengths
    # Where the copy stops, so does drafting: every alive prediction ends at the same token.
    drafting.append(-1)
    assert drafting.length(source[500:560], 3, room=100) <= 5


def test_drafting_goes_on_only_while_it_pays() -> None:
    """The pace's rule: one plain step as the yardstick, then drafts; kept while a token costs
    less with them, else tried again after DRAFT_RETRY plain steps, then twice as many; never
    again if drafting would lose even with every drafted token taken, twice running."""
    pace = DraftPace()

    def plain_steps_before_a_retry() -> int:
        for steps in range(1000):
            if pace.use_drafts():
                return steps
            pace.plain(0.020)
        raise AssertionError("no retry")

    assert not pace.use_drafts()
    pace.plain(0.020)
    assert pace.use_drafts()
    pace.drafted(0.090, 8, 6)  # 15 ms a token against 20: it pays
    assert pace.use_drafts()
    pace.drafted(0.150, 8, 1)  # a bad step: averaged by length (96 ms for 5.5 tokens), it still pays
    assert pace.pays
    pace.drafted(0.300, 8, 1)  # a worse one: 116 ms for 5.05 tokens, 23 ms a token, loses
    waits = []
    for _ in range(2):
        waits.append(plain_steps_before_a_retry())
        pace.drafted(0.060, 4, 2)  # the retry loses too (30 ms a token; 12 if all were taken)
    assert waits == [DRAFT_RETRY, 2 * DRAFT_RETRY]
    plain_steps_before_a_retry()
    pace.drafted(0.040, 4, 4)  # a retry that pays is measured afresh: drafting goes on
    assert pace.pays and pace.use_drafts()
    for _ in range(100):  # 22 ms a token with all 8 taken: once it loses, it cannot pay at all
        if not pace.pays:
            break
        pace.drafted(0.200, 8, 9)
    assert not pace.hopeless  # one such step may be the machine's hiccup: a retry
    assert plain_steps_before_a_retry() == DRAFT_RETRY
    pace.drafted(0.200, 8, 9)
    assert pace.hopeless
    for _ in range(1000):
        pace.plain(0.020)
        assert not pace.use_drafts()


class SlowMarkovBackend(MarkovBackend):
    """The stand-in model taking `delay` seconds an evaluation and `row_delay` more for each
    token after the first (a small model's step on a CPU is mostly fixed cost)."""

    def __init__(self, delay: float, row_delay: float = 0.0) -> None:
        super().__init__()
        self.delay, self.row_delay = delay, row_delay

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        time.sleep(self.delay + self.row_delay * (len(tokens) - 1))
        return super().evaluate_all(seq, tokens, start)


@pytest.mark.parametrize(("row_delay", "pays"), [(0.0, True), (0.006, False)])
def test_lookup_drafts_only_while_they_pay(row_delay: float, pays: bool) -> None:
    """Timed for real: lookup drafts whose rows cost nothing go on all along; rows dearer than a
    plain step (4 ms) end drafting once a few drafting steps have shown what they cost."""
    tokens = 80
    settings = GenerationSettings(max_tokens=tokens, sampler=ARGMAX, lookup_draft=8)
    decoder = start_reply(markov_session(SlowMarkovBackend(0.004, row_delay)), [0, 1, 2, 3, 0, 1, 2, 3, 0, 1], settings)
    finish_reply(decoder)
    reply = decoder.reply
    # Greedy decoding of this table soon repeats a 5-token cycle: the drafts are taken.
    if pays:
        assert reply.drafted_tokens > tokens // 2
    else:
        assert 0 < reply.drafted_tokens < tokens // 4


@pytest.mark.parametrize(("target_delay", "draft_delay", "pays"), [(0.004, 0.0, True), (0.0, 0.004, False)])
def test_the_decoder_drafts_with_a_draft_model_while_it_pays(target_delay: float, draft_delay: float, pays: bool) -> None:
    """Timed for real: a draft model costing nothing against a slow target drafts all along; one
    slower than its target drafts twice. The reply is the same either way (greedy, the draft model
    has the target's table)."""
    prompt, tokens = [0, 1, 2], 120
    settings = GenerationSettings(max_tokens=tokens, sampler=ARGMAX)
    draft_model = DraftModel(SlowMarkovBackend(draft_delay))  # type: ignore[arg-type]
    decoder = start_reply(markov_session(SlowMarkovBackend(target_delay), draft_model), prompt, settings)
    steps = finish_reply(decoder)
    reply = decoder.reply
    plain = decode(MarkovBackend(), prompt, settings)
    assert reply.token_ids == plain.token_ids and reply.accepted_tokens == reply.drafted_tokens > 0
    if pays:
        assert steps < tokens // 4  # drafts of up to 8, nearly every step
    else:
        # Two draft steps of 8 (the second DRAFT_RETRY plain steps later): 8 draft-model steps for 9 tokens
        # lose even with all 8 taken.
        assert draft_model.pace.hopeless and reply.drafted_tokens == 16 and steps == tokens - 1 - 16


def greedy_run(session: Session, prompt: list[int], lookup_draft: int) -> Generation:
    session.reset()
    generation = session.generate(prompt, GenerationSettings(max_tokens=32, sampler=ARGMAX, lookup_draft=lookup_draft, logprobs=2))
    generation.text()
    assert generation.stats is not None
    # The session knows exactly what the KV cache holds: the next turn can reuse it.
    held = [*prompt, *generation.stats.completion_ids]
    assert session.tokens == held[: len(session.tokens)] and len(session.tokens) >= len(held) - 1
    return generation


def assert_same_up_to_near_ties(plain: Generation, drafted: Generation) -> int:
    """Token for token, up to the kernels' rounding: a draft is verified by one batched evaluation,
    whose logits differ from one-token evaluations by up to 0.2 (tests/test_evaluate_all.py), so
    a reply may part from the plain one only from the plain one's first near tie on."""
    assert plain.stats is not None and drafted.stats is not None
    return assert_same_until_near_tie(plain.completion_ids, plain.logprobs, drafted.stats.completion_ids, min_compared=0)


def test_greedy_replies_are_the_same_with_drafting(engine: Engine) -> None:
    session = engine.sessions[0]
    compared = 0
    for text in PROMPTS:
        prompt = engine.backend.tokenize(text, add_bos=True, special=False)
        plain, drafted = greedy_run(session, prompt, 0), greedy_run(session, prompt, 8)
        compared += assert_same_up_to_near_ties(plain, drafted)
        if text is PROMPTS[0]:  # the reply copies the prompt: drafted tokens are kept
            # How far depends on the CPU's rounding: on AMD EPYC with AVX-512 most of the 32 tokens; with AVX2
            # only, the greedy copy drops "narrow" and ends after 27 tokens, and 12 are kept.
            stats = drafted.stats
            assert stats is not None and stats.accepted_tokens >= stats.completion_tokens // 4
    session.reset()
    # Enough drafted steps compared to catch a wrong row (the counting prompt has no near tie in 32 tokens).
    assert compared >= 32, compared


def test_a_banned_token_stays_out_of_a_reply_that_lookup_drafts(engine: Engine) -> None:
    """The reply copies the prompt's passage, whose tokens lookup drafts at every step; the third token of the plain
    copy banned (" narrow" on AMD EPYC with AVX-512; " stairs" with AVX2 alone, where the greedy copy drops
    " narrow") is drafted and refused at every step that verifies it, and never comes."""
    session = engine.sessions[0]
    prompt = engine.backend.tokenize(PROMPTS[0], add_bos=True, special=False)
    session.reset()
    plain = session.generate(prompt, GenerationSettings(max_tokens=16, sampler=ARGMAX))
    plain.text()
    banned = plain.completion_ids[2]
    assert engine.backend.token_text(banned) in PASSAGE
    settings = GenerationSettings(max_tokens=16, sampler=dataclasses.replace(ARGMAX, logit_bias=((banned, -100.0),)),
                                  lookup_draft=8)
    decoder = start_reply(session, prompt, settings)
    decoder.lookup = AlwaysDraftLookup(settings.lookup_draft, session.step_costs, engine.backend.even_rows)
    finish_reply(decoder)
    decoder.close()
    session.reset()
    reply = decoder.reply
    assert banned not in reply.token_ids and reply.drafted_tokens > reply.accepted_tokens > 0


def test_a_draft_model_drafts_and_the_reply_stays_the_same(settings: Settings, default_model: Path) -> None:
    """The default model drafting for itself (every step, though it cannot pay): its greedy drafts
    are the target's own choices, so most are taken (all but near ties that batched and single
    evaluations round apart), and the reply is the one plain decoding gives."""
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=1024)) as engine:
        session = engine.sessions[0]
        prompts = [engine.backend.tokenize(text, add_bos=True, special=False) for text in (PROMPTS[3], PROMPTS[1])]
        plain = [greedy_run(session, prompt, 0) for prompt in prompts]
        engine.add_draft_model(str(default_model), PlanRequest(n_ctx=1024))
        assert session.draft_model is not None
        session.draft_model.pace = AlwaysDraft()
        compared = 0
        for prompt, alone in zip(prompts, plain, strict=True):
            drafted = greedy_run(session, prompt, 0)
            compared += assert_same_up_to_near_ties(alone, drafted)
            stats = drafted.stats
            assert stats is not None and stats.accepted_tokens >= 0.6 * stats.drafted_tokens > 0
        assert compared >= 32, compared


class _Vocabulary:
    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.info = ModelInfo(path=Path("v"), name="v", architecture="v", n_vocab=len(words), n_ctx_train=8, n_layers=1,
                              bos_id=None, eos_id=None, add_bos=False, eog_ids=frozenset(), chat_template=None, size_bytes=0)

    def token_text(self, token: int) -> str:
        return self.words[token]


def test_a_draft_model_must_share_the_vocabulary() -> None:
    words = [f"w{i}" for i in range(500)]
    check_same_vocabulary(_Vocabulary(words), _Vocabulary(list(words)))  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="has 499 tokens but the model has 500"):
        check_same_vocabulary(_Vocabulary(words), _Vocabulary(words[:-1]))  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="spells token 499 'x', the model 'w499'"):
        check_same_vocabulary(_Vocabulary(words), _Vocabulary([*words[:-1], "x"]))  # type: ignore[arg-type]


def test_bench_measures_both_tasks_with_and_without_drafts(engine: Engine) -> None:
    grounded, open_ended = measure_speculation(engine, tokens=24)
    assert (grounded.task, open_ended.task) == ("input-grounded", "open-ended")
    assert all(r.plain_tok_s > 0 and r.lookup_tok_s > 0 for r in (grounded, open_ended))
    # Correcting a text copies it: most drafts are taken.
    assert grounded.acceptance is not None and grounded.acceptance > 0.5
