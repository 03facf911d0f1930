"""Every llama_decode of the process runs on one thread (see `_ComputeThread` for why)."""

from __future__ import annotations

import os
import signal
import threading
import time

import llama_cpp
import numpy as np
import pytest

from localchat.backends.llamacpp import _ComputeThread
from localchat.engine import Engine


def test_decodes_asked_for_by_several_threads_all_run_on_one_thread(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = engine.backend
    engine.sessions[0].reset()  # the shared engine's sequence 0 may hold an earlier test's tokens
    decoding_threads: set[int] = set()
    real_decode = llama_cpp.llama_decode

    def recorded_decode(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
        decoding_threads.add(threading.get_ident())
        return real_decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", recorded_decode)
    prompt = backend.tokenize("The lighthouse keeper climbed the stairs", add_bos=True, special=False)
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
