"""The ONNX backend's numpy sampler on the real model, against llama.cpp's sampler chain."""

from __future__ import annotations

import numpy as np

from localchat.backends.base import ARGMAX, DRY_SEQUENCE_BREAKERS, SamplerSettings
from localchat.engine import Engine
from localchat.session import GenerationSettings


def test_dry_breaks_sequences_at_the_tokens_llama_cpp_does(gemma_engine: Engine, gemma_gguf_engine: Engine) -> None:
    llama = gemma_gguf_engine.backend
    expected = np.array([any(b in llama.token_text(t) for b in DRY_SEQUENCE_BREAKERS) for t in range(llama.info.n_vocab)])
    ours = gemma_engine.backend._dry_breakers()  # type: ignore[attr-defined]
    assert 1000 < expected.sum() < len(expected) / 10
    np.testing.assert_array_equal(ours, expected)


def test_dry_changes_a_repetitive_continuation(gemma_engine: Engine) -> None:
    session = gemma_engine.sessions[0]
    prompt = gemma_engine.backend.tokenize("one two three one two three one two three one two", add_bos=True, special=False)
    outputs = []
    for sampler in (ARGMAX, SamplerSettings(temperature=0, dry_multiplier=0.8)):
        session.reset()
        generation = session.generate(prompt, GenerationSettings(max_tokens=6, sampler=sampler, ignore_eos=True))
        outputs.append(generation.text())
    assert outputs[0].split()[:2] == ["three", "one"]  # the loop goes on
    assert outputs[1].split()[:1] != ["three"]  # DRY: "three" would extend an 8-token repeat
    session.reset()
