"""Time to first token of a conversation continued after a restart: restored from the prefix
cache's disk tier (written when the first engine closed) against computed from scratch.

    python benchmarks/restart_ttft.py [--model PATH]

Uses the cache directory of the current settings (set LOCALCHAT_HOME to keep it apart).
"""

from __future__ import annotations

import argparse
import json

from localchat.backends.base import ARGMAX
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.chat import Chat
from localchat.session import GenerationSettings, GenerationStats
from localchat.templates import Message

GREEDY = GenerationSettings(max_tokens=32, sampler=ARGMAX)
SYSTEM = "You are the keeper of a lighthouse and answer questions about its history. " * 60
REQUEST = PlanRequest(n_ctx=4096)


def next_turn(engine: Engine, history: list[Message]) -> GenerationStats:
    generation = Chat(engine.sessions[0], engine.template, list(history)).send("What changed last winter?", GREEDY)
    generation.text()
    assert generation.stats is not None
    return generation.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a .gguf file or ONNX folder (default: the default model)")
    args = parser.parse_args()
    with Engine.load(args.model, request=REQUEST) as before:
        before.prefix_cache.clear()
        chat = before.new_chat(SYSTEM)
        first = chat.send("Who kept the ledger?", GREEDY)
        chat.commit(first.text())
        history = list(chat.messages)
    with Engine.load(args.model, request=REQUEST) as after:
        restored = next_turn(after, history)
        after.sessions[0].reset()
        after.prefix_cache.clear()
        cold = next_turn(after, history)
        after.prefix_cache.clear()
    print(json.dumps({
        "history_tokens": restored.prompt_tokens,
        "restored_from_disk_tokens": restored.prefix_cache_tokens,
        "ttft_ms_after_restart": round(restored.ttft_s * 1000),
        "ttft_ms_cold": round(cold.ttft_s * 1000),
    }))


if __name__ == "__main__":
    main()
