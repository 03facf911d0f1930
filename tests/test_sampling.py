"""Sampler settings, the penalties and the logit bias both backends apply (llama.cpp's chain and the ONNX
backend's numpy sampler) and the default settings against a small model's loops."""

from __future__ import annotations

import dataclasses
import ctypes
from typing import Any

import llama_cpp
import numpy as np
import pytest

from localchat.backends.base import ARGMAX, DRY_SEQUENCE_BREAKERS, FAR_SPAN, SamplerSettings
from localchat.backends.llamacpp_natives import dry_key
from localchat.backends._logits_scan import draw, near_best
from localchat.backends.llamacpp_sampler import ACCEPT, APPLY, TOKEN_DATA, LlamaSampler, TouchableTokens, device_sampleable
from localchat.backends.onnx import NumpySampler
from localchat.engine import Engine
from localchat.errors import InvalidSettingError
from localchat.chat import Chat
from localchat.session import GenerationSettings

# A text whose end repeats what came before, across lines and after a colon.
REPEATS = (
    "Note: the sea is deep and the sea is wide.\n"
    "The sea is deep and the sea is wide and the sea is deep and the sea is\n"
    "the sea is deep\nthe sea is deep\nthe sea is deep and the sea is deep and the sea"
)


def dry_only(**changes: object) -> SamplerSettings:
    """Greedy with DRY alone (llama.cpp's suggested 0.8 / 1.75 / 2 unless changed)."""
    return SamplerSettings(**{"temperature": 0, "repeat_penalty": 1.0, "dry_multiplier": 0.8, **changes})  # type: ignore[arg-type]


def test_the_fallback_defaults_are_llama_cpps_and_penalise_nothing() -> None:
    defaults = SamplerSettings()
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (0.8, 40, 0.95, 0.05)
    assert not defaults.repeat_penalized and not defaults.dry and not defaults.penalized
    assert defaults.history_window == 0
    assert ARGMAX.greedy and not ARGMAX.penalized and ARGMAX.history_window == 0
    penalised = SamplerSettings(repeat_penalty=1.1, dry_multiplier=0.8)
    assert penalised.repeat_penalized and penalised.dry and penalised.history_window == -1  # DRY looks at the whole reply
    assert SamplerSettings(temperature=0, repeat_penalty=1.1).penalized  # greedy keeps the penalties
    assert SamplerSettings(repeat_penalty=1.1).history_window == 64
    assert not SamplerSettings(repeat_penalty=1.1, penalty_last_n=0).penalized  # a window of 0 disables them


@pytest.mark.parametrize("field", ["dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n"])
def test_bad_dry_settings_are_refused(field: str) -> None:
    with pytest.raises(InvalidSettingError, match=field):
        SamplerSettings(**{field: -2})


def test_dry_penalises_the_token_that_would_extend_a_repeat() -> None:
    breaker = 9
    mask = np.zeros(10, dtype=bool)
    mask[breaker] = True

    def penalised(history: list[int], settings: SamplerSettings | None = None) -> np.ndarray:
        sampler = NumpySampler(settings or dry_only(), mask)
        sampler.accept(history, reply=True)
        logits = np.zeros(10, dtype=np.float32)
        sampler.penalise(logits)
        return logits

    # "1 2 3" ends the text and came before, followed by 4: emitting 4 would make it 4 long.
    expected = np.zeros(10, dtype=np.float32)
    expected[4] = -0.8 * 1.75 ** (3 - 2)
    np.testing.assert_allclose(penalised([1, 2, 3, 4, 5, 1, 2, 3]), expected, rtol=1e-6)
    # The longest repeat counts; a repeat of 1 token is allowed.
    expected[4] = -0.8 * 1.75 ** (4 - 2)
    np.testing.assert_allclose(penalised([0, 1, 2, 3, 4, 0, 1, 2, 3]), expected, rtol=1e-6)
    # A breaker since the repeat began limits it to the tokens after the breaker...
    assert penalised([0, 1, 2, 3, 4, 0, 9, 2, 3])[4] == pytest.approx(-0.8)
    assert not penalised([0, 1, 2, 3, 4, 0, 1, 9, 3]).any()
    # ...and a token holding a breaker is never penalised.
    assert not penalised([1, 2, 9, 5, 1, 2]).any()
    assert not penalised([1, 2, 3, 4, 5, 1, 2, 3], dry_only(dry_multiplier=0.0)).any()
    # Only the last dry_penalty_last_n tokens are looked at.
    assert not penalised([1, 2, 3, 4, 5, 1, 2, 3], dry_only(dry_penalty_last_n=5)).any()


