"""How many bits each weight of an ONNX conversion gets, by role, and in what blocks: the plans,
with what was measured for each choice."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUANTS = ("fp32", "fp16", "int8", "int4")
BLOCK_SIZE = 32
# The least block size MatMulNBits and GatherBlockQuantized take.
MIN_BLOCK = 16


@dataclass(frozen=True)
class QuantPlan:
    """Bits per weight role; 0 keeps float (32 or 16 bit storage)."""

    name: str
    linear_bits: int = 0
    embedding_bits: int = 0
    # Roles kept at 8 bits when linear_bits is 4: measured as the most sensitive on small models.
    sensitive_roles: tuple[str, ...] = ()
    # This many first and last layers keep every weight at 8 bits when linear_bits is 4.
    edge_layers: int = 0
    # Block size of 4-bit linear weights; of 8-bit ones, the first of these that divides the
    # matrix's input width (else the last).
    block_4bit: int = BLOCK_SIZE
    blocks_8bit: tuple[int, ...] = (BLOCK_SIZE,)
    # Block size of the embedding (and of the output head, tied or not).
    embedding_block: int = BLOCK_SIZE
    float_storage: type = np.float32
    # The type matrices, attention and the KV cache compute in. float16 keeps the residual stream
    # and its norms in float32: Gemma 3 270M's residual reaches 104,086 (the first position's, on
    # every text tried), past float16's 65,504, where the branches stay under 600.
    compute: type = np.float32
    # Quantize against activations measured on the calibration text: 4-bit matrices by GPTQ on
    # their inputs' second moments, 8-bit ones weighing each column's error by its mean squared
    # activation (llama.cpp's importance matrix).
    calibrate: bool = False
    # Smoothing (SmoothQuant, Xiao et al. 2022), with `calibrate`: each linear reads x / s and
    # multiplies its weight's columns by s, with s = rms(x) ** smooth per column, and 1/s is folded
    # into what makes x: the RMS norm before it, v's rows (o_proj), up's rows (down_proj), and the
    # lookup of a tied head's table (`test_smoothing_folds_exactly`). MatMulNBits' accuracy
    # level 4 quantizes x to int8 per block, and a few columns carry most of x (Gemma 3 270M's final
    # hidden state: mean |x| 38 in its largest column, 2.4 in the median one): smoothed, the other
    # columns keep their int8 resolution. 0 turns it off.
    smooth: float = 0.0

    def block(self, role: str, bits: int, k: int) -> int:
        """The block size of a `bits`-bit matrix of `role` with `k` inputs. The embedding's divides
        its width (halved down to MatMulNBits' least, 16): its lookup reads whole blocks, so one
        running past the row (SmolLM2's 576 in blocks of 128) gives rows too long for the model."""
        if role == "embedding":
            block = self.embedding_block
            while k % block and block > MIN_BLOCK:
                block //= 2
            return block
        if bits == 4:
            return self.block_4bit
        return next((block for block in self.blocks_8bit if k % block == 0), self.blocks_8bit[-1])

    def bits(self, role: str, layer: int = -1, n_layers: int = 0) -> int:
        if role == "embedding":
            return self.embedding_bits
        edge = 0 <= layer < self.edge_layers or layer >= n_layers - self.edge_layers >= 0
        if self.linear_bits == 4 and (role in self.sensitive_roles or edge):
            return 8
        return self.linear_bits


QUANT_PLANS: dict[str, QuantPlan] = {
    "fp32": QuantPlan("fp32"),
    "fp16": QuantPlan("fp16", float_storage=np.float16, compute=np.float16),
    "int8": QuantPlan("int8", linear_bits=8, embedding_bits=8),
    # Measured on Gemma 3 270M (bench text, perplexity vs fp32 20.62): all 4-bit but the embedding
    # 23.49 (+14%); attention and down projections at 8 bits 22.02; plus the first and last two
    # layers 21.85; plus 4-bit blocks of 16 21.4. The (tied) embedding/output matrix stays at 8
    # bits: it is most of this model's weights and the most sensitive. Calibrated (GPTQ for the
    # 4-bit MLP weights): first 256 tokens of the verification text +2.2% over fp32 (+4.5% with
    # the uncalibrated search), benchmark text +1.8% (+4.2%); KL divergence from fp32 halved.
    # The embedding/head in other formats (first 256 tokens / all of the verification text /
    # benchmark text, vs fp32; 8-bit blocks of 32: +2.2/+2.9/+1.8%): 4-bit blocks of 32
    # +94/+69/+7.6%; 8-bit blocks of 64 +3.2/+4.1/+2.1% (the head's activations are quantized
    # per block too); 8-bit symmetric +2.4/+3.1/+2.1%; 8-bit blocks of 16 +0.4/+1.9/+1.8%, but
    # 25 MiB more on disk and 86 MiB more peak RSS.
    # Smoothed (alpha 0.5), the head runs at 8-bit blocks of 128 (MatMulNBits 7.2 ms a token
    # against 10.8 at blocks of 32; a 4-bit head, 6.5 ms, is +81% with plain rounding and +5.7%
    # with GPTQ on its own): +2.9/+2.6/+2.2% with every linear smoothed, 264 MiB on disk against
    # 283, peak RSS 645 against 709 MiB. Smoothing only the head: +2.6/+3.3/+2.1%. Each figure is
    # one draw of the int8 activations' rounding noise: that plan (8-bit linears in blocks of 32,
    # 4-bit ones of 16, two edge layers) with its scales jittered by 1e-6 gave +3.5-4.5/+2.6-3.3/
    # +2.2-2.4% (4 draws).
    # Speed: MatMulNBits' CPU kernels run 8-bit blocks of 128 and 4-bit blocks of 32 much faster
    # than 8-bit blocks of 32 and 4-bit blocks of 16. Decode tok/s (medians of 8 alternating
    # rounds, 64 tokens after 512, AMD EPYC, 2 threads) / perplexity / on disk, against that
    # plan's 52.5 / +2.9/+2.6/+2.2% / 264 MiB: 8-bit linears in blocks of 128 56.7 /
    # +5.5/+3.7/+2.4% / 257 MiB; and 4-bit blocks of 32 64.4 / +5.3/+4.3/+2.6% / 252 MiB; and one
    # edge layer +5.2/+4.0/+2.6% / 250.25 MiB (59.3 against 49.7 tok/s over 10 rounds); no edge
    # layer +8.0/+5.7/+3.3%. This plan takes 8-bit blocks of 256 where the input width allows
    # (o_proj, down_proj): 249.6 MiB, decode 62.5 against 58.7 tok/s and prefill 420 against 403
    # (12 rounds), +5.2-6.0/+3.7-4.4/+2.5-2.9% (3 draws, scales jittered by 1e-6, against
    # +5.2-6.2/+4.0-4.9/+2.6-2.7%); a 512-token prompt peaks 16 MiB higher (595 MiB), a short
    # reply does not.
    # Decode is bound by the weights read a token: 249 MiB here (the head 166), 160 MiB in
    # onnxruntime-genai's all-4-bit model (its head 100). In this graph the builder's head format
    # (4-bit blocks of 32, symmetric; 5.5 ms a token alone against 6.8) decoded 17% faster, and
    # a 4-bit head costs +5.7% with GPTQ on its own.
    # Not taken: the head symmetric at 8 bits (1.25 MiB less, no zero points)
    # +4.7-6.1/+3.5-4.2/+2.7-2.9% (3 draws), top-1 agreement on the verification text 78-80%, at
    # `--verify`'s floor; the 8-bit linears symmetric +10.5/+7.4/+3.0%; o_proj at 4 bits too,
    # 246 MiB, +6.4/+5.0/+4.2%; q, v and o +12.8/+10.3/+4.7%; every linear, 232 MiB,
    # +16.5/+12.5/+8.8%, for 14-18% faster decoding; the embedding's rows from id 65536 on at 4
    # bits except single characters, 226 MiB and 7% faster, +2.3% on the benchmark text but +10.7%
    # on the verification text (+6.4% in blocks of 16, which decode slower): its Chinese, Japanese
    # and Korean lines hold such tokens. GPTQ for the 8-bit linears too: +5.7-6.0/+4.3-4.7/
    # +2.7-3.0% (2 draws), no better.
    "int4": QuantPlan(
        "int4", linear_bits=4, embedding_bits=8, sensitive_roles=("q_proj", "v_proj", "o_proj", "down_proj"),
        edge_layers=1, blocks_8bit=(256, 128), embedding_block=128, calibrate=True, smooth=0.5,
    ),
}
