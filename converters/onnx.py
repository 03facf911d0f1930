"""Hugging Face checkpoint -> an ONNX decoder graph on onnxruntime's fused contrib operators.

The graph is written straight from the checkpoint's weights with the `onnx` package (no torch
export): GroupQueryAttention with rotary inside it and past/present KV buffers that can be the same
memory, SkipSimplifiedLayerNormalization between blocks, MatMulNBits for quantized weights. Beside
it go the tokenizer files and `localchat_onnx.json`, which tells the runtime what it needs.

Graph inputs: input_ids (batch, seq) int64; seqlens_k (batch) int32 = tokens held after this step
minus one; total_sequence_length () int32; logits_count (1) int64, how many last positions get
logits; past_key_values.{i}.key/value (batch, kv_heads, max_length, head_dim); rotary.{kind}.cos/sin
(positions, rotary_dim / 2), GroupQueryAttention's tables, which the runtime computes at load for
its context from the marker's `rope_frequencies` (stored, they took 64 MiB for 32k positions).
Outputs: logits (batch, logits_count, vocab) float32 and present.{i}.key/value, the same buffers
when bound so.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import TensorProto

from localchat.converters.block_quant import quantize, quantize_gptq, unpack
from localchat.converters.checkpoint import Checkpoint, ModelConfig, RopeSettings
from localchat.converters.onnx_graph import MS_DOMAIN, ExternalData, GraphBuilder
from localchat.backends.onnx import rotary_input_names, rotary_tables
from localchat.errors import ModelError
from localchat.models import ONNX_MARKER

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
# 2: the rotary tables are graph inputs, computed at load.
FORMAT_VERSION = 2
QUANTS = ("fp32", "fp16", "int8", "int4")
BLOCK_SIZE = 32
# MatMulNBits accuracy level 4: activations are quantized to int8 per block and the product runs
# on the CPU's int8 dot-product units; measured fastest on AVX2/AVX-512 machines.
CPU_ACCURACY_LEVEL = 4
# MatMulNBits over more stored bytes than this is split by rows (`_Build.matmul_nbits`): Gemma 3
# 270M's int4 peak RSS, loading and writing 8 tokens, went 646 -> 511 MiB with its 160 MiB head in
# 11 runs of rows rather than one, logits unchanged to the bit. Runs are whole multiples of
# PACK_CHUNK_ROWS rows, so they start on a page of the data file whatever a row's size.
PACK_CHUNK_BYTES = 16 * 2**20
PACK_CHUNK_ROWS = 4096
# The runtime caps its context to this many positions (or the checkpoint's own context, if less).
MAX_POSITIONS = 32768
# Files copied next to the graph when the checkpoint has them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "tokenizer.model",
)
CALIBRATION_ASSET = "calibration_text.txt"
# Calibration tokens (the shipped text has about 1.7k in Gemma's vocabulary), run through the
# 8-bit model this many at a time with the KV cache between.
CALIBRATION_TOKENS = 4096
CALIBRATION_CHUNK = 512
# The final norm's node: the output head's smoothing is looked up by its output's name.
FINAL_NORM = "final_norm"
# Turn-ending tokens that models emit instead of their EOS token.
KNOWN_EOG_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|eom_id|>")

Progress = Callable[[int, int, str], None]


class UnsupportedModelError(ModelError):
    """A checkpoint this converter cannot express as an onnxruntime graph."""


@dataclass(frozen=True)
class OnnxArchitecture:
    """How one Hugging Face decoder maps onto the graph: names of its norms and its quirks."""

    name: str  # the llama.cpp-style architecture name (chat template fallbacks key on it)
    pre_mlp_norm: str = "post_attention_layernorm"
    post_attn_norm: str | None = None  # Gemma's "sandwich" norms after attention and MLP
    post_mlp_norm: str | None = None
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (1 + weight)
    scale_embeddings: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size)
    qk_norm: bool = False  # per-head RMSNorm on Q and K before rotary
    window_all_layers: bool = False  # Mistral's sliding window applies to every layer


GEMMA3 = OnnxArchitecture(
    "gemma3",
    pre_mlp_norm="pre_feedforward_layernorm",
    post_attn_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    norm_offset=1.0,
    scale_embeddings=True,
    qk_norm=True,
)
ARCHITECTURES: dict[str, OnnxArchitecture] = {
    "LlamaForCausalLM": OnnxArchitecture("llama"),
    "MistralForCausalLM": OnnxArchitecture("llama", window_all_layers=True),
    "Qwen2ForCausalLM": OnnxArchitecture("qwen2"),
    "Qwen3ForCausalLM": OnnxArchitecture("qwen3", qk_norm=True),
    "Gemma3ForCausalLM": GEMMA3,
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


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
        """The block size of a `bits`-bit matrix of `role` with `k` inputs."""
        if role == "embedding":
            return self.embedding_block
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


def architecture_for(config: ModelConfig) -> OnnxArchitecture:
    try:
        arch = ARCHITECTURES[config.architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(f"cannot convert architecture {config.architecture} to ONNX; supported: {supported}") from None
    if config.raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("this checkpoint uses bidirectional attention (an embedding model); convert a causal LM")
    activation = config.raw.get("hidden_activation") or config.raw.get("hidden_act") or "silu"
    if activation not in ACTIVATIONS:
        raise UnsupportedModelError(f"activation '{activation}' is not supported; supported: {', '.join(ACTIVATIONS)}")
    return arch


# -- rotary tables ------------------------------------------------------------------


def _inverse_frequencies(rope: RopeSettings, head_dim: int) -> tuple[np.ndarray, float]:
    """Per-pair inverse frequencies (float32, as transformers computes them) and a position scale."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(rope.theta) ** exponents)).astype(np.float32)
    kind = rope.scaling_type
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return (inv_freq / np.float32(rope.scaling["factor"])).astype(np.float32), 1.0
    if kind == "llama3":
        factor = float(rope.scaling["factor"])
        low = float(rope.scaling.get("low_freq_factor", 1.0))
        high = float(rope.scaling.get("high_freq_factor", 4.0))
        original = float(rope.scaling.get("original_max_position_embeddings", 8192))
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        scaled = np.where(wavelength > original / low, inv_freq / factor, inv_freq)
        medium = (wavelength <= original / low) & (wavelength >= original / high)
        scaled = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
        return scaled.astype(np.float32), 1.0
    raise UnsupportedModelError(f"RoPE scaling '{kind}' is not supported for ONNX; supported: default, linear, llama3")


