"""The ONNX backend's numpy sampler on the real model, against llama.cpp's sampler chain, and its logit bias."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from localchat.backends.base import ARGMAX, DRY_SEQUENCE_BREAKERS, SamplerSettings
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings


def test_dry_breaks_sequences_at_the_tokens_llama_cpp_does(gemma_engine: Engine, gemma_gguf_engine: Engine) -> None:
    llama = gemma_gguf_engine.backend
    expected = np.array([any(b in llama.token_text(t) for b in DRY_SEQUENCE_BREAKERS) for t in range(llama.info.n_vocab)])
    ours = gemma_engine.backend._dry_breakers()  # type: ignore[attr-defined]
    assert 1000 < expected.sum() < len(expected) / 10
    np.testing.assert_array_equal(ours, expected)


def test_dry_breaks_a_loop_of_the_reply_but_lets_it_quote_its_prompt(gemma_engine: Engine) -> None:
    """DRY sees the reply alone: the first words continue the prompt's cycle as greedy decoding does (a reply
    may quote its prompt), then the reply's own repeats are penalised and the loop breaks."""
    session = gemma_engine.sessions[0]
    prompt = gemma_engine.backend.tokenize("one two three one two three one two three one two", add_bos=True, special=False)
    outputs = []
    for sampler in (ARGMAX, SamplerSettings(temperature=0, dry_multiplier=0.8)):
        session.reset()
        generation = session.generate(prompt, GenerationSettings(max_tokens=24, sampler=sampler, ignore_eos=True))
        outputs.append(generation.text().split())
    plain, dry = outputs
    assert plain[:2] == dry[:2] == ["three", "one"]  # quoting the prompt's cycle is not penalised
    cycle = ["two", "three", "one"]
    assert plain[2:11] == cycle * 3  # the loop goes on
    assert dry[2:11] != cycle * 3  # DRY: the reply's own cycle, repeated, is
    session.reset()


def test_a_logit_bias_bans_and_forces_tokens_in_onnxruntime(onnx_model: Callable[[str, str], Path], settings: Settings) -> None:
    """A tiny random-weight model: its greedy first token never comes once banned, and +100 on another makes
    every token of the reply, greedy or drawn."""
    with Engine.load(str(onnx_model("llama", "fp32")), settings, PlanRequest(n_ctx=512)) as engine:
        session = engine.sessions[0]
        prompt = engine.backend.tokenize("Describe a person.", add_bos=True, special=False)

        def reply(sampler: SamplerSettings, biases: tuple[tuple[int, float], ...]) -> tuple[int, ...]:
            session.reset()
            generation = session.generate(prompt, GenerationSettings(max_tokens=8, ignore_eos=True,
                                                                     sampler=dataclasses.replace(sampler, logit_bias=biases)))
            generation.text()
            assert generation.stats is not None
            return generation.stats.completion_ids

        first = reply(ARGMAX, ())[0]
        assert first not in reply(ARGMAX, ((first, -100.0),))
        forced = (first + 1) % engine.backend.info.n_vocab
        assert reply(ARGMAX, ((forced, 100.0),)) == reply(SamplerSettings(seed=3), ((forced, 100.0),)) == (forced,) * 8
