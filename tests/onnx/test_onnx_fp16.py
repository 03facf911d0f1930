"""fp16 ONNX models compute in float16 (matrices, attention, the KV cache) with the residual stream
in float32, as the CUDA provider runs them; on the CPU provider too, where they are checked."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from checkpoint_fixtures import TINY_ARCHITECTURES
from test_onnx_conversion import prompt_and_text

from localchat.converters.verify import ReferenceModel
from localchat.backends.onnx import rotary_tables
from localchat.engine import Engine
from localchat.models import ONNX_MARKER
from localchat.planner import PlanRequest
from localchat.settings import Settings

# Operators whose outputs are in the compute type, and those that carry the residual stream.
COMPUTE_OPERATORS = {"MatMul", "Gemm", "GroupQueryAttention", "FastGelu", "Sigmoid"}
RESIDUAL_OPERATORS = {"SkipSimplifiedLayerNormalization"}


def _output_types(folder: Path) -> dict[str, set[str]]:
    """By operator: the element types its outputs have when the graph runs a 3-token prompt."""
    meta = json.loads((folder / ONNX_MARKER).read_text())
    model = onnx.load(str(folder / meta["graph"]))
    watched = {node.output[0]: node.op_type for node in model.graph.node
               if node.op_type in COMPUTE_OPERATORS | RESIDUAL_OPERATORS and node.output[0] not in
               {o.name for o in model.graph.output}}
    for name in watched:
        model.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    kv_type = np.dtype(meta["kv_dtype"])
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([[2, 5, 7]], dtype=np.int64),
        "seqlens_k": np.array([2], dtype=np.int32),
        "total_sequence_length": np.array(3, dtype=np.int32),
        "logits_count": np.array([1], dtype=np.int64),
    }
    for arg in session.get_inputs():
        if arg.name.startswith("past_key_values."):
            feeds[arg.name] = np.zeros((1, meta["n_kv_heads"], 3, meta["head_dim"]), dtype=kv_type)
    feeds.update(rotary_tables(meta["rope_frequencies"], 3, kv_type.type))
    names = [arg.name for arg in session.get_outputs()]
    types: dict[str, set[str]] = {}
    for name, value in zip(names, session.run(names, feeds)):
        types.setdefault(watched.get(name, name.split(".")[0]), set()).add(value.dtype.name)
    return types


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_fp16_computes_in_float16_and_keeps_the_residual_stream_in_float32(
        name: str, onnx_model: Callable[[str, str], Path]) -> None:
    folder = onnx_model(name, "fp16")
    types = _output_types(folder)
    for operator in COMPUTE_OPERATORS & types.keys():
        assert types[operator] == {"float16"}, operator
    assert types["SkipSimplifiedLayerNormalization"] == {"float32"}
    assert types["present"] == {"float16"} and types["logits"] == {"float32"}
    half = json.loads((folder / ONNX_MARKER).read_text())
    full = json.loads((onnx_model(name, "fp32") / ONNX_MARKER).read_text())
    assert half["kv_dtype"] == "float16" and 2 * half["kv_bytes_per_token"] == full["kv_bytes_per_token"]
    assert _output_types(onnx_model(name, "fp32"))["GroupQueryAttention"] == {"float32"}


@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_tiny_fp16_agrees_with_transformers(name: str, onnx_model: Callable[[str, str], Path],
                                            tiny_checkpoint: Callable[[str], Path], settings: Settings) -> None:
    checkpoint = tiny_checkpoint(name)
    with Engine.load(str(onnx_model(name, "fp16")), settings, PlanRequest(n_ctx=1024)) as engine:
        backend = engine.backend
        _, tokens = prompt_and_text(checkpoint, backend.info.bos_id if backend.info.add_bos else None)
        scores = backend.score(0, tokens)
    ref_logprobs, ref_top1 = ReferenceModel(checkpoint).logprobs_and_top1(tokens)
    print(f"{name}: top-1 agreement {np.mean(scores.top1 == ref_top1):.1%}, "
          f"largest logprob difference {np.max(np.abs(scores.logprobs - ref_logprobs)):.4f}")
    # Measured on an AMD EPYC: 99.6-100% and at most 0.036 (fp32 agrees to 5e-3).
    assert np.mean(scores.top1 == ref_top1) >= 0.95
    np.testing.assert_allclose(scores.logprobs, ref_logprobs, atol=0.1)


def test_gemma_fp16_perplexity_equals_fp32s(onnx_model: Callable[[str, str], Path], gemma_checkpoint: Path,
                                            settings: Settings) -> None:
    """Measured on an AMD EPYC: perplexity 49.801 against fp32's 49.798, top-1 agreement 99.6%."""
    results = {}
    for precision in ("fp32", "fp16"):
        with Engine.load(str(onnx_model("gemma-270m", precision)), settings, PlanRequest(n_ctx=1024)) as engine:
            _, tokens = prompt_and_text(gemma_checkpoint, engine.backend.info.bos_id)
            results[precision] = engine.backend.score(0, tokens)
    base, half = results["fp32"], results["fp16"]
    assert half.perplexity <= base.perplexity * 1.005
    assert np.mean(base.top1 == half.top1) >= 0.98


def test_fp16_kv_cache_batches_and_moves_between_sequences(onnx_model: Callable[[str, str], Path],
                                                           settings: Settings) -> None:
    with Engine.load(str(onnx_model("qwen2", "fp16")), settings, PlanRequest(n_ctx=256, n_seq=2)) as engine:
        backend = engine.backend
        tokens = backend.tokenize("the quick brown fox jumps over the lazy dog " * 4, add_bos=True, special=False)[:40]

        def last_logits(seq: int) -> np.ndarray:
            return backend.logits(seq).copy()

        for seq, length in ((0, 30), (1, 17)):
            backend.truncate(seq, 0)
            backend.evaluate(seq, tokens[:length], 0)
        state = backend.save_state(0)
        backend.evaluate_batch([(1, tokens[17], 17), (0, tokens[30], 30)])
        batched = [last_logits(0), last_logits(1)]
        for seq, length in ((0, 30), (1, 17)):
            backend.truncate(seq, length)
            backend.evaluate(seq, [tokens[length]], length)
            np.testing.assert_allclose(last_logits(seq), batched[seq], atol=1e-2)
        backend.restore_state(1, state)  # sequence 0's 30 tokens, now in sequence 1
        backend.evaluate(1, [tokens[30]], 30)
        np.testing.assert_allclose(last_logits(1), batched[0], atol=1e-2)
