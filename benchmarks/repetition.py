"""How many first replies loop: 20 chat prompts a new user might send, each in a new chat, through
the path the chat app takes (the engine's chat with the model's template, the app's token limit),
sampled with a fixed seed set, under localchat's sampler defaults and the settings compared.

    python benchmarks/repetition.py [--model PATH] [--seeds 0 1 2] [--threads N] [--configs none shipped]
        [--max-tokens N] [--json]

Each configuration is a repetition control over the model's own default sampler (its temperature and
truncations unchanged): none, the repeat penalty alone, DRY alone, or the default as shipped.

A reply loops when the same unit, or the same run of up to 4 units, comes 3 times in a row. A
unit is a sentence: a line's text up to each '.', '!' or '?' followed by a space, or the rest of
the line; stripped, with the ones holding no letter or digit (blank lines, '---') skipped. So a
line said 3 times over, a haiku said 3 times over and a sentence looping within one line all count.
A reply is stopped as soon as it loops (the rest cannot undo it); "limit" counts the replies that
ran to the token limit without looping.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import asdict, dataclass, replace

from localchat.backends.base import SamplerSettings
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.chat import Chat
from localchat.tui.app import REPLY_SETTINGS

PROMPTS = (
    "Write a haiku about the sea.",
    "Hello! Who are you?",
    "What is the capital of France?",
    "Tell me a joke.",
    "Explain what a black hole is in simple terms.",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    'Translate "good morning" into Spanish, French and German.',
    "What should I cook for dinner tonight?",
    "Summarize the plot of Romeo and Juliet.",
    "Write a short poem about autumn leaves.",
    "How do I make a cup of tea?",
    "List five animals that live in the ocean.",
    "What is 12 times 7?",
    "Write a limerick about a cat.",
    "Why is the sky blue?",
    "Write a short story about a robot who learns to paint.",
    "What are the planets of the solar system?",
    "Give me a recipe for pancakes.",
    "Describe your ideal holiday.",
)
# The repetition controls compared: SamplerSettings fields set over the model's default sampler ("shipped":
# none, the default itself).
CONFIGS: dict[str, dict[str, float | int]] = {
    "none": {"repeat_penalty": 1.0, "dry_multiplier": 0.0},
    "repeat": {"repeat_penalty": 1.1, "penalty_last_n": 64, "dry_multiplier": 0.0},
    "dry": {"repeat_penalty": 1.0, "dry_multiplier": 0.8},
    "dry1.2": {"repeat_penalty": 1.0, "dry_multiplier": 1.2},
    "shipped": {},
}
MAX_PERIOD = 4  # units in the longest run looked for
TIMES = 3
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
WORD = re.compile(r"\w")


def units(text: str) -> list[str]:
    """The reply's sentences, in order (see the module's docstring)."""
    found = []
    for line in text.splitlines():
        found += [part.strip() for part in SENTENCE_END.split(line) if WORD.search(part)]
    return found


def loop(text: str) -> list[str] | None:
    """The first run of units that comes TIMES times in a row, or None."""
    seen = units(text)
    for start in range(len(seen)):
        for period in range(1, MAX_PERIOD + 1):
            if seen[start : start + period] * TIMES == seen[start : start + TIMES * period]:
                return seen[start : start + period]
    return None


@dataclass
class Reply:
    prompt: str
    seed: int | None
    loop: list[str] | None  # the units that repeat
    limit: bool  # ran to the token limit without looping
    tokens: int
    text: str


def reply(engine: Engine, prompt: str, sampler: SamplerSettings, max_tokens: int) -> Reply:
    """The first reply of a new chat, stopped once it loops."""
    settings = replace(REPLY_SETTINGS, sampler=sampler, max_tokens=max_tokens)
    generation = Chat(engine.sessions[0], engine.template).send(prompt, settings)
    text, looped = "", None
    for piece in generation:
        text += piece
        if "\n" in piece or len(generation.completion_ids) % 32 == 0:
            looped = loop(text)
            if looped:
                generation.cancel()
    looped = looped or loop(text)
    assert generation.stats is not None
    stats = generation.stats
    return Reply(prompt, sampler.seed, looped, stats.finish_reason == "length" and not looped, stats.completion_tokens, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a .gguf file or ONNX folder (default: the default model)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds, each run on every prompt (default: 0)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: the planner's)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=["none", "shipped"])
    parser.add_argument("--max-tokens", type=int, default=REPLY_SETTINGS.max_tokens,
                        help=f"each reply's token limit (default: the chat app's, {REPLY_SETTINGS.max_tokens})")
    parser.add_argument("--json", action="store_true", help="every reply as one JSON line, then the summary")
    args = parser.parse_args()
    with Engine.load(args.model, request=PlanRequest(n_threads=args.threads)) as engine:
        for name in args.configs:
            sampler = replace(engine.sampler_defaults.settings, **CONFIGS[name])
            started = time.perf_counter()
            replies = []
            for seed in args.seeds:
                for prompt in PROMPTS:
                    row = reply(engine, prompt, replace(sampler, seed=seed), args.max_tokens)
                    replies.append(row)
                    if args.json:
                        print(json.dumps({"config": name, **asdict(row)}), flush=True)
                    elif row.loop:
                        print(f"{name:>6}  loops  seed {seed}  {prompt!r}: {' / '.join(row.loop)[:80]!r}", flush=True)
            print(json.dumps({
                "config": name,
                "replies": len(replies),
                "loops": sum(r.loop is not None for r in replies),
                "limit": sum(r.limit for r in replies),
                "mean_tokens": round(sum(r.tokens for r in replies) / len(replies)),
                "seconds": round(time.perf_counter() - started),
                "sampler": sampler.describe(),
            }), flush=True)


if __name__ == "__main__":
    main()
