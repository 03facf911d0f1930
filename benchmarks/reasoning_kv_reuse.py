"""KV reuse through `localchat serve` when the chat template rewrites earlier turns.

Qwen 3's template, with thinking off (`reasoning_effort: "none"`, i.e. enable_thinking=false),
opens each reply with an empty `<think>\\n\\n</think>\\n\\n` block, then renders earlier replies
without it: the prompt of turn k+1 differs from turn k's cached tokens from that block on, and the
last reply is computed again. With thinking on it renders the history as it was sent. This runs
the 6-turn chat of serve_load.py both ways on the default model given Qwen 3's template (a copy of
the GGUF with new metadata) and records per turn the time to first token, the prompt tokens and
the cached ones (`usage.prompt_tokens_details.cached_tokens`): prompt - cached were recomputed.

Usage: python benchmarks/reasoning_kv_reuse.py [--rounds 3]   (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai
import requests
from serve_load import SYSTEM, TURN_QUESTIONS, free_port

from localchat.models import default_model_path
from localchat.settings import Settings

TEMPLATE = Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_templates" / "qwen3.jinja"


def chat_turns(client: openai.OpenAI, thinking: bool) -> list[dict[str, float]]:
    """The 6-turn chat, history resent in full; per turn TTFT and token counts."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    turns = []
    for question in TURN_QUESTIONS:
        messages.append({"role": "user", "content": question})
        start = time.perf_counter()
        stream = client.chat.completions.create(
            model="qwen3-template", messages=messages, max_tokens=48, temperature=0, stream=True,
            stream_options={"include_usage": True}, **({} if thinking else {"reasoning_effort": "none"}))
        ttft, pieces, usage = 0.0, [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - start
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        turns.append({"ttft_s": ttft, "prompt_tokens": usage.prompt_tokens, "recomputed": usage.prompt_tokens - cached})
        messages.append({"role": "assistant", "content": "".join(pieces)})
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "qwen3-template.gguf"
        subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(default_model_path(Settings())), str(model),
                        "--chat-template-file", str(TEMPLATE), "--force"], check=True, capture_output=True)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "-m", str(model), "--port", str(port),
                                   "--parallel", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    time.sleep(0.3)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
            runs: dict[str, list[list[dict[str, float]]]] = {"thinking_on": [], "thinking_off": []}
            for _ in range(args.rounds):
                for name in runs:
                    runs[name].append(chat_turns(client, thinking=name == "thinking_on"))
        finally:
            server.terminate()
            log = server.communicate(timeout=60)[1]
    result = {
        name: [{key: round(statistics.median(r[turn][key] for r in rounds), 4) for key in rounds[0][turn]}
               for turn in range(len(TURN_QUESTIONS))]
        for name, rounds in runs.items()
    }
    result["server_log"] = [line for line in log.splitlines() if "rewrites its earlier turns" in line]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
