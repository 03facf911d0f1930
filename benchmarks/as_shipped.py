"""What a person gets as shipped: localchat's defaults against llama.cpp's on the same GGUF, side by side.

Two servers on loopback, each as its maker ships it (no sampler flags, no sampler fields in the requests):
`localchat serve` (the model's default sampler, prompt-lookup drafts on) and llama.cpp's own `llama-server`
built from the llama.cpp that llama-cpp-python vendors (../shared/tools/build-llamacpp-anchors.sh OUTDIR).
Rounds alternate which goes first; the server not measured is stopped (SIGSTOP). Per round and server: time to
first token of a short chat, single-stream decode tok/s (the stream's tokens after the first, over the time
after the first), and aggregate tok/s with 1 and 4 concurrent streams of 128 tokens (ignore_eos). Then, in
this process, the cost of sampling alone with each model's default chain, timed inside a reply (the steps
take turns): localchat's sampler against llama.cpp's `llama_sampler_sample` (ms per token), and the argmax.
Then drafting as shipped: a chat reply correcting a ~500-token text (input-grounded) and a story (open-ended),
each with and without prompt-lookup drafts, with the model's default sampler. With `--llama-bench`, the cold
start: `localchat run -n 1` from its process start to its exit (wall seconds, peak RSS, started from a small
parent: SMALL_PARENT) against llama.cpp's `llama-bench -p 0 -n 1 -r 1` on the same file and llama-bench
evaluating the same prompt first (`-pg N,1`), alternating, `run`'s
first start (a file it has derived nothing from: localchat.file_facts), and the chat app from its start to its
status bar saying ready in an 80x24 pseudo-terminal. Medians; each localchat figure against llama.cpp's.

Measured (AMD EPYC, 2 threads, 3 rounds, 2026-11-27 at e958ccb), localchat against llama-server: SmolLM2-135M-Instruct
decode 0.90x (91.1 against 100.9 tok/s), aggregate 0.88x with 1 stream and 1.10x with 4, time to first token of
a resent short chat 1.09x faster (17.7 against 19.2 ms); Gemma 3 270M 0.88x, 0.94x, 1.06x and 1.21x faster (23.8
against 28.8 ms). The 3-round server figures move 5-15% between runs on this machine (Gemma's decode read 0.99x
at c52c329; 8 alternating rounds of e958ccb against 0ae79cc gave both 64.5 tok/s). Sampling alone, inside a
reply: 0.196 ms against 0.204 (49k; the argmax 0.021) and 0.297 against 1.702 with Gemma's penalties (262k; the
argmax 0.045). Drafting, input-grounded / open-ended: SmolLM2 1.81x (95% taken) / 1.01x, Gemma 2.61x (97%) /
1.00x; the rounds' seeds decide much of it (SmolLM2 over seeds 0-11: 0.99x to 2.02x, median 1.75x; Gemma over
0-7: 0.93x to 3.00x, median 2.44x, both at c52c329). Cold start: SmolLM2 0.41 s against 0.13 (3.24x) and 0.21 s
for llama-bench's same work (1.97x), 205 against 126 MiB; Gemma 0.66 s against 0.49 (1.36x) and 0.49 (1.35x),
369 against 312 MiB; a first start 0.43 s and 0.82 s; the chat app ready 0.64 s and 0.82 s after it starts (its
first output at 0.45 and 0.47 s).

On an AMD EPYC without AVX-512 (AVX2 only; 2 threads, 2026-11-27, about half as fast and noisier), two runs of 3
rounds: serve 0.84x and 1.04x on SmolLM2, 0.93x and 0.95x on Gemma (4 streams 1.19-1.30x and 1.05-1.17x);
sampling 0.30 against 0.37-0.39 ms and 0.53 against 2.94-2.96 ms. The cold start keeping its bytecode
(USER_PYTHON): SmolLM2 0.71-0.81 s against 0.25-0.28 (2.88x), Gemma 1.44-1.52 s against 1.03-1.22 (1.24-1.40x).
Drafting over 8 seeds, three runs: SmolLM2 grounded 1.53-2.02x, open-ended 0.92-0.99x; Gemma 1.55-1.78x and
0.98-1.02x. The drafted replies' texts change from run to run (near ties, timed step costs), and so do these.
Single-stream serve on SmolLM2 there, at fce0675, six runs of 12-16 alternated rounds (first to last piece of 128
tokens): 0.90x to 0.97x llama-server (median 0.92x), 0.93x with both greedy; Gemma 1.02x (4 rounds). llama.cpp is
not slower from Python: a one-token llama_decode loop in Python and the same loop in C on llama-cpp-python's
libraries ran alike within this machine's noise (+-10% a run), though llama-bench read 3-13% over that C loop in
three runs and 0.6% in a fourth (4% over it with 2048 cells of context rather than llama-bench's 128; a persistent
threadpool, as llama-bench attaches, gave the C loop +5% and -3%). Against an argmax reply through Generation (a
process of its own, alternated), serve's decode calls took 3-7% longer (the hop to the compute thread in them) and
the time between two calls was 0.58-0.68 ms against 0.23 (temperature 0, DRY and drafts still on); its event loop
spends 0.39-0.47 ms of CPU a streamed token. Handing the loop a few tokens a chunk, or running the scheduler on the
compute thread, moved the figure by no more than the noise (1.006x, 0.98x). Part of that time between calls is the
hand-off of each text piece to the event loop: serve's scheduler waited in it 0.26-0.34 ms a token (mean over 4 replies
of 128 tokens; median 0.08 ms), as waking the loop's thread preempts it on 2 cores whose other one holds llama.cpp's
OpenMP worker spinning after a decode. GOMP_SPINCOUNT=10000 or 1000 cut the wait to 0.11-0.18 ms but slowed decoding
(67-72 against 72-75 tok/s); sys.setswitchinterval(1e-4) changed nothing.

The same machine at dec47aa, 3 rounds (10 for `run`): SmolLM2 serve decode 0.96x, aggregate 0.93x with 1 stream and
1.09x with 4, time to first token 0.79x (40.0 against 31.5 ms; 6 more rounds of 5: 28.9 against 23.7 ms, the
fastest alike at 17.8 and 18.0); `run` 0.97x llama-completion (74.5 against 76.7 tok/s), whose sampling took 0.148 ms a
token against localchat's 0.267 with DRY. Gemma serve 0.95x, 0.87x and 0.99x, time to first token 1.60x faster;
`run` 0.91x llama-completion in those 10 rounds and 1.03x in 8 more right after, its sampling 0.707 ms against 0.443.
Cold start 3.3x llama-bench on SmolLM2 (0.86 against 0.26 s; 1.85x its same work) and 1.49x on Gemma (1.32x).
The servers alone at 070e2d6 (localchat's on uvloop and httptools), 5 rounds: SmolLM2 decode 0.86x, aggregate 0.86x
with 1 stream and 1.08x with 4, time to first token 35.5 against 30.2 ms; Gemma 0.94x, 1.05x and 1.03x, time to first
token 1.58x faster (46 against 73 ms). SmolLM2's single stream read 0.94x and 0.91x in another run of 6 that day.
Sampling alone once a C pass found the candidates (a57d434, two runs): SmolLM2 0.160 and 0.152 ms against 0.392 and
0.380, Gemma 0.302 and 0.259 against 2.87 and 2.93 (the argmax 0.093-0.117: a 262k row read once right after a decode);
`run` against llama-completion, 10 and 12 rounds: SmolLM2 0.94x and 0.89x, Gemma 1.00x and 0.99x.
The servers at 5b4dd1a, 6 rounds: SmolLM2 decode 0.94x, aggregate 0.91x with 1 stream and 1.24x with 4. Drafting
once the predictions still coming true count (40f6b37), 12 seeds: Gemma grounded 2.17x (paired 2.25x; 1.66x before,
8 seeds), open-ended 1.01x; SmolLM2 1.78x (paired 1.81x; its Q4_1 rows cost the same in a batch, 1.88x with every
draft taken) and 0.99x. Cold start once the prefix cache keeps 16-token heads (e03f7ba), 7 rounds, a new question
each run: SmolLM2 0.79 s against 0.29 (2.68x; 1.74x llama-bench's same work), a first start 0.99 s, the chat app
ready at 1.27 s; Gemma 1.48 s against 1.06 (1.40x; 1.18x), 1.80 s and 1.77 s. Once the search reads the row in one
pass (f99564f), 6 rounds on a slower day (SmolLM2's plain story at 57 tok/s, 72-75 the day before): sampling 0.13
against 0.40 ms (49k) and 0.26 against 3.32 (262k); SmolLM2 serve decode 0.87x, aggregate 0.86x with 1 stream and
1.13x with 4, `run` 0.93x (9 rounds more, alternating with its parent and llama-completion: 0.97x, the parent 0.94x),
drafting 1.79x (paired 1.84x) and 0.97x, cold start 0.88 s against 0.34 (2.56x); Gemma 1.02x, 0.97x and 1.06x, `run`
0.99x, drafting 2.03x (paired 2.08x) and 1.04x, cold start 1.77 s against 1.36 (1.30x), the chat app ready at 1.96 s.
Once the scheduler steps on the compute thread (b0d2fcf; the time between two decodes 0.57 ms against 1.1-1.2), 6
rounds, 2026-11-28: SmolLM2 serve decode 0.99x, aggregate 0.90x with 1 stream and 1.06x with 4, time to first token
31.8 against 33.1 ms, `run` 0.89x (paired 0.93x), drafting 2.06x (paired 2.08x, 95% taken) and 1.01x, sampling 0.13
against 0.38 ms, cold start 0.76 s against 0.32 (2.39x); Gemma serve 0.92x, 0.84x and 0.95x (5 rounds right after,
beside the tree before it: 0.995x, 0.98x and 1.05x, against 1.02x, 0.96x and 1.08x), `run` 0.98x, drafting 2.17x
(83%) and 1.04x, sampling 0.29 against 3.30 ms, cold start 1.67 s against 1.27 (1.31x).
On an AMD EPYC with AVX-512 (VNNI, BF16; 2 threads), 6 rounds, 2026-11-28 at d6a9aec (the draw one call into C):
sampling 0.055 against 0.183 ms (49k; the argmax 0.019) and 0.089 against 1.645 (262k; 0.042); SmolLM2 serve decode
0.92x, aggregate 0.89x with 1 stream and 1.14x with 4, time to first token 16.9 against 22.7 ms, `run` 0.96x (139.2
against 145.4 tok/s), drafting 1.49x (83% taken) and 0.98x, cold start 0.33 s against 0.12 (2.68x; 1.64x its same
work); Gemma serve 0.95x, 0.97x and 1.07x, 23.9 against 30.0 ms, `run` 0.96x, drafting 2.22x (83%) and 1.00x, cold
start 0.72 s against 0.54 (1.33x). SmolLM2's Q4_1 rows cost 0.55 plain steps each there (benchmarks/speculative.py
--step-cost: 26 rows 14.2 plain steps), so its drafts top out at 1.83x with every one taken. The same machine
later that day, slower by a quarter (llama-bench tg128 103 tok/s against 135), 6 rounds at 56f1f73: SmolLM2 serve
0.91x, 0.97x and 1.15x, `run` 0.91x by each one's own figures and 0.92x at the output (paired 0.94x), drafting
1.76x (89%) and 0.99x, cold start 0.32 s against 0.13 (2.51x; 1.52x its same work); Gemma serve 0.96x, 0.98x and
1.08x, `run` 0.96x at the output, drafting 2.36x (96%) and 1.01x, cold start 0.70 s against 0.52 (1.35x; 1.27x).

With `--llama-completion`, `localchat run` against llama.cpp's own command-line tool, llama-completion (built from
the same source as the others: its CMake target `llama-completion`, beside the anchors script's two), each as shipped
on the same chat message (`-st`: one turn with the model's template), alternating: decode tok/s by each one's own
figures, and at each one's output (`at_output`: the tokens after the first over the time from the first piece of
text on stdout to the last, as a person sees them come), and llama.cpp's sampling ms per token. llama-completion's
own figure counts its decodes and picks alone, not the rest of its loop (text, its log thread, the write); localchat's
counts all of its loop, so the figures at the output are the like-for-like ones.

    python benchmarks/as_shipped.py --llama-server OUTDIR/llama-server [--llama-bench OUTDIR/llama-bench]
        [--llama-completion OUTDIR/llama-completion] [--rounds 3] [--model NAME_OR_GGUF ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import itertools
import json
import os
import pty
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import localchat  # noqa: F401  (first: llama.cpp's libraries load before numpy's, localchat.native)
import llama_cpp
import numpy as np
import openai
from first_chat import EVERYDAY, FACTUAL
from serve_load import free_port
from vs_vllm import Served, start, stop_all

from localchat.backends.llamacpp_sampler import LlamaSampler
from localchat.bench import OPEN_ENDED_PROMPT, grounded_prompt
from localchat.engine import Engine
from localchat.models import resolve_model
from localchat.planner import PlanRequest
from localchat.chat import tokenize_chat
from localchat.session import GenerationSettings
from localchat.settings import DEFAULT_LOOKUP_DRAFT, Settings
from localchat.templates import Message

CONTEXT = 8192
APP_READY_TIMEOUT_S = 60
# A terminal's control sequences (colours, cursor moves), taken out before the screen's words are read.
TERMINAL_CODES = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[@-Z\\-_])")
TOKENS = 128
STREAMS = (1, 4)
QUESTION = [{"role": "user", "content": "Write a story about a dragon who guards a library."}]
SHORT = [{"role": "user", "content": "What is the capital of Japan?"}]
SAMPLE_STEPS = 400
# Drafting is timed over at least this many seeds: a seed decides whether a reply copies the text it corrects at
# all (Gemma 3 270M over seeds 0-2 on an AMD EPYC without AVX-512: 0.92x, 0.98x and 1.85x, its second reply
# rewording the text), so a median of three is a draw more than a measure.
DRAFTING_ROUNDS = 8
# The commands timed from their start run as a user's Python does, keeping the bytecode of the modules it
# compiles (the warm-up writes it): an environment that sets PYTHONDONTWRITEBYTECODE (this sandbox's does)
# compiles localchat's 20k lines at every start, about 0.1 s of `run -n 1`'s 0.9 s here.
USER_PYTHON = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
DRAFTED_TOKENS = 192
# `run` against llama-completion over at least this many rounds: one reply's speed moves 10-15% from one process to
# the next on the AMD EPYC machines.
RUN_ROUNDS = 10


def stream(client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, float, int]:
    """One streamed chat reply: time to the first content, decode tok/s after it, tokens counted by the server."""
    began = time.perf_counter()
    first = last = None
    tokens = 0
    pieces = client.chat.completions.create(model="", messages=messages, max_tokens=max_tokens, stream=True,  # type: ignore[call-overload]
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    for chunk in pieces:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    assert first is not None and last is not None, "no content streamed"
    return first - began, (tokens - 1) / (last - first) if last > first else 0.0, tokens


def aggregate(client: openai.OpenAI, streams: int) -> float:
    began = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        tokens = sum(pool.map(lambda _: stream(client, QUESTION, TOKENS)[2], range(streams)))
    return tokens / (time.perf_counter() - began)


def measure_server(server: Served) -> dict[str, float]:
    client = server.client()
    ttft = statistics.median(stream(client, SHORT, 8)[0] for _ in range(3))
    _, decode, _ = stream(client, QUESTION, TOKENS)
    figures = {"ttft_ms": ttft * 1000, "decode_tok_s": decode}
    for streams in STREAMS:
        figures[f"aggregate_tok_s_{streams}"] = aggregate(client, streams)
    return figures


def compare_servers(model: Path, llama_server: Path, rounds: int, threads: int, logs: Path) -> dict[str, object]:
    commands = {
        "localchat": [sys.executable, "-m", "localchat", "serve", "-m", str(model), "--port", "{port}", "--ctx",
                      str(CONTEXT), "--threads", str(threads)],
        "llama_server": [str(llama_server), "-m", str(model), "--port", "{port}", "-c", str(CONTEXT), "-t", str(threads),
                         "--host", "127.0.0.1"],
    }
    medians = alternate_servers(commands, rounds, logs, "as_shipped", measure_server)
    return {"medians": medians, "localchat_vs_llama_server": ratios(medians["localchat"], medians["llama_server"])}


def ratios(ours: dict[str, float], theirs: dict[str, float], lower_better: frozenset[str] = frozenset({"ttft_ms"})) -> dict[str, float]:
    """Each figure of ours against theirs, >1 where ours is better: theirs over ours for the figures where lower is
    better (times), ours over theirs for the others (speeds)."""
    return {key: round(theirs[key] / ours[key] if key in lower_better else ours[key] / theirs[key], 3) for key in ours}


def alternate_servers(commands: dict[str, list[str]], rounds: int, logs: Path, label: str,
                      measure: Callable[[Served], dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each command's server on a port of its own ("{port}" in the command; its log LOGS/LABEL-NAME.log), warmed up;
    then `rounds` rounds of `measure` on each in turn, the first changing from round to round and the others stopped
    (SIGSTOP). The medians of each server's figures."""
    servers: list[Served] = []
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in commands}
    try:
        for name, command in commands.items():
            port = free_port()
            servers.append(start(name, [part.replace("{port}", str(port)) for part in command], f"http://127.0.0.1:{port}",
                                 logs / f"{label}-{name}.log", dict(os.environ)))
            stream(servers[-1].client(), SHORT, 8)  # warm-up
            servers[-1].signal(signal.SIGSTOP)
        for round_ in range(rounds):
            for server in servers[round_ % len(servers):] + servers[: round_ % len(servers)]:
                server.signal(signal.SIGCONT)
                time.sleep(1)
                for key, value in measure(server).items():
                    figures[server.name].setdefault(key, []).append(value)
                server.signal(signal.SIGSTOP)
    finally:
        stop_all(servers)
    return {name: {key: round(statistics.median(values), 3) for key, values in record.items()} for name, record in figures.items()}


