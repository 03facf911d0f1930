"""Load figures for `localchat serve`, measured with the real `openai` client on loopback.

1. Aggregate decode throughput: 1 stream, then 4 concurrent streams (target: 4 >= 2.5x 1).
2. Time to first token across a 6-turn conversation resent in full each turn (target: turn 6 <= 1.5x turn 1).
3. 100 requests from 16 concurrent clients: each answered or refused with 503, none lost or hung.

Usage: python benchmarks/serve_load.py [--url http://127.0.0.1:8080] [--api-key KEY] [--rounds 5]
(start `localchat serve --parallel 4` first), or with no --url it starts one on a free port.
Prints one JSON object; record it with the machine's load (`uptime`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import requests

DECODE_TOKENS = 128
TURN_QUESTIONS = ("Who kept the ledger?", "What changed last winter?", "Why did engineers value it?",
                  "How was the lamp powered?", "What did visiting children learn?", "What does the last entry say?")
SYSTEM = "You are the keeper of a lighthouse and answer questions about its history. " * 8


def stream_tokens(client: openai.OpenAI, index: int) -> tuple[int, float]:
    """One streamed reply of DECODE_TOKENS tokens: (tokens, seconds from first to last token)."""
    stream = client.chat.completions.create(
        model="gemma-3-270m", messages=[{"role": "user", "content": f"Tell story number {index} about a dragon."}],
        max_tokens=DECODE_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    first = last = 0.0
    tokens = 0
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or now
            last = now
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens, last - first


def throughput(client: openai.OpenAI, streams: int) -> float:
    """Aggregate generated tokens per second over `streams` concurrent streams."""
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda i: stream_tokens(client, i), range(streams)))
    return sum(tokens for tokens, _ in results) / (time.perf_counter() - start)


def conversation_ttft(client: openai.OpenAI) -> list[float]:
    """TTFT of each turn of a conversation whose whole history is resent every turn."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    ttfts = []
    for question in TURN_QUESTIONS:
        messages.append({"role": "user", "content": question})
        start = time.perf_counter()
        stream = client.chat.completions.create(model="gemma-3-270m", messages=messages, max_tokens=48, temperature=0,
                                                stream=True)
        pieces: list[str] = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if not pieces:
                    ttfts.append(time.perf_counter() - start)
                pieces.append(chunk.choices[0].delta.content)
        messages.append({"role": "assistant", "content": "".join(pieces)})
    return ttfts


def many_clients(client: openai.OpenAI, requests_total: int = 100, clients: int = 16) -> dict[str, int]:
    def ask(i: int) -> str:
        try:
            reply = client.chat.completions.create(model="gemma-3-270m", max_tokens=32,
                                                   messages=[{"role": "user", "content": f"Say something about {i}."}])
            return "answered" if reply.choices[0].finish_reason in ("stop", "length") else "odd"
        except openai.APIStatusError as error:
            return "refused_503" if error.status_code == 503 else f"error_{error.status_code}"
        except openai.APIConnectionError:
            return "lost"

    with ThreadPoolExecutor(clients) as pool:
        outcomes = list(pool.map(ask, range(requests_total), timeout=600))
    return {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(api_key: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--port", str(port), "--parallel", "4",
                                "--api-key", api_key], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                return url, process
        except requests.ConnectionError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--api-key", default=os.environ.get("LOCALCHAT_API_KEY", "bench"))
    parser.add_argument("--rounds", type=int, default=5, help="alternating 1- and 4-stream rounds (the median is reported)")
    args = parser.parse_args()
    process = None
    url = args.url
    if url is None:
        url, process = start_server(args.api_key)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=args.api_key, max_retries=0, timeout=600)
        stream_tokens(client, 0)  # warm-up
        # One and four streams alternate, so a change in the machine's speed touches both sides.
        rounds = [(throughput(client, 1), throughput(client, 4)) for _ in range(args.rounds)]
        ttfts = conversation_ttft(client)
        outcomes = many_clients(client)
        print(json.dumps({
            "load_average": os.getloadavg(),
            "decode_tok_s_1_stream": round(statistics.median(one for one, _ in rounds), 1),
            "decode_tok_s_4_streams": round(statistics.median(four for _, four in rounds), 1),
            "speedup_4_vs_1": round(statistics.median(four / one for one, four in rounds), 2),
            "speedup_per_round": [round(four / one, 2) for one, four in rounds],
            "ttft_ms_per_turn": [round(t * 1000) for t in ttfts],
            "ttft_turn6_vs_turn1": round(ttfts[-1] / ttfts[0], 2),
            "100_requests_16_clients": outcomes,
        }))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
