"""`localchat serve` against llama.cpp's own `llama-server` on the same GGUF, side by side.

Three servers run at once on loopback, each answering in turn (rounds rotate which goes first; the
ones not measured are stopped with SIGSTOP): localchat as it ships (prompt-lookup drafting on),
localchat with `--lookup-draft 0` (unless `--no-undrafted`), and `llama-server -np SLOTS` built from the
llama.cpp that llama-cpp-python vendors (`../shared/tools/build-llamacpp-anchors.sh OUTDIR` builds it).
Each round sends 1, 3 and 4 (`--streams`) concurrent streams of 128 tokens to `/v1/completions` (raw
prompts, so no chat template differs) and records aggregate tok/s: greedy with no penalties on every
server (`repeat_penalty` 1 and `dry_multiplier` 0, llama.cpp's fields, which localchat takes too), or
with `--sampler shipped` each server's own default sampler (no sampler field sent). Medians over
rounds, and each localchat against llama-server.

    python benchmarks/vs_llama_server.py --llama-server OUTDIR/llama-server [--rounds 5] [--model GGUF]
        [--streams 1,4,8,16 --slots 16] [--sampler greedy|shipped] [--no-undrafted]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from serve_load import free_port
from vs_vllm import Served, start, stop_all

from localchat.models import default_model_path
from localchat.settings import Settings

STREAMS = "1,3,4"
TOKENS = 128
SLOTS = 4
CONTEXT = 8192
SAMPLERS: dict[str, dict[str, object]] = {
    "greedy": {"temperature": 0, "extra_body": {"ignore_eos": True, "repeat_penalty": 1, "dry_multiplier": 0}},
    "shipped": {"extra_body": {"ignore_eos": True}},
}
SAMPLER = SAMPLERS["greedy"]


def stream_tokens(client: openai.OpenAI, index: int) -> int:
    """One streamed completion of TOKENS tokens; the tokens the server counted."""
    stream = client.completions.create(model="", prompt=f"Tell story number {index} about a dragon.\n",  # type: ignore[call-overload]
                                       max_tokens=TOKENS, stream=True, stream_options={"include_usage": True}, **SAMPLER)
    tokens = 0
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens


def throughput(client: openai.OpenAI, streams: int) -> float:
    start_s = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        tokens = sum(pool.map(lambda i: stream_tokens(client, i), range(streams)))
    return tokens / (time.perf_counter() - start_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True, type=Path, help="llama.cpp's llama-server binary")
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--logs", type=Path, default=Path("/tmp"), help="where the servers' logs go")
    parser.add_argument("--streams", default=STREAMS, help="concurrent streams per measurement, comma-separated")
    parser.add_argument("--slots", type=int, default=SLOTS, help="parallel replies of each server")
    parser.add_argument("--sampler", choices=SAMPLERS, default="greedy")
    parser.add_argument("--no-undrafted", action="store_true", help="leave out localchat with --lookup-draft 0")
    args = parser.parse_args()
    global SAMPLER
    SAMPLER = SAMPLERS[args.sampler]
    stream_counts = [int(n) for n in args.streams.split(",")]
    model = str(args.model or default_model_path(Settings()))
    common = ["--port", "{port}", "--ctx", str(CONTEXT), "--threads", str(args.threads)]
    slots = str(args.slots)
    commands = {
        "localchat": [sys.executable, "-m", "localchat", "serve", "-m", model, "--parallel", slots, *common],
        "localchat_no_drafts": [sys.executable, "-m", "localchat", "serve", "-m", model, "--parallel", slots,
                                "--lookup-draft", "0", *common],
        "llama_server": [str(args.llama_server), "-m", model, "-np", slots, "--port", "{port}", "-c", str(CONTEXT),
                         "-t", str(args.threads), "--host", "127.0.0.1"],
    }
    if args.no_undrafted:
        del commands["localchat_no_drafts"]
    servers: list[Served] = []
    try:
        for name, command in commands.items():
            port = free_port()
            servers.append(start(name, [part.replace("{port}", str(port)) for part in command], f"http://127.0.0.1:{port}",
                                 args.logs / f"vs_llama_server-{name}.log", dict(os.environ)))
            throughput(servers[-1].client(), 1)  # warm-up
            servers[-1].signal(signal.SIGSTOP)
        figures: dict[str, dict[str, list[float]]] = {s.name: {} for s in servers}
        for round_ in range(args.rounds):
            for server in servers[round_ % len(servers):] + servers[: round_ % len(servers)]:
                server.signal(signal.SIGCONT)
                time.sleep(1)
                for streams in stream_counts:
                    figures[server.name].setdefault(f"tok_s_{streams}", []).append(throughput(server.client(), streams))
                server.signal(signal.SIGSTOP)
        medians = {name: {key: round(statistics.median(values), 1) for key, values in record.items()}
                   for name, record in figures.items()}
        anchor = medians["llama_server"]
        ratios = {f"{name}_vs_llama_server": {key: round(value / anchor[key], 3) for key, value in record.items()}
                  for name, record in medians.items() if name != "llama_server"}
        print(json.dumps({"load": os.getloadavg(), "rounds": args.rounds, "sampler": args.sampler, "tok_s": medians, **ratios,
                          "per_round": figures}, indent=1))
    finally:
        stop_all(servers)


if __name__ == "__main__":
    main()
