"""Int4 ONNX of one checkpoint two ways: onnxruntime-genai 0.18's model builder against `localchat convert`.

Builds both models from a Hugging Face checkpoint (or takes them ready-made) and runs them in
alternating rounds (which goes first alternates too), each run a fresh child process, so that its
peak RSS (loading and generating) is its own. Prints the medians as a Markdown table:

- decode tok/s: 128 greedy tokens after a 512-token prompt of the benchmark text, counted as
  localchat counts them (the tokens after the first, over the time after the first);
- prefill tok/s: that prompt; TTFT: a fresh 200-token prompt to its first token (chat-sized);
- peak RSS: the child's ru_maxrss, and in brackets its peak when loading was done;
- on disk: the .onnx files and their external data;
- perplexity: the whole benchmark text with BOS (1124 tokens: it crosses Gemma 3's 512-token sliding
  window), scored the same way for both in a child of its own: chunks of 64 tokens appended to the
  KV cache, every position's logits scored by localchat's `score_rows`. localchat's model goes
  through `OnnxBackend.score`; onnxruntime-genai's through its own Generator (`append_tokens`, then
  `get_output("logits")`: the builder's graph gives the logits of every appended position), so each
  model runs in the runtime it ships for. The fp32 figure is transformers on the checkpoint.

Both sides get the same token ids, the same thread count and a 2048-token context (onnxruntime-genai
allocates its KV cache for max_length, so it gets 2048 too). localchat runs in this interpreter;
onnxruntime-genai in `--ortgenai-python`, an environment with onnxruntime-genai 0.18 and, to build,
what its builder imports (torch, transformers, onnx, onnx_ir):

    python -m venv /path/ortgenai && /path/ortgenai/bin/pip install onnxruntime-genai==0.18.0 torch transformers onnx onnx_ir
    python benchmarks/onnx_vs_ortgenai.py [CHECKPOINT] --ortgenai-python /path/ortgenai/bin/python [--rounds 3]
        [--threads 2] [--ortgenai-model DIR] [--localchat-model DIR] [--work DIR]

CHECKPOINT defaults to the pytest cache's Gemma 3 270M (made if missing, as tests/checkpoint_fixtures does).
Record the machine's load (`uptime`) with the figures.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the onnxruntime-genai child imports localchat.backends.base (numpy only)

DEFAULT_CHECKPOINT = ROOT / ".pytest_cache" / "d" / "gemma-3-270m-hf"
ORTGENAI_VERSION = "0.18.0"
CONTEXT = 2048
PREFILL_TOKENS = 512  # as localchat.bench.measure_speed
DECODE_TOKENS = 128
TTFT_TOKENS = 200
WARMUP_TOKENS = 16
KIB = 1024
MIB = 2**20
SIDES = ("ortgenai", "localchat")
LABELS = {"ortgenai": f"onnxruntime-genai {ORTGENAI_VERSION} builder, int4", "localchat": "localchat `--quant int4`"}


def missing_ortgenai(python: str) -> str | None:
    """One line on how to get onnxruntime-genai when `python` cannot import it, else None."""
    try:
        found = subprocess.run([python, "-c", "import onnxruntime_genai"], check=False, capture_output=True).returncode == 0
    except OSError:
        found = False
    if found:
        return None
    return (f"onnxruntime-genai is not installed for {python}: `pip install onnxruntime-genai=={ORTGENAI_VERSION}` "
            "(building also needs torch, transformers, onnx and onnx_ir) in a venv and pass its python as --ortgenai-python")


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB / MIB


# -- children -------------------------------------------------------------------------------------


def _build_ortgenai(job: dict) -> dict:
    """The builder's own command line, with the checkpoint's RoPE settings made flat for it.

    The builder reads `config.rope_theta` and `config.rope_local_base_freq`; transformers 5 loads Gemma 3's
    as `rope_parameters` nested per layer type, and its config class pops the flat keys from config.json
    into that dict, so no config.json can carry them: the builder's config object gets them back here.
    The torch model it loads keeps the nested form it needs (the extra keys are ignored)."""
    import runpy

    from transformers import AutoConfig

    load = AutoConfig.from_pretrained

    def flat_rope(*args: object, **kwargs: object) -> object:
        config = load(*args, **kwargs)
        nested = getattr(config, "rope_parameters", None)
        if isinstance(nested, dict) and "full_attention" in nested:
            config.rope_theta = nested["full_attention"]["rope_theta"]
            config.rope_local_base_freq = nested["sliding_attention"]["rope_theta"]
            nested["rope_type"] = nested["full_attention"]["rope_type"]
        return config

    AutoConfig.from_pretrained = flat_rope
    sys.argv = ["builder", "-i", job["checkpoint"], "-o", job["output"], "-p", "int4", "-e", "cpu", "-c", job["cache"]]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
    return {}


def _ortgenai_model(job: dict):  # -> onnxruntime_genai.Model
    import onnxruntime_genai as og

    config = og.Config(job["model"])
    threads = {"intra_op_num_threads": job["threads"], "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": threads}}}))
    return og.Model(config)


def _ortgenai_generator(model):  # -> onnxruntime_genai.Generator
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    # min_length: no early stop at an end-of-turn token (localchat's side runs with ignore_eos).
    params.set_search_options(do_sample=False, max_length=CONTEXT, min_length=CONTEXT)
    return og.Generator(model, params)


def _ortgenai_run(model, prompt: list[int], new_tokens: int) -> tuple[float, float, float]:
    """Seconds to append `prompt`, to its first token, and to the `new_tokens - 1` after it."""
    import numpy as np

    generator = _ortgenai_generator(model)
    started = time.perf_counter()
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    prefilled = time.perf_counter()
    generator.generate_next_token()  # samples from the prompt's logits
    generator.get_next_tokens()
    first = time.perf_counter()
    for _ in range(new_tokens - 1):
        generator.generate_next_token()
        generator.get_next_tokens()
    return prefilled - started, first - started, time.perf_counter() - first


def _ortgenai_speed(job: dict) -> dict:
    model = _ortgenai_model(job)
    loaded = _peak_rss_mib()
    prompt = job["prompt"]
    _ortgenai_run(model, prompt[:WARMUP_TOKENS], 4)
    prefill_s, _, decode_s = _ortgenai_run(model, prompt, DECODE_TOKENS)
    _, ttft_s, _ = _ortgenai_run(model, prompt[:TTFT_TOKENS], 1)
    return {"prefill_tok_s": len(prompt) / prefill_s, "decode_tok_s": (DECODE_TOKENS - 1) / decode_s, "ttft_s": ttft_s,
            "load_peak_mib": loaded}


def _ortgenai_score(job: dict) -> dict:
    import numpy as np

    from localchat.backends.base import TokenScores
    from localchat.backends.logprobs import score_rows

    tokens, chunk = job["tokens"], job["chunk"]
    generator = _ortgenai_generator(_ortgenai_model(job))
    n = len(tokens) - 1
    logprobs, top1 = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.int64)
    for offset in range(0, n, chunk):
        generator.append_tokens(np.asarray(tokens[offset : offset + chunk], dtype=np.int32))
        logits = generator.get_output("logits")[0]
        rows = min(len(logits), n - offset)
        targets = np.asarray(tokens[offset + 1 : offset + 1 + rows])
        logprobs[offset : offset + rows], top1[offset : offset + rows] = score_rows(logits[:rows], targets)
    return {"perplexity": TokenScores(logprobs=logprobs, top1=top1).perplexity}


def _localchat_engine(job: dict):  # -> localchat.engine.Engine
    from localchat.engine import Engine
    from localchat.planner import PlanRequest
    from localchat.settings import Settings

    return Engine.load(job["model"], Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=CONTEXT, n_threads=job["threads"]))


def _localchat_speed(job: dict) -> dict:
    from localchat.backends.base import ARGMAX
    from localchat.bench import bench_text, measure_speed
    from localchat.session import GenerationSettings

    with _localchat_engine(job) as engine:
        loaded = _peak_rss_mib()
        if engine.backend.tokenize(bench_text(), add_bos=True, special=False)[:PREFILL_TOKENS] != job["prompt"]:
            raise SystemExit("localchat tokenizes the benchmark text differently from the checkpoint's tokenizer")
        speed = measure_speed(engine)  # warms up first
        session = engine.sessions[0]
        session.reset()
        generation = session.generate(job["prompt"][:TTFT_TOKENS], GenerationSettings(max_tokens=1, sampler=ARGMAX))
        generation.text()
        assert generation.stats is not None and generation.stats.cached_tokens == 0
        return {"prefill_tok_s": speed.prefill_tok_s, "decode_tok_s": speed.decode_tok_s, "ttft_s": generation.stats.ttft_s,
                "load_peak_mib": loaded}


def _localchat_score(job: dict) -> dict:
    with _localchat_engine(job) as engine:
        return {"perplexity": engine.backend.score(0, job["tokens"]).perplexity}


CHILD_STEPS = {
    ("ortgenai", "build"): _build_ortgenai,
    ("ortgenai", "speed"): _ortgenai_speed,
    ("ortgenai", "score"): _ortgenai_score,
    ("localchat", "speed"): _localchat_speed,
    ("localchat", "score"): _localchat_score,
}


# -- the parent -----------------------------------------------------------------------------------


def _child(python: str, side: str, step: str, job: dict, work: Path, log: Path | None = None) -> dict:
    """Run one step in a child process; its JSON result with its peak RSS in MiB added."""
    job_file = work / f"job-{side}-{step}.json"
    job_file.write_text(json.dumps(job))
    with open(log or os.devnull, "w") as quiet:
        command = [python, __file__, "--child", side, step, str(job_file)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=quiet if log else None, text=True)
        output = child.stdout.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{side} {step} failed" + (f"; see {log}" if log else ""))
    return {**json.loads(output.strip().splitlines()[-1]), "peak_mib": usage.ru_maxrss * KIB / MIB}


def _build(args: argparse.Namespace, checkpoint: Path) -> dict[str, Path]:
    """Each model from its flag, or built into --work (into a `.partial` folder, renamed when complete)."""
    given = {"ortgenai": args.ortgenai_model, "localchat": args.localchat_model}
    models: dict[str, Path] = {}
    for side, folder in given.items():
        if folder is not None:
            models[side] = folder
            continue
        output, partial = args.work / f"{side}-int4", args.work / f"{side}-int4.partial"
        shutil.rmtree(partial, ignore_errors=True)
        log = args.work / f"{side}-build.log"
        started = time.perf_counter()
        if side == "ortgenai":
            job = {"checkpoint": str(checkpoint), "output": str(partial), "cache": str(args.work / "ortgenai-cache")}
            _child(args.ortgenai_python, side, "build", job, args.work, log)
        else:
            command = [sys.executable, "-m", "localchat", "convert", str(checkpoint), "--to", "onnx", "--quant", "int4", "-o", str(partial)]
            with open(log, "w") as quiet:
                if subprocess.run(command, check=False, stdout=quiet, stderr=subprocess.STDOUT).returncode != 0:
                    raise SystemExit(f"localchat convert failed; see {log}")
        shutil.rmtree(output, ignore_errors=True)
        partial.rename(output)
        print(f"built {output} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        models[side] = output
    return models


def weights_mib(folder: Path) -> float:
    """The .onnx files and their external data."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".onnx", ".data")) / MIB


