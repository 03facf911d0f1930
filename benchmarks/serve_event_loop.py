"""`localchat serve` on uvicorn's C event loop and HTTP parser (uvloop, httptools) against its pure-Python fallbacks.

uvicorn runs on uvloop and httptools once they are installed (localchat depends on both) and on asyncio's own loop
and h11 otherwise. On a machine with few cores the event loop's work for each streamed token is taken from the
decode beside it (llama.cpp's threads hold every core), so this measures it: per round and server, the CPU time of
the event loop's thread (the server's main thread, /proc schedstat) per streamed token over a reply of 256 tokens,
then as_shipped's figures (time to first token of a short chat, single-stream decode, aggregate with 1 and 4
streams). Two servers on loopback, as shipped (no sampler flags); rounds alternate which goes first and the one not
measured is stopped (SIGSTOP). Medians; each figure of the C loop against the fallback's (>1: the C loop better).

    python benchmarks/serve_event_loop.py [--model NAME_OR_GGUF] [--rounds 6] [--logs DIR]

Measured (AMD EPYC without AVX-512, 2 threads, 2026-11-27, SmolLM2-135M-Instruct, two runs of 6 rounds): the loop's
CPU 0.39 and 0.41 ms a streamed token against 0.55 and 0.53; time to first token 34 against 40 ms and 27.6 against
31.3; decode 1.02x and 0.98x, aggregate 1.07x and 1.00x with 1 stream, 1.09x and 0.95x with 4: within the noise of a
machine whose decode moved 37-70 tok/s from round to round, as 0.12 ms of CPU is under 1% of a 17 ms step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from as_shipped import CONTEXT, QUESTION, alternate_servers, measure_server, ratios, stream
from vs_vllm import Served

from localchat.models import resolve_model
from localchat.settings import Settings

LOOP_TOKENS = 256
# `localchat serve` as it runs where uvloop and httptools are not installed: uvicorn's asyncio loop and h11.
ON_FALLBACKS = ("import functools, sys, uvicorn; "
                "uvicorn.Config.__init__ = functools.partialmethod(uvicorn.Config.__init__, loop='asyncio', http='h11'); "
                "from localchat.cli import main; sys.argv[0] = 'localchat'; main()")


def loop_cpu_ms_per_token(server: Served) -> float:
    """CPU time of the server's event-loop thread (its main thread) per token of one streamed reply."""
    before = _main_thread_cpu_ns(server.process.pid)
    _, _, tokens = stream(server.client(), QUESTION, LOOP_TOKENS)
    return (_main_thread_cpu_ns(server.process.pid) - before) / tokens / 1e6


def _main_thread_cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


def compare(model: Path, rounds: int, threads: int, logs: Path) -> dict[str, object]:
    serve = ["serve", "-m", str(model), "--port", "{port}", "--ctx", str(CONTEXT), "--threads", str(threads)]
    commands = {"c_loop": [sys.executable, "-m", "localchat", *serve], "fallbacks": [sys.executable, "-c", ON_FALLBACKS, *serve]}
    medians = alternate_servers(commands, rounds, logs, "serve_event_loop", measure)
    lower_better = frozenset({"loop_cpu_ms_per_token", "ttft_ms"})
    return {"medians": medians, "c_loop_vs_fallbacks": ratios(medians["c_loop"], medians["fallbacks"], lower_better)}


def measure(server: Served) -> dict[str, float]:
    return {"loop_cpu_ms_per_token": loop_cpu_ms_per_token(server), **measure_server(server)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model name or .gguf file (default: the default chat model)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    model = resolve_model(args.model, Settings()).path
    report = {"model": model.name, "load": os.getloadavg(), "rounds": args.rounds}
    print(json.dumps({**report, **compare(model, args.rounds, args.threads, args.logs)}, indent=1))


if __name__ == "__main__":
    main()
