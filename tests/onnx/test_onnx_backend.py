"""The onnxruntime backend through the engine: KV reuse, states, batches, sampling, chat, CLI."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localchat.converters.verify import reference_tokenize, verify_text
from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.backends.onnx import describe_weight_formats
from localchat.cli import main
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

GREEDY = ARGMAX


def _tokens(engine: Engine, n: int) -> list[int]:
    backend = engine.backend
    return backend.tokenize(verify_text(), add_bos=True, special=False)[:n]


def _last_logits(engine: Engine, seq: int) -> np.ndarray:
    return engine.backend._logits[seq].copy()  # the row `sample` reads


def test_tokenizer_matches_transformers(gemma_engine: Engine, gemma_checkpoint: Path) -> None:
    text = verify_text()
    ours = gemma_engine.backend.tokenize(text, add_bos=False, special=False)
    assert ours == reference_tokenize(gemma_checkpoint, text)
    assert b"".join(gemma_engine.backend.token_bytes(t) for t in ours).decode() == text
    turn = gemma_engine.backend.tokenize("<start_of_turn>user", add_bos=False, special=True)
    assert turn[0] == 105 and len(gemma_engine.backend.tokenize("<start_of_turn>", add_bos=False, special=False)) > 1


def test_truncate_and_continue_equals_full_evaluation(gemma_engine: Engine) -> None:
    backend, tokens = gemma_engine.backend, _tokens(gemma_engine, 120)
    backend.truncate(0, 0)
    backend.evaluate(0, tokens, 0)
    full = _last_logits(gemma_engine, 0)
    backend.truncate(0, 70)  # keep a common prefix, as a new chat turn does
    backend.evaluate(0, tokens[70:], 70)
    np.testing.assert_allclose(_last_logits(gemma_engine, 0), full, atol=1e-3)


def test_saved_state_restores_the_sequence(gemma_engine: Engine) -> None:
    backend, tokens = gemma_engine.backend, _tokens(gemma_engine, 80)
    backend.truncate(0, 0)
    backend.evaluate(0, tokens[:60], 0)
    state = backend.save_state(0)
    backend.evaluate(0, tokens[60:], 60)
    expected = _last_logits(gemma_engine, 0)
    backend.truncate(0, 0)
    backend.evaluate(0, tokens[:5], 0)  # something else takes the sequence meanwhile
    backend.restore_state(1, state)  # and the state moves to another sequence
    backend.evaluate(1, tokens[60:], 60)
    np.testing.assert_allclose(_last_logits(gemma_engine, 1), expected, atol=1e-3)


def test_batch_step_equals_single_steps(onnx_model: Callable[[str, str], Path], settings: Settings) -> None:
    """Each token of a batched step lands at its own sequence's position. In float32: at int4,
    MatMulNBits sums a batch's rows in another order than a single row's (4-bit blocks of 32,
    1e-5 apart), and the int8 activations turn that into a new draw of their rounding noise."""
    with Engine.load(str(onnx_model("gemma-270m", "fp32")), settings, PlanRequest(n_ctx=256, n_seq=2)) as engine:
        backend, tokens = engine.backend, _tokens(engine, 40)
        for seq, length in ((0, 30), (1, 17)):
            backend.evaluate(seq, tokens[:length], 0)
        backend.evaluate_batch([(1, tokens[17], 17), (0, tokens[30], 30)])
        batched = [_last_logits(engine, 0), _last_logits(engine, 1)]
        for seq, length in ((0, 30), (1, 17)):
            backend.truncate(seq, length)
            backend.evaluate(seq, [tokens[length]], length)
            np.testing.assert_allclose(_last_logits(engine, seq), batched[seq], atol=1e-3)


def test_sampling_is_seeded_and_respects_top_k(gemma_engine: Engine) -> None:
    session = gemma_engine.sessions[0]
    prompt = _tokens(gemma_engine, 20)
    runs = []
    for _ in range(2):
        session.reset()
        settings = GenerationSettings(max_tokens=12, sampler=SamplerSettings(temperature=1.0, seed=7), ignore_eos=True)
        generation = session.generate(prompt, settings)
        generation.text()
        runs.append(generation.stats.completion_ids)
    assert runs[0] == runs[1]
    session.reset()
    top1 = session.generate(prompt, GenerationSettings(max_tokens=8, sampler=replace(ARGMAX, temperature=0.7, top_k=1), ignore_eos=True))
    top1.text()
    session.reset()
    greedy = session.generate(prompt, GenerationSettings(max_tokens=8, sampler=GREEDY, ignore_eos=True))
    greedy.text()
    assert top1.stats.completion_ids == greedy.stats.completion_ids
    session.reset()


def test_repeat_penalty_changes_a_repetitive_continuation(gemma_engine: Engine) -> None:
    session = gemma_engine.sessions[0]
    prompt = gemma_engine.backend.tokenize("one one one one one one one", add_bos=True, special=False)
    outputs = []
    for penalty in (1.0, 1.8):
        session.reset()
        sampler = replace(ARGMAX, repeat_penalty=penalty)
        generation = session.generate(prompt, GenerationSettings(max_tokens=6, sampler=sampler, ignore_eos=True))
        generation.text()
        outputs.append(generation.stats.completion_ids)
    assert outputs[0] != outputs[1]
    session.reset()


def test_chat_turns_reuse_the_cache(gemma_engine: Engine) -> None:
    gemma_engine.prefix_cache.clear()
    gemma_engine.sessions[0].reset()
    chat = gemma_engine.new_chat("You answer in one short sentence.")
    stats = []
    for question in ("What is the capital of France?", "And of Italy?"):
        generation = chat.send(question, GenerationSettings(max_tokens=16, sampler=GREEDY))
        chat.commit(generation.text())
        stats.append(generation.stats)
    assert chat.messages[2].content and gemma_engine.template.origin == "model"
    assert stats[1].cached_tokens >= stats[0].prompt_tokens
    gemma_engine.sessions[0].reset()


def test_info_lists_fused_operators(onnx_model: Callable[[str, str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "-m", str(onnx_model("gemma-270m", "int4"))]) == 0
    out = capsys.readouterr().out
    assert "plan       onnxruntime" in out
    assert "GroupQueryAttention 18" in out and "MatMulNBits" in out and "SkipSimplifiedLayerNormalization 36" in out
    # The converter's per-matrix choices, by role.
    assert "weights: embed_tokens int" in out and "lm_head int" in out and "mlp.gate_up_proj int4/" in out


def test_weight_formats_line_names_the_layers_that_differ() -> None:
    formats = {"embed_tokens": "int4/32", **{f"layers.{i}.mlp.down_proj": "int8/32" if i in (0, 1, 5) else "int4/16" for i in range(8)}}
    assert describe_weight_formats(formats) == "embed_tokens int4/32, mlp.down_proj int4/16 (int8/32 in layers 0-1, 5)"