def test_the_numpy_sampler_picks_after_the_penalties() -> None:
    mask = np.zeros(10, dtype=bool)
    sampler = NumpySampler(SamplerSettings(temperature=0, dry_multiplier=0.0, repeat_penalty=2.0), mask)
    sampler.accept([3])
    logits = np.array([0, 0, 0, 3, 2, 0, 0, 0, 0, 0], dtype=np.float32)
    assert sampler.pick(logits) == 4  # 3's logit halved to 1.5
    assert sampler.pick(np.array([0, 0, 0, 3, 2.5, 0, 0, 0, 0, 0], dtype=np.float32)) == 3  # 4 now penalised too


def test_the_numpy_sampler_draws_a_token_as_far_under_the_best_as_a_high_temperature_reaches() -> None:
    """At temperature 10 a token 31 under the best weighs e^-3.1 beside it: about 1 draw in 20."""
    row = np.full(10, -np.inf, dtype=np.float32)
    row[5], row[7] = 0.0, -31.0
    picks = [NumpySampler(SamplerSettings(seed=seed, temperature=10.0, top_p=1.0, min_p=0.0)).pick(row.copy()) for seed in range(200)]
    assert 3 <= picks.count(7) <= 20 and set(picks) == {5, 7}


def llama_penalised(engine: Engine, settings: SamplerSettings, history: list[int], logits: np.ndarray) -> np.ndarray:
    """The logits after llama.cpp's chain for `settings` (greedy, so its last step changes none)."""
    sampler = engine.backend.make_sampler(settings)
    try:
        sampler.accept(history, reply=True)
        data = (llama_cpp.llama_token_data * len(logits))()
        rows = np.frombuffer(data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
        rows["id"], rows["logit"], rows["p"] = np.arange(len(logits)), logits, 0
        candidates = llama_cpp.llama_token_data_array(data=data, size=len(logits), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(sampler.chain, ctypes.byref(candidates))  # type: ignore[attr-defined]
        return rows["logit"][np.argsort(rows["id"])].copy()
    finally:
        sampler.close()


def llama_breakers(engine: Engine, tokens: list[int]) -> np.ndarray:
    """A mask of the tokens whose text holds a sequence breaker, as llama.cpp's DRY finds them;
    right for `tokens` (all the numpy sampler looks at when it has seen only those)."""
    mask = np.zeros(engine.backend.info.n_vocab, dtype=bool)
    for token in set(tokens):
        mask[token] = any(b in engine.backend.token_text(token) for b in DRY_SEQUENCE_BREAKERS)
    return mask


@pytest.mark.parametrize(
    ("sampler", "text"),
    [
        (SamplerSettings(temperature=0, repeat_penalty=1.1, dry_multiplier=0.8), REPEATS),
        (SamplerSettings(temperature=0, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=16), REPEATS),
        (dry_only(dry_multiplier=1.5, dry_base=2.0, dry_allowed_length=3, dry_penalty_last_n=40), REPEATS),
        # A window of -1 is the whole context (llama.cpp itself reads -1 as 0: no penalty).
        (SamplerSettings(temperature=0, repeat_penalty=1.3, penalty_last_n=-1), REPEATS),
        # A repeat longer than the one where llama.cpp stops growing the penalty.
        (dry_only(), "the sea is deep and the sea is wide and " * 40 + "the sea"),
    ],
    ids=["both", "repeat", "dry", "whole-context", "long-repeat"],
)
def test_the_numpy_sampler_penalises_as_llamas_chain_does(engine: Engine, sampler: SamplerSettings, text: str) -> None:
    backend = engine.backend
    history = backend.tokenize(text, add_bos=True, special=False)
    logits = np.random.default_rng(0).normal(0, 4, backend.info.n_vocab).astype(np.float32)
    ours = logits.copy()
    numpy_sampler = NumpySampler(sampler, llama_breakers(engine, history))
    numpy_sampler.accept(history, reply=True)
    numpy_sampler.penalise(ours)
    theirs = llama_penalised(engine, sampler, history, logits)
    assert (ours != logits).any()  # the text does get penalised
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("n_vocab", [1, 63, 64, 65, 300, 49152, 262144, 600_000])
def test_near_best_takes_what_numpy_finds(n_vocab: int) -> None:
    """The C scan the sampler searches with, against numpy: the logits within a span of the best, or the
    `least` best if fewer, on rows of several spreads, rows mostly or wholly masked to -inf, ties (the lowest
    id is the argmax; tied logits are all taken), NaNs (never taken), rows rising to their best (the scan's
    floor rises as it reads), and vocabularies that are not a whole number of its groups."""
    rng = np.random.default_rng(n_vocab)
    out = np.zeros(n_vocab, dtype=TOKEN_DATA)
    for trial in range(48):
        row = rng.normal(0, rng.choice([0.3, 2.0, 8.0]), n_vocab).astype(np.float32)
        if trial % 6 == 1:
            row[rng.integers(n_vocab, size=max(1, n_vocab - 3))] = -np.inf
        elif trial % 6 == 2:
            row[:] = -np.inf
        elif trial % 6 == 3:  # many ties, at the best and below it
            row = np.round(row).astype(np.float32)
        elif trial % 6 == 4 and n_vocab > 2:
            row[rng.integers(n_vocab, size=2)] = np.nan
        elif trial % 6 == 5:
            row.sort()
        span = float(rng.choice([0.0, 1.0, 10.0, 50.0, np.inf]))
        least = int(rng.choice([0, 1, 40, 45, 2000]))
        count, best_id, floor = near_best(row, span, least, out)
        best = np.nanmax(row)
        expected_floor = best - np.float32(span)
        if 0 < least <= np.count_nonzero(~np.isnan(row)):
            expected_floor = max(expected_floor, np.sort(row[~np.isnan(row)])[-least])
        expected = np.flatnonzero(row >= expected_floor)
        assert best_id == int(np.nanargmax(row)), trial
        assert floor == expected_floor or np.isneginf(floor) and np.isneginf(expected_floor), trial
        assert out["id"][:count].tolist() == expected.tolist(), trial
        assert np.array_equal(out["logit"][:count], row[expected]), trial


def test_near_best_says_what_is_wrong_with_its_buffers() -> None:
    with pytest.raises(TypeError, match="float32"):
        near_best(np.zeros(8, dtype=np.float64), 1.0, 0, np.zeros(8, dtype=TOKEN_DATA))
    with pytest.raises(ValueError, match="fewer candidates"):
        near_best(np.zeros(8, dtype=np.float32), 1.0, 0, np.zeros(7, dtype=TOKEN_DATA))


def small_vocabulary_sampler(settings: SamplerSettings, n_vocab: int) -> LlamaSampler:
    """A LlamaSampler over a vocabulary of `n_vocab` tokens and no model (DRY without sequence breakers)."""
    n_ctx, dry = 4096, None
    if settings.dry:
        dry = llama_cpp.llama_sampler_init_dry(None, *dry_key(settings, n_ctx), None, 0)
    try:
        return LlamaSampler(settings, n_vocab, n_ctx, dry)
    finally:
        if dry is not None:
            llama_cpp.llama_sampler_free(dry)  # the sampler holds a copy


def test_the_candidates_sampler_picks_what_llamas_chain_picks_over_random_settings_and_texts() -> None:
    """Random sampler settings (penalties and DRY with their windows, truncations, temperatures up to 10), a
    prompt and a reply over a few tokens that repeat, and rows of several spreads (some masked to a few
    tokens, some with one token far above the rest): the candidates path draws what the chain on the whole
    row draws, pick for pick."""
    n_vocab, rng = 300, np.random.default_rng(0)
    for _ in range(150):
        settings = SamplerSettings(
            temperature=float(rng.choice([0.0, 0.5, 0.8, 1.0, 3.0, 10.0])), top_k=int(rng.choice([0, 1, 3, 10, 40])),
            top_p=float(rng.choice([1.0, 0.9])), min_p=float(rng.choice([0.0, 0.05, 0.2])), seed=int(rng.integers(1000)),
            repeat_penalty=float(rng.choice([1.0, 1.3, 2.0, 0.8])), frequency_penalty=float(rng.choice([0.0, 0.5])),
            presence_penalty=float(rng.choice([0.0, 1.0])), penalty_last_n=int(rng.choice([-1, 1, 4, 16, 64])),
            dry_multiplier=float(rng.choice([0.0, 3.0, 8.0])), dry_allowed_length=int(rng.choice([1, 2, 3])),
            dry_penalty_last_n=int(rng.choice([-1, 3, 8, 32])))
        ours, whole = small_vocabulary_sampler(settings, n_vocab), small_vocabulary_sampler(settings, n_vocab)
        whole._whole_row = True
        alphabet = int(rng.integers(3, 12))
        prompt, reply = rng.integers(0, alphabet, int(rng.integers(0, 40))).tolist(), rng.integers(0, alphabet, int(rng.integers(0, 20))).tolist()
        try:
            for sampler in (ours, whole):
                sampler.accept(prompt)
                sampler.accept(reply, reply=True)
            for _ in range(40):
                row = (rng.normal(0, 1, n_vocab) * rng.choice([0.3, 2.0, 8.0])).astype(np.float32)
                row[:alphabet] += rng.choice([0.0, 4.0, 10.0, 25.0])  # the tokens of the text among the best
                if rng.random() < 0.15:
                    row[rng.integers(n_vocab)] += 40.0
                if rng.random() < 0.1:  # a grammar allowing a few tokens
                    allowed = rng.integers(0, n_vocab, int(rng.integers(1, 6)))
                    row[np.setdiff1d(np.arange(n_vocab), allowed)] = -np.inf
                picked = ours.pick(row.copy())
                assert picked == whole.pick(row.copy()), (settings, prompt, reply)
        finally:
            ours.close()
            whole.close()


def test_top_k_looks_past_the_far_span_when_a_penalty_lowers_the_best_token() -> None:
    """Fewer than k tokens lie within FAR_SPAN of the best, and the best was in the prompt: the repeat penalty
    halves it (80 to 40), and a token 35 under it (45) becomes the likeliest pick. The search must look past
    the span measured from the best before the penalty, as the chain on the whole row does; where the best was
    not in the prompt, the tokens within that span are all it needs (and the same draws)."""
    row = np.full(300, -np.inf, dtype=np.float32)
    row[7], row[9] = 80.0, 45.0
    for prompt, expected in (([7], 9), ([3], 7)):
        draws = []
        for seed in range(20):
            settings = SamplerSettings(seed=seed, temperature=1.0, repeat_penalty=2.0, penalty_last_n=64)
            ours, whole = small_vocabulary_sampler(settings, 300), small_vocabulary_sampler(settings, 300)
            whole._whole_row = True
            try:
                for sampler in (ours, whole):
                    sampler.accept(prompt)
                draws.append((ours.pick(row.copy()), whole.pick(row.copy())))
            finally:
                ours.close()
                whole.close()
        assert [a for a, _ in draws] == [b for _, b in draws]
        assert {a for a, _ in draws} == {expected}


def test_the_candidates_sampler_reaches_as_far_as_a_high_temperature_lets_a_token_be_drawn(engine: Engine) -> None:
    """At temperature 10 a token FAR_SPAN + 1 under the best weighs e^-3.1 beside it in the draw: the search
    must look past FAR_SPAN to find it, as the chain on the whole row does."""
    backend = engine.backend
    row = np.full(backend.info.n_vocab, -np.inf, dtype=np.float32)
    row[5], row[7] = 0.0, -(FAR_SPAN + 1)
    picked = []
    for seed in range(200):
        settings = SamplerSettings(seed=seed, temperature=10.0, top_p=1.0, min_p=0.0)
        ours, whole = backend.make_sampler(settings), backend.make_sampler(settings)
        whole._whole_row = True  # type: ignore[attr-defined]
        try:
            picked.append((ours.pick(row.copy()), whole.pick(row.copy())))
        finally:
            ours.close()
            whole.close()
    assert [a for a, _ in picked] == [b for _, b in picked]
    assert 7 in {b for _, b in picked}


def test_greedy_takes_the_argmax_shortcut_only_without_penalties(engine: Engine) -> None:
    assert engine.backend.make_sampler(ARGMAX).argmax_only  # type: ignore[attr-defined]
    for settings in (SamplerSettings(temperature=0, repeat_penalty=1.1), dry_only(), SamplerSettings(temperature=0, frequency_penalty=0.5)):
        assert not engine.backend.make_sampler(settings).argmax_only  # type: ignore[attr-defined]


def test_gemma_s_default_penalty_stops_its_loop(gemma_gguf_engine: Engine) -> None:
    """Issue 14: Gemma 3 270M (a base model) answered "Write a haiku about the sea." with the same lines
    over and over; its family's defaults (localchat.sampling_defaults) carry the repeat penalty that stops it."""
    engine = gemma_gguf_engine
    defaults = engine.sampler_defaults
    assert defaults.source == "family: Gemma 3 270M base" and defaults.settings.repeat_penalized

    def loops(sampler: SamplerSettings) -> bool:
        """Whether a run of up to 4 non-empty lines comes 3 times in a row in the reply."""
        chat = Chat(engine.sessions[0], engine.template)
        text = chat.send("Write a haiku about the sea.", GenerationSettings(max_tokens=64, sampler=sampler)).text()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return any(lines[i : i + n] * 3 == lines[i : i + 3 * n] for n in range(1, 5) for i in range(len(lines)))

    assert loops(ARGMAX)
    assert not loops(dataclasses.replace(defaults.settings, temperature=0))


def test_the_touchable_tokens_are_the_repeat_window_and_what_followed_the_reply_s_last_token() -> None:
    touchable = TouchableTokens(SamplerSettings(repeat_penalty=1.1, penalty_last_n=2, dry_multiplier=0.8))
    for token in (1, 2, 3):
        touchable.append(token, reply=False)  # the prompt: the repeat penalty's alone
    for token in (7, 8, 9, 7):
        touchable.append(token, reply=True)
    # The window holds 9 and 7; 8 followed the last token, 7, before.
    assert sorted(touchable.ids().tolist()) == [7, 8, 9] and 8 in touchable and 1 not in touchable
    touchable.append(9, reply=True)
    assert sorted(touchable.ids().tolist()) == [7, 9]  # 7 followed 9 before; the window holds 7 and 9
    touchable.clear()
    assert not touchable and touchable.bound() == 0
    dry_alone = TouchableTokens(dry_only())
    for token in (4, 5, 4):
        dry_alone.append(token, reply=True)
    dry_alone.append(6, reply=False)  # a token DRY never sees
    assert dry_alone.ids().tolist() == [5]


@pytest.mark.parametrize("sampler", [dry_only(dry_multiplier=5.0), dry_only(dry_multiplier=5.0, temperature=0.8, top_k=1, seed=7)],
                         ids=["greedy", "top-1"])
def test_the_candidates_sampler_keeps_the_token_dry_lowers_and_the_one_that_moves_up(engine: Engine, sampler: SamplerSettings) -> None:
    """DRY touches only the tokens that followed the reply's last token before: the one that would extend the
    repeat here stands far above the rest, too far for a search that did not know DRY touches it to look
    past it, and DRY drops it under the second best (the whole row's chain picks that one)."""
    backend = engine.backend
    history = backend.tokenize(REPEATS, add_bos=False, special=False)
    follower = history[history.index(history[-1]) + 1]  # what followed the last token's first occurrence
    second = next(token for token in range(backend.info.n_vocab) if token not in history)
    row = np.full(backend.info.n_vocab, -100.0, dtype=np.float32)
    row[follower], row[second] = 20.0, 20.0 - FAR_SPAN / 2
    ours, whole = backend.make_sampler(sampler), backend.make_sampler(sampler)
    whole._whole_row = True  # type: ignore[attr-defined]
    try:
        for sampler_ in (ours, whole):
            sampler_.accept(history, reply=True)
        assert whole.pick(row.copy()) == second
        assert ours.pick(row.copy()) == second
    finally:
        ours.close()
        whole.close()


@pytest.mark.parametrize(
    "sampler",
    [
        SamplerSettings(seed=7),  # llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
        SamplerSettings(seed=7, temperature=0.2, top_p=0.9, dry_multiplier=1.2),  # SmolLM2's row
        # Penalties strong enough to push seen tokens out of the top-k, so unseen ones below it move in.
        SamplerSettings(seed=7, repeat_penalty=1.5, presence_penalty=1.0, penalty_last_n=64, dry_multiplier=0.8),
        SamplerSettings(seed=7, repeat_penalty=1.1, penalty_last_n=64, dry_multiplier=0.8),  # Gemma's row
        SamplerSettings(seed=7, top_k=0, top_p=1.0, min_p=0.1),  # min-p alone truncates
        SamplerSettings(seed=7, top_k=0, top_p=1.0, min_p=0.1, repeat_penalty=1.5, dry_multiplier=0.8),
        SamplerSettings(temperature=0, repeat_penalty=1.5, dry_multiplier=0.8),  # greedy after penalties
        # Penalties that raise the logits of seen tokens (a repeat penalty under 1, a negative presence one).
        SamplerSettings(seed=7, repeat_penalty=0.7, presence_penalty=-1.0, penalty_last_n=64),
        # Windows shorter than the prompt and than the reply.
        SamplerSettings(seed=7, repeat_penalty=1.5, penalty_last_n=8, dry_multiplier=0.8, dry_penalty_last_n=16),
    ],
    ids=["llama.cpp", "smollm2", "penalised", "gemma", "min-p", "min-p-penalised", "greedy-penalised", "raising", "short-windows"],
)
def test_the_candidates_sampler_picks_what_llamas_chain_picks_on_the_whole_row(engine: Engine, sampler: SamplerSettings) -> None:
    """The same seeded draws, token for token, as the chain run on every logit of each row: rows of
    several spreads (a wide one, one token far above the rest, a flat one). The text is shown as a reply
    does: its first half as the prompt (the repeat penalties' alone), the rest as the reply."""
    backend = engine.backend
    history = backend.tokenize(REPEATS, add_bos=True, special=False)
    rng = np.random.default_rng(0)
    spreads = np.resize([2.0, 8.0, 0.3, 2.0, 4.0], 60)
    rows = (rng.normal(0, 1, (len(spreads), backend.info.n_vocab)) * spreads[:, None]).astype(np.float32)
    rows[:, history[-12:]] += 6.0  # the tokens just seen among the best, as in a reply that repeats itself
    rows[::7, rng.integers(backend.info.n_vocab)] += FAR_SPAN + 20  # one token far above the rest
    rows[10, np.setdiff1d(np.arange(backend.info.n_vocab), history)] = -np.inf  # a grammar allowing seen tokens alone
    ours, whole = backend.make_sampler(sampler), backend.make_sampler(sampler)
    whole._whole_row = True  # type: ignore[attr-defined]
    handed = []
    try:
        for sampler_ in (ours, whole):
            sampler_.accept(history[: len(history) // 2])
            sampler_.accept(history[len(history) // 2 :], reply=True)
        picked = []
        for row in rows:
            handed.append(len(ours.candidates(row.copy())))  # type: ignore[union-attr]
            picked.append((ours.pick(row.copy()), whole.pick(row.copy())))
    finally:
        ours.close()
        whole.close()
    assert [a for a, _ in picked] == [b for _, b in picked]
    assert len({a for a, _ in picked}) > 5  # draws, not one token over and over
    if sampler.top_k and not sampler.greedy:
        # The k best and at most as many more as tokens are touchable (the 64-token window, a few DRY followers),
        # not every logit near the best; row 10, masked to the seen tokens, hands all it has.
        assert max(handed[:10] + handed[11:]) <= sampler.top_k + 64 + 10


def test_the_draw_refuses_no_candidates_or_more_than_its_buffer_holds() -> None:
    sampler = small_vocabulary_sampler(SamplerSettings(seed=0), 300)
    try:
        for count in (0, 301):
            with pytest.raises(ValueError, match="at least one candidate"):
                draw(sampler._candidates, count, sampler._chain_address, APPLY, ACCEPT)
    finally:
        sampler.close()


def test_a_bad_logit_bias_is_refused() -> None:
    for biases in (((-1, 5.0),), ((5, float("nan")),), ((5, float("inf")),), ((5, 1.0), (5, 2.0))):
        with pytest.raises(InvalidSettingError, match="logit_bias"):
            SamplerSettings(logit_bias=biases)
    biased = SamplerSettings(logit_bias=((5, -100.0), (299, 3.0)))
    biased.check_vocabulary(300)
    with pytest.raises(InvalidSettingError, match=r"logit_bias: token 299 is not in the model's vocabulary \(ids 0 to 298\)"):
        biased.check_vocabulary(299)


class AllowOnly:
    """A grammar's guide that allows the same few tokens at every step (the TokenGuide protocol)."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed
        self.consumed: list[int] = []

    def mask(self, logits: np.ndarray) -> None:
        held = logits[self.allowed].copy()
        logits[:] = -np.inf
        logits[self.allowed] = held

    def consume(self, token: int) -> None:
        self.consumed.append(token)


# Either backend's sampler over a vocabulary of 300 tokens: llama.cpp's chain on candidates, the numpy one.
SAMPLERS = {
    "llama.cpp": lambda settings, guide=None: LlamaSampler(settings, 300, 4096, None, guide),
    "numpy": lambda settings, guide=None: NumpySampler(settings, None, guide),
}


@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_a_raised_token_far_under_the_top_k_is_picked_and_a_banned_best_one_never(make: Any) -> None:
    """Token 250 lies 50 under the best, past top-k's 40 best and past the far span the candidates are
    searched in: +100 makes it the pick, greedy or drawn with the default chain. -100 on the best token keeps
    it out of every draw at temperature 1.5 over the whole vocabulary, where it is otherwise drawn most often."""
    row = np.random.default_rng(1).normal(0, 2, 300).astype(np.float32)
    row[7], row[250] = row.max() + 3, row.max() - 50
    for seed in range(20):
        for settings in (SamplerSettings(seed=seed, logit_bias=((250, 100.0),)), dataclasses.replace(ARGMAX, logit_bias=((250, 100.0),))):
            assert make(settings).pick(row.copy()) == 250
    wide = SamplerSettings(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    drawn = [make(dataclasses.replace(wide, seed=seed)).pick(row.copy()) for seed in range(100)]
    banned = [make(dataclasses.replace(wide, seed=seed, logit_bias=((7, -100.0),))).pick(row.copy()) for seed in range(100)]
    assert drawn.count(7) > 25 and 7 not in banned and len(set(banned)) > 10
    assert make(dataclasses.replace(ARGMAX, logit_bias=((7, -100.0),))).pick(row.copy()) == int(np.argsort(row)[-2])


@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_a_logit_bias_moves_tokens_within_what_the_grammar_allows_and_none_past_it(make: Any) -> None:
    row = np.zeros(300, dtype=np.float32)
    row[3], row[4], row[9] = 5.0, 4.0, 8.0
    for biases, expected in ((((3, -100.0),), 4), (((9, 100.0), (4, 2.0)), 4), ((), 3)):
        guide = AllowOnly([3, 4])
        assert make(dataclasses.replace(ARGMAX, logit_bias=biases), guide).pick(row.copy()) == expected
        assert guide.consumed == [expected]


def test_the_candidates_sampler_with_a_logit_bias_picks_what_the_chain_picks_on_the_biased_row() -> None:
    """Random settings (penalties, truncations, temperatures) and random biases, among them tokens far under
    the best raised past it and the best ones lowered: the candidates path draws what the chain on the whole
    row with the biases added to it draws, pick for pick."""
    n_vocab, rng = 300, np.random.default_rng(2)
    for _ in range(60):
        unbiased = SamplerSettings(
            temperature=float(rng.choice([0.0, 0.5, 0.8, 1.0, 3.0])), top_k=int(rng.choice([0, 1, 3, 40])),
            top_p=float(rng.choice([1.0, 0.9])), min_p=float(rng.choice([0.0, 0.05, 0.2])), seed=int(rng.integers(1000)),
            repeat_penalty=float(rng.choice([1.0, 1.3, 0.8])), presence_penalty=float(rng.choice([0.0, 1.0])),
            dry_multiplier=float(rng.choice([0.0, 3.0])))
        tokens = rng.choice(n_vocab, int(rng.integers(1, 12)), replace=False)
        biases = tuple((int(token), float(rng.choice([-100.0, -5.0, 0.5, 30.0, 100.0]))) for token in tokens)
        ours = small_vocabulary_sampler(dataclasses.replace(unbiased, logit_bias=biases), n_vocab)
        whole = small_vocabulary_sampler(unbiased, n_vocab)
        whole._whole_row = True
        added = np.zeros(n_vocab, dtype=np.float32)
        added[[token for token, _ in biases]] = [bias for _, bias in biases]
        history = rng.integers(0, 12, 30).tolist()
        try:
            for sampler in (ours, whole):
                sampler.accept(history)
            for _ in range(20):
                row = (rng.normal(0, 1, n_vocab) * rng.choice([0.3, 2.0, 8.0])).astype(np.float32)
                row[:12] += rng.choice([0.0, 4.0, 25.0])
                assert ours.pick(row.copy()) == whole.pick(row + added), (unbiased, biases)
        finally:
            ours.close()
            whole.close()


def test_a_reply_with_a_logit_bias_is_sampled_on_the_host() -> None:
    """llama.cpp's device chain has no bias: the host's sampler adds it (LogitBias)."""
    assert device_sampleable(ARGMAX, None, False, 1)
    assert not device_sampleable(dataclasses.replace(ARGMAX, logit_bias=((5, 1.0),)), None, False, 1)


def test_a_reply_with_its_first_token_banned_starts_otherwise_and_a_forced_token_fills_it(engine: Engine) -> None:
    """Greedy and drawn with the model's defaults: " Paris" (78% by the raw logits after the prompt) never comes once banned;
    +100 on " banana" makes it every token of the reply."""
    backend, session = engine.backend, engine.sessions[0]
    prompt = backend.tokenize("The capital of France is", add_bos=True, special=False)

    def reply(sampler: SamplerSettings, biases: tuple[tuple[int, float], ...], tokens: int = 8) -> tuple[int, ...]:
        session.reset()
        generation = session.generate(prompt, GenerationSettings(max_tokens=tokens, ignore_eos=True,
                                                                 sampler=dataclasses.replace(sampler, logit_bias=biases)))
        generation.text()
        assert generation.stats is not None
        return generation.stats.completion_ids

    paris = reply(ARGMAX, ())[0]
    assert backend.token_text(paris) == " Paris"
    assert paris not in reply(ARGMAX, ((paris, -100.0),))
    assert all(reply(SamplerSettings(seed=seed), ((paris, -100.0),), 1) != (paris,) for seed in range(5))
    (banana,) = backend.tokenize(" banana", add_bos=False, special=False)
    assert reply(ARGMAX, ((banana, 100.0),)) == (banana,) * 8
    assert reply(SamplerSettings(seed=3), ((banana, 100.0),)) == (banana,) * 8
    session.reset()
