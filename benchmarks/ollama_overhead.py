"""What Ollama's routes add to a reply's time: the same chat through /api/chat and through
/v1/chat/completions of one `localchat serve`, streamed and whole.

Each round sends the same greedy conversation (no penalties, so both routes write the same
tokens) through both routes back to back, for each of streamed and whole, the order alternating
by round, and records the whole request's time as a client sees it (the last line or event read)
and the server process's CPU time for it (user and system, all its threads): on a machine shared
with other work, wall times drift with the load, so each round's /api time is compared with the
/v1 time taken just before or after it, and CPU time, which the load moves less, is compared too.
The routes' replies are checked to hold the same number of tokens. Medians of the per-round
ratios.

Where the load swamps a few percent, the routes' own cost is measured apart: the same requests
to the real app and scheduler over tests/server/scripted_app.py's stand-in model, which writes
its reply at no cost, so what a reply takes there is the route's work (HTTP, parsing, the reply's
lines or events); /api's extra time per reply there, against the fastest reply on the real model, is
the share Ollama's route adds. Prints one JSON object.

Measured (AMD EPYC, 15 rounds, 128 tokens, SmolLM2-135M-Instruct): /api against /v1 1.002x streamed and
1.009x whole (wall); the route's own work adds 0.26% of a streamed reply.

    python benchmarks/ollama_overhead.py [--rounds 15] [--tokens 128] [--model GGUF]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
from serve_load import free_port
from vs_vllm import start

MESSAGES = [{"role": "user", "content": "Tell me a long story about a dragon who guards a library."}]
# Greedy with no penalties on both routes (dry_multiplier: localchat's option, on /api too).
GREEDY = {"temperature": 0, "repeat_penalty": 1, "dry_multiplier": 0}


def _timed_lines(server: psutil.Process, url: str, body: dict[str, object], stream: bool) -> tuple[float, float, list[bytes]]:
    """Wall and server CPU seconds of one request, and its lines."""
    cpu, started = sum(server.cpu_times()[:2]), time.perf_counter()
    with requests.post(url, json=body, stream=stream, timeout=600) as response:
        response.raise_for_status()
        lines = [line for line in response.iter_lines() if line] if stream else [response.content]
    return time.perf_counter() - started, sum(server.cpu_times()[:2]) - cpu, lines


def openai_reply(server: psutil.Process, root: str, tokens: int, stream: bool) -> tuple[float, float, int]:
    body = {"messages": MESSAGES, "max_tokens": tokens, "stream": stream, **GREEDY}
    if stream:
        body["stream_options"] = {"include_usage": True}
    wall, cpu, lines = _timed_lines(server, f"{root}/v1/chat/completions", body, stream)
    last = json.loads(lines[-2].removeprefix(b"data: ")) if stream else json.loads(lines[0])
    return wall, cpu, last["usage"]["completion_tokens"]


def ollama_reply(server: psutil.Process, root: str, model: str, tokens: int, stream: bool) -> tuple[float, float, int]:
    body = {"model": model, "messages": MESSAGES, "stream": stream, "options": {**GREEDY, "num_predict": tokens}}
    wall, cpu, lines = _timed_lines(server, f"{root}/api/chat", body, stream)
    return wall, cpu, json.loads(lines[-1])["eval_count"]


def route_costs(tokens: int, rounds: int) -> dict[str, float]:
    """Median seconds a reply of `tokens` tokens takes through each route over a model that costs nothing."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))
    from live_server import serving
    from scripted_app import ScriptedBackend, scripted_app

    backend = ScriptedBackend("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:", n_seq=4)
    with tempfile.TemporaryDirectory() as home, serving(scripted_app(backend, Path(home))) as api_root:
        root = api_root.removesuffix("/v1")
        process = psutil.Process()
        routes = {
            "v1_stream": lambda: openai_reply(process, root, tokens, True),
            "api_stream": lambda: ollama_reply(process, root, "scripted", tokens, True),
            "v1_whole": lambda: openai_reply(process, root, tokens, False),
            "api_whole": lambda: ollama_reply(process, root, "scripted", tokens, False),
        }
        seconds: dict[str, list[float]] = {name: [] for name in routes}
        for _ in range(rounds):
            for name, measure in routes.items():
                backend.replies.append("a" * tokens)
                wall, _, written = measure()
                assert written == tokens, (name, written)
                seconds[name].append(wall)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    port = free_port()
    command = [sys.executable, "-m", "localchat", "serve", "--port", str(port), *(["-m", str(args.model)] if args.model else [])]
    root = f"http://127.0.0.1:{port}"
    server = start("localchat", command, root, Path(tempfile.gettempdir()) / f"ollama-overhead-{port}.log", dict(os.environ))
    try:
        model = requests.get(f"{root}/v1/models", timeout=10).json()["data"][0]["id"]
        process = psutil.Process(server.process.pid)
        routes = {
            ("v1", "stream"): lambda: openai_reply(process, root, args.tokens, True),
            ("api", "stream"): lambda: ollama_reply(process, root, model, args.tokens, True),
            ("v1", "whole"): lambda: openai_reply(process, root, args.tokens, False),
            ("api", "whole"): lambda: ollama_reply(process, root, model, args.tokens, False),
        }
        for measure in routes.values():
            measure()  # warm-up: the prompt's KV is cached from here on, for every route alike
        figures: dict[str, dict[str, list[float]]] = {f"{api}_{mode}": {"wall_s": [], "cpu_s": []} for api, mode in routes}
        counts: set[int] = set()
        for round_ in range(args.rounds):
            for mode in ("stream", "whole"):
                for api in (("v1", "api") if round_ % 2 == 0 else ("api", "v1")):
                    wall, cpu, tokens = routes[api, mode]()
                    figures[f"{api}_{mode}"]["wall_s"].append(wall)
                    figures[f"{api}_{mode}"]["cpu_s"].append(cpu)
                    counts.add(tokens)
        ratios = {f"api_vs_v1_{mode}_{kind}": round(statistics.median(
            a / b for a, b in zip(figures[f"api_{mode}"][kind], figures[f"v1_{mode}"][kind], strict=True)), 4)
            for mode in ("stream", "whole") for kind in ("wall_s", "cpu_s")}
        medians = {name: {kind: round(statistics.median(values), 4) for kind, values in record.items()}
                   for name, record in figures.items()}
        costs = route_costs(args.tokens, 20 * args.rounds)
        # The fastest /v1 reply seen: the load only adds to a reply's time, so this is the closest to an idle
        # machine's, and the share against it the largest.
        reply_s = min(*figures["v1_whole"]["wall_s"], *figures["v1_stream"]["wall_s"])
        shares = {f"api_adds_{mode}": round((costs[f"api_{mode}"] - costs[f"v1_{mode}"]) / reply_s, 5)
                  for mode in ("stream", "whole")}
        print(json.dumps({"load": os.getloadavg(), "rounds": args.rounds, "tokens": sorted(counts), "median": medians,
                          **ratios, "route_cost_s": {name: round(value, 5) for name, value in costs.items()},
                          "reply_s": reply_s, **shares, "per_round": figures}, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
