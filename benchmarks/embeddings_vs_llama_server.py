"""Embeddings: `localchat serve` against `llama-server --embeddings` on the same GGUF, side by side.

Both servers run at once on loopback and answer in turn (rounds alternate which goes first; the
one not measured is stopped with SIGSTOP). Each round sends the same /v1/embeddings request, 64
distinct inputs of ~100 tokens, and times it whole. llama-server is built from the llama.cpp that
llama-cpp-python vendors (`../shared/tools/build-llamacpp-anchors.sh OUTDIR`), with its defaults
and `--pooling mean` (a generative model names no pooling, and llama-server's OpenAI route refuses
"none"); localchat pools a generative model by the mean too. Also checked: the two servers' vectors
for the same inputs (cosine), which shows they pool alike. Medians over rounds; prints one JSON object.

Measured (AMD EPYC, 2 threads, 5 rounds, SmolLM2-135M-Instruct): localchat 25.4 s against 27.6 s
(0.92x), cosine of the two servers' vectors at least 0.99997.

    python benchmarks/embeddings_vs_llama_server.py --llama-server OUTDIR/llama-server [--rounds 5] [--model GGUF]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import localchat  # noqa: F401  (first: llama.cpp's libraries load in the order that works, localchat.native)
import numpy as np
from serve_load import free_port
from vs_vllm import Served, start, stop_all

from localchat.models import default_model_path
from localchat.settings import Settings

INPUTS = 64
WORDS = ("river", "mountain", "engine", "garden", "market", "signal", "harbor", "lantern", "meadow", "circuit",
         "library", "canyon", "orchard", "compass", "glacier", "furnace")


def texts() -> list[str]:
    """64 distinct paragraphs of ~100 tokens (Gemma's tokenizer: 95-110 each)."""
    made = []
    for number in range(INPUTS):
        words = [WORDS[(number * 7 + step * 3) % len(WORDS)] for step in range(12)]
        made.append(f"Note {number}: " + " ".join(
            f"the {word} near the {words[(i + 5) % len(words)]} was quiet that morning," for i, word in enumerate(words)))
    return made


def embed(server: Served, inputs: list[str]) -> tuple[float, np.ndarray]:
    """Seconds for the whole request, and its vectors."""
    client = server.client()
    model = client.models.list().data[0].id
    started = time.perf_counter()
    reply = client.embeddings.create(model=model, input=inputs, encoding_format="float")
    seconds = time.perf_counter() - started
    return seconds, np.array([item.embedding for item in reply.data], dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True, type=Path, help="llama.cpp's llama-server binary")
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--logs", type=Path, default=Path("/tmp"), help="where the servers' logs go")
    args = parser.parse_args()
    model = str(args.model or default_model_path(Settings()))
    commands = {
        "localchat": [sys.executable, "-m", "localchat", "serve", "-m", model, "--port", "{port}", "--threads",
                      str(args.threads)],
        "llama_server": [str(args.llama_server), "-m", model, "--embeddings", "--pooling", "mean", "--port", "{port}",
                         "-t", str(args.threads), "--host", "127.0.0.1"],
    }
    inputs = texts()
    servers: list[Served] = []
    try:
        for name, command in commands.items():
            port = free_port()
            servers.append(start(name, [part.replace("{port}", str(port)) for part in command], f"http://127.0.0.1:{port}",
                                 args.logs / f"embeddings_vs_llama_server-{name}.log", dict(os.environ)))
            embed(servers[-1], inputs[:4])  # warm-up: localchat makes its embeddings context on first use
            servers[-1].signal(signal.SIGSTOP)
        seconds: dict[str, list[float]] = {server.name: [] for server in servers}
        vectors: dict[str, np.ndarray] = {}
        for round_ in range(args.rounds):
            for server in servers[round_ % len(servers):] + servers[: round_ % len(servers)]:
                server.signal(signal.SIGCONT)
                time.sleep(1)
                took, vectors[server.name] = embed(server, inputs)
                seconds[server.name].append(took)
                server.signal(signal.SIGSTOP)
        a, b = vectors["localchat"], vectors["llama_server"]
        cosines = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        medians = {name: round(statistics.median(values), 3) for name, values in seconds.items()}
        print(json.dumps({
            "load": os.getloadavg(), "rounds": args.rounds, "inputs": INPUTS, "median_s": medians,
            "localchat_vs_llama_server": round(medians["localchat"] / medians["llama_server"], 3),
            "cosine_min": round(float(cosines.min()), 6), "per_round_s": seconds,
        }, indent=1))
    finally:
        stop_all(servers)


if __name__ == "__main__":
    main()
