"""Decode speed of localchat against a bare llama.cpp loop on the same file and threads.

The bare loop is llama_decode on a one-token batch plus the cheapest greedy pick (numpy's argmax
over the logits row, as localchat does; llama.cpp's C greedy sampler costs 0.6 ms a token more),
with no other work per token, on a context made with the same parameters as localchat's, so the
ratio measures only localchat's Python layer. Runs alternate to even out
machine noise.

    python benchmarks/decode_vs_bare_loop.py [--model PATH] [--tokens 256] [--rounds 3]

localchat is measured greedy with no drafts (the ratio), and as `localchat run` ships: the model's default
sampler and prompt-lookup drafts (ratio_as_shipped).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import localchat  # noqa: F401  (first: llama.cpp's libraries load before numpy's, localchat.native)
import llama_cpp
import numpy as np

from localchat.backends.base import ARGMAX
from localchat.backends.llamacpp import PROMPT_BATCH, decode_on_this_thread
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import DEFAULT_LOOKUP_DRAFT

PROMPT = "The history of the lighthouse begins"


def bare_loop_tok_s(engine: Engine, n_tokens: int) -> float:
    """Tokens per second of a minimal llama.cpp decode loop, on its own model and context."""
    plan = engine.plan
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = plan.use_extra_bufts
    model_params.n_gpu_layers = plan.n_gpu_layers
    model = llama_cpp.llama_model_load_from_file(str(engine.model_plan.model.path).encode(), model_params)
    ctx_params = llama_cpp.llama_context_default_params()
    ctx_params.n_ctx = plan.n_ctx
    ctx_params.n_threads = plan.n_threads
    ctx_params.n_threads_batch = plan.n_threads_batch
    ctx_params.n_batch = ctx_params.n_ubatch = PROMPT_BATCH
    ctx_params.swa_full = True
    ctx_params.kv_unified = True
    ctx = llama_cpp.llama_init_from_model(model, ctx_params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    prompt = engine.backend.tokenize(PROMPT, add_bos=True, special=False)
    prompt_array = (llama_cpp.llama_token * len(prompt))(*prompt)
    llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(prompt_array, len(prompt)))
    token = llama_cpp.llama_token(0)
    start = time.perf_counter()
    for _ in range(n_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        token.value = int(logits.argmax())
        llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(ctypes.pointer(token), 1))
    elapsed = time.perf_counter() - start
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return n_tokens / elapsed


def localchat_tok_s(engine: Engine, n_tokens: int, *, shipped: bool = False) -> float:
    """Greedy decoding with no drafts, or (`shipped`) as `localchat run` ships: the model's default sampler
    and prompt-lookup drafts."""
    session = engine.sessions[0]
    session.reset()
    prompt = engine.backend.tokenize(PROMPT, add_bos=True, special=False)
    settings = (GenerationSettings(max_tokens=n_tokens + 1, ignore_eos=True, lookup_draft=DEFAULT_LOOKUP_DRAFT) if shipped
                else GenerationSettings(max_tokens=n_tokens + 1, sampler=ARGMAX, ignore_eos=True))
    generation = session.generate(prompt, settings)
    generation.text()
    assert generation.stats is not None
    return generation.stats.decode_tok_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a .gguf file (default: the default model)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    decode_on_this_thread()  # both loops decode on this thread, as `localchat run` does
    with Engine.load(args.model, request=PlanRequest(n_ctx=2048)) as engine:
        bare, ours, shipped = [], [], []
        for _ in range(args.rounds):
            bare.append(bare_loop_tok_s(engine, args.tokens))
            ours.append(localchat_tok_s(engine, args.tokens))
            shipped.append(localchat_tok_s(engine, args.tokens, shipped=True))
        result = {
            "model": str(engine.model_plan.model.path),
            "threads": engine.plan.n_threads,
            "tokens": args.tokens,
            "bare_loop_tok_s": round(statistics.median(bare), 2),
            "localchat_tok_s": round(statistics.median(ours), 2),
            "localchat_as_shipped_tok_s": round(statistics.median(shipped), 2),
            "sampler_as_shipped": f"{engine.sampler_defaults.settings.describe()} ({engine.sampler_defaults.source})",
        }
    result["ratio"] = round(result["localchat_tok_s"] / result["bare_loop_tok_s"], 3)
    result["ratio_as_shipped"] = round(result["localchat_as_shipped_tok_s"] / result["bare_loop_tok_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