def rope_frequencies(config: ModelConfig) -> dict[str, list[float]]:
    """The marker's `rope_frequencies`: per kind of attention layer ("global", and "local" for
    sliding-window layers with their own RoPE), the inverse frequency of each rotary pair."""
    kinds = {"global": config.rope, "local": config.rope_local}
    return {kind: [float(f) for f in _inverse_frequencies(rope, config.head_dim)[0]] for kind, rope in kinds.items() if rope is not None}


# -- the graph ----------------------------------------------------------------------


@dataclass
class _Build:
    """State of one conversion: the checkpoint, the graph and what the JSON will say."""

    checkpoint: Checkpoint
    arch: OnnxArchitecture
    quant: QuantPlan
    graph: GraphBuilder
    progress: Progress
    done_bytes: int = 0
    layer_bytes: list[int] = field(default_factory=list)
    # By the name of the tensor a linear reads: the mean of x x^T over the calibration text where a
    # 4-bit linear reads it (K, K), else the mean of x^2 (K,).
    activations: dict[str, np.ndarray] = field(default_factory=dict)
    # When building the calibration model for the plan `calibrating_for`: the linears' inputs, each
    # with its width and whether a 4-bit linear reads it.
    calibrating_for: QuantPlan | None = None
    probes: dict[str, tuple[int, bool]] = field(default_factory=dict)
    # By matrix: how it is stored ("int4/32": 4 bits in blocks of 32; "float32"), for the JSON.
    formats: dict[str, str] = field(default_factory=dict)

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config

    @property
    def compute_type(self) -> int:
        return TensorProto.FLOAT16 if self.quant.compute is np.float16 else TensorProto.FLOAT

    def to_compute(self, x: str) -> str:
        """`x`, a float32 value of the residual stream or its norms, in the compute type."""
        if self.compute_type == TensorProto.FLOAT:
            return x
        return self.graph.op1("Cast", [x], f"{x}/to_compute", to=self.compute_type)

    def to_residual(self, y: str) -> str:
        """`y`, a branch's output in the compute type, in float32 for the residual stream."""
        if self.compute_type == TensorProto.FLOAT:
            return y
        return self.graph.op1("Cast", [y], f"{y}/to_float32", to=TensorProto.FLOAT)

    def tensor(self, name: str) -> np.ndarray:
        ref = self.checkpoint.tensors.get(name)
        if ref is None:
            raise ModelError(f"{self.checkpoint.folder} lacks tensor '{name}'; is this a complete {self.config.architecture} checkpoint?")
        array = self.checkpoint.read_float32(ref)
        self.checkpoint.release(ref)
        self.done_bytes += ref.n_bytes
        self.progress(self.done_bytes, self.checkpoint.n_bytes, name)
        return array

    def has(self, name: str) -> bool:
        return name in self.checkpoint.tensors

    def norm_weight(self, name: str, dtype: type = np.float32, smooth: np.ndarray | None = None) -> str:
        """A norm's weight as the graph multiplies by it, divided by the smoothing of the linear
        that reads the norm."""
        weight = self.tensor(name) + np.float32(self.arch.norm_offset)
        return self.graph.weight(name, (weight if smooth is None else weight / smooth).astype(dtype))

    def bits(self, role: str, layer: int = -1) -> int:
        return self.quant.bits(role, layer, self.config.n_layers)

    def probe(self, x: str, k: int, role: str, layer: int = -1) -> None:
        """When calibrating: measure `x`, the input of a linear of `role` (k wide)."""
        if self.calibrating_for is not None:
            four_bit = self.calibrating_for.bits(role, layer, self.config.n_layers) == 4
            self.probes[x] = (k, four_bit or self.probes.get(x, (k, False))[1])

    def smoothing(self, x: str) -> np.ndarray | None:
        """The smoothing factors s (QuantPlan.smooth) for the linear input `x`, if measured."""
        seen = self.activations.get(x)
        if not self.quant.smooth or seen is None:
            return None
        mean_square = np.diag(seen) if seen.ndim == 2 else seen
        factors = np.maximum(mean_square, np.finfo(np.float32).tiny).astype(np.float64) ** (self.quant.smooth / 2)
        return (factors / np.exp(np.log(factors).mean())).astype(np.float32)

    def matmul_nbits(self, x: str, stored: tuple[str, str, str], name: str, *, k: int, n: int, bits: int, block: int) -> str:
        """MatMulNBits of `x` by an (n, k) matrix's stored (qweight, scales, zero_points). A matrix
        of more than PACK_CHUNK_BYTES runs as several over runs of its rows, their outputs
        concatenated: onnxruntime maps an initializer, packs it into memory of its own and only then
        releases the mapping, so loading holds one chunk twice rather than the whole matrix."""
        g = self.graph
        attrs: dict[str, object] = {"K": k, "bits": bits, "block_size": block, "accuracy_level": CPU_ACCURACY_LEVEL}
        row_bytes = math.ceil(k / block) * block * bits // 8
        rows = max(PACK_CHUNK_ROWS, PACK_CHUNK_BYTES // row_bytes // PACK_CHUNK_ROWS * PACK_CHUNK_ROWS)
        if n <= rows:
            return g.op1("MatMulNBits", [x, *stored], name, domain=MS_DOMAIN, N=n, **attrs)
        parts = []
        for first in range(0, n, rows):
            count = min(rows, n - first)
            views = [g.rows(f"{tensor}.rows{first}", tensor, first, count) for tensor in stored]
            parts.append(g.op1("MatMulNBits", [x, *views], f"{name}/rows{first}", domain=MS_DOMAIN, N=count, **attrs))
        for tensor in stored:
            g.drop(tensor)
        return g.op1("Concat", parts, name, axis=-1)

    def linear(self, x: str, weight: np.ndarray, name: str, role: str, bias: np.ndarray | None = None, layer: int = -1,
               smooth: np.ndarray | None = None) -> str:
        """x @ weight.T (+ bias), weight in the Hugging Face (out, in) layout; `x` arrives divided
        by `smooth` (per column) when given."""
        g, bits = self.graph, self.bits(role, layer)
        n, k = weight.shape
        self.probe(x, k, role, layer)
        if smooth is not None:
            weight = weight * smooth
        if bits:
            block = self.quant.block(role, bits, k)
            self.formats[name] = f"int{bits}/{block}" + (" smoothed" if smooth is not None else "")
            seen = self.activations.get(x)
            if smooth is not None and seen is not None:
                seen = seen / (np.outer(smooth, smooth) if seen.ndim == 2 else smooth**2)
            if bits == 4 and seen is not None and seen.ndim == 2:
                q = quantize_gptq(weight, bits, block, seen)
            else:
                q = quantize(weight, bits, block, seen if seen is None or seen.ndim == 1 else np.diag(seen))
            stored = (
                g.weight(f"{name}.qweight", q.packed),
                g.weight(f"{name}.scales", q.scales),
                g.weight(f"{name}.zero_points", q.zero_points),
            )
            y = self.matmul_nbits(x, stored, name, k=k, n=n, bits=bits, block=block)
        else:
            self.formats[name] = np.dtype(self.quant.float_storage).name + (" smoothed" if smooth is not None else "")
            stored = g.weight(f"{name}.weight_t", np.ascontiguousarray(weight.T).astype(self.quant.float_storage))
            if self.quant.float_storage is not self.quant.compute:
                stored = g.op1("Cast", [stored], f"{name}/cast", to=self.compute_type)
            y = g.op1("MatMul", [x, stored], name)
        if bias is not None:
            y = g.op1("Add", [y, g.weight(f"{name}.bias", bias.astype(self.quant.compute))], f"{name}/bias")
        return y


def _embedding(build: _Build, input_ids: str) -> tuple[str, Callable[[str], str], np.ndarray | None]:
    """The embedding lookup, a function making logits from final hidden states (the output head,
    sharing the embedding's weights when the checkpoint ties them), and the head's smoothing."""
    g, config = build.graph, build.config
    table = build.tensor("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or not build.has("lm_head.weight")
    bits = build.bits("embedding")
    n_vocab, hidden = table.shape
    block = build.quant.embedding_block
    head_smooth = build.smoothing(g.output_name(FINAL_NORM))
    # Tied, the table holds the head's smoothed columns, and the lookup undoes them.
    table_smooth = head_smooth if tied else None
    smoothed = " smoothed" if table_smooth is not None else ""
    build.formats["embed_tokens"] = (f"int{bits}/{block}" if bits else np.dtype(build.quant.float_storage).name) + smoothed
    if tied:
        build.formats["lm_head"] = build.formats["embed_tokens"] + " (tied)"
    if table_smooth is not None:
        table = table * table_smooth
    if bits:
        q = quantize(table, bits, block)
        del table
        # GatherBlockQuantized wants scales and zero points of the data's rank, one zero point a
        # block (in the low bits of its byte), where MatMulNBits wants (vocab, blocks) and packs two
        # 4-bit zero points a byte.
        data = g.weight("embed_tokens.qweight", q.packed)
        scales = g.weight("embed_tokens.scales", q.scales[..., None])
        zeros = g.weight("embed_tokens.zero_points", unpack(q.zero_points, bits)[:, : q.scales.shape[1], None])
        gathered = g.op1(
            "GatherBlockQuantized", [data, input_ids, scales, zeros], "embed_tokens", domain=MS_DOMAIN,
            bits=bits, block_size=block, gather_axis=0, quantize_axis=2,
        )
        x = g.op1("Reshape", [gathered, g.constant("embed_shape", [0, 0, hidden])], "embed_tokens/reshape")

        if tied:
            # The head reads the same stored bytes under its own names (views): onnxruntime maps
            # each initializer by itself and releases the head's after packing it, so of the
            # table only the rows looked up stay resident. Measured on Gemma 3 270M: peak RSS
            # 787 -> 710 MiB, 768 -> 607 MiB after loading; 25 MiB less on disk than two copies
            # of the scales and zero points.
            head_data = g.view("lm_head.qweight", data, q.packed.shape)
            head_scales = g.view("lm_head.scales", scales, q.scales.shape)
            if bits == 8:  # a byte a zero point for both operators
                head_zeros = g.view("lm_head.zero_points", zeros, q.zero_points.shape)
            else:  # MatMulNBits packs two 4-bit zero points a byte
                head_zeros = g.weight("lm_head.zero_points", q.zero_points)

            def head(h: str) -> str:
                build.probe(h, hidden, "embedding")
                stored = (head_data, head_scales, head_zeros)
                return build.matmul_nbits(h, stored, "lm_head", k=hidden, n=n_vocab, bits=bits, block=block)
        del q
    else:
        stored = g.weight("embed_tokens.weight", table.astype(build.quant.float_storage, copy=False))
        if build.quant.float_storage is not build.quant.compute:
            stored = g.op1("Cast", [stored], "embed_tokens/cast", to=build.compute_type)
        x = build.to_residual(g.op1("Gather", [stored, input_ids], "embed_tokens"))
        if tied:

            def head(h: str) -> str:
                # Gemm with transB reads the (vocab, hidden) table in place: no transposed copy.
                flat = g.op1("Reshape", [h, g.constant("flat_shape", [-1, hidden])], "lm_head/flatten")
                logits = g.op1("Gemm", [flat, stored], "lm_head", transB=1)
                shape = g.op1("Shape", [h], "lm_head/shape", end=2)
                full = g.op1("Concat", [shape, g.constant("vocab_dim", [n_vocab])], "lm_head/out_shape", axis=0)
                return g.op1("Reshape", [logits, full], "lm_head/unflatten")

    if not tied:

        def head(h: str) -> str:
            return build.linear(h, build.tensor("lm_head.weight"), "lm_head", "embedding", smooth=head_smooth)

    scale = np.float32(np.sqrt(hidden) if build.arch.scale_embeddings else 1.0)
    if table_smooth is not None:
        x = g.op1("Mul", [x, g.weight("embed_scale", scale / table_smooth)], "embed_tokens/scale")
    elif build.arch.scale_embeddings:
        x = g.op1("Mul", [x, g.weight("embed_scale", np.asarray(scale))], "embed_tokens/scale")
    return x, head, head_smooth


def _attention(build: _Build, x: str, i: int, rotary: dict[str, tuple[str, str]], io: dict[str, str]) -> tuple[str, np.ndarray | None]:
    """The attention block's output, and the smoothing its input norm must fold in."""
    g, config, arch = build.graph, build.config, build.arch
    prefix = f"model.layers.{i}.self_attn"
    heads, kv_heads, head_dim = config.n_heads, config.n_kv_heads, config.head_dim
    weights = [build.tensor(f"{prefix}.{p}_proj.weight") for p in "qkv"]
    biases = [build.tensor(f"{prefix}.{p}_proj.bias") if build.has(f"{prefix}.{p}_proj.bias") else None for p in "qkv"]
    # q and k at the linear bits, v by its own role: fused only when they share a format.
    same_bits = build.bits("q_proj", i) == build.bits("v_proj", i)
    name = f"layers.{i}.attn"
    x = build.to_compute(x)
    smooth = build.smoothing(x)
    # o_proj's smoothing goes into v's rows: attention output column (head, d) mixes v's column
    # d of the head's KV group, so the heads of a group share one factor, their geometric mean.
    o_smooth = build.smoothing(g.output_name(f"{name}.gqa"))
    if o_smooth is not None:
        per_group = np.exp(np.log(o_smooth).reshape(kv_heads, heads // kv_heads, head_dim).mean(axis=1))
        o_smooth = np.repeat(per_group, heads // kv_heads, axis=0).reshape(-1)
        weights[2] = weights[2] / per_group.reshape(-1, 1)
        if biases[2] is not None:
            biases[2] = biases[2] / per_group.reshape(-1)
    bias = np.concatenate(biases) if all(b is not None for b in biases) else None
    if same_bits:
        qkv = build.linear(x, np.concatenate(weights), f"{name}.qkv_proj", "q_proj", bias, i, smooth)
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        q, k, v = g.op("Split", [qkv, g.constant("qkv_split", [q_size, kv_size, kv_size])], f"{name}.qkv_split", n_outputs=3, axis=-1)
    else:
        qk_bias = np.concatenate(biases[:2]) if bias is not None else None
        qk = build.linear(x, np.concatenate(weights[:2]), f"{name}.qk_proj", "q_proj", qk_bias, i, smooth)
        q, k = g.op("Split", [qk, g.constant("qk_split", [heads * head_dim, kv_heads * head_dim])], f"{name}.qk_split", n_outputs=2, axis=-1)
        v = build.linear(x, weights[2], f"{name}.v_proj", "v_proj", biases[2], i, smooth)
    del weights
    if arch.qk_norm:
        eps = config.rms_norm_eps
        per_head = g.constant("per_head_shape", [0, 0, -1, head_dim])
        merged = g.constant("merged_shape", [0, 0, -1])
        for label in ("q", "k"):
            weight = build.norm_weight(f"{prefix}.{label}_norm.weight", build.quant.compute)
            split = g.op1("Reshape", [q if label == "q" else k, per_head], f"{name}.{label}_heads")
            normed = g.op1("SimplifiedLayerNormalization", [split, weight], f"{name}.{label}_norm", axis=-1, epsilon=eps)
            joined = g.op1("Reshape", [normed, merged], f"{name}.{label}_merge")
            q, k = (joined, k) if label == "q" else (q, joined)

    layer_type = config.layer_types[i] if i < len(config.layer_types) else "full_attention"
    windowed = layer_type == "sliding_attention" or (arch.window_all_layers and bool(config.sliding_window))
    cos, sin = rotary["local" if windowed and "local" in rotary else "global"]
    scalar = config.raw.get("query_pre_attn_scalar")
    scale = float(scalar) ** -0.5 if scalar else head_dim**-0.5
    attrs: dict[str, object] = dict(num_heads=heads, kv_num_heads=kv_heads, scale=scale, do_rotary=1, rotary_interleaved=0)
    if windowed and config.sliding_window:
        # Both count the query's own key: a query sees `sliding_window` keys, itself included
        # (checked against transformers in tests/onnx).
        attrs["local_window_size"] = int(config.sliding_window)
    if softcap := config.raw.get("attn_logit_softcapping"):
        attrs["softcap"] = float(softcap)
    past_k, past_v = io[f"past_key_values.{i}.key"], io[f"past_key_values.{i}.value"]
    out, present_k, present_v = g.op(
        "GroupQueryAttention",
        [q, k, v, past_k, past_v, io["seqlens_k"], io["total_sequence_length"], cos, sin],
        f"{name}.gqa", n_outputs=3, domain=MS_DOMAIN, **attrs,
    )
    kv_shape: list[int | str] = ["batch", kv_heads, "max_length", head_dim]
    g.add_output(present_k, f"present.{i}.key", build.compute_type, kv_shape)
    g.add_output(present_v, f"present.{i}.value", build.compute_type, kv_shape)
    return build.to_residual(build.linear(out, build.tensor(f"{prefix}.o_proj.weight"), f"{name}.o_proj", "o_proj", layer=i, smooth=o_smooth)), smooth


def _mlp(build: _Build, x: str, i: int) -> tuple[str, np.ndarray | None]:
    """The MLP block's output, and the smoothing its input norm must fold in."""
    g, config = build.graph, build.config
    prefix = f"model.layers.{i}.mlp"
    name = f"layers.{i}.mlp"
    x = build.to_compute(x)
    smooth = build.smoothing(x)
    # down_proj's smoothing goes into up's rows: its input is act(gate) * up.
    down_smooth = build.smoothing(g.output_name(f"{name}.mul"))
    up = build.tensor(f"{prefix}.up_proj.weight")
    gate_up = np.concatenate([build.tensor(f"{prefix}.gate_proj.weight"), up if down_smooth is None else up / down_smooth[:, None]])
    del up
    fused = build.linear(x, gate_up, f"{name}.gate_up_proj", "gate_proj", layer=i, smooth=smooth)
    del gate_up
    gate, up = g.op("Split", [fused, g.constant("mlp_split", [config.intermediate_size] * 2)], f"{name}.split", n_outputs=2, axis=-1)
    activation = ACTIVATIONS[config.raw.get("hidden_activation") or config.raw.get("hidden_act") or "silu"]
    if activation == "gelu_tanh":
        act = g.op1("FastGelu", [gate], f"{name}.act", domain=MS_DOMAIN)
    else:
        act = g.op1("Mul", [gate, g.op1("Sigmoid", [gate], f"{name}.sigmoid")], f"{name}.act")
    hidden = g.op1("Mul", [act, up], f"{name}.mul")
    return build.to_residual(build.linear(hidden, build.tensor(f"{prefix}.down_proj.weight"), f"{name}.down_proj", "down_proj", layer=i, smooth=down_smooth)), smooth


def build_graph(build: _Build) -> None:
    g, config, arch = build.graph, build.config, build.arch
    eps = config.rms_norm_eps
    io = {
        "input_ids": g.add_input("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        "seqlens_k": g.add_input("seqlens_k", TensorProto.INT32, ["batch"]),
        "total_sequence_length": g.add_input("total_sequence_length", TensorProto.INT32, []),
        "logits_count": g.add_input("logits_count", TensorProto.INT64, [1]),
    }
    kv_shape: list[int | str] = ["batch", config.n_kv_heads, "max_length", config.head_dim]
    for i in range(config.n_layers):
        for kind in ("key", "value"):
            name = f"past_key_values.{i}.{kind}"
            io[name] = g.add_input(name, build.compute_type, kv_shape)

    rotary = {}
    for kind, frequencies in rope_frequencies(config).items():
        shape: list[int | str] = ["positions", len(frequencies)]
        cos, sin = rotary_input_names(kind)
        rotary[kind] = (g.add_input(cos, build.compute_type, shape), g.add_input(sin, build.compute_type, shape))

    x, head, head_smooth = _embedding(build, io["input_ids"])
    residual = x
    delta: str | None = None
    for i in range(config.n_layers):
        start_bytes = g.data.n_bytes
        prefix = f"model.layers.{i}"
        # A norm's weight is stored once the linear reading it has chosen its smoothing.
        attn_norm = f"{prefix}.input_layernorm.weight"
        if delta is None:
            h = g.op1("SimplifiedLayerNormalization", [residual, attn_norm], f"layers.{i}.input_norm", axis=-1, epsilon=eps)
        else:
            h, _, _, residual = g.op(
                "SkipSimplifiedLayerNormalization", [delta, residual, attn_norm], f"layers.{i}.input_norm",
                n_outputs=4, domain=MS_DOMAIN, epsilon=eps,
            )
        attn, attn_smooth = _attention(build, h, i, rotary, io)
        build.norm_weight(attn_norm, smooth=attn_smooth)
        if arch.post_attn_norm:
            weight = build.norm_weight(f"{prefix}.{arch.post_attn_norm}.weight")
            attn = g.op1("SimplifiedLayerNormalization", [attn, weight], f"layers.{i}.post_attn_norm", axis=-1, epsilon=eps)
        mlp_norm = f"{prefix}.{arch.pre_mlp_norm}.weight"
        h, _, _, residual = g.op(
            "SkipSimplifiedLayerNormalization", [attn, residual, mlp_norm], f"layers.{i}.mlp_norm",
            n_outputs=4, domain=MS_DOMAIN, epsilon=eps,
        )
        delta, mlp_smooth = _mlp(build, h, i)
        build.norm_weight(mlp_norm, smooth=mlp_smooth)
        if arch.post_mlp_norm:
            weight = build.norm_weight(f"{prefix}.{arch.post_mlp_norm}.weight")
            delta = g.op1("SimplifiedLayerNormalization", [delta, weight], f"layers.{i}.post_mlp_norm", axis=-1, epsilon=eps)
        build.layer_bytes.append(g.data.n_bytes - start_bytes)
    assert delta is not None

    # Only the last `logits_count` positions reach the output head: a prompt needs one row, and
    # the head (vocab x hidden) dominates prefill otherwise.
    starts = g.op1("Neg", [io["logits_count"]], "logits/starts")
    ends = g.constant("logits_ends", [np.iinfo(np.int64).max])
    axes = g.constant("logits_axes", [1])
    delta = g.op1("Slice", [delta, starts, ends, axes], "logits/slice_delta")
    residual = g.op1("Slice", [residual, starts, ends, axes], "logits/slice_residual")
    final_norm = build.norm_weight("model.norm.weight", smooth=head_smooth)
    h, _, _, _ = g.op("SkipSimplifiedLayerNormalization", [delta, residual, final_norm], FINAL_NORM, n_outputs=4, domain=MS_DOMAIN, epsilon=eps)
    logits = build.to_residual(head(build.to_compute(h)))
    if softcap := config.raw.get("final_logit_softcapping"):
        cap = g.weight("final_softcap", np.asarray(softcap, dtype=np.float32))
        logits = g.op1("Mul", [g.op1("Tanh", [g.op1("Div", [logits, cap], "softcap/div")], "softcap/tanh"), cap], "softcap/mul")
    g.add_output(logits, "logits", TensorProto.FLOAT, ["batch", "logits_count", config.vocab_size])


# -- tokenizer facts ----------------------------------------------------------------


def _first_id(value: object) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return int(value) if isinstance(value, int) else None


def _all_ids(value: object) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] if isinstance(value, int) else []


def tokenizer_facts(checkpoint: Checkpoint) -> dict[str, object]:
    """BOS/EOS/end-of-generation ids, whether to add BOS, and the chat template."""
    from tokenizers import Tokenizer

    folder = checkpoint.folder
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"{folder} has no tokenizer.json; the ONNX runtime needs the fast tokenizer file")
    checkpoint.json_file("tokenizer.json")  # not JSON: a ModelError naming the file
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises plain Exception for a file it cannot use
        raise ModelError(f"{folder / 'tokenizer.json'} is not a tokenizer the tokenizers library can load ({error}); download it again") from None
    config = checkpoint.config.raw
    generation = checkpoint.json_file("generation_config.json") or {}
    tok_config = checkpoint.json_file("tokenizer_config.json") or {}

    def token_id(entry: object) -> int | None:
        text = entry.get("content") if isinstance(entry, dict) else entry
        return tokenizer.token_to_id(text) if isinstance(text, str) else None

    bos = _first_id(config.get("bos_token_id")) if config.get("bos_token_id") is not None else token_id(tok_config.get("bos_token"))
    eos = _first_id(config.get("eos_token_id")) if config.get("eos_token_id") is not None else token_id(tok_config.get("eos_token"))
    eog = set(_all_ids(config.get("eos_token_id"))) | set(_all_ids(generation.get("eos_token_id")))
    if eos is not None:
        eog.add(eos)
    for text in KNOWN_EOG_TOKENS:
        if (token := tokenizer.token_to_id(text)) is not None:
            eog.add(token)
    # Whether the tokenizer's own post-processor puts BOS first is what transformers does.
    probe = tokenizer.encode("a", add_special_tokens=True).ids
    add_bos = bool(tok_config.get("add_bos_token", bos is not None and bool(probe) and probe[0] == bos))
    template = tok_config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    elif chat_json := checkpoint.json_file("chat_template.json"):
        template = chat_json.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return {"bos_id": bos, "eos_id": eos, "eog_ids": sorted(eog), "add_bos": add_bos, "chat_template": template}


# -- calibration --------------------------------------------------------------------


def calibration_tokens(checkpoint: Checkpoint, facts: dict[str, object]) -> list[int]:
    """The shipped calibration text (prose in a dozen languages, chat turns, code, numbers; not
    the verification or benchmark text) in the checkpoint's tokens, BOS first if it uses one."""
    from tokenizers import Tokenizer

    text = importlib.resources.files("localchat.assets").joinpath(CALIBRATION_ASSET).read_text(encoding="utf-8")
    ids = Tokenizer.from_file(str(checkpoint.folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    bos = facts["bos_id"]
    return ([bos] if facts["add_bos"] and isinstance(bos, int) else []) + ids[:CALIBRATION_TOKENS]


def activation_statistics(checkpoint: Checkpoint, arch: OnnxArchitecture, plan: QuantPlan, tokens: list[int],
                          folder: Path, progress: Progress) -> dict[str, np.ndarray]:
    """What `_Build.activations` holds, measured by running `tokens` through the model at 8 bits
    (the statistics barely differ from fp32's, and the graph is a quarter of the size), built in
    `folder` with the statistics as extra outputs."""
    import onnx
    import onnxruntime as ort

    folder.mkdir()
    data = ExternalData(folder / DATA_FILE)
    build = _Build(checkpoint, arch, QUANT_PLANS["int8"], GraphBuilder(data), progress, calibrating_for=plan)
    g = build.graph
    try:
        build_graph(build)
        sources = list(build.probes)
        for i, source in enumerate(sources):
            width, full = build.probes[source]
            if full:
                rows = g.op1("Reshape", [source, g.constant("calibration_rows", [-1, width])], f"calibration.{i}/rows")
                columns = g.op1("Transpose", [rows], f"calibration.{i}/transpose", perm=[1, 0])
                total = g.op1("MatMul", [columns, rows], f"calibration.{i}")
            else:
                total = g.op1("ReduceSumSquare", [source, g.constant("calibration_axes", [0, 1])], f"calibration.{i}", keepdims=0)
            g.add_output(total, f"calibration.{i}", TensorProto.FLOAT, [width, width] if full else [width])
    finally:
        data.close()
    onnx.save_model(g.model("calibration"), str(folder / GRAPH_FILE))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(folder / GRAPH_FILE), options, providers=["CPUExecutionProvider"])
    config = checkpoint.config
    outputs = [f"calibration.{i}" for i in range(len(sources))]
    kv_names = [f"{i}.{kind}" for i in range(config.n_layers) for kind in ("key", "value")]
    kv = [np.zeros((1, config.n_kv_heads, len(tokens), config.head_dim), dtype=np.float32) for _ in kv_names]
    sums = [np.zeros((width, width) if full else width) for width, full in build.probes.values()]
    tables = rotary_tables(rope_frequencies(config), len(tokens), np.float32)
    for start in range(0, len(tokens), CALIBRATION_CHUNK):
        part = np.asarray(tokens[start : start + CALIBRATION_CHUNK], dtype=np.int64)[None, :]
        end = start + part.shape[1]
        feeds = {
            "input_ids": part,
            "seqlens_k": np.array([end - 1], dtype=np.int32),
            "total_sequence_length": np.array(end, dtype=np.int32),
            "logits_count": np.array([1], dtype=np.int64),
            **{f"past_key_values.{name}": value for name, value in zip(kv_names, kv)},
            **tables,
        }
        results = session.run(outputs + [f"present.{name}" for name in kv_names], feeds)
        for total, value in zip(sums, results):
            total += value
        kv = results[len(outputs) :]
    del session
    return {source: (total / len(tokens)).astype(np.float32) for source, total in zip(sources, sums)}


# -- conversion ---------------------------------------------------------------------


@dataclass(frozen=True)
class ConversionResult:
    output: Path
    seconds: float
    n_bytes: int
    operators: dict[str, int]


def _quiet(done: int, total: int, what: str) -> None:
    del done, total, what


def _half(progress: Progress, which: int, label: str = "") -> Progress:
    """Progress of one of two passes over the weights, as half of the whole."""

    def report(done: int, total: int, what: str) -> None:
        progress(which * total + done, 2 * total, label + what)

    return report


def convert_to_onnx(source: Path, output: Path, quant: str = "fp32", *, progress: Progress = _quiet, overwrite: bool = False) -> ConversionResult:
    """Convert the checkpoint folder `source` into the ONNX model folder `output`, atomically:
    everything is written to `output.incomplete` and renamed when complete."""
    if quant not in QUANT_PLANS:
        raise ModelError(f"unknown quantization '{quant}'; choose one of: {', '.join(QUANTS)}")
    if output.exists() and not overwrite:
        raise ModelError(f"{output} already exists; remove it or choose another output folder (-o)")
    if output.exists() and not (output / ONNX_MARKER).is_file():
        # --force replaces an earlier conversion, never an unrelated file or folder.
        raise ModelError(f"{output} exists and is not an ONNX model made by localchat; choose another output folder (-o)")
    started = time.perf_counter()
    checkpoint = Checkpoint(source, accept=architecture_for)
    partial = output.with_name(output.name + ".incomplete")
    try:
        config = checkpoint.config
        arch = architecture_for(config)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        facts = tokenizer_facts(checkpoint)
        plan = QUANT_PLANS[quant]
        activations: dict[str, np.ndarray] = {}
        if plan.calibrate:
            tokens = calibration_tokens(checkpoint, facts)
            calibration = partial / "calibration"
            activations = activation_statistics(checkpoint, arch, plan, tokens, calibration, _half(progress, 0, "calibration: "))
            shutil.rmtree(calibration)
        data = ExternalData(partial / DATA_FILE)
        graph = GraphBuilder(data)
        build = _Build(checkpoint, arch, plan, graph, _half(progress, 1) if plan.calibrate else progress, activations=activations)
        try:
            build_graph(build)
        finally:
            data.close()
        import onnx

        onnx.save_model(graph.model(f"localchat-{arch.name}"), str(partial / GRAPH_FILE))
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, partial / name)
        shutil.copy2(source / "config.json", partial / "config.json")
        operators = graph.operator_counts()
        kv_dtype = np.dtype(plan.compute)
        kv_bytes_per_token = config.n_layers * 2 * config.n_kv_heads * config.head_dim * kv_dtype.itemsize
        meta = {
            "format_version": FORMAT_VERSION,
            "graph": GRAPH_FILE,
            "name": config.raw.get("_name_or_path") or source.name,
            "architecture": arch.name,
            "source_architecture": config.architecture,
            "quant": quant,
            "n_layers": config.n_layers,
            "n_heads": config.n_heads,
            "n_kv_heads": config.n_kv_heads,
            "head_dim": config.head_dim,
            "hidden_size": config.hidden_size,
            "n_vocab": config.vocab_size,
            "n_ctx_train": config.context_length,
            "max_positions": min(config.context_length or MAX_POSITIONS, MAX_POSITIONS),
            "rope_frequencies": rope_frequencies(config),
            "kv_dtype": kv_dtype.name,
            "kv_bytes_per_token": kv_bytes_per_token,
            "layer_bytes": int(np.mean(build.layer_bytes)) if build.layer_bytes else 0,
            "other_bytes": int(data.n_bytes - sum(build.layer_bytes)),
            "weight_bytes": int(data.n_bytes),
            "operators": operators,
            "weight_formats": build.formats,
            **facts,
        }
        (partial / ONNX_MARKER).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if output.exists():
            shutil.rmtree(output)
        os.replace(partial, output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        checkpoint.close()
    return ConversionResult(output, time.perf_counter() - started, data.n_bytes, operators)


# The GGUF type whose agreement floors `--verify` applies to each ONNX precision.
EQUIVALENT_GGUF_TYPE = {"fp32": "f32", "fp16": "f16", "int8": "q8_0", "int4": "q4_k_m"}


def verify_onnx(folder: Path, checkpoint: Path, quant: str):  # -> converters.verify.VerifyReport
    """`--verify` for an ONNX folder: the GGUF converter's checks, which load any model the engine can."""
    from localchat.converters.verify import verify_gguf

    return verify_gguf(folder, checkpoint, EQUIVALENT_GGUF_TYPE[quant])
