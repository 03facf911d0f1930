"""Block-wise integer quantization of weight matrices in onnxruntime's MatMulNBits layout.

A weight (N outputs x K inputs, the Hugging Face layout) is cut into blocks of `block` values
along K. Each block gets a float scale and an integer zero point: w ~ (q - zero) * scale.
4-bit blocks search a few clipping ranges and zero-point anchors for the least squared error,
refitting the scale by least squares for each (llama.cpp's make_qkx2_quants, with the integer
zero point MatMulNBits needs). The error of each input column can be weighted by the mean squared
activation it meets (an importance matrix), and `quantize_gptq` goes further with the inputs'
full second moments: each column's rounding error is compensated in the columns not yet
quantized (GPTQ, Frantar et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Rows quantized at once: bounds the temporaries to a few hundred MB for wide matrices.
ROW_CHUNK = 4096
# Fractions of the min..max range tried for 4-bit blocks (1.0 is plain min/max).
CLIP_CANDIDATES_4BIT = (1.0, 0.96, 0.92, 0.88, 0.84, 0.80)
# Rounds of re-rounding with the refit scale after the search (4-bit).
REFINE_ROUNDS = 2
# GPTQ: added to the second-moment matrix's diagonal, as a share of its mean (keeps it invertible
# when the calibration text has fewer tokens than inputs); columns updated together.
GPTQ_DAMPING = 0.01
GPTQ_COLUMNS = 128
# Least error weight of an input column, as a share of the mean: a column that the calibration
# text hardly used may still matter on other text.
IMPORTANCE_FLOOR = 0.01


@dataclass(frozen=True)
class BlockQuantized:
    """MatMulNBits inputs: packed codes (N, k_blocks, block*bits/8), scales (N, k_blocks),
    packed zero points (N, ceil(k_blocks*bits/8))."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    bits: int
    block: int
    k: int

    def dequantize(self) -> np.ndarray:
        """The float32 (N, K) matrix these codes stand for (tests, error checks)."""
        codes = unpack(self.packed, self.bits).astype(np.float32)
        zeros = unpack(self.zero_points, self.bits)[:, : self.scales.shape[1]].astype(np.float32)
        values = (codes - zeros[..., None]) * self.scales[..., None]
        return values.reshape(values.shape[0], -1)[:, : self.k]


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes -> bytes, low bits first along the last axis (which must be even for 4 bits)."""
    if bits == 8:
        return codes.astype(np.uint8)
    if bits == 4:
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    raise ValueError(f"unsupported bit width {bits}; supported: 4, 8")


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return packed
    low, high = packed & 0x0F, packed >> 4
    return np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)


def _column_weights(importance: np.ndarray) -> np.ndarray:
    importance = np.asarray(importance, dtype=np.float32)
    mean = float(importance.mean())
    if not mean > 0:
        return np.ones_like(importance)
    return np.maximum(importance / mean, IMPORTANCE_FLOOR)


def _fit(w: np.ndarray, weights: np.ndarray, scale: np.ndarray, zero: np.ndarray, qmax: float
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round `w` with `scale` and `zero`, then refit the scale by weighted least squares for those
    codes: (codes, refit scale, weighted squared error)."""
    codes = np.clip(np.round(w / scale[..., None]) + zero[..., None], 0, qmax)
    centred = codes - zero[..., None]
    weighted = weights * centred
    denom = (weighted * centred).sum(axis=-1)
    refit = np.where(denom > 0, (weighted * w).sum(axis=-1) / np.maximum(denom, 1e-30), scale)
    err = (weights * np.square(centred * refit[..., None] - w)).sum(axis=-1)
    return codes, refit, err


def _quantize_rows(w: np.ndarray, bits: int, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, k_blocks, block) float32 and per-value error weights -> codes uint8, scales float32,
    zero points uint8."""
    qmax = float((1 << bits) - 1)
    lo = np.minimum(w.min(axis=-1), 0.0)
    hi = np.maximum(w.max(axis=-1), 0.0)
    span = np.maximum(hi - lo, 1e-12)
    search = bits == 4  # 8-bit rounding error is small: min/max and a refit scale do
    best_err = np.full(lo.shape, np.inf, dtype=np.float32)
    best_scale = np.zeros_like(lo)
    best_zero = np.zeros_like(lo)
    codes = np.zeros(w.shape, dtype=np.float32)
    for fraction in CLIP_CANDIDATES_4BIT if search else (1.0,):
        scale = span * fraction / qmax
        # Anchor the clipped range at either end or centre it; keep whichever fits the block best.
        anchors = (-lo / scale, qmax - hi / scale, (qmax - (hi + lo) / scale) / 2) if search else (-lo / scale,)
        for zero in anchors:
            zero = np.clip(np.round(zero), 0, qmax)
            found, refit, err = _fit(w, weights, scale, zero, qmax)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_scale = np.where(better, refit, best_scale)
            best_zero = np.where(better, zero, best_zero)
            codes = np.where(better[..., None], found, codes)
    # Rounding again with the refit scale moves a few codes; keep that only where it helps.
    for _ in range(REFINE_ROUNDS if search else 0):
        found, refit, err = _fit(w, weights, best_scale, best_zero, qmax)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, refit, best_scale)
        codes = np.where(better[..., None], found, codes)
    return codes.astype(np.uint8), best_scale.astype(np.float32), best_zero.astype(np.uint8)


def _check_bits(bits: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"unsupported bit width {bits}; supported: 4, 8")


def _packed(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, bits: int, block: int, k: int) -> BlockQuantized:
    """Codes (N, k_blocks, block), scales and zero points (N, k_blocks) in MatMulNBits' layout."""
    if bits == 4 and zeros.shape[1] % 2:
        zeros = np.pad(zeros, ((0, 0), (0, 1)))
    return BlockQuantized(pack(codes, bits), scales.astype(np.float32), pack(zeros, bits), bits, block, k)


