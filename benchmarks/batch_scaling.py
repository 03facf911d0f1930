"""How much one llama_decode of N sequences gains over N single-token steps, through the backend.

The REST endpoint's 4-stream throughput cannot beat this ratio: it is the llama.cpp build's own
ceiling before any sampling or HTTP work.

    python benchmarks/batch_scaling.py [--model PATH] [--sequences 4] [--steps 64]
"""

from __future__ import annotations

import argparse
import json
import time

from localchat.engine import Engine
from localchat.planner import PlanRequest

TOKEN = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a .gguf file (default: the default model)")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    with Engine.load(args.model, request=PlanRequest(n_ctx=2048, n_seq=args.sequences)) as engine:
        backend = engine.backend
        for seq in range(args.sequences):
            backend.truncate(seq, 0)
        backend.evaluate(0, [TOKEN], 0)  # warm-up
        start = time.perf_counter()
        for position in range(1, args.steps + 1):
            backend.evaluate(0, [TOKEN], position)
        single = args.steps / (time.perf_counter() - start)
        for seq in range(args.sequences):
            backend.truncate(seq, 0)
        start = time.perf_counter()
        for position in range(args.steps):
            backend.evaluate_batch([(seq, TOKEN, position) for seq in range(args.sequences)])
        batched = args.steps * args.sequences / (time.perf_counter() - start)
        print(json.dumps({
            "build": engine.model_plan.build.description,
            "use_extra_bufts": engine.plan.use_extra_bufts,
            "one_sequence_tok_s": round(single, 1),
            f"{args.sequences}_sequences_tok_s": round(batched, 1),
            "ratio": round(batched / single, 2),
        }))


if __name__ == "__main__":
    main()
