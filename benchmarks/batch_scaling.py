"""How much one llama_decode of N sequences gains over N single-token steps, through the backend.

The REST endpoint's 4-stream throughput cannot beat this ratio: it is the llama.cpp build's own
ceiling before any sampling or HTTP work. One and N sequences alternate round by round, so a
change in the machine's speed (this VM's varies by ±20%) touches both sides; the median is the figure.

    python benchmarks/batch_scaling.py [--model PATH] [--sequences 4] [--steps 48] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from localchat.backends.base import Backend
from localchat.engine import Engine
from localchat.planner import PlanRequest

TOKEN = 100


def decode_rate(backend: Backend, sequences: int, steps: int) -> float:
    """Tokens per second for `steps` decode steps of one token in each of `sequences` sequences."""
    for seq in range(backend.n_seq):
        backend.truncate(seq, 0)
    backend.evaluate_batch([(seq, TOKEN, 0) for seq in range(sequences)])  # warm-up
    start = time.perf_counter()
    for position in range(1, steps + 1):
        backend.evaluate_batch([(seq, TOKEN, position) for seq in range(sequences)])
    return steps * sequences / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a .gguf file (default: the default model)")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with Engine.load(args.model, request=PlanRequest(n_ctx=2048, n_seq=args.sequences)) as engine:
        rounds = [(decode_rate(engine.backend, 1, args.steps), decode_rate(engine.backend, args.sequences, args.steps))
                  for _ in range(args.rounds)]
        print(json.dumps({
            "build": engine.model_plan.build.description,
            "use_extra_bufts": engine.plan.use_extra_bufts,
            "one_sequence_tok_s": round(statistics.median(one for one, _ in rounds), 1),
            f"{args.sequences}_sequences_tok_s": round(statistics.median(many for _, many in rounds), 1),
            "ratio_median": round(statistics.median(many / one for one, many in rounds), 2),
            "ratio_per_round": [round(many / one, 2) for one, many in rounds],
        }))


if __name__ == "__main__":
    main()