def quantize(weight: np.ndarray, bits: int, block: int = 32, importance: np.ndarray | None = None) -> BlockQuantized:
    """Quantize an (N, K) float matrix block-wise along K. `importance` (K,), when given, weighs
    each input column's squared error (the mean squared activation it meets: the output error)."""
    _check_bits(bits)
    n, k = weight.shape
    k_blocks = -(-k // block)
    codes = np.empty((n, k_blocks, block), dtype=np.uint8)
    scales = np.empty((n, k_blocks), dtype=np.float32)
    zeros = np.empty((n, k_blocks), dtype=np.uint8)
    weights = np.ones(k, dtype=np.float32) if importance is None else _column_weights(importance)
    weights = np.pad(weights, (0, k_blocks * block - k)).reshape(k_blocks, block)
    for start in range(0, n, ROW_CHUNK):
        rows = np.asarray(weight[start : start + ROW_CHUNK], dtype=np.float32)
        rows = np.pad(rows, ((0, 0), (0, k_blocks * block - k)))
        part = slice(start, start + len(rows))
        codes[part], scales[part], zeros[part] = _quantize_rows(rows.reshape(len(rows), k_blocks, block), bits, weights)
    return _packed(codes, scales, zeros, bits, block, k)


def quantize_gptq(weight: np.ndarray, bits: int, block: int, second_moments: np.ndarray) -> BlockQuantized:
    """Quantize an (N, K) matrix block-wise along K, minimizing the output error on inputs whose
    mean of x x^T is `second_moments` (K, K): columns are rounded in order, and each one's error
    is spread over the columns after it through the inverse second-moment matrix (GPTQ). A block's
    scale and zero point are searched as in `quantize` when its first column is reached."""
    _check_bits(bits)
    n, k = weight.shape
    k_blocks = -(-k // block)
    padded = k_blocks * block
    w = np.pad(np.asarray(weight, dtype=np.float32), ((0, 0), (0, padded - k)))
    moments = np.eye(padded, dtype=np.float64)  # padding columns: independent, and zero anyway
    moments[:k, :k] = second_moments
    diagonal = np.diag(moments)[:k].copy()
    moments[np.diag_indices(k)] += GPTQ_DAMPING * max(float(diagonal.mean()), 1e-12)
    # Upper Cholesky factor of the inverse: row i holds how column i's error moves later columns.
    inverse = np.linalg.cholesky(np.linalg.inv(moments)).T.astype(np.float32)
    weights = np.pad(_column_weights(diagonal), (0, padded - k))
    qmax = float((1 << bits) - 1)
    codes = np.empty((n, padded), dtype=np.uint8)
    scales = np.empty((n, k_blocks), dtype=np.float32)
    zeros = np.empty((n, k_blocks), dtype=np.uint8)
    span = block * max(1, GPTQ_COLUMNS // block)
    for first in range(0, padded, span):
        last = min(first + span, padded)
        part = w[:, first:last].copy()
        errors = np.zeros_like(part)
        for i in range(last - first):
            column = first + i
            if column % block == 0:
                b = column // block
                _, found_scales, found_zeros = _quantize_rows(part[:, None, i : i + block], bits, weights[column : column + block])
                scales[:, b], zeros[:, b] = found_scales[:, 0], found_zeros[:, 0]
                scale, zero = scales[:, b], zeros[:, b].astype(np.float32)
            q = np.clip(np.round(part[:, i] / scale) + zero, 0, qmax)
            codes[:, column] = q
            errors[:, i] = (part[:, i] - (q - zero) * scale) / inverse[column, column]
            part[:, i:] -= np.outer(errors[:, i], inverse[column, column:last])
        w[:, last:] -= errors @ inverse[first:last, last:]
    return _packed(codes.reshape(n, k_blocks, block), scales, zeros, bits, block, k)
