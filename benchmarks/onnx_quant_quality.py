"""Perplexity of quantized ONNX models against the fp32 conversion of the same checkpoint.

Scores the first 256 tokens of the verification text (what tests/onnx checks), the whole
verification text and the benchmark text (a longer, different text: a check that a choice does
not just fit 256 tokens), each with a BOS token first.

    python benchmarks/onnx_quant_quality.py FP32_DIR QUANT_DIR [QUANT_DIR ...] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json

import localchat  # noqa: F401  (first: llama.cpp's libraries load before numpy's, localchat.native)
import numpy as np

from localchat.converters.verify import verify_text
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.settings import Settings

SCORED_TOKENS = 256


def texts() -> dict[str, str]:
    bench = importlib.resources.files("localchat.assets").joinpath("bench_text.txt").read_text(encoding="utf-8")
    return {"verify_256": verify_text(), "verify": verify_text(), "bench": bench}


def scores(folder: str, settings: Settings, request: PlanRequest) -> dict[str, tuple[float, np.ndarray]]:
    """Per text: perplexity and the top-1 token at each position."""
    results = {}
    with Engine.load(folder, settings, request) as engine:
        backend = engine.backend
        for name, text in texts().items():
            tokens = backend.tokenize(text, add_bos=True, special=False)
            if name == "verify_256":
                tokens = tokens[:SCORED_TOKENS]
            scored = backend.score(0, tokens)
            results[name] = (scored.perplexity, scored.top1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fp32", help="the fp32 ONNX folder of the checkpoint")
    parser.add_argument("quantized", nargs="+", help="ONNX folders of the same checkpoint at other precisions")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    settings = Settings(prefix_cache_disk_bytes=0)
    request = PlanRequest(n_ctx=2048, n_threads=args.threads)
    base = scores(args.fp32, settings, request)
    print(json.dumps({"model": args.fp32, **{name: round(ppl, 3) for name, (ppl, _) in base.items()}}))
    for folder in args.quantized:
        ours = scores(folder, settings, request)
        row: dict[str, object] = {"model": folder}
        for name, (ppl, top1) in ours.items():
            row[name] = round(ppl, 3)
            row[f"{name}_vs_fp32_pct"] = round(100 * (ppl / base[name][0] - 1), 2)
            row[f"{name}_top1_agreement"] = round(float(np.mean(top1 == base[name][1])), 3)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
