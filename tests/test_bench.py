"""`localchat bench`: its decode figures, greedy and as shipped beside it, and the context it needs (the real default model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from localchat.bench import context_needed, measure_speed
from localchat.engine import Engine


def test_bench_decodes_greedy_and_with_the_model_s_default_sampler(engine: Engine) -> None:
    speed = measure_speed(engine)
    assert speed.shipped_sampler == engine.sampler_defaults.settings.describe() != "greedy"
    assert min(speed.prefill_tok_s, speed.decode_tok_s, speed.decode_shipped_tok_s) > 0


def test_a_context_too_small_for_the_benchmark_says_the_smallest_that_works(engine: Engine, localchat_home: Path) -> None:
    """Refused before the first measurement, not with advice to shorten a prompt the user never gave."""
    result = subprocess.run([sys.executable, "-m", "localchat", "bench", "--ctx", "16"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "LOCALCHAT_HOME": str(localchat_home)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"localchat: error: a context of 16 tokens is too small for the benchmark's prompts: "
                                     f"give --ctx {context_needed(engine)} or more")
