"""A new user's first chat, as shipped: the default model with its default sampler answers everyday prompts
without loops or noise, and simple factual questions in its first sentence more often than not.
The prompt sets and the checks are benchmarks/first_chat.py's (which measures them over several seeds)."""

from __future__ import annotations

import sys
from pathlib import Path

from localchat.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from first_chat import first_chat, loops, noise  # noqa: E402


def test_the_checks_tell_loops_and_noise_from_answers() -> None:
    assert loops("Roses are red.\nThe sea is blue.\n" * 3) and loops("and then it rained " * 6)
    assert not loops("Boil water. Put the egg in. Wait eight minutes. Cool it in cold water.")
    assert noise("150,000.6128954380769078 1,489,273.500") and noise("vuonna srtk bcdf ghjk vuonna")
    assert not noise("The capital of Japan is Tokyo.")


def test_the_default_model_answers_a_first_chat(engine: Engine) -> None:
    result = first_chat(engine, seeds=(0,))
    assert result.looped == () and result.noisy == (), (result.looped, result.noisy)
    # benchmarks/first_chat.py, AMD EPYC: 30 of 50 over seeds 0-4 (17 of 30 over 0-2), 0 of 50 everyday
    # replies looped; Gemma 3 270M base answered 1 of 10. Bounded below the mean, as another CPU's logits
    # draw other samples: what it guards against is a model or sampler that does not answer at all.
    assert result.answered >= 4, result