def sampling_cost(model: str) -> dict[str, object]:
    """ms per token of sampling alone with the model's default chain, inside a real reply: each step's
    decode leaves the row, and the samplers' own data, out of the caches, as in every reply (a sampler timed
    on one row over and over reads both from the caches: 0.04 ms where a decode's row costs 0.2). The
    steps take turns: localchat's sampler, llama.cpp's `llama_sampler_sample` with the same stages (it
    copies every logit into its candidates first), and the argmax; each sampler is shown the tokens the
    others picked, so both keep the reply's history."""
    with Engine.load(model, Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=1024)) as engine:
        backend, defaults = engine.backend, engine.sampler_defaults
        context = backend._ctx  # type: ignore[attr-defined]
        prompt = tokenize_chat(backend, engine.template, [Message("user", QUESTION[0]["content"])])
        backend.evaluate(0, prompt, 0)
        ours = backend.make_sampler(defaults.settings)
        assert isinstance(ours, LlamaSampler)
        ours.accept(prompt)
        theirs = llama_cpp.llama_sampler_clone(ours.chain)  # cloned after the prompt was accepted: the penalties have seen it
        times: dict[str, list[float]] = {"localchat_ms": [], "llama_cpp_ms": [], "argmax_ms": []}
        turns, position = list(times), len(prompt)
        for step in range(SAMPLE_STEPS):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(context, -1), shape=(backend.info.n_vocab,))
            turn = turns[step % len(turns)]
            began = time.perf_counter()
            if turn == "localchat_ms":
                token = ours.pick(row)
            elif turn == "llama_cpp_ms":
                token = llama_cpp.llama_sampler_sample(theirs, context, -1)
            else:
                token = int(row.argmax())
            times[turn].append(time.perf_counter() - began)
            if turn != "localchat_ms":
                ours.accept([token], reply=True)
            if turn != "llama_cpp_ms":
                llama_cpp.llama_sampler_accept(theirs, token)
            backend.evaluate(0, [token], position)
            position += 1
        llama_cpp.llama_sampler_free(theirs)
        ours.close()
    figures = {turn: round(statistics.median(values) * 1000, 4) for turn, values in times.items()}
    return {"vocabulary": backend.info.n_vocab, "sampler": defaults.source, **figures}


