"""Prefill and decode speed of an ONNX model against a GGUF one through localchat, same threads.

Both engines stay loaded and the rounds alternate, so machine noise hits both alike.

    python benchmarks/onnx_vs_gguf.py ONNX_DIR [GGUF] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics

from localchat.bench import measure_speed
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", help="an ONNX model folder made by `localchat convert --to onnx`")
    parser.add_argument("gguf", nargs="?", help="a .gguf file (default: the default model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = Settings(prefix_cache_disk_bytes=0)
    request = PlanRequest(n_ctx=2048, n_threads=args.threads)
    engines = {"onnx": Engine.load(args.onnx, settings, request), "gguf": Engine.load(args.gguf, settings, request)}
    speeds: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            speed = measure_speed(engine)
            speeds[name].append((speed.prefill_tok_s, speed.decode_tok_s))
    result: dict[str, object] = {"threads": args.threads, "rounds": args.rounds}
    for name, runs in speeds.items():
        result[f"{name}_prefill_tok_s"] = round(statistics.median(p for p, _ in runs), 1)
        result[f"{name}_decode_tok_s"] = round(statistics.median(d for _, d in runs), 1)
    result["decode_ratio_onnx_over_gguf"] = round(result["onnx_decode_tok_s"] / result["gguf_decode_tok_s"], 3)  # type: ignore[operator]
    for engine in engines.values():
        engine.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
