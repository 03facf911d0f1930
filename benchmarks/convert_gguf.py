"""Times GGUF conversion of the real Gemma 3 270M checkpoint and prints one JSON object.

    python benchmarks/convert_gguf.py [--work DIR] [--threads N]

Q8_0 from the bf16 checkpoint, F16 from it, then F16 GGUF -> Q4_K_M (what llama-quantize does);
each step runs in its own process so its peak RSS is its own. Perplexities on the fixed text.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import localchat  # noqa: F401  (first: llama.cpp's libraries load before numpy's, localchat.native)
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KIB = 1024


def _step(name: str, work: Path, threads: int) -> None:
    """One timed step, run in a child process."""
    from localchat.converters.gguf import convert_checkpoint, quantize_gguf

    checkpoint = work / "gemma-3-270m"
    started = time.perf_counter()
    if name == "quantize":
        quantize_gguf(work / "gemma-F16.gguf", work / "gemma-Q4_K_M.gguf", "q4_k_m", threads)
    else:
        convert_checkpoint(checkpoint, work / f"gemma-{name.upper()}.gguf", name, force=True, threads=threads)
    print(json.dumps({"seconds": time.perf_counter() - started}))


def _timed_child(name: str, work: Path, threads: int) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--step", name, "--work", str(work), "--threads", str(threads)], stdout=subprocess.PIPE, text=True
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"step {name} failed")
    seconds = json.loads(output.strip().splitlines()[-1])["seconds"]
    return {"seconds": round(seconds, 2), "peak_rss_mib": round(usage.ru_maxrss * KIB / 2**20, 1)}


def _perplexities(work: Path) -> dict[str, float]:
    from localchat.converters.verify import ReferenceModel, reference_tokenize, verify_text
    from localchat.engine import Engine
    from localchat.planner import PlanRequest
    from localchat.settings import Settings

    checkpoint = work / "gemma-3-270m"
    tokens = [2] + reference_tokenize(checkpoint, verify_text())  # <bos> + text
    result = {}
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        with Engine.load(str(work / f"gemma-{quant}.gguf"), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=2048)) as engine:
            result[quant] = round(engine.backend.score(0, tokens).perplexity, 4)
    logprobs, _ = ReferenceModel(checkpoint).logprobs_and_top1(tokens)
    result["transformers"] = round(float(np.exp(-logprobs.mean())), 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/localchat-convert-bench"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        _step(args.step, args.work, args.threads)
        return
    from localchat.converters.reference_checkpoints import build_gemma3_270m_checkpoint

    template = importlib.resources.files("localchat.assets").joinpath("templates/gemma.jinja").read_text()
    args.work.mkdir(parents=True, exist_ok=True)
    build_gemma3_270m_checkpoint(args.work / "gemma-3-270m", template)
    record = {
        "threads": args.threads,
        "hf_to_q8_0": _timed_child("q8_0", args.work, args.threads),
        "hf_to_f16": _timed_child("f16", args.work, args.threads),
        "f16_to_q4_k_m": _timed_child("quantize", args.work, args.threads),
    }
    ppl = _perplexities(args.work)
    record["perplexity"] = ppl
    record["q8_0_vs_f16"] = f"{ppl['Q8_0'] / ppl['F16'] - 1:+.2%}"
    record["q4_k_m_vs_f16"] = f"{ppl['Q4_K_M'] / ppl['F16'] - 1:+.2%}"
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
