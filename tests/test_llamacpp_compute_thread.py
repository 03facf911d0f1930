"""Every llama_decode of the process runs on one thread (see `_ComputeThread` for why)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from localchat.backends.base import ARGMAX
from localchat.backends.llamacpp import _ComputeThread
from localchat.engine import Engine
from localchat.session import GenerationSettings

LIGHTHOUSE = "The lighthouse keeper climbed the stairs"


def test_decodes_asked_for_by_several_threads_all_run_on_one_thread(engine: Engine, decoding_threads: set[int]) -> None:
    backend = engine.backend
    engine.sessions[0].reset()  # the shared engine's sequence 0 may hold an earlier test's tokens
    prompt = backend.tokenize(LIGHTHOUSE, add_bos=True, special=False)
    logits: dict[int, np.ndarray] = {}
    done_evaluating = threading.Event()

    def evaluate(then_wait: bool) -> None:
        backend.evaluate(0, prompt, 0)
        logits[threading.get_ident()] = backend.logits(0).copy()
        backend.truncate(0, 0)
        if then_wait:  # alive until the end, so no later caller gets its thread id
            done_evaluating.wait()

    evaluate(then_wait=False)
    callers = []
    for _ in range(2):
        callers.append(threading.Thread(target=evaluate, args=(True,)))
        callers[-1].start()
        while len(logits) < len(callers) + 1:  # one caller at a time: the backend is not thread-safe
            time.sleep(0.01)
    done_evaluating.set()
    for caller in callers:
        caller.join()
    assert len(logits) == 3
    assert len(decoding_threads) == 1 and not decoding_threads & logits.keys()
    first, *others = logits.values()
    for other in others:
        np.testing.assert_array_equal(first, other)


def test_a_streamed_reply_decodes_and_passes_its_text_on_the_compute_thread(engine: Engine,
                                                                           decoding_threads: set[int]) -> None:
    """Generation.stream (the chat app's reply worker) runs the reply where llama.cpp decodes: no decode is
    handed from the caller's thread to another, and the text comes from that thread too."""
    session = engine.sessions[0]
    session.reset()
    text_threads: set[int] = set()
    pieces: list[str] = []

    def emit(piece: str) -> None:
        text_threads.add(threading.get_ident())
        pieces.append(piece)

    prompt = engine.backend.tokenize(LIGHTHOUSE, add_bos=True, special=False)
    generation = session.generate(prompt, GenerationSettings(max_tokens=16, sampler=ARGMAX))
    caller = threading.Thread(target=generation.stream, args=(emit,))
    caller.start()
    caller.join()
    assert "".join(pieces) and generation.stats is not None and generation.stats.completion_tokens == 16
    assert len(decoding_threads) == 1 and text_threads == decoding_threads and caller.ident not in decoding_threads


def test_a_streamed_reply_lets_another_model_decode_before_it_ends(engine: Engine, gemma_gguf_engine: Engine) -> None:
    """A streamed reply holds the compute thread, and steps aside after a token when a decode asked for by
    another thread waits: a second model's reply (or its warm-up) is not held back until the first one's end."""
    session = engine.sessions[0]
    session.reset()
    prompt = engine.backend.tokenize(LIGHTHOUSE, add_bos=True, special=False)
    generation = session.generate(prompt, GenerationSettings(max_tokens=400, sampler=ARGMAX, ignore_eos=True))
    first_piece, ended = threading.Event(), threading.Event()

    def stream() -> None:
        try:
            generation.stream(lambda piece: first_piece.set())
        finally:
            ended.set()

    caller = threading.Thread(target=stream)
    caller.start()
    try:
        assert first_piece.wait(60)
        other = gemma_gguf_engine.sessions[0]
        other.reset()
        gemma_prompt = gemma_gguf_engine.backend.tokenize(LIGHTHOUSE, add_bos=True, special=False)
        assert other.generate(gemma_prompt, GenerationSettings(max_tokens=4, sampler=ARGMAX)).text()
        assert not ended.is_set(), "the other model's reply waited for the streamed one's end"
    finally:
        generation.cancel()
        caller.join()
    assert generation.stats is not None and generation.stats.finish_reason == "cancelled"


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_while_a_decode_runs_takes_effect_once_it_has_returned() -> None:
    compute = _ComputeThread()
    finished = threading.Event()

    def slow_decode() -> int:
        time.sleep(0.4)
        finished.set()
        return 0

    interrupt = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    with pytest.raises(KeyboardInterrupt):
        compute.run(slow_decode)
    interrupt.join()
    assert finished.is_set(), "the caller went on while its decode still ran"
    assert compute.run(lambda: 7) == 7, "the compute thread still serves calls"