def drafting_as_shipped(model: str, rounds: int) -> dict[str, object]:
    """Decode tok/s of a chat reply with prompt-lookup drafts against without, each with the model's default
    sampler (seeded per round, the same seed both ways): a reply that corrects a text (input-grounded) and a
    story (open-ended). Medians over alternating rounds: `speed_up` is the medians' ratio, `paired_speed_up` the
    median of each seed's own ratio (the two replies of a seed run one after the other, so this machine's drift
    between rounds, 68-86 tok/s for the same plain story, cancels out)."""
    figures: dict[str, dict[str, list[float]]] = {}
    with Engine.load(model, Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=2048)) as engine:
        tasks = {"input-grounded": grounded_prompt(engine), "open-ended": OPEN_ENDED_PROMPT}
        figures = {task: {"plain": [], "drafted": [], "accepted": []} for task in tasks}
        defaults = engine.sampler_defaults.settings
        for round_ in range(rounds):
            for task, question in tasks.items():
                order = (0, DEFAULT_LOOKUP_DRAFT) if round_ % 2 == 0 else (DEFAULT_LOOKUP_DRAFT, 0)
                for lookup in order:
                    settings = GenerationSettings(max_tokens=DRAFTED_TOKENS, ignore_eos=True, lookup_draft=lookup,
                                                  sampler=dataclasses.replace(defaults, seed=round_))
                    engine.sessions[0].reset()
                    generation = engine.new_chat().send(question, settings)
                    generation.text()
                    stats = generation.stats
                    assert stats is not None
                    figures[task]["drafted" if lookup else "plain"].append(stats.decode_tok_s)
                    if lookup and stats.drafted_tokens:
                        figures[task]["accepted"].append(stats.accepted_tokens / stats.drafted_tokens)
    return {task: {"plain_tok_s": round(statistics.median(f["plain"]), 1), "drafted_tok_s": round(statistics.median(f["drafted"]), 1),
                   "speed_up": round(statistics.median(f["drafted"]) / statistics.median(f["plain"]), 3),
                   "paired_speed_up": round(statistics.median(d / p for d, p in zip(f["drafted"], f["plain"], strict=True)), 3),
                   "accepted": round(statistics.median(f["accepted"]), 2) if f["accepted"] else None}
            for task, f in figures.items()}


