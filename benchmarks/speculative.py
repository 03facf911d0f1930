"""Prompt-lookup speculative decoding against plain decoding, on the default model (llama.cpp).

Two tasks: an input-grounded one (a text of about 500 tokens in the prompt, to be written out
again with its mistakes fixed: the reply copies long runs of the prompt) and an open-ended one (a
story). With `--sampler greedy` (the model's argmax, no penalties) the replies must be the same;
with `--sampler chat` (llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05; a fixed seed)
they are the same too, as each token takes the same random draw either way. Rounds alternate plain
and drafting on the same session, so machine noise hits both alike; figures are medians of decode
tok/s (tokens after the first, per second of decoding them), with the draft acceptance rate, and
whether the replies were the same token for token.

`--draft-model MODEL` drafts with that model too, where prompt lookup has none (e.g. the default
Q4_K_M for a Q8_0 target of the same checkpoint: `localchat convert --to gguf --quant q8_0
CHECKPOINT`); with `--draft 0` the draft model alone.

`--step-cost` measures instead what a draft costs: the time of one evaluation of T tokens of one
sequence with every row's logits (a draft of T - 1), and of one batched step of N sequences, each
against the plain one-token step.

    python benchmarks/speculative.py [--model PATH] [--tokens 128] [--rounds 3] [--draft 24] [--sampler greedy|chat]
    python benchmarks/speculative.py --model TARGET.gguf --draft-model DRAFT.gguf
    python benchmarks/speculative.py --step-cost [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.bench import OPEN_ENDED_PROMPT, grounded_prompt
from localchat.engine import Engine
from localchat.models import default_model_path
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings, GenerationStats, Session
from localchat.settings import DEFAULT_LOOKUP_DRAFT, Settings


SAMPLERS = {"greedy": ARGMAX, "chat": SamplerSettings(seed=0)}
# Odd and even counts side by side: llama.cpp takes longer for an odd count of rows than for one more.
STEP_TOKENS = (1, 2, 3, 4, 9, 10, 17, 18, 25, 26)
STEP_SEQUENCES = (1, 2, 3, 4, 5, 6)
TOKEN = 100


def run(session: Session, prompt: list[int], tokens: int, draft: int, sampler: SamplerSettings) -> GenerationStats:
    generation = session.generate(prompt, GenerationSettings(max_tokens=tokens, sampler=sampler, ignore_eos=True,
                                                             lookup_draft=draft))
    generation.text()
    assert generation.stats is not None
    return generation.stats


def step_costs(engine: Engine, rounds: int, steps: int = 16) -> dict[str, float]:
    """Median milliseconds of a step: "T tokens" is one sequence evaluating T tokens with all logits,
    "N sequences" one batched step of one token each; alternated round by round."""
    backend = engine.backend
    timings: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, step in [*((f"{t} tokens", t) for t in STEP_TOKENS), *((f"{n} sequences", -n) for n in STEP_SEQUENCES)]:
            for seq in range(backend.n_seq):
                backend.truncate(seq, 0)
                backend.evaluate(seq, [TOKEN] * 64, 0)
            position = 64
            start = time.perf_counter()
            for _ in range(steps):
                if step > 0:
                    backend.evaluate_all(0, [TOKEN] * step, position)
                    position += step
                else:
                    backend.evaluate_batch([(seq, TOKEN, position) for seq in range(-step)])
                    position += 1
            timings.setdefault(label, []).append((time.perf_counter() - start) / steps * 1000)
    return {label: round(statistics.median(values), 2) for label, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draft", type=int, default=DEFAULT_LOOKUP_DRAFT)
    parser.add_argument("--sampler", choices=sorted(SAMPLERS), default="greedy")
    parser.add_argument("--draft-model", help="draft with this model too, where prompt lookup has no draft")
    parser.add_argument("--step-cost", action="store_true", help="measure what a draft's rows cost instead")
    args = parser.parse_args()
    settings = Settings()
    sequences = max(STEP_SEQUENCES) if args.step_cost else 1
    with Engine.load(args.model or str(default_model_path(settings)), settings,
                     PlanRequest(n_ctx=2048 * sequences, n_seq=sequences)) as engine:
        if args.step_cost:
            costs = step_costs(engine, args.rounds)
            one = costs["1 tokens"]
            print(json.dumps({"load": os.getloadavg(), "rounds": args.rounds,
                              "ms": costs, "x_one_step": {k: round(v / one, 2) for k, v in costs.items()}}, indent=1))
            return
        sampler = SAMPLERS[args.sampler]
        session = engine.sessions[0]
        if args.draft_model:
            engine.add_draft_model(args.draft_model, PlanRequest(n_ctx=2048))
        draft_model = session.draft_model
        results = {}
        for task, text in (("input-grounded", grounded_prompt(engine)), ("open-ended", OPEN_ENDED_PROMPT)):
            prompt = engine.backend.tokenize(text, add_bos=True, special=False)
            run(session, prompt, 8, 0, sampler)  # warm-up; the prompt stays in the KV cache for the rounds
            speeds: dict[str, list[float]] = {"plain": [], "drafting": []}
            replies, accepted, drafted = {}, 0, 0
            for _ in range(args.rounds):
                for mode, draft in (("plain", 0), ("drafting", args.draft)):
                    session.draft_model = draft_model if mode == "drafting" else None
                    stats = run(session, prompt, args.tokens, draft, sampler)
                    speeds[mode].append(stats.decode_tok_s)
                    replies[mode] = stats.completion_ids
                    accepted, drafted = accepted + stats.accepted_tokens, drafted + stats.drafted_tokens
            plain, drafting = statistics.median(speeds["plain"]), statistics.median(speeds["drafting"])
            results[task] = {
                "prompt_tokens": len(prompt), "plain_tok_s": round(plain, 1), "drafting_tok_s": round(drafting, 1),
                "speedup": round(drafting / plain, 2), "acceptance": round(accepted / drafted, 2) if drafted else None,
                "drafted_per_reply": round(drafted / args.rounds, 1), "same_reply": replies["plain"] == replies["drafting"],
            }
        print(json.dumps({"load": os.getloadavg(), "tokens": args.tokens, "rounds": args.rounds, "draft": args.draft,
                          "sampler": args.sampler, "model": args.model, "draft_model": args.draft_model,
                          "results": results}, indent=1))


if __name__ == "__main__":
    main()
