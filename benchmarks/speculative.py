"""Prompt-lookup speculative decoding against plain decoding, on the default model (llama.cpp).

Two tasks at temperature 0 (the model's argmax, no penalties): an input-grounded one (a text of
about 500 tokens in the prompt, to be written out again with its mistakes fixed: the reply copies
long runs of the prompt) and an open-ended one (a story). Rounds alternate plain and drafting on
the same session, so machine noise hits both alike; figures are medians of decode tok/s (tokens
after the first, per second of decoding them), with the draft acceptance rate, and whether the
replies were the same token for token.

    python benchmarks/speculative.py [--model PATH] [--tokens 128] [--rounds 3] [--draft 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from localchat.backends.base import ARGMAX
from localchat.bench import bench_text
from localchat.engine import Engine
from localchat.models import default_model_path
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings, GenerationStats, Session
from localchat.settings import Settings


def grounded_prompt(engine: Engine, n_tokens: int) -> str:
    tokens = engine.backend.tokenize(bench_text(), add_bos=False, special=False)[:n_tokens]
    text = b"".join(engine.backend.token_bytes(t) for t in tokens).decode("utf-8", errors="ignore")
    return f"Text with typos:\n{text}\n\nThe same text with its spelling corrected:\n"


OPEN_ENDED = "Write a long story about a dragon who learns to bake bread.\n\nOnce upon a time"


def run(session: Session, prompt: list[int], tokens: int, draft: int) -> GenerationStats:
    generation = session.generate(prompt, GenerationSettings(max_tokens=tokens, sampler=ARGMAX, ignore_eos=True,
                                                             lookup_draft=draft))
    generation.text()
    assert generation.stats is not None
    return generation.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draft", type=int, default=8)
    args = parser.parse_args()
    settings = Settings()
    with Engine.load(args.model or str(default_model_path(settings)), settings, PlanRequest(n_ctx=2048)) as engine:
        session = engine.sessions[0]
        results = {}
        for task, text in (("input-grounded", grounded_prompt(engine, 500)), ("open-ended", OPEN_ENDED)):
            prompt = engine.backend.tokenize(text, add_bos=True, special=False)
            run(session, prompt, 8, 0)  # warm-up; the prompt stays in the KV cache for the rounds
            speeds: dict[int, list[float]] = {0: [], args.draft: []}
            replies, accepted, drafted = {}, 0, 0
            for _ in range(args.rounds):
                for draft in (0, args.draft):
                    stats = run(session, prompt, args.tokens, draft)
                    speeds[draft].append(stats.decode_tok_s)
                    replies[draft] = stats.completion_ids
                    accepted, drafted = accepted + stats.accepted_tokens, drafted + stats.drafted_tokens
            plain, drafting = statistics.median(speeds[0]), statistics.median(speeds[args.draft])
            results[task] = {
                "prompt_tokens": len(prompt), "plain_tok_s": round(plain, 1), "lookup_tok_s": round(drafting, 1),
                "speedup": round(drafting / plain, 2), "acceptance": round(accepted / drafted, 2) if drafted else None,
                "same_reply": replies[0] == replies[args.draft],
            }
        print(json.dumps({"load": os.getloadavg(), "tokens": args.tokens, "rounds": args.rounds, "draft": args.draft,
                          "results": results}, indent=1))


if __name__ == "__main__":
    main()
