"""Three probes of the GPU path that the one-shot check (run.sh) runs beside its figures.

    python3 benchmarks/gpu/probes.py shapes MODEL        what a step of k rows costs, and the one-token steps after it
    python3 benchmarks/gpu/probes.py first MODEL [warm|uncharged]  a fresh process's first replies (drafting, not,
                                                         greedy); `warm`: after one evaluation of each draft shape;
                                                         `uncharged`: lookup not charging a shape's first step
                                                         (localchat.backends.llamacpp.FIRST_SHAPE_STEPS = 0)
    python3 benchmarks/gpu/probes.py profile MODEL       Python's profile of a greedy and an as-shipped reply
    python3 benchmarks/gpu/probes.py paths MODEL [N]     one reply as `run` decodes it and as `serve`'s scheduler does
                                                         (N slots, default 4; no HTTP), as shipped without drafts and greedy
    python3 benchmarks/gpu/probes.py chains MODEL        one reply with each part of the default sampler's chain
    python3 benchmarks/gpu/probes.py placement MODEL     one reply as shipped, without drafts and greedy, each sampled
                                                         on the device and on the host, alternated; then where a token's
                                                         time goes in each (the decode's launch, the wait and pick, the rest)

A batch of another shape makes llama.cpp build its graph again and ggml-cuda capture its CUDA graph again
(localchat.speculative.RECOVERY_STEPS); a shape never seen in the process may also load its kernels then.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import localchat  # noqa: F401  (first: llama.cpp's libraries, localchat.native)
import queue

import llama_cpp
from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.backends import llamacpp, llamacpp_sampler
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.scheduler import ReplyDone, Scheduler, TextDelta
from localchat.session import GenerationSettings, GenerationStats
from localchat.settings import DEFAULT_LOOKUP_DRAFT, Settings

PROMPT = "Write a story about a dragon."
DRAFT_SHAPES = (2, 3, 5, 9, 17)
TOKEN = 100


def reply(engine: Engine, mode: str, tokens: int = 256) -> dict[str, object]:
    """One reply of `tokens` from a fresh session: as shipped with drafts, without, or greedy."""
    session = engine.sessions[0]
    session.reset()
    prompt = engine.backend.tokenize(PROMPT, add_bos=True, special=False)
    settings = {"drafts": GenerationSettings(max_tokens=tokens + 1, ignore_eos=True, lookup_draft=DEFAULT_LOOKUP_DRAFT),
                "no drafts": GenerationSettings(max_tokens=tokens + 1, ignore_eos=True),
                "greedy": GenerationSettings(max_tokens=tokens + 1, sampler=ARGMAX, ignore_eos=True)}[mode]
    generation = session.generate(prompt, settings)
    generation.text()
    stats = generation.stats
    assert stats is not None
    return {"mode": mode, "tok_s": round(stats.decode_tok_s, 1), "drafted": stats.drafted_tokens,
            "accepted": stats.accepted_tokens}


def shapes(engine: Engine) -> None:
    backend = engine.backend
    backend.evaluate(0, [TOKEN] * 32, 0)
    position = 32

    def step(rows: int) -> float:
        nonlocal position
        started = time.perf_counter()
        if rows == 1:
            backend.evaluate(0, [TOKEN], position)
            backend.logits(0)
        else:
            backend.evaluate_all(0, [TOKEN] * rows, position)
        position += rows
        return (time.perf_counter() - started) * 1e3

    for _ in range(30):
        step(1)
    first: dict[int, list[float]] = {}
    later: dict[int, list[list[float]]] = {}
    for round_ in range(12):
        for rows in DRAFT_SHAPES:
            timed = [step(rows), *(step(1) for _ in range(5))]
            if round_ == 0:
                first[rows] = timed
            else:
                later.setdefault(rows, []).append(timed)
        if position > 3000:
            backend.truncate(0, 32)
            position = 32
    steady = statistics.median(step(1) for _ in range(50))
    print(f"steady one-token step {steady:.3f} ms; the step of k rows, then the 5 one-token steps after it (ms):")
    for rows in DRAFT_SHAPES:
        print(f"k={rows:2d} first:  " + " ".join(f"{x:7.3f}" for x in first[rows]))
        print(f"k={rows:2d} median: " + " ".join(f"{statistics.median(c):7.3f}" for c in zip(*later[rows])))


def first_replies(engine: Engine, warm: bool) -> None:
    started = time.perf_counter()
    if warm:
        for rows in (*range(2, 11), 17, 26):
            engine.backend.evaluate_all(0, [TOKEN] * rows, 0)
            engine.backend.truncate(0, 0)
    warm_ms = (time.perf_counter() - started) * 1e3
    replies = [reply(engine, mode) for mode in ("drafts", "no drafts", "greedy", "drafts")]
    print(json.dumps({"warm": warm, "warm_ms": round(warm_ms, 1), "first_shape_steps": engine.backend.first_shape_steps,
                      "replies": replies}))


def profile(engine: Engine) -> None:
    for mode in ("greedy", "drafts"):
        reply(engine, mode, 64)
        profiler = cProfile.Profile()
        profiler.enable()
        result = reply(engine, mode, 512)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print(result)
        print("\n".join(line[:160] for line in out.getvalue().splitlines()[4:30]))


def paths(engine: Engine, rounds: int = 3, tokens: int = 256) -> None:
    """Decode tok/s of one reply through Session.generate (`run`) and through the Scheduler (`serve`)."""
    prompt = engine.backend.tokenize(PROMPT, add_bos=True, special=False)
    samplers = {"shipped, no drafts": None, "greedy": ARGMAX}
    speeds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, sampler in samplers.items():
            settings = GenerationSettings(max_tokens=tokens + 1, ignore_eos=True, sampler=sampler)
            session = engine.sessions[0]
            session.reset()
            generation = session.generate(prompt, settings)
            generation.text()
            assert generation.stats is not None
            speeds.setdefault(f"run, {name}", []).append(generation.stats.decode_tok_s)
            session.reset()
            scheduler = Scheduler(engine, max_waiting=0)
            scheduler.start()
            sink: queue.SimpleQueue[object] = queue.SimpleQueue()
            scheduler.submit(prompt, settings, sink.put)
            deltas = 0
            while not isinstance(event := sink.get(timeout=120), ReplyDone):
                deltas += isinstance(event, TextDelta) and bool(event.text)
            scheduler.close()
            speeds.setdefault(f"scheduler, {name}", []).append(event.stats.decode_tok_s)
            speeds.setdefault(f"text deltas, {name}", []).append(deltas)
    print(json.dumps({label: round(statistics.median(values), 1) for label, values in speeds.items()}))


CHAINS = {"greedy": ARGMAX, "top-k, dist": SamplerSettings(top_p=1.0, min_p=0.0, temperature=1.0),
          "top-k, temp, dist": SamplerSettings(top_p=1.0, min_p=0.0), "top-k, top-p, temp, dist": SamplerSettings(min_p=0.0),
          "top-k, min-p, temp, dist": SamplerSettings(top_p=1.0), "as shipped": None}


def chains(engine: Engine, rounds: int = 3, tokens: int = 256) -> None:
    """Decode tok/s of one reply with each chain (no drafts), alternated round by round."""
    prompt = engine.backend.tokenize(PROMPT, add_bos=True, special=False)
    speeds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, sampler in CHAINS.items():
            session = engine.sessions[0]
            session.reset()
            generation = session.generate(prompt, GenerationSettings(max_tokens=tokens + 1, ignore_eos=True, sampler=sampler))
            generation.text()
            assert generation.stats is not None
            speeds.setdefault(name, []).append(generation.stats.decode_tok_s)
    print(json.dumps({name: round(statistics.median(values), 1) for name, values in speeds.items()}))


def split_chain(settings: SamplerSettings) -> object:
    """The chain with top-k alone on the device: a sampler llama.cpp runs only on the host (typical at 1, which
    keeps every token) ends the device's part, so the decode reads back top-k's candidates, and
    llama_sampler_sample runs the rest of the chain over them on the host."""
    chain = llamacpp_sampler._new_chain()
    add = partial(llama_cpp.llama_sampler_chain_add, chain)
    if settings.greedy or settings.top_k <= 0:
        llamacpp_sampler._add_truncations_and_draw(settings, add)
        return chain
    add(llama_cpp.llama_sampler_init_top_k(settings.top_k))
    add(llama_cpp.llama_sampler_init_typical(1.0, 1))
    llamacpp_sampler._add_truncations_and_draw(replace(settings, top_k=0), add)
    return chain


def pick_split(self: llamacpp_sampler.DeviceSampler, index: int) -> int:
    return int(llama_cpp.llama_sampler_sample(self.chain, self._context, index))


PLACEMENTS = {"device": (llamacpp_sampler.device_sampleable, llamacpp_sampler.device_chain),
              "split": (llamacpp_sampler.device_sampleable, split_chain), "host": (lambda *args: False, None)}
PLACED = {"as shipped": (DEFAULT_LOOKUP_DRAFT, None), "no drafts": (0, None), "greedy": (0, ARGMAX)}


def placement(engine: Engine, rounds: int = 5, tokens: int = 512) -> None:
    """Decode tok/s of one reply with each sampler sampled on the device and on the host (llama.cpp's chain over
    the C pass's candidates), alternated round by round, each after a short reply with the same settings (a
    chain attached anew makes llama.cpp reserve its graph again); then one reply of each timed by part."""
    prompt = engine.backend.tokenize(PROMPT, add_bos=True, special=False)
    session = engine.sessions[0]

    def one(place: str, lookup_draft: int, sampler: SamplerSettings | None, n: int) -> GenerationStats:
        engine.backend._detach(session.seq)  # type: ignore[attr-defined]
        llamacpp.device_sampleable, chain = PLACEMENTS[place]
        if chain is not None:
            llamacpp.device_chain = chain
        llamacpp_sampler.DeviceSampler.pick_output = pick_split if place == "split" else pick_output  # type: ignore[method-assign]
        session.reset()
        generation = session.generate(prompt, GenerationSettings(max_tokens=n + 1, ignore_eos=True, sampler=sampler,
                                                                 lookup_draft=lookup_draft))
        generation.text()
        assert generation.stats is not None
        return generation.stats

    pick_output = llamacpp_sampler.DeviceSampler.pick_output
    placed = [(name, place) for name in PLACED for place in PLACEMENTS if not (name == "greedy" and place == "split")]
    speeds: dict[str, list[float]] = {}
    drafted: dict[str, list[int]] = {}
    for _ in range(rounds):
        for name, place in placed:
            lookup_draft, sampler = PLACED[name]
            one(place, lookup_draft, sampler, 16)
            stats = one(place, lookup_draft, sampler, tokens)
            speeds.setdefault(f"{name}, {place}", []).append(stats.decode_tok_s)
            drafted.setdefault(f"{name}, {place}", []).append(stats.accepted_tokens)
    print(json.dumps({label: round(statistics.median(values), 1) for label, values in speeds.items()}))
    print(json.dumps({"accepted drafted tokens": drafted}))
    backend = engine.backend
    evaluate, sample = backend.evaluate, backend.sample
    spent = {"launch": 0.0, "wait and pick": 0.0}

    def timed(part: str, call: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - started
        return run

    parts: dict[str, dict[str, float]] = {}
    for name, place in placed:
        lookup_draft, sampler = PLACED[name]
        one(place, lookup_draft, sampler, 16)
        backend.evaluate, backend.sample = timed("launch", evaluate), timed("wait and pick", sample)  # type: ignore[method-assign]
        spent.update({"launch": 0.0, "wait and pick": 0.0})
        started = time.perf_counter()
        stats = one(place, lookup_draft, sampler, tokens)
        total = time.perf_counter() - started
        del backend.evaluate, backend.sample
        per_token = {part: seconds / stats.completion_tokens * 1e6 for part, seconds in spent.items()}
        per_token["rest"] = total / stats.completion_tokens * 1e6 - sum(per_token.values())
        parts[f"{name}, {place}"] = {part: round(us, 1) for part, us in per_token.items()}
    print(json.dumps({"us a token": parts}))


def main() -> None:
    probe, path = sys.argv[1], sys.argv[2]
    if probe != "paths":  # paths decodes on the scheduler's thread too: llama.cpp's compute thread serves both
        llamacpp.decode_on_this_thread()  # as `localchat run` decodes
    n_seq = int(sys.argv[3]) if probe == "paths" and len(sys.argv) > 3 else 4 if probe == "paths" else 1
    if sys.argv[3:] == ["uncharged"]:
        llamacpp.FIRST_SHAPE_STEPS = 0.0
    with Engine.load(path, Settings(), PlanRequest(n_ctx=4096, n_seq=n_seq)) as engine:
        if probe == "shapes":
            shapes(engine)
        elif probe == "first":
            first_replies(engine, warm=sys.argv[3:] == ["warm"])
        elif probe == "paths":
            paths(engine)
        elif probe == "chains":
            chains(engine)
        elif probe == "placement":
            placement(engine)
        else:
            profile(engine)


if __name__ == "__main__":
    main()
