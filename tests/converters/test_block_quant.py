"""The 4/8-bit block quantizer behind MatMulNBits weights (pure logic)."""

from __future__ import annotations

import numpy as np
import pytest

from localchat.converters.block_quant import quantize, quantize_gptq


def output_error(restored: np.ndarray, weight: np.ndarray, second_moments: np.ndarray) -> float:
    """Mean squared output error of the restored weight on inputs with these second moments."""
    delta = restored - weight
    return float(np.einsum("nk,kl,nl->", delta, second_moments, delta) / len(weight))


def correlated_inputs(k: int, rng: np.random.Generator) -> np.ndarray:
    """2000 activations of width k with correlated columns of very different scales, as a
    network's hidden states have."""
    mixing = rng.standard_normal((k, k)) * 0.3 + np.eye(k)
    return (rng.standard_normal((2000, k)) @ mixing) * np.exp(rng.normal(0.0, 1.0, k))


@pytest.mark.parametrize(("bits", "block", "worst"), [(8, 32, 1 / 255), (4, 32, 1 / 15), (4, 16, 1 / 15)])
def test_round_trip_error_is_within_a_step_or_two_of_each_block(bits: int, block: int, worst: float) -> None:
    weight = np.random.default_rng(0).standard_normal((48, 100)).astype(np.float32)  # k not a multiple of the block
    quantized = quantize(weight, bits, block)
    restored = quantized.dequantize()
    assert restored.shape == weight.shape
    # Rounding a code costs half a step; a clipped range (4 bits) trades a little more at a
    # block's edge for finer steps inside. A wrong scale, zero point or packing order would
    # miss by many steps.
    padded = np.pad(weight, ((0, 0), (0, -weight.shape[1] % block))).reshape(48, -1, block)
    span = (np.maximum(padded.max(axis=-1), 0) - np.minimum(padded.min(axis=-1), 0))
    step = np.repeat(span * worst, block, axis=1)[:, : weight.shape[1]]
    error = np.abs(restored - weight) / step
    assert error.max() <= (1.1 if bits == 8 else 2.0) and error.mean() <= 0.3


def test_four_bit_search_beats_min_max_rounding() -> None:
    weight = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    blocks = weight.reshape(64, -1, 32)
    lo, hi = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    scale = (hi - lo) / 15
    zero = np.round(-lo / scale)
    min_max = ((np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 15) - zero[..., None]) * scale[..., None])
    searched = quantize(weight, 4, 32).dequantize()
    # Measured: 0.92 of min/max rounding's squared error on Gaussian weights.
    assert np.square(searched - weight).mean() < 0.96 * np.square(min_max.reshape(64, -1) - weight).mean()


def test_importance_lowers_the_error_where_activations_are_large() -> None:
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((64, 128)).astype(np.float32)
    importance = np.exp(rng.normal(0.0, 1.5, 128)).astype(np.float32)
    plain = np.square(quantize(weight, 4, 16).dequantize() - weight) @ importance
    weighted = np.square(quantize(weight, 4, 16, importance).dequantize() - weight) @ importance
    assert weighted.mean() < 0.85 * plain.mean()  # measured 0.72


def test_gptq_lowers_the_output_error_on_correlated_inputs() -> None:
    rng = np.random.default_rng(3)
    k = 96  # 6 blocks of 16: not a multiple of GPTQ's 128-column span
    inputs = correlated_inputs(k, rng)
    moments = inputs.T @ inputs / len(inputs)
    weight = rng.standard_normal((80, k)).astype(np.float32)
    diagonal = output_error(quantize(weight, 4, 16, np.diag(moments)).dequantize(), weight, moments)
    gptq = quantize_gptq(weight, 4, 16, moments)
    assert gptq.dequantize().shape == weight.shape
    # Measured: 0.68 of the importance-weighted rounding's output error here, 0.41 on the MLP
    # inputs of Gemma 3 270M.
    assert output_error(gptq.dequantize(), weight, moments) < 0.8 * diagonal


def test_gptq_pads_a_width_that_is_not_a_multiple_of_the_block() -> None:
    rng = np.random.default_rng(4)
    inputs = correlated_inputs(40, rng)
    moments = inputs.T @ inputs / len(inputs)
    weight = rng.standard_normal((8, 40)).astype(np.float32)
    quantized = quantize_gptq(weight, 4, 16, moments)
    assert quantized.scales.shape == (8, 3) and quantized.packed.shape == (8, 3, 8)
    plain = output_error(quantize(weight, 4, 16).dequantize(), weight, moments)
    assert output_error(quantized.dequantize(), weight, moments) < plain
