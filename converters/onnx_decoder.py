"""A Hugging Face decoder as an ONNX graph on onnxruntime's fused contrib operators, written straight
from the checkpoint's weights with the `onnx` package (no torch export): GroupQueryAttention with
rotary inside it and past/present KV buffers that can be the same memory,
SkipSimplifiedLayerNormalization between blocks, MatMulNBits for quantized weights. The
architectures it can write are a table of their norms and quirks; the graph's inputs and outputs
are localchat/onnx_format.py's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto

from localchat.converters.block_quant import quantize, quantize_gptq, unpack
from localchat.converters.checkpoint import Checkpoint, ModelConfig, RopeSettings
from localchat.converters.onnx_graph import MS_DOMAIN, GraphBuilder
from localchat.converters.onnx_quant import QuantPlan
from localchat.errors import ModelError
from localchat.onnx_format import MatrixFormat, rotary_input_names

# MatMulNBits accuracy level 4: activations are quantized to int8 per block and the product runs
# on the CPU's int8 dot-product units; measured fastest on AVX2/AVX-512 machines.
CPU_ACCURACY_LEVEL = 4
# The final norm's node: the output head's smoothing is looked up by its output's name.
FINAL_NORM = "final_norm"

# Told the bytes of weights done, of all, and the tensor read.
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
    # Gemma 3 4B and up: their text model, which checkpoint.WRAPPERS finds beside the vision part.
    "Gemma3ForConditionalGeneration": GEMMA3,
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


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
class DecoderBuild:
    """State of one conversion: the checkpoint, the graph and what the JSON will say."""

    checkpoint: Checkpoint
    arch: OnnxArchitecture
    quant: QuantPlan
    graph: GraphBuilder
    progress: Progress
    # A MatMulNBits of more stored bytes than this runs as several over runs of its rows, each
    # a whole multiple of `pack_chunk_rows` (see `matmul_nbits`; the conversion sets both).
    pack_chunk_bytes: int
    pack_chunk_rows: int
    done_bytes: int = 0
    layer_bytes: list[int] = field(default_factory=list)
    # By the name of the tensor a linear reads: the mean of x x^T over the calibration text where a
    # 4-bit linear reads it (K, K), else the mean of x^2 (K,).
    activations: dict[str, np.ndarray] = field(default_factory=dict)
    # When building the calibration model for the plan `calibrating_for`: the linears' inputs, each
    # with its width and whether a 4-bit linear reads it.
    calibrating_for: QuantPlan | None = None
    probes: dict[str, tuple[int, bool]] = field(default_factory=dict)
    # By matrix: how it is stored, for the marker.
    formats: dict[str, MatrixFormat] = field(default_factory=dict)

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
        of more than `pack_chunk_bytes` runs as several over runs of its rows, their outputs
        concatenated: onnxruntime maps an initializer, packs it into memory of its own and only then
        releases the mapping, so loading holds one chunk twice rather than the whole matrix."""
        g = self.graph
        attrs: dict[str, object] = {"K": k, "bits": bits, "block_size": block, "accuracy_level": CPU_ACCURACY_LEVEL}
        row_bytes = math.ceil(k / block) * block * bits // 8
        rows = max(self.pack_chunk_rows, self.pack_chunk_bytes // row_bytes // self.pack_chunk_rows * self.pack_chunk_rows)
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
            self.formats[name] = MatrixFormat(f"int{bits}", block, smoothed=smooth is not None)
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
            self.formats[name] = MatrixFormat(np.dtype(self.quant.float_storage).name, smoothed=smooth is not None)
            stored = g.weight(f"{name}.weight_t", np.ascontiguousarray(weight.T).astype(self.quant.float_storage))
            if self.quant.float_storage is not self.quant.compute:
                stored = g.op1("Cast", [stored], f"{name}/cast", to=self.compute_type)
            y = g.op1("MatMul", [x, stored], name)
        if bias is not None:
            y = g.op1("Add", [y, g.weight(f"{name}.bias", bias.astype(self.quant.compute))], f"{name}/bias")
        return y


def _embedding(build: DecoderBuild, input_ids: str) -> tuple[str, Callable[[str], str], np.ndarray | None]:
    """The embedding lookup, a function making logits from final hidden states (the output head,
    sharing the embedding's weights when the checkpoint ties them), and the head's smoothing."""
    g, config = build.graph, build.config
    table = build.tensor("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or not build.has("lm_head.weight")
    bits = build.bits("embedding")
    n_vocab, hidden = table.shape
    block = build.quant.block("embedding", bits, hidden)
    head_smooth = build.smoothing(g.output_name(FINAL_NORM))
    # Tied, the table holds the head's smoothed columns, and the lookup undoes them.
    table_smooth = head_smooth if tied else None
    stored_as = MatrixFormat(f"int{bits}", block) if bits else MatrixFormat(np.dtype(build.quant.float_storage).name)
    build.formats["embed_tokens"] = dataclasses.replace(stored_as, smoothed=table_smooth is not None)
    if tied:
        build.formats["lm_head"] = dataclasses.replace(build.formats["embed_tokens"], tied=True)
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


def _attention(build: DecoderBuild, x: str, i: int, rotary: dict[str, tuple[str, str]], io: dict[str, str]) -> tuple[str, np.ndarray | None]:
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
    # LLaMA's attention_bias gives o_proj a bias too (Qwen2's q, k and v alone have one).
    o_bias = build.tensor(f"{prefix}.o_proj.bias") if build.has(f"{prefix}.o_proj.bias") else None
    output = build.linear(out, build.tensor(f"{prefix}.o_proj.weight"), f"{name}.o_proj", "o_proj", o_bias, i, o_smooth)
    return build.to_residual(output), smooth


def _mlp(build: DecoderBuild, x: str, i: int) -> tuple[str, np.ndarray | None]:
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


def build_graph(build: DecoderBuild) -> None:
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
