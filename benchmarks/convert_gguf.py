"""Times GGUF conversion and prints one JSON object.

    python benchmarks/convert_gguf.py [--work DIR] [--threads N]
    python benchmarks/convert_gguf.py --families [--llama-cpp DIR] [--rounds N] [--work DIR] [--threads N]

The first form converts the real Gemma 3 270M checkpoint: Q8_0 from the bf16 checkpoint, F16 from it,
then F16 GGUF -> Q4_K_M (what llama-quantize does); perplexities on the fixed text.

--families converts a random bf16 checkpoint of each family the converter supports beyond the first
five (FAMILIES: 8 layers 512 wide, Gemma 3's 262k-token SentencePiece vocabulary, made once in the
work folder) to F16 and to Q8_0, with localchat's converter and, given --llama-cpp (the vendored
llama.cpp of the llama-cpp-python sdist: `pip download --no-deps --no-binary :all:
llama-cpp-python==0.3.36` and untar; its vendor/llama.cpp), with llama.cpp's convert_hf_to_gguf.py
on the same checkpoint, in alternating rounds (medians of whole runs, each in a process of its own;
a conversion llama.cpp's converter refuses is recorded with its reason). Gemma 3's vocabulary is
one llama.cpp's converter reads as SentencePiece or, by its tokenizer.json's hash, as BPE, so it
converts every family.

Measured (2 threads, AMD EPYC, a machine shared with three other jobs; 3 rounds): localchat took
0.39-0.77x llama.cpp's converter's time for every family, F16 and Q8_0 (6.4-12.8 s against
11.4-22.6 s for 305-792 MiB checkpoints); the mixtures of experts gain most (0.39-0.47x).

The Gemma 3 form runs each step in its own process, so its peak RSS is its own.
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


# Family -> (transformers model_type, its config beyond the common sizes). Mixtures of experts have
# 8 experts of 2 chosen; every setting llama.cpp fixes is as it fixes it.
FAMILIES: dict[str, tuple[str, dict[str, object]]] = {
    "phi3": ("phi3", {}),
    "gemma2": ("gemma2", {"head_dim": 64, "query_pre_attn_scalar": 64}),
    "granite": ("granite", {"attention_multiplier": 0.125, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                            "logits_scaling": 8.0}),
    "smollm3": ("smollm3", {}),
    "olmo2": ("olmo2", {}),
    "mixtral": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2}),
    "qwen2moe": ("qwen2_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512,
                               "shared_expert_intermediate_size": 1024}),
    "qwen3moe": ("qwen3_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512,
                               "norm_topk_prob": True}),
    "olmoe": ("olmoe", {"num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 512}),
}
FAMILY_SIZES = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=8, max_position_embeddings=4096, vocab_size=262144, bos_token_id=2, eos_token_id=1,
                    pad_token_id=0)
FAMILY_QUANTS = ("f16", "q8_0")


def _family_checkpoint(family: str, work: Path, gemma: Path) -> Path:
    """A random bf16 checkpoint of `family` with Gemma 3's tokenizer, made once."""
    folder = work / "families" / family
    if (folder / "model.safetensors").is_file():
        return folder
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_type, extra = FAMILIES[family]
    config = AutoConfig.for_model(model_type, **{**FAMILY_SIZES, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02) if parameter.ndim > 1 else parameter.fill_(1.0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gemma).save_pretrained(folder)
    shutil.copy(gemma / "tokenizer.model", folder / "tokenizer.model")
    return folder


def _convert_family(family: str, converter: str, quant: str, work: Path, threads: int, llama_cpp: Path | None) -> None:
    """One conversion, in this (child) process; prints its seconds, or why it could not run."""
    source = work / "families" / family
    output = work / "families" / f"{family}-{converter}-{quant}.gguf"
    started = time.perf_counter()
    if converter == "localchat":
        from localchat.converters.gguf import convert_checkpoint

        convert_checkpoint(source, output, quant, force=True, threads=threads)
    else:
        assert llama_cpp is not None
        done = subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(source), "--outtype", quant,
                               "--outfile", str(output)], capture_output=True, text=True)
        if done.returncode != 0:
            print(json.dumps({"refused": done.stderr.strip().splitlines()[-1][:200]}))
            return
    print(json.dumps({"seconds": time.perf_counter() - started}))


def _timed_family(family: str, converter: str, quant: str, args: argparse.Namespace) -> dict[str, object]:
    command = [sys.executable, __file__, "--convert-family", family, converter, quant, "--work", str(args.work),
               "--threads", str(args.threads)] + (["--llama-cpp", str(args.llama_cpp)] if args.llama_cpp else [])
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{converter} {family} {quant} failed")
    output = done.stdout
    # No peak RSS here: a child forked from this process (which built the checkpoints with torch) is
    # charged this process's pages until it execs.
    return dict(json.loads(output.strip().splitlines()[-1]))


def _families(args: argparse.Namespace) -> dict[str, object]:
    from localchat.converters.reference_checkpoints import build_gemma3_270m_checkpoint

    template = importlib.resources.files("localchat.assets").joinpath("templates/gemma.jinja").read_text()
    gemma = build_gemma3_270m_checkpoint(args.work / "gemma-3-270m", template)
    converters = ["localchat", "llama.cpp"] if args.llama_cpp else ["localchat"]
    record: dict[str, object] = {"threads": args.threads, "rounds": args.rounds, "sizes": FAMILY_SIZES}
    for family in args.only or FAMILIES:
        size = sum(p.stat().st_size for p in _family_checkpoint(family, args.work, gemma).glob("*.safetensors"))
        results: dict[str, dict[str, object]] = {}
        for quant in FAMILY_QUANTS:
            runs: dict[str, list[dict[str, object]]] = {c: [] for c in converters}
            for round_ in range(args.rounds):
                # Alternating which goes first, so neither always meets a cold page cache.
                for converter in converters if round_ % 2 == 0 else converters[::-1]:
                    runs[converter].append(_timed_family(family, converter, quant, args))
            for converter, done in runs.items():
                refused = next((run["refused"] for run in done if "refused" in run), None)
                key = f"{converter} {quant}"
                if refused is not None:
                    results[key] = {"refused": refused}
                else:
                    results[key] = {"seconds": round(float(np.median([r["seconds"] for r in done])), 2),
                                    "all_seconds": [round(float(r["seconds"]), 2) for r in done]}
            ours, theirs = results[f"localchat {quant}"], results.get(f"llama.cpp {quant}", {})
            if "seconds" in ours and "seconds" in theirs:
                results[f"{quant} localchat / llama.cpp"] = round(ours["seconds"] / theirs["seconds"], 2)
        record[family] = {"checkpoint_mib": round(size / 2**20, 1), **results}
        print(json.dumps({family: record[family]}), file=sys.stderr, flush=True)
    return record


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
    parser.add_argument("--families", action="store_true", help="time the families beyond the first five (see above)")
    parser.add_argument("--llama-cpp", type=Path, help="the vendored llama.cpp folder whose convert_hf_to_gguf.py runs beside")
    parser.add_argument("--rounds", type=int, default=3, help="--families: conversions per converter, family and type")
    parser.add_argument("--only", nargs="+", choices=tuple(FAMILIES), help="--families: just these")
    parser.add_argument("--convert-family", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        _step(args.step, args.work, args.threads)
        return
    if args.convert_family:
        _convert_family(*args.convert_family, args.work, args.threads, args.llama_cpp)
        return
    if args.families:
        args.work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(_families(args), indent=2))
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
