"""What Ollama's routes add to a reply's time: the same chat through /api/chat and through
/v1/chat/completions of one `localchat serve`, streamed and whole.

Each round sends the same greedy conversation (no penalties, so both routes write the same
tokens) through each route in turn, the order alternating by round, and times the whole request
as a client sees it (the last line or event read). The routes' replies are checked to hold the
same number of tokens. Medians over rounds, and /api against /v1; prints one JSON object.

    python benchmarks/ollama_overhead.py [--rounds 15] [--tokens 128] [--model GGUF]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests
from serve_load import free_port

MESSAGES = [{"role": "user", "content": "Tell me a long story about a dragon who guards a library."}]
GREEDY = {"temperature": 0, "repeat_penalty": 1, "dry_multiplier": 0}


def _timed_lines(url: str, body: dict[str, object], stream: bool) -> tuple[float, list[bytes]]:
    started = time.perf_counter()
    with requests.post(url, json=body, stream=stream, timeout=600) as response:
        response.raise_for_status()
        lines = [line for line in response.iter_lines() if line] if stream else [response.content]
    return time.perf_counter() - started, lines


def openai_reply(root: str, tokens: int, stream: bool) -> tuple[float, int]:
    body = {"messages": MESSAGES, "max_tokens": tokens, "stream": stream, **GREEDY}
    if stream:
        body["stream_options"] = {"include_usage": True}
    seconds, lines = _timed_lines(f"{root}/v1/chat/completions", body, stream)
    last = json.loads(lines[-2].removeprefix(b"data: ")) if stream else json.loads(lines[0])
    return seconds, last["usage"]["completion_tokens"]


def ollama_reply(root: str, model: str, tokens: int, stream: bool) -> tuple[float, int]:
    body = {"model": model, "messages": MESSAGES, "stream": stream, "options": {**GREEDY, "num_predict": tokens}}
    seconds, lines = _timed_lines(f"{root}/api/chat", body, stream)
    return seconds, json.loads(lines[-1])["eval_count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    port = free_port()
    command = [sys.executable, "-m", "localchat", "serve", "--port", str(port), *(["-m", str(args.model)] if args.model else [])]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if requests.get(f"{root}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("localchat serve did not start")
            time.sleep(0.2)
        model = requests.get(f"{root}/v1/models", timeout=10).json()["data"][0]["id"]
        routes = {
            "v1_stream": lambda: openai_reply(root, args.tokens, True),
            "api_stream": lambda: ollama_reply(root, model, args.tokens, True),
            "v1_whole": lambda: openai_reply(root, args.tokens, False),
            "api_whole": lambda: ollama_reply(root, model, args.tokens, False),
        }
        for measure in routes.values():
            measure()  # warm-up: the prompt's KV is cached from here on, for every route alike
        seconds: dict[str, list[float]] = {name: [] for name in routes}
        counts: dict[str, set[int]] = {name: set() for name in routes}
        names = list(routes)
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                took, tokens = routes[name]()
                seconds[name].append(took)
                counts[name].add(tokens)
        medians = {name: round(statistics.median(values), 4) for name, values in seconds.items()}
        print(json.dumps({
            "load": os.getloadavg(), "rounds": args.rounds, "tokens": {name: sorted(c) for name, c in counts.items()},
            "median_s": medians,
            "api_vs_v1_stream": round(medians["api_stream"] / medians["v1_stream"], 4),
            "api_vs_v1_whole": round(medians["api_whole"] / medians["v1_whole"], 4),
            "per_round_s": seconds,
        }, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
