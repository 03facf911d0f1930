"""Log-probabilities of sampled tokens on the ONNX backend (the real Gemma 3 270M)."""

from __future__ import annotations

from localchat.backends.base import ARGMAX
from localchat.engine import Engine
from localchat.session import GenerationSettings


def test_greedy_pick_is_the_top_logprob(gemma_engine: Engine) -> None:
    session = gemma_engine.sessions[0]
    session.reset()
    prompt = gemma_engine.backend.tokenize("The capital of France is", add_bos=True, special=False)
    generation = session.generate(prompt, GenerationSettings(max_tokens=6, sampler=ARGMAX, logprobs=2))
    generation.text()
    assert generation.stats is not None
    assert [entry.token for entry in generation.logprobs] == list(generation.stats.completion_ids)
    for entry in generation.logprobs:
        assert entry.top[0] == (entry.token, entry.logprob) and entry.logprob <= 0 and entry.top[1][1] <= entry.logprob
    session.reset()
