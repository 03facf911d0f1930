"""Block-wise integer quantization of weight matrices in onnxruntime's MatMulNBits layout.

A weight (N outputs x K inputs, the Hugging Face layout) is cut into blocks of `block` values
along K. Each block gets a float scale and an integer zero point: w ~ (q - zero) * scale.
4-bit blocks search a few clipping ranges for the least squared error and then refit the scale;
that recovers much of what plain min/max rounding loses on small models.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Rows quantized at once: bounds the temporaries to a few hundred MB for wide matrices.
ROW_CHUNK = 4096
# Fractions of the min..max range tried for 4-bit blocks (1.0 is plain min/max).
CLIP_CANDIDATES_4BIT = (1.0, 0.96, 0.92, 0.88, 0.84, 0.80)


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


def _quantize_rows(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, k_blocks, block) float32 -> codes uint8, scales float32, zero points uint8."""
    qmax = float((1 << bits) - 1)
    lo = np.minimum(w.min(axis=-1), 0.0)
    hi = np.maximum(w.max(axis=-1), 0.0)
    span = np.maximum(hi - lo, 1e-12)
    candidates = CLIP_CANDIDATES_4BIT if bits == 4 else (1.0,)
    best_err = np.full(lo.shape, np.inf, dtype=np.float32)
    best_scale = np.zeros_like(lo)
    best_zero = np.zeros_like(lo)
    for fraction in candidates:
        scale = span * fraction / qmax
        # Anchor the clipped range at either end; keep whichever fits the block better.
        for zero in (np.round(-lo / scale), np.round(qmax - hi / scale)):
            zero = np.clip(zero, 0, qmax)
            codes = np.clip(np.round(w / scale[..., None]) + zero[..., None], 0, qmax)
            err = np.square((codes - zero[..., None]) * scale[..., None] - w).sum(axis=-1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_scale = np.where(better, scale, best_scale)
            best_zero = np.where(better, zero, best_zero)
    codes = np.clip(np.round(w / best_scale[..., None]) + best_zero[..., None], 0, qmax)
    # With the codes fixed, the least-squares scale.
    centred = codes - best_zero[..., None]
    denom = np.square(centred).sum(axis=-1)
    refit = np.where(denom > 0, (w * centred).sum(axis=-1) / np.maximum(denom, 1e-30), best_scale)
    return codes.astype(np.uint8), refit.astype(np.float32), best_zero.astype(np.uint8)


def quantize(weight: np.ndarray, bits: int, block: int = 32) -> BlockQuantized:
    """Quantize an (N, K) float matrix block-wise along K."""
    if bits not in (4, 8):
        raise ValueError(f"unsupported bit width {bits}; supported: 4, 8")
    n, k = weight.shape
    k_blocks = -(-k // block)
    packed = np.empty((n, k_blocks, block * bits // 8), dtype=np.uint8)
    scales = np.empty((n, k_blocks), dtype=np.float32)
    zero_width = -(-k_blocks * bits // 8)
    zero_points = np.zeros((n, zero_width), dtype=np.uint8)
    for start in range(0, n, ROW_CHUNK):
        rows = np.asarray(weight[start : start + ROW_CHUNK], dtype=np.float32)
        if k_blocks * block != k:
            rows = np.pad(rows, ((0, 0), (0, k_blocks * block - k)))
        codes, part_scales, zeros = _quantize_rows(rows.reshape(len(rows), k_blocks, block), bits, block)
        packed[start : start + len(rows)] = pack(codes, bits)
        scales[start : start + len(rows)] = part_scales
        if bits == 4 and k_blocks % 2:
            zeros = np.pad(zeros, ((0, 0), (0, 1)))
        zero_points[start : start + len(rows)] = pack(zeros, bits)
    return BlockQuantized(packed, scales, zero_points, bits, block, k)
