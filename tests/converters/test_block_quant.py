"""The 4/8-bit block quantizer behind MatMulNBits weights (pure logic)."""

from __future__ import annotations

import numpy as np
import pytest

from converters.block_quant import quantize


@pytest.mark.parametrize(("bits", "block", "worst"), [(8, 32, 1 / 255), (4, 32, 1 / 15), (4, 16, 1 / 15)])
def test_round_trip_error_is_about_one_step_of_each_block_at_most(bits: int, block: int, worst: float) -> None:
    weight = np.random.default_rng(0).standard_normal((48, 100)).astype(np.float32)  # k not a multiple of the block
    quantized = quantize(weight, bits, block)
    restored = quantized.dequantize()
    assert restored.shape == weight.shape
    # Rounding a code costs half a step; the rounded zero point can clip a block's edge by another
    # half. A wrong scale, zero point or packing order would miss by many steps.
    padded = np.pad(weight, ((0, 0), (0, -weight.shape[1] % block))).reshape(48, -1, block)
    span = (np.maximum(padded.max(axis=-1), 0) - np.minimum(padded.min(axis=-1), 0))
    step = np.repeat(span * worst, block, axis=1)[:, : weight.shape[1]]
    error = np.abs(restored - weight) / step
    assert error.max() <= 1.1 and error.mean() <= 0.3
