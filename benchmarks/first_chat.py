"""A new user's first chat, as shipped: do everyday prompts get answers, and simple questions the right one?

Each prompt is sent as a fresh chat to the model with its default sampler (as `localchat` and `localchat run`
use it), `--seeds` times. Everyday prompts (a haiku, sleep tips, boiling an egg ...) must not loop (a run of up
to 4 lines, or a span of 8+ words, repeated 3 times) and must not be digits or noise (replies mostly digits,
or mostly words of no language: tokens with no vowel). Factual questions count as answered when the answer's
key word is in the reply's first sentence. tests/test_first_chat.py holds the default model to it.

    python benchmarks/first_chat.py [--model NAME] [--seeds 3] [--temperature T]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass

import localchat  # noqa: F401  (first: llama.cpp's libraries load before numpy's, localchat.native)
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

EVERYDAY = (
    "Write a haiku about the sea.",
    "Give me three tips for sleeping well.",
    "How do I boil an egg?",
    "Write a limerick about a cat.",
    "What should I pack for a weekend trip?",
    "Suggest a name for a bakery.",
    "Explain what a rainbow is to a child.",
    "Write a short thank-you note to a teacher.",
    "What are some good exercises for beginners?",
    "Describe a sunset in two sentences.",
)
# A question and the word its answer must hold (any of them), in the reply's first sentence.
FACTUAL = (
    ("What is the capital of Japan?", ("Tokyo",)),
    ("What is the capital of France?", ("Paris",)),
    ("What is the capital of Italy?", ("Rome",)),
    ("How many days are in a week?", ("seven", "7")),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What is the largest ocean on Earth?", ("Pacific",)),
    ("Who wrote Romeo and Juliet?", ("Shakespeare",)),
    ("What do bees make?", ("honey",)),
    ("What is the freezing point of water in Celsius?", ("0", "zero")),
    ("How many legs does a spider have?", ("eight", "8")),
)
MAX_TOKENS = 160


def loops(text: str) -> bool:
    """A run of up to 4 non-empty lines three times in a row, or a span of 8+ words three times in a row."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(lines[i : i + n] * 3 == lines[i : i + 3 * n] for n in range(1, 5) for i in range(len(lines))):
        return True
    words = text.split()
    return any(words[i : i + n] * 3 == words[i : i + 3 * n] for n in range(8, 20) for i in range(max(len(words) - 3 * n + 1, 0)))


def noise(text: str) -> bool:
    """Mostly digits, or mostly words without a vowel (not a language): what a base model's loops turned into."""
    letters_and_digits = [c for c in text if c.isalnum()]
    if not letters_and_digits:
        return True
    if sum(c.isdigit() for c in letters_and_digits) > len(letters_and_digits) / 2:
        return True
    words = re.findall(r"[^\W\d_]+", text)
    return bool(words) and sum(not re.search(r"[aeiouyAEIOUY]", w) for w in words) > len(words) / 2


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s|\n", text.strip(), maxsplit=1)[0]


def answered(text: str, keys: tuple[str, ...]) -> bool:
    sentence = first_sentence(text).lower()
    return any(re.search(rf"\b{re.escape(key.lower())}\b", sentence) for key in keys)


@dataclass(frozen=True)
class FirstChat:
    replies: int
    looped: tuple[str, ...]
    noisy: tuple[str, ...]
    answered: int  # factual questions answered in the first sentence
    asked: int
    sampler: str


def first_chat(engine: Engine, seeds: tuple[int, ...], temperature: float | None = None) -> FirstChat:
    """Every prompt of both sets as a fresh chat, once per seed, with the model's default sampler."""
    looped, noisy = [], []
    hits = asked = 0
    defaults = engine.sampler_defaults.settings
    if temperature is not None:
        defaults = dataclasses.replace(defaults, temperature=temperature)
    for seed in seeds:
        settings = GenerationSettings(max_tokens=MAX_TOKENS, sampler=dataclasses.replace(defaults, seed=seed))
        for prompt in EVERYDAY:
            text = engine.new_chat().send(prompt, settings).text()
            if loops(text):
                looped.append(f"{prompt} -> {text[:120]!r}")
            if noise(text):
                noisy.append(f"{prompt} -> {text[:120]!r}")
        for question, keys in FACTUAL:
            text = engine.new_chat().send(question, settings).text()
            hits += answered(text, keys)
            asked += 1
    return FirstChat(len(seeds) * (len(EVERYDAY) + len(FACTUAL)), tuple(looped), tuple(noisy), hits, asked,
                     f"{engine.sampler_defaults.source}, temperature {defaults.temperature}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model name or .gguf file (default: the default model)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--temperature", type=float, help="instead of the model's default temperature")
    args = parser.parse_args()
    with Engine.load(args.model, Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=2048)) as engine:
        result = first_chat(engine, tuple(range(args.seeds)), args.temperature)
    print(json.dumps({"model": args.model or "default", **dataclasses.asdict(result)}, indent=1))


if __name__ == "__main__":
    main()