def _reference_perplexity(checkpoint: Path, tokens: list[int]) -> float:
    import numpy as np

    from localchat.converters.verify import ReferenceModel

    logprobs, _ = ReferenceModel(checkpoint).logprobs_and_top1(tokens)
    return float(np.exp(-logprobs.mean()))


def table(medians: dict[str, dict[str, float]], fp32: float) -> str:
    header = f"| model | decode tok/s | prefill tok/s | TTFT | peak RSS (load) | on disk | perplexity (fp32 {fp32:.2f}) |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for side in SIDES:
        m = medians[side]
        lines.append(
            f"| {LABELS[side]} | {m['decode_tok_s']:.1f} | {m['prefill_tok_s']:.0f} | {m['ttft_s']:.2f} s "
            f"| {m['peak_mib']:.0f} MiB ({m['load_peak_mib']:.0f}) | {m['on_disk_mib']:.1f} MiB "
            f"| {m['perplexity']:.2f} ({100 * (m['perplexity'] / fp32 - 1):+.1f}%) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", type=Path, default=DEFAULT_CHECKPOINT, help="a Hugging Face checkpoint folder")
    parser.add_argument("--ortgenai-python", default=sys.executable, help="a Python with onnxruntime-genai (default: this one)")
    parser.add_argument("--ortgenai-model", type=Path, help="an int4 model folder made by onnxruntime-genai's builder")
    parser.add_argument("--localchat-model", type=Path, help="an int4 folder made by `localchat convert --to onnx --quant int4`")
    parser.add_argument("--work", type=Path, default=Path("/tmp/localchat-ortgenai-bench"), help="where models are built")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, step, job_file = args.child
        print(json.dumps(CHILD_STEPS[side, step](json.loads(Path(job_file).read_text()))))
        return
    missing = missing_ortgenai(args.ortgenai_python)
    if missing:
        raise SystemExit(missing)

    from localchat.converters.reference_checkpoints import build_gemma3_270m_checkpoint
    from localchat.converters.verify import reference_tokenize
    from localchat.backends.onnx import SCORE_CHUNK
    from localchat.bench import bench_text

    if args.checkpoint == DEFAULT_CHECKPOINT:
        template = importlib.resources.files("localchat.assets").joinpath("templates/gemma.jinja").read_text()
        build_gemma3_270m_checkpoint(DEFAULT_CHECKPOINT, template)
    args.work.mkdir(parents=True, exist_ok=True)
    models = _build(args, args.checkpoint)
    bos = json.loads((args.checkpoint / "config.json").read_text())["bos_token_id"]
    tokens = [bos] + reference_tokenize(args.checkpoint, bench_text())
    pythons = {"ortgenai": args.ortgenai_python, "localchat": sys.executable}

    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            job = {"model": str(models[side]), "threads": args.threads, "prompt": tokens[:PREFILL_TOKENS]}
            runs[side].append(_child(pythons[side], side, "speed", job, args.work))
            print(f"round {round_ + 1} {side}: {json.dumps(runs[side][-1])}", file=sys.stderr)
    medians: dict[str, dict[str, float]] = {}
    for side in SIDES:
        medians[side] = {key: statistics.median(run[key] for run in runs[side]) for key in runs[side][0]}
        job = {"model": str(models[side]), "threads": args.threads, "tokens": tokens, "chunk": SCORE_CHUNK}
        medians[side]["perplexity"] = _child(pythons[side], side, "score", job, args.work)["perplexity"]
        medians[side]["on_disk_mib"] = weights_mib(models[side])
    fp32 = _reference_perplexity(args.checkpoint, tokens)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.threads} threads, {args.rounds} rounds, medians; load average after: {load}; {len(tokens)} tokens scored")
    print(table(medians, fp32))
    print(json.dumps({"threads": args.threads, "rounds": args.rounds, "fp32_perplexity": fp32, **medians}))


if __name__ == "__main__":
    main()
