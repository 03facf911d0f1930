"""`localchat bench`'s decode figures: greedy, and as shipped beside it (the real default model)."""

from __future__ import annotations

from localchat.bench import measure_speed
from localchat.engine import Engine


def test_bench_decodes_greedy_and_with_the_model_s_default_sampler(engine: Engine) -> None:
    speed = measure_speed(engine)
    assert speed.shipped_sampler == engine.sampler_defaults.settings.describe() != "greedy"
    assert min(speed.prefill_tok_s, speed.decode_tok_s, speed.decode_shipped_tok_s) > 0
