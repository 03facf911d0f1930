"""What switching LoRA adapters per request costs, on Gemma 3 270M Q4_K_M (the packaged model
whose checkpoint is at hand to make adapters for).

Two random rank-16 PEFT adapters on every linear layer of the Gemma 3 270M checkpoint (made once in
the work folder, converted with `localchat convert`), loaded with the model. Three kinds of request,
each a chat turn (a shared system prompt and a question of its own) answered with 64 greedy tokens on
one session, as a server slot or `localchat chat` answers them:

    none    no adapter
    same    adapter A every time (its compute, no switching)
    switch  adapters A and B in turns: every request switches, and its prompt's KV is reused only
            from the prefix cache entry of its own adapter

A round answers one request of each kind, each after an unmeasured one of its kind (which switches
from the kind before: `none` and `same` must not be charged for that), so a round's three measured
replies lie within a few seconds of each other. On a machine other jobs share, load comes in bursts
longer than that: each round's ratios to its own `none` reply are what is compared, as medians over
the rounds, beside the medians of the reply times themselves.

What the switch itself costs is measured apart as well: one decode step right after the adapters
change (llama.cpp re-plans its compute graph) against one with the same adapters, in alternation.

Measured (AMD EPYC, 2 threads, 20 rounds): switching every request against keeping one adapter +0.4%
of a reply's time (a decode step right after a switch 22.5 ms against 17.9); any adapter against none +15%,
llama.cpp computing the adapters' matrices.

    python benchmarks/lora_switch.py [--rounds 30] [--work DIR]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import statistics
import time
from pathlib import Path

from localchat.adapters import LoraSpec
from localchat.backends.base import ARGMAX, LoraScales
from localchat.engine import Engine
from localchat.models import gemma_model_path
from localchat.planner import PlanRequest
from localchat.chat import tokenize_chat
from localchat.session import GenerationSettings
from localchat.settings import Settings
from localchat.templates import Message

SYSTEM = ("You are a careful assistant for a team of engineers who build and run a service that answers questions "
          "about the weather, trains and opening hours. Answer briefly and say when you do not know.")
QUESTIONS = ["When does the museum open on Sundays?", "Is the 8:15 train to Basel late today?",
             "Will it rain in Zurich tomorrow?", "Which platform does the night train leave from?",
             "How warm will it be on Saturday?", "Are the shops open on the holiday?"]
KINDS = ("none", "same", "switch")
RANK = 16


def _adapter(work: Path, seed: int) -> Path:
    """A random PEFT LoRA adapter on every linear layer of Gemma 3 270M, as GGUF (made once)."""
    output = work / f"gemma-lora-{seed}.gguf"
    if output.is_file():
        return output
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from localchat.converters.lora import convert_adapter
    from localchat.converters.reference_checkpoints import build_gemma3_270m_checkpoint

    template = importlib.resources.files("localchat.assets").joinpath("templates/gemma.jinja").read_text()
    checkpoint = build_gemma3_270m_checkpoint(work / "gemma-3-270m", template)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    tuned = peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in tuned.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.01 * torch.randn(parameter.shape, generator=generator))
    folder = work / f"gemma-lora-{seed}"
    tuned.save_pretrained(folder)
    return convert_adapter(folder, output, "f16", base=str(checkpoint), force=True).output


def _switch_step(engine: Engine, rounds: int) -> dict[str, object]:
    """One decode step right after the adapters change (A to B or back) against one with the same
    adapters as the step before, alternating, on one sequence."""
    backend = engine.backend
    prompt = backend.tokenize(SYSTEM, add_bos=True, special=False)
    engine.sessions[0].reset()  # the steps below use its sequence directly
    current: LoraScales = ((0, 1.0),)
    backend.use_loras(current)
    backend.evaluate(0, prompt, 0)
    position, same, changed = len(prompt), [], []
    for step in range(20 * rounds):
        switching = step % 2 == 1
        if switching:
            current = ((1 - current[0][0], 1.0),)
        backend.use_loras(current)
        started = time.perf_counter()
        backend.evaluate(0, [prompt[-1]], position)
        (changed if switching else same).append(time.perf_counter() - started)
        position += 1
    backend.truncate(0, 0)
    return {"decode_step_ms": {"same_adapters": round(1000 * statistics.median(same), 2),
                               "right_after_a_switch": round(1000 * statistics.median(changed), 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--work", type=Path, default=Path("/tmp/localchat-lora-bench"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    adapters = [_adapter(args.work, seed) for seed in (0, 1)]
    settings = Settings(prefix_cache_disk_bytes=0)
    loras = {"none": [(), ()], "same": [((0, 1.0),), ((0, 1.0),)], "switch": [((0, 1.0),), ((1, 1.0),)]}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with Engine.load(str(gemma_model_path(settings)), settings, PlanRequest(n_ctx=2048),
                     loras=[LoraSpec(path, 0.0) for path in adapters]) as engine:
        session, asked = engine.sessions[0], 0

        def reply(kind: str, turn: int) -> float:
            nonlocal asked
            messages = [Message("system", SYSTEM), Message("user", QUESTIONS[asked % len(QUESTIONS)])]
            asked += 1
            tokens = tokenize_chat(engine.backend, engine.template, messages)
            generation_settings = GenerationSettings(max_tokens=args.tokens, sampler=ARGMAX, ignore_eos=True,
                                                     loras=loras[kind][turn % 2])
            started = time.perf_counter()
            session.generate(tokens, generation_settings).text()
            return time.perf_counter() - started

        for kind in KINDS:  # warm-up: graphs planned, the prefix cache holding each kind's system prompt
            reply(kind, 0), reply(kind, 1)
        for round_ in range(args.rounds):
            for kind in KINDS[round_ % 3:] + KINDS[:round_ % 3]:
                reply(kind, 1)  # from the kind before to this one: the measured reply is one of this kind's
                times[kind].append(reply(kind, 0))
        step = _switch_step(engine, args.rounds)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    quartiles = {kind: [round(q, 3) for q in statistics.quantiles(values, n=4)] for kind, values in times.items()}
    ratios = {kind: statistics.median(t / n for t, n in zip(times[kind], times["none"])) for kind in ("same", "switch")}
    switch_ratio = statistics.median(w / s for w, s in zip(times["switch"], times["same"]))
    record = {
        "model": "gemma-3-270m Q4_K_M", "adapters": f"2 x rank {RANK}, every linear layer, F16",
        "tokens": args.tokens, "rounds": args.rounds,
        "median_reply_s": {kind: round(value, 4) for kind, value in medians.items()},
        "quartiles_s": quartiles,
        "overhead_vs_none_of_medians": {kind: f"{medians[kind] / medians['none'] - 1:+.1%}" for kind in ("same", "switch")},
        "overhead_vs_none_paired": {kind: f"{ratio - 1:+.1%}" for kind, ratio in ratios.items()},
        "switching_vs_same_paired": f"{switch_ratio - 1:+.1%}",
        **step,
    }
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