# Starts a command from a small process and prints its wall seconds and peak RSS (KiB): Linux counts in a
# process's peak RSS the memory of the one it was forked from (exec keeps the old image's high-water mark),
# so a command forked from this benchmark, which holds models by then, would report at least its size.
SMALL_PARENT = """
import os, sys, time
began = time.perf_counter()
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=[(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)])
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - began, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def process_figures(command: list[str], env: dict[str, str] = USER_PYTHON) -> tuple[float, float]:
    """Wall seconds from start to exit and peak RSS (MiB) of one run of `command` (started by SMALL_PARENT)."""
    parent = subprocess.run([sys.executable, "-c", SMALL_PARENT, *command], capture_output=True, text=True, env=env)
    assert parent.returncode == 0, f"could not start {command[0]}: {parent.stderr[-400:]}"
    wall, peak_kib, code = parent.stdout.split()
    assert code == "0", f"{command[0]} exited with {code}"
    return float(wall), int(peak_kib) / 1024


def chat_app_ready(command: list[str]) -> tuple[float, float]:
    """Seconds from starting the chat app `command` in an 80x24 pseudo-terminal to its first output
    and to its status bar saying the model is ready."""
    began = time.perf_counter()
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the app, in a terminal of 80x24
        os.execve(command[0], command, {**USER_PYTHON, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"})
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    screen, first = b"", None
    try:
        while b"ready" not in TERMINAL_CODES.sub(b"", screen):
            left = APP_READY_TIMEOUT_S - (time.perf_counter() - began)
            if left <= 0 or not select.select([terminal], [], [], left)[0]:
                raise TimeoutError(f"the chat app was not ready in {APP_READY_TIMEOUT_S} s: {screen[-400:]!r}")
            screen += os.read(terminal, 1 << 16)
            first = first or time.perf_counter() - began
        return first, time.perf_counter() - began
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(terminal)


def run_stats(model: Path, threads: int, tokens: int, prompt: str) -> dict[str, Any]:
    """`localchat run` as shipped: its --stats line."""
    done = subprocess.run([sys.executable, "-m", "localchat", "run", "-m", str(model), "-n", str(tokens), "--threads", str(threads),
                           "--stats", prompt], capture_output=True, text=True, check=True, env=USER_PYTHON)
    return json.loads(done.stderr.strip().splitlines()[-1])


def run_prompt_tokens(model: Path, threads: int) -> int:
    """The prompt tokens `localchat run -n 1 Hi` evaluates on `model`."""
    return int(run_stats(model, threads, 1, "Hi")["prompt_tokens"])


def cold_start(model: Path, llama_bench: Path, rounds: int, threads: int) -> dict[str, object]:
    """`localchat run -n 1` against `llama-bench -p 0 -n 1 -r 1`, each from the shell to its exit, and the
    chat app (`localchat chat`) from its start to the model ready on its screen, alternating (one warm-up
    each: the page cache holds the file for all, and localchat has kept what it derives from the file,
    localchat.file_facts). `run` asks a new question each time, as a user does: the prefix cache holds the head
    its chat shares with the earlier ones (the default system prompt), not the question (the same question
    again would be restored whole). `first_start` is `run` in a new LOCALCHAT_HOME each time: a file seen for
    the first time, no prefix cache. `-p 0 -n 1` decodes one token and evaluates no prompt, where `run`
    evaluates its chat-templated prompt (31 tokens for "Hi" with SmolLM2's default system prompt):
    `llama_bench_same_work` is llama-bench doing that too, that many tokens and one more in one test, without
    its warm-up run (`-p 0 -n 0 -pg N,1 --no-warmup`)."""
    prompt_tokens = run_prompt_tokens(model, threads)
    questions = itertools.cycle([*EVERYDAY, *(question for question, _ in FACTUAL)])
    commands = {
        "localchat": [sys.executable, "-m", "localchat", "run", "-m", str(model), "-n", "1", "--threads", str(threads)],
        "llama_bench": [str(llama_bench), "-m", str(model), "-p", "0", "-n", "1", "-r", "1", "-t", str(threads)],
        "llama_bench_same_work": [str(llama_bench), "-m", str(model), "-p", "0", "-n", "0", "-pg", f"{prompt_tokens},1",
                                  "-r", "1", "--no-warmup", "-t", str(threads)],
    }
    app = [sys.executable, "-m", "localchat", "chat", "-m", str(model), "--threads", str(threads)]
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    app_figures: list[tuple[float, float]] = []
    first_starts: list[float] = []

    def command(name: str) -> list[str]:
        """`name`'s command: `run`'s with the next question."""
        return [*commands[name], next(questions)] if name == "localchat" else commands[name]

    for name in commands:
        process_figures(command(name))
    chat_app_ready(app)
    for round_ in range(rounds):
        for name in (list(commands) if round_ % 2 == 0 else list(commands)[::-1]):
            figures[name].append(process_figures(command(name)))
        app_figures.append(chat_app_ready(app))
        with tempfile.TemporaryDirectory() as home:
            first_starts.append(process_figures(command("localchat"), {**USER_PYTHON, "LOCALCHAT_HOME": home})[0])
    medians = {name: {"wall_s": round(statistics.median(w for w, _ in runs), 3),
                      "peak_mib": round(statistics.median(m for _, m in runs), 1)} for name, runs in figures.items()}
    ours, theirs, same_work = medians["localchat"], medians["llama_bench"], medians["llama_bench_same_work"]
    ready = statistics.median(r for _, r in app_figures)
    return {"prompt_tokens": prompt_tokens, "medians": medians,
            "localchat_over_llama_bench": {key: round(ours[key] / theirs[key], 2) for key in ours},
            "localchat_over_llama_bench_same_work": {key: round(ours[key] / same_work[key], 2) for key in ours},
            "first_start": {"wall_s": round(statistics.median(first_starts), 3),
                            "over_llama_bench": round(statistics.median(first_starts) / theirs["wall_s"], 2)},
            "chat_app": {"first_output_s": round(statistics.median(f for f, _ in app_figures), 3), "ready_s": round(ready, 3),
                         "ready_over_llama_bench": round(ready / theirs["wall_s"], 2)}}


# llama-completion's own figures: its generated tokens' decode time, and its sampling time over every pick.
COMPLETION_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")
COMPLETION_SAMPLING = re.compile(r"sampling time =\s*([\d.]+) ms")


def output_times(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run `command` and read its output as a person at a terminal sees it come: when its first and its last piece
    of text reached stdout (perf_counter seconds), and its stderr."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stderr is not None
    streams = {process.stdout.fileno(): "out", process.stderr.fileno(): "err"}
    errors = bytearray()
    first = last = 0.0
    while streams:
        for fd in select.select(list(streams), [], [])[0]:
            data = os.read(fd, 65536)
            if not data:
                del streams[fd]
            elif streams[fd] == "err":
                errors += data
            else:
                last = time.perf_counter()
                first = first or last
    if process.wait() != 0:
        raise subprocess.CalledProcessError(process.returncode, command, stderr=errors.decode(errors="replace"))
    assert last > first, f"{command[0]} wrote no reply"
    return first, last, errors.decode(errors="replace")


@dataclasses.dataclass(frozen=True)
class RunDecode:
    """One reply's decode tok/s: by the program's own figures, and at its output (the tokens after the first over
    the time from the first piece of text on stdout to the last)."""

    stated: float
    at_output: float


def run_decode(model: Path, threads: int) -> RunDecode:
    """`localchat run` as shipped on QUESTION: --stats' decode tok/s (the tokens after the first over the time after it)."""
    first, last, errors = output_times([sys.executable, "-m", "localchat", "run", "-m", str(model), "-n", str(TOKENS),
                                        "--threads", str(threads), "--stats", QUESTION[0]["content"]], USER_PYTHON)
    stats = json.loads(errors.strip().splitlines()[-1])
    return RunDecode(float(stats["decode_tok_s"]), (int(stats["completion_tokens"]) - 1) / (last - first))


def completion_decode(model: Path, llama_completion: Path, threads: int) -> tuple[RunDecode, float]:
    """llama-completion as shipped on QUESTION (`-st`: one turn of its conversation mode, the model's template;
    `--no-display-prompt`, so that its output is the reply alone): its decode tok/s (the generated tokens it
    evaluated over that time and their picks' share of its sampling time, which leave out the rest of its loop:
    turning tokens into text, writing it) and at its output, and its sampling ms per token."""
    first, last, errors = output_times([str(llama_completion), "-m", str(model), "-p", QUESTION[0]["content"], "-st",
                                        "--no-display-prompt", "-n", str(TOKENS), "-t", str(threads)])
    evaluated = COMPLETION_EVAL.findall(errors)
    sampling = COMPLETION_SAMPLING.findall(errors)
    assert evaluated and sampling, f"no timings from llama-completion: {errors[-400:]}"
    eval_ms, runs = float(evaluated[-1][0]), int(evaluated[-1][1])
    picks = runs + 1  # the first token is picked after the prompt's evaluation
    sampling_ms = float(sampling[-1])
    return RunDecode(runs / (eval_ms + sampling_ms * runs / picks) * 1000, runs / (last - first)), sampling_ms / picks


def compare_runs(model: Path, llama_completion: Path, rounds: int, threads: int) -> dict[str, object]:
    """`localchat run` against llama.cpp's llama-completion, each as shipped (no sampler flags) on the same file and
    chat message, alternating: decode tok/s by each one's own figures and at each one's output, and llama.cpp's
    sampling ms per token (its default chain, from a copy of the whole row)."""
    ours: list[RunDecode] = []
    theirs: list[RunDecode] = []
    sampling_ms: list[float] = []
    for round_ in range(rounds):
        for name in ("localchat", "llama_completion") if round_ % 2 == 0 else ("llama_completion", "localchat"):
            if name == "localchat":
                ours.append(run_decode(model, threads))
            else:
                decode, sampling = completion_decode(model, llama_completion, threads)
                theirs.append(decode)
                sampling_ms.append(sampling)

    def compared(figure: Callable[[RunDecode], float]) -> dict[str, float]:
        mine, other = [figure(run) for run in ours], [figure(run) for run in theirs]
        return {"localchat_decode_tok_s": round(statistics.median(mine), 1),
                "llama_completion_decode_tok_s": round(statistics.median(other), 1),
                "localchat_vs_llama_completion": round(statistics.median(mine) / statistics.median(other), 3),
                "paired": round(statistics.median(a / b for a, b in zip(mine, other, strict=True)), 3)}

    return {**compared(lambda run: run.stated), "at_output": compared(lambda run: run.at_output),
            "llama_completion_sampling_ms": round(statistics.median(sampling_ms), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary (without it: sampling only)")
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench binary (with it: the cold start)")
    parser.add_argument("--llama-completion", type=Path, help="llama.cpp's llama-completion binary (with it: `run` against it)")
    parser.add_argument("--model", action="append", help="a model name or .gguf file, repeatable "
                        "(default: the default chat model and gemma-3-270m)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    settings = Settings()
    report: dict[str, object] = {"load": os.getloadavg(), "rounds": args.rounds}
    for model in args.model or ["smollm2-135m-instruct", "gemma-3-270m"]:
        path = resolve_model(model, settings).path
        entry: dict[str, object] = {"sampling": sampling_cost(str(path)), "drafting": drafting_as_shipped(str(path), max(args.rounds, DRAFTING_ROUNDS))}
        if args.llama_server is not None:
            entry["servers"] = compare_servers(path, args.llama_server, args.rounds, args.threads, args.logs)
        if args.llama_completion is not None:
            entry["run"] = compare_runs(path, args.llama_completion, max(args.rounds, RUN_ROUNDS), args.threads)
        if args.llama_bench is not None:
            entry["cold_start"] = cold_start(path, args.llama_bench, max(args.rounds, 5), args.threads)
        report[model] = entry
        print(json.dumps({model: entry}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
