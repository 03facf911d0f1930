"""What constrained decoding costs: decode tok/s of the same chat reply with and without a JSON
schema, alternating rounds (so a busy machine slows both alike), medians reported.

    python benchmarks/constrained_decode.py [--model PATH] [--rounds 7] [--tokens 96] [--threads N] [--json]

Both replies run to `--tokens` (the schema asks for at least 60 list items, so it never completes
first; the free reply ignores end tokens), under the default sampler with a fixed seed. The
llguidance vocabulary is built before the first round (a one-time cost, reported apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from localchat.backends.base import SamplerSettings
from localchat.constraints import Constraint, tokenizer_for
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings

PROMPT = "List the names of many animals, as JSON."
SCHEMA = {
    "type": "object",
    "properties": {"animals": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 60}},
    "required": ["animals"],
    "additionalProperties": False,
}


def decode_rate(engine: Engine, settings: GenerationSettings) -> float:
    generation = engine.new_chat().send(PROMPT, settings)
    generation.text()
    assert generation.stats is not None and generation.stats.completion_tokens == settings.max_tokens
    return generation.stats.decode_tok_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF or ONNX model (default: the default model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, help="CPU threads (default: the planner's)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()

    from localchat.settings import Settings

    with Engine.load(args.model, Settings(), PlanRequest(n_ctx=1024, n_threads=args.threads)) as engine:
        started = time.perf_counter()
        tokenizer_for(engine.backend)
        vocabulary_s = time.perf_counter() - started
        sampler = SamplerSettings(seed=1)
        free = GenerationSettings(max_tokens=args.tokens, sampler=sampler, ignore_eos=True)
        constrained = GenerationSettings(max_tokens=args.tokens, sampler=sampler, constraint=Constraint.json_schema(SCHEMA))
        decode_rate(engine, free)  # warm-up: first-run allocations
        rates: dict[str, list[float]] = {"free": [], "json_schema": []}
        for _ in range(args.rounds):
            rates["free"].append(decode_rate(engine, free))
            rates["json_schema"].append(decode_rate(engine, constrained))
        medians = {name: statistics.median(values) for name, values in rates.items()}
        result = {
            "model": engine.model_plan.model.name,
            "backend": engine.backend.name,
            "n_vocab": engine.backend.info.n_vocab,
            "tokens": args.tokens,
            "rounds": args.rounds,
            "vocabulary_build_s": round(vocabulary_s, 2),
            "free_tok_s": round(medians["free"], 2),
            "json_schema_tok_s": round(medians["json_schema"], 2),
            "cost_pct": round(100 * (1 - medians["json_schema"] / medians["free"]), 1),
            "all_tok_s": {name: [round(v, 2) for v in values] for name, values in rates.items()},
        }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['model']} ({result['backend']}, {result['n_vocab']} tokens), {args.tokens} tokens x {args.rounds} rounds")
    print(f"llguidance vocabulary built once in {result['vocabulary_build_s']} s")
    print(f"decode tok/s (median): free {result['free_tok_s']}, JSON schema {result['json_schema_tok_s']}: "
          f"constrained decoding costs {result['cost_pct']}%")


if __name__ == "__main__":
    main()
