"""What each supported architecture needs to become GGUF: a table of per-architecture quirks and
one loop that maps Hugging Face tensor names to GGUF names with gguf's TensorNameMap.

Checked against llama.cpp's own converter (convert_hf_to_gguf.py, conversion/*.py) and the graphs
of the llama.cpp that localchat runs (src/models/*.cpp): where a graph hard-codes a choice that a
config.json may make otherwise (Qwen3-MoE renormalising its experts' weights, Gemma 2's pattern of
sliding-window layers), a checkpoint that differs is refused rather than converted into a model that
answers differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, ExpertGatingFuncType, GGUFWriter, RopeScalingType, get_tensor_name_map

from localchat.converters.checkpoint import (
    EXPERT_INDEX,
    LAYER_PREFIX,
    LINEAR_ATTENTION,
    LONGROPE_TYPES,
    MXFP4_BLOCK,
    MXFP4_PARTS,
    Checkpoint,
    DeltaNetSizes,
    LatentAttentionSizes,
    Mamba2Sizes,
    ModelConfig,
    RopeSettings,
    TensorRef,
    layer_key,
)
from localchat.errors import ModelError

# Present in some checkpoints, recomputed by llama.cpp.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Layer tensors by family (names after "model.layers.N."; "*" stands for every expert's index).
ATTENTION = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight")
GATED_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
ROUTED_EXPERTS = ("mlp.gate.weight", "mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight",
                  "mlp.experts.*.down_proj.weight")
MIXTRAL_EXPERTS = ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.*.w1.weight",
                   "block_sparse_moe.experts.*.w2.weight", "block_sparse_moe.experts.*.w3.weight")
SHARED_EXPERT = ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
                 "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight")
# The routers and LFM2's and Qwen 3.5's convolution kernels stay F32 at every quantization, as llama.cpp's converter and
# quantizer keep them (its CPU convolution reads F32 kernels only); so do Mamba-2's A, D and grouped norm, matrices in its layout.
F32_TENSORS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "shortconv.conv.weight", "ssm_conv1d.weight", "ssm_a", "ssm_d",
               "ssm_norm.weight")
# RoPE scalings llama.cpp applies to any architecture from GGUF keys (LongRoPE is Phi-3's own).
ROPE_SCALINGS = ("default", "linear", "yarn", "llama3")
# llama.cpp's Gemma 3 graph fixes these; a checkpoint that differs cannot run there.
GEMMA3_SWA_PATTERN = 6
GEMMA3_SWA_ROPE_THETA = 10000.0
GEMMA2_SWA_PATTERN = 2
GEMMA2_DEFAULT_WINDOW = 4096
# llama.cpp's SmolLM3 graph leaves RoPE out of every 4th layer.
SMOLLM3_NO_ROPE_STEP = 4
# transformers' YaRN ramp bounds where rope_parameters gives none (or 0).
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
# Ministral 3's rope_parameters beyond YaRN's factor and original context, each a number >= 0 where given.
MINISTRAL3_ROPE_NUMBERS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "llama_4_scaling_beta")
# OLMo 3's full layers' YaRN settings beyond its factor and original context, each a number >= 0 where given.
OLMO3_ROPE_NUMBERS = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# OLMo 2's and 3's layer tensors: norms after attention and after the MLP, none before.
OLMO2_LAYER = (*ATTENTION[1:], *GATED_MLP, "post_attention_layernorm.weight", "post_feedforward_layernorm.weight")
# Gemma 4's layer tensors. Its last layers may keep no keys and values of its own (no k_proj, k_norm,
# v_proj) and its global layers may take their values from the keys (no v_proj): only these are in every layer.
GEMMA4_LAYER = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_norm.weight", "self_attn.o_proj.weight",
                "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight",
                *GATED_MLP)
# A frequency divisor that stops a RoPE pair turning: Gemma 4's proportional RoPE leaves the pairs past its
# share of the head unrotated, and llama.cpp's rotation reads that as a per-pair factor (rope_freqs).
UNROTATED_FREQ_FACTOR = 1e30
# LFM2's layer tensors in every layer; its convolution layers' (conv.*) and attention layers' (self_attn.*) differ.
LFM2_LAYER = ("operator_norm.weight", "ffn_norm.weight", "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight")
# The layer types transformers' LFM2 runs.
LFM2_LAYER_TYPES = {"conv", "full_attention"}
# llama.cpp's lfm2 graph keeps the last span - 1 inputs of each convolution, and asserts there is one.
LFM2_MIN_CONV_KERNEL = 2
# LFM2-MoE's layer tensors in every layer after its leading dense ones (LFM2_LAYER's): the router, the bias its choice adds to each
# expert's score, the experts.
LFM2MOE_LAYER = ("operator_norm.weight", "ffn_norm.weight", "feed_forward.gate.weight", "feed_forward.expert_bias",
                 "feed_forward.experts.*.w1.weight", "feed_forward.experts.*.w2.weight", "feed_forward.experts.*.w3.weight")
# Qwen 3.5's layer tensors in every layer; its Gated DeltaNet layers' (linear_attn.*) and attention layers' (self_attn.*) differ.
QWEN35_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight", *GATED_MLP)
QWEN35_LAYER_TYPES = {LINEAR_ATTENTION, "full_attention"}
# transformers' M-RoPE sections for Qwen 3.5 where rope_parameters give no mrope_section (pairs turned by time, height, width).
QWEN35_MROPE_SECTIONS = [11, 11, 10]
# llama.cpp's key listing a hybrid's recurrent layers (the gguf package here predates it).
RECURRENT_LAYERS_KEY = "{arch}.attention.recurrent_layers"
# Granite 4's layer tensors in every layer; its Mamba-2 layers' (mamba.*) and attention layers' (self_attn.*) differ.
GRANITE4_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight", "shared_mlp.input_linear.weight",
                  "shared_mlp.output_linear.weight")
# Granite 4's experts in its mixtures of experts (h-tiny, h-small): each layer's router, and each expert's matrices, which the
# checkpoint stacks in two tensors (its fused gate and up projections, its down projections) and checkpoint.STACKED_EXPERTS reads
# under Mixtral's names.
GRANITE4_EXPERTS = ("block_sparse_moe.router.layer.weight", *MIXTRAL_EXPERTS[1:])
# transformers' time_step_limit that leaves Mamba-2's time steps as they are, as llama.cpp's graph does.
UNCLAMPED_TIME_STEPS = (0.0, math.inf)
# EXAONE 4's layer tensors: per-head query and key norms, and norms after attention and the MLP, none before.
EXAONE4_LAYER = (*ATTENTION[1:], "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                 "post_feedforward_layernorm.weight", *GATED_MLP)
# llama.cpp's exaone4 graph slides windows in a model of this many layers alone (EXAONE 4.0 32B's), turning RoPE in its
# sliding-window layers alone; in any other it attends over the whole context with RoPE in every layer (the 1.2B's kind).
EXAONE4_HYBRID_LAYERS = 64
# GLM-4's layer tensors: norms before and after attention and the MLP, whose gate and up projections are one matrix (llama.cpp's
# glm4 graph reads it so: the gate's rows, then the up projection's).
GLM4_LAYER = (*ATTENTION, "post_self_attn_layernorm.weight", "post_attention_layernorm.weight", "post_mlp_layernorm.weight",
              "mlp.gate_up_proj.weight", "mlp.down_proj.weight")
# GLM-4.5's layer tensors in every layer (its leading dense layers add the MLP, the others GLM4MOE_EXPERTS).
GLM4MOE_LAYER = (*ATTENTION, "post_attention_layernorm.weight")
# GLM-4.5's layer tensors after its leading dense layers: the router, the bias its choice adds to each expert's score, the experts,
# the shared experts as one MLP.
GLM4MOE_EXPERTS = (*ROUTED_EXPERTS, "mlp.gate.e_score_correction_bias", "mlp.shared_experts.gate_proj.weight",
                   "mlp.shared_experts.up_proj.weight", "mlp.shared_experts.down_proj.weight")
# DeepSeek V2's and V3's layer tensors in every layer: multi-head latent attention's keys and values through one latent (its
# queries' differ: DEEPSEEK_QUERIES), the norms; after the leading dense layers, the experts beside the shared ones.
DEEPSEEK_LAYER = ("input_layernorm.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                  "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight")
DEEPSEEK2_EXPERTS = (*ROUTED_EXPERTS, *GLM4MOE_EXPERTS[-3:])
# Its queries' tensors, by whether they go through a latent of their own (q_lora_rank: V3's, V2's) or not (V2-Lite's, Moonlight's).
DEEPSEEK_QUERIES = {True: ("self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight"),
                    False: ("self_attn.q_proj.weight",)}
# llama.cpp's deepseek2 graph projects the queries of a model of these many layers directly, whatever its q_lora_rank (it takes
# them for DeepSeek-V2-Lite's kind), as it does in 48-layer models of DEEPSEEK2_LITE_VOCAB tokens.
DEEPSEEK2_LITE_LAYERS = (26, 27)
DEEPSEEK2_LITE_VOCAB = 128256
# gpt-oss's layer tensors: attention with biases and a sink per head, the norm before the MLP, a router with a bias, and each
# expert's matrices and biases as checkpoint.GPT_OSS_STACKED_EXPERTS reads them.
GPT_OSS_LAYER = (*ATTENTION, "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias",
                 "self_attn.sinks", "post_attention_layernorm.weight", "mlp.router.weight", "mlp.router.bias",
                 "mlp.experts.*.gate_up_proj", "mlp.experts.*.gate_up_proj_bias", "mlp.experts.*.down_proj", "mlp.experts.*.down_proj_bias")
# Its release's, the experts' matrices in MXFP4: each one's packed values and scales.
GPT_OSS_MXFP4_LAYER = (*(key for key in GPT_OSS_LAYER if key not in ("mlp.experts.*.gate_up_proj", "mlp.experts.*.down_proj")),
                       *(f"mlp.experts.*.{matrix}{part}" for matrix in ("gate_up_proj", "down_proj") for part in MXFP4_PARTS))
# ERNIE 4.5's multi-token-prediction layers (the 21B's and 300B's), which llama.cpp's converter leaves out and its graph never runs.
ERNIE4_5_MTP_PREFIXES = ("model.mtp_block.", "model.mtp_emb_norm.", "model.mtp_hidden_norm.", "model.mtp_linear_proj.")


class UnsupportedModelError(ModelError):
    """A checkpoint whose architecture or settings llama.cpp cannot run."""


@dataclass(frozen=True)
class FixedSetting:
    """A config.json setting that llama.cpp's graph for the architecture implements one way only."""

    key: str
    value: object
    default: object  # what transformers assumes when the key is absent


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor: where it comes from and what to do to it on the way."""

    gguf_name: str
    shape: tuple[int, ...]
    # One checkpoint tensor, or each expert's, stacked along a new first axis (`stacked`).
    sources: tuple[TensorRef, ...] = ()
    stacked: bool = False
    permute_heads: int = 0  # reorder rows of this many heads (LLaMA Q/K)
    add: float = 0.0  # Gemma norms
    data: np.ndarray | None = field(default=None, compare=False)  # generated tensors (rope_freqs)
    # The values llama.cpp's graph reads, from the checkpoint tensor's in float32 (Qwen 3.5's reordered value heads); for an
    # MXFP4 matrix, the rows of its packed values and of its scales.
    rewrite: Callable[[np.ndarray], np.ndarray] | None = field(default=None, compare=False)
    # An MXFP4 matrix's scales, one per source (`sources` its packed values): written as MXFP4, never requantized.
    scales: tuple[TensorRef, ...] = ()

    @property
    def keeps_f32(self) -> bool:
        """Vectors (norms, biases, RoPE factors), routers and biases of stacked experts (gpt-oss's) stay F32 at every
        quantization, as llama.cpp's converter writes every tensor but a weight."""
        return len(self.shape) == 1 or self.gguf_name.endswith((*F32_TENSORS, ".bias"))


@dataclass(frozen=True)
class TensorRewrite:
    """A checkpoint tensor that llama.cpp's graph reads otherwise: its values, the name gguf's map knows it by, its shape."""

    values: Callable[[np.ndarray], np.ndarray] | None = None
    renamed: str | None = None  # its name after "model.layers.N." for gguf's map, where that differs
    # Its shape after `values`, where that differs (Mamba-2's A and D as one-column matrices; each expert's, for a stack of them).
    shape: tuple[int, ...] | None = None
    # A fused matrix llama.cpp reads as several: their names for gguf's map, each an equal block of its rows (after `values`) in
    # order, or every len(split_into)th row from the part's index on where `interleaved` (gpt-oss's experts' gate and up).
    split_into: tuple[str, ...] = ()
    interleaved: bool = False
    # A matrix llama.cpp reads as several of other shapes, each made by a rewrite of its own (DeepSeek's kv_b_proj).
    into: tuple[TensorRewrite, ...] = ()

    def parts(self, shape: tuple[int, ...]) -> list[TensorRewrite]:
        """Each block `split_into` names, of a tensor of `shape`, as a rewrite of its own; or the rewrites `into` gives."""
        if self.into:
            return list(self.into)
        whole, shape = self.values or (lambda weights: weights), self.shape or shape
        count = len(self.split_into)
        size = shape[0] // count

        def block(index: int) -> Callable[[np.ndarray], np.ndarray]:
            rows = slice(index, None, count) if self.interleaved else slice(index * size, (index + 1) * size)
            return lambda weights: whole(weights)[rows]

        return [TensorRewrite(block(i), part, (size, *shape[1:])) for i, part in enumerate(self.split_into)]


# Granite 4's MLP (shared_mlp: the shared expert of its mixtures of experts) as llama.cpp's gate, up and down projections.
GRANITE4_MLP_REWRITES = {
    "shared_mlp.input_linear.weight": TensorRewrite(split_into=("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "shared_mlp.output_linear.weight": TensorRewrite(renamed="mlp.down_proj.weight"),
}
# Granite 4's mixtures of experts: the shared MLP's gate and up as the shared expert's (gguf's map knows its down projection).
GRANITE4_MOE_REWRITES = {
    "shared_mlp.input_linear.weight": TensorRewrite(split_into=("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight")),
}
# LFM2-MoE's experts and expert bias under the names gguf's map knows (llama.cpp's lfm2moe graph reads the bias as exp_probs_b.bias).
LFM2MOE_REWRITES = {
    "feed_forward.experts.w1.weight": TensorRewrite(renamed="feed_forward.experts.gate_proj.weight"),
    "feed_forward.experts.w3.weight": TensorRewrite(renamed="feed_forward.experts.up_proj.weight"),
    "feed_forward.experts.w2.weight": TensorRewrite(renamed="feed_forward.experts.down_proj.weight"),
    "feed_forward.expert_bias": TensorRewrite(renamed="feed_forward.expert_bias.bias"),
}
# GLM-4.5's expert bias under the name gguf's map knows (llama.cpp's glm4moe graph reads it as exp_probs_b.bias).
GLM4MOE_REWRITES = {"mlp.gate.e_score_correction_bias": TensorRewrite(renamed="mlp.gate.e_score_correction.bias")}


def _ernie4_5_moe_rewrites(config: ModelConfig) -> dict[str, TensorRewrite]:
    """ERNIE 4.5's expert bias, one row of one per expert, as the vector llama.cpp's ernie4_5-moe graph adds (exp_probs_b.bias)."""
    return {"mlp.moe_statics.e_score_correction_bias": TensorRewrite(lambda bias: bias.reshape(-1), "mlp.moe_statics.e_score_correction.bias",
                                                                     (config.n_experts,))}


def _gpt_oss_rewrites(config: ModelConfig) -> dict[str, TensorRewrite]:
    """gpt-oss's experts as llama.cpp's stacks of gate, up and down projections and their biases: each expert's matrices turned
    to output rows by input columns, its gate and up (alternating columns and biases, as transformers splits them) apart."""
    ffn, hidden = config.expert_intermediate_size, config.hidden_size
    turned = np.transpose
    return {
        "mlp.experts.gate_up_proj": TensorRewrite(turned, shape=(2 * ffn, hidden), interleaved=True,
                                                  split_into=("mlp.experts.gate_proj.weight", "mlp.experts.up_proj.weight")),
        "mlp.experts.gate_up_proj_bias": TensorRewrite(interleaved=True, split_into=("mlp.experts.gate_proj.bias", "mlp.experts.up_proj.bias")),
        "mlp.experts.down_proj": TensorRewrite(turned, renamed="mlp.experts.down_proj.weight", shape=(hidden, ffn)),
        "mlp.experts.down_proj_bias": TensorRewrite(renamed="mlp.experts.down_proj.bias"),
        # The release's MXFP4 matrices are output rows by blocks of input columns already: gate and up rows alternate.
        "mlp.experts.gate_up_proj_blocks": TensorRewrite(interleaved=True, split_into=("mlp.experts.gate_proj.weight", "mlp.experts.up_proj.weight")),
        "mlp.experts.down_proj_blocks": TensorRewrite(renamed="mlp.experts.down_proj.weight"),
    }


def _gpt_oss_variant(config: ModelConfig) -> Architecture:
    """gpt-oss's row with its release's MXFP4 experts' tensors, where the checkpoint has them."""
    row = ARCHITECTURES[config.architecture]
    return replace(row, layer_tensors=GPT_OSS_MXFP4_LAYER if config.mxfp4 else row.layer_tensors, variant=None)


Metadata = Callable[[ModelConfig, GGUFWriter], None]
ExtraTensors = Callable[[ModelConfig], list[PlannedTensor]]
# A configuration's rewrites, by a layer tensor's name after "model.layers.N.".
Rewrites = Callable[[ModelConfig], dict[str, TensorRewrite]]


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture maps onto a llama.cpp one."""

    gguf_arch: MODEL_ARCH
    # llama.cpp's LLaMA graph rotates interleaved pairs; HF rotates halves: Q and K rows are reordered.
    permute_qk: bool = False
    # Gemma's RMSNorm multiplies by (1 + weight); llama.cpp by weight.
    norm_offset: float = 0.0
    # GGUF norms the offset leaves as they are: those the checkpoint's model multiplies by the weight itself (Qwen 3.5's ssm_norm).
    norms_without_offset: tuple[str, ...] = ()
    # Tensors every layer must have; an expert's tensors make the model a mixture of experts.
    layer_tensors: tuple[str, ...] = ATTENTION + GATED_MLP
    # Tensors every leading dense layer of a mixture of experts has instead (LFM2-MoE's first num_dense_layers).
    dense_layer_tensors: tuple[str, ...] = ()
    fixed: tuple[FixedSetting, ...] = ()
    rope_scalings: tuple[str, ...] = ROPE_SCALINGS
    check: Callable[[ModelConfig], None] | None = None
    metadata: Metadata | None = None
    extra_tensors: ExtraTensors | None = None
    # Checkpoint tensors saved without a .weight suffix (Gemma 4's layer_scalar buffers), given one in the GGUF.
    bare_tensors: tuple[str, ...] = ()
    # Checkpoint tensors whose axes of length 1 llama.cpp drops (LFM2's depthwise kernels, hidden x 1 x span); the bytes stay as they are.
    squeezed_tensors: tuple[str, ...] = ()
    # Checkpoint tensors llama.cpp's graph reads otherwise, for a configuration (Qwen 3.5's value heads reordered, A from A_log).
    rewrites: Rewrites | None = None
    # llama.cpp's tokenizer model when the architecture has its own (tokenizer.ggml.model), else read from the files.
    tokenizer_model: str | None = None
    # Whether tokenizer_config.json's add_prefix_space, where given, says if a space goes before the text, over tokenizer.model's
    # add_dummy_prefix, as llama.cpp's converter takes it for ERNIE 4.5.
    space_prefix_from_tokenizer_config: bool = False
    # Prefixes of checkpoint tensors that llama.cpp's converter leaves out (ERNIE 4.5's multi-token-prediction layers).
    left_out: tuple[str, ...] = ()
    # Whether llama.cpp's converter leaves out the layers after the last that predict further tokens (DeepSeek V3's), where it
    # keeps others' (GLM-4.5's).
    drops_nextn_layers: bool = False
    # Where one class covers several of llama.cpp's architectures (Granite 4's), the row for a checkpoint's settings.
    variant: Callable[[ModelConfig], Architecture] | None = None

    @property
    def gguf_name(self) -> str:
        return MODEL_ARCH_NAMES[self.gguf_arch]

    @property
    def routed(self) -> bool:
        return any("*" in name for name in self.layer_tensors)


def _check_layer_pattern(config: ModelConfig, every: int, family: str) -> None:
    """Every `every`th layer global, the others sliding-window: the pattern llama.cpp fixes."""
    expected = tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(config.n_layers))
    if config.layer_types != expected:
        raise UnsupportedModelError(
            f"this {family} checkpoint's layer_types differ from llama.cpp's fixed pattern (one global layer in every {every}); "
            "llama.cpp cannot run it"
        )


def _check_attention_scalar(config: ModelConfig, layers_of_largest: int, family: str) -> None:
    """llama.cpp scales Gemma's attention by 1/sqrt(head_dim), or by 1/sqrt(hidden/heads) for the
    largest model (told apart by its layer count)."""
    expected = config.hidden_size // config.n_heads if config.n_layers == layers_of_largest else config.head_dim
    if (scalar := config.raw.get("query_pre_attn_scalar", expected)) != expected:
        raise UnsupportedModelError(f"this {family} checkpoint's query_pre_attn_scalar is {scalar}; llama.cpp assumes {expected}")


def _check_gemma3(config: ModelConfig) -> None:
    _check_layer_pattern(config, GEMMA3_SWA_PATTERN, "Gemma 3")
    if config.rope_local is not None and config.rope_local.theta != GEMMA3_SWA_ROPE_THETA:
        raise UnsupportedModelError(
            f"this Gemma 3 checkpoint's sliding-window RoPE base is {config.rope_local.theta:g}; "
            f"llama.cpp fixes it at {GEMMA3_SWA_ROPE_THETA:g}"
        )
    _check_attention_scalar(config, 62, "Gemma 3")
    if config.raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("this Gemma 3 checkpoint uses bidirectional attention (an embedding model); convert a causal LM")


def _gemma3_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    if config.sliding_window:
        writer.add_sliding_window(int(config.sliding_window))
    if config.rope_local is not None:
        writer.add_rope_freq_base_swa(config.rope_local.theta)
    if softcap := config.raw.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(softcap))


def _check_gemma2(config: ModelConfig) -> None:
    _check_layer_pattern(config, GEMMA2_SWA_PATTERN, "Gemma 2")
    _check_attention_scalar(config, 46, "Gemma 2")
    if config.raw.get("attn_logit_softcapping") is None:
        raise UnsupportedModelError(
            "this Gemma 2 checkpoint has no attn_logit_softcapping; llama.cpp's gemma2 graph always soft-caps attention"
        )


def _gemma2_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    writer.add_sliding_window(int(config.sliding_window or GEMMA2_DEFAULT_WINDOW))
    writer.add_attn_logit_softcapping(float(config.raw["attn_logit_softcapping"]))
    if softcap := config.raw.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(softcap))


def _check_gemma4(config: ModelConfig) -> None:
    """What llama.cpp's gemma4 graph fixes: causal text attention, one head size per attention type,
    shared keys and values taken from the last layers that compute them, per-layer inputs for every token."""
    if config.raw.get("use_bidirectional_attention") == "all":
        raise UnsupportedModelError("this Gemma 4 checkpoint attends both ways over all tokens (an embedding model); convert a causal LM")
    if set(config.layer_types) - {"sliding_attention", "full_attention"} or config.layer_types[-1] != "full_attention":
        raise UnsupportedModelError(
            "this Gemma 4 checkpoint's layer_types are not sliding_attention and full_attention ending with a full one, "
            "as transformers runs Gemma 4; llama.cpp cannot run it as written"
        )
    for kind in ("sliding_attention", "full_attention"):
        if len({config.head_dim_of(i) for i, t in enumerate(config.layer_types) if t == kind}) > 1:
            raise UnsupportedModelError(f"this Gemma 4 checkpoint's {kind} layers differ in head size; llama.cpp's gemma4 graph has one per attention type")
    first_shared = config.n_layers - config.kv_shared_layers
    if first_shared < 2:
        raise UnsupportedModelError(f"this Gemma 4 checkpoint has {first_shared} layer computing keys and values; llama.cpp's gemma4 graph needs two")
    # llama.cpp's shared layers read layer first_shared - 1 (global) or first_shared - 2 (sliding); transformers
    # the last one of their own type that computes keys and values: the two agree when those are the last two.
    if config.kv_shared_layers and config.layer_types[first_shared - 2:first_shared] != ("sliding_attention", "full_attention"):
        raise UnsupportedModelError(
            f"this Gemma 4 checkpoint's last {config.kv_shared_layers} layers share keys and values, but the layers before them "
            "are not a sliding-window layer then a global one; llama.cpp's gemma4 graph would share other layers' keys and values"
        )
    if config.per_layer_input_size and config.raw.get("vocab_size_per_layer_input", config.vocab_size) != config.vocab_size:
        raise UnsupportedModelError(
            f"this Gemma 4 checkpoint's per-layer embeddings have {config.raw['vocab_size_per_layer_input']} rows for "
            f"{config.vocab_size} tokens; llama.cpp's gemma4 graph needs one per token"
        )
    if config.rope_local is not None and config.rope_local.scaling_type != "default":
        raise UnsupportedModelError(f"this Gemma 4 checkpoint scales its sliding-window RoPE ('{config.rope_local.scaling_type}'); llama.cpp's gemma4 graph does not")
    if config.rope.scaling.get("factor", 1.0) != 1.0:
        raise UnsupportedModelError(f"this Gemma 4 checkpoint slows its global RoPE by a factor {config.rope.scaling['factor']}; llama.cpp's gemma4 graph does not")


def _gemma4_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    writer.add_sliding_window(int(config.sliding_window or 0))
    if config.rope_local is not None:
        writer.add_rope_freq_base_swa(config.rope_local.theta)
    # llama.cpp's gemma4 graph soft-caps the logits at 30 unless told otherwise: 0 says not at all.
    writer.add_final_logit_softcapping(float(config.raw.get("final_logit_softcapping") or 0.0))
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in config.layer_types])
    sliding = next((config.head_dim_of(i) for i, kind in enumerate(config.layer_types) if kind == "sliding_attention"), config.head_dim)
    writer.add_key_length_swa(sliding)
    writer.add_value_length_swa(sliding)
    writer.add_rope_dimension_count_swa(sliding)
    writer.add_shared_kv_layers(config.kv_shared_layers)
    writer.add_embedding_length_per_layer_input(config.per_layer_input_size)


def _proportional_rope_factors(config: ModelConfig) -> list[PlannedTensor]:
    """The global layers' rope_freqs: 1 for the pairs proportional RoPE turns, a huge divisor for the rest
    (all turn with default RoPE). llama.cpp's gemma4 graph needs the tensor either way."""
    head = config.global_head_dim
    turned = int(config.rope.scaling.get("partial_rotary_factor", 1.0) * head // 2)
    factors = np.array([1.0] * turned + [UNROTATED_FREQ_FACTOR] * (head // 2 - turned), dtype=np.float32)
    return [PlannedTensor("rope_freqs.weight", factors.shape, data=factors)]


def _check_lfm2(config: ModelConfig) -> None:
    """What llama.cpp's lfm2 graph fixes: convolution and attention layers alone, heads as wide as the model
    together (its attention output is square), convolutions over at least two positions."""
    if unknown := sorted(set(config.layer_types) - LFM2_LAYER_TYPES):
        raise UnsupportedModelError(f"this LFM2 checkpoint has layers of type '{unknown[0]}'; llama.cpp's lfm2 graph runs conv and full_attention layers only")
    if config.n_heads * config.head_dim != config.hidden_size:
        raise UnsupportedModelError(
            f"this LFM2 checkpoint's {config.n_heads} heads of {config.head_dim} are not hidden_size ({config.hidden_size}) wide together; "
            "llama.cpp's lfm2 graph needs them to be"
        )
    if config.conv_kernel < LFM2_MIN_CONV_KERNEL:
        raise UnsupportedModelError(
            f"this LFM2 checkpoint's convolutions span {config.conv_kernel} position (conv_L_cache); llama.cpp's lfm2 graph needs at least {LFM2_MIN_CONV_KERNEL}"
        )


def _lfm2_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    writer.add_shortconv_l_cache(config.conv_kernel)


def _lfm2moe_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """LFM2's, its leading dense layers, and its router's sigmoid (llama.cpp's lfm2moe graph reads no default)."""
    _lfm2_metadata(config, writer)
    writer.add_leading_dense_block_count(config.dense_layers)
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)


def _delta_net(config: ModelConfig) -> DeltaNetSizes:
    if config.delta_net is None:  # transformers' class gives them to every Qwen 3.5 config
        raise ModelError(f"this {config.architecture} checkpoint's config.json lacks its linear attention's sizes (linear_num_key_heads...); it is incomplete")
    return config.delta_net


def _mrope_sections(config: ModelConfig) -> list[int]:
    """Qwen 3.5's M-RoPE sections as llama.cpp's converter writes them: four, the last 0 where not given."""
    sections = config.rope.scaling.get("mrope_section", QWEN35_MROPE_SECTIONS)
    if not isinstance(sections, list) or not any(sections) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sections):
        raise ModelError(f"this Qwen 3.5 checkpoint's mrope_section is {sections!r}, expected a list of counts of pairs; the config.json is corrupt")
    return (sections + [0] * 4)[:4]


def _pairs_by_fourth_position(sections: list[int], pairs: int) -> list[int]:
    """The rotated pairs that llama.cpp's interleaved M-RoPE turns by a token's fourth position, 0 for text (ggml's
    rope_multi): pair p, p % sum(sections) = s, turns by time, height or width as s % 3 says, while s < 3 * that section."""
    return [p for p in range(pairs) if (s := p % sum(sections)) >= 3 * sections[s % 3]]


def _check_qwen35(config: ModelConfig) -> None:
    """What llama.cpp's qwen35 graph fixes: Gated DeltaNet and full-attention layers alone, value heads as wide as key
    heads, and an interleaved M-RoPE turning each rotated pair of a text token by its position, as transformers does."""
    if unknown := sorted(set(config.layer_types) - QWEN35_LAYER_TYPES):
        raise UnsupportedModelError(
            f"this Qwen 3.5 checkpoint has layers of type '{unknown[0]}'; llama.cpp's qwen35 graph runs linear_attention and full_attention layers only"
        )
    delta = _delta_net(config)
    if delta.key_head_dim != delta.value_head_dim:
        raise UnsupportedModelError(
            f"this Qwen 3.5 checkpoint's linear-attention value heads are {delta.value_head_dim} wide and its key heads "
            f"{delta.key_head_dim}; llama.cpp's qwen35 graph makes both as wide (ssm.state_size)"
        )
    sections = _mrope_sections(config)
    if sum(sections) > config.head_dim:
        raise UnsupportedModelError(
            f"this Qwen 3.5 checkpoint's mrope_section spans {sum(sections)} pairs of its {config.head_dim}-wide heads; llama.cpp's rotation needs no more than the head is wide"
        )
    if unturned := _pairs_by_fourth_position(sections, config.rope_dimensions // 2):
        raise UnsupportedModelError(
            f"this Qwen 3.5 checkpoint's mrope_section {sections[:3]} leaves rotated pairs {unturned} to llama.cpp's fourth "
            "position, 0 for text, where transformers turns them by the token's position"
        )


def _add_ssm_sizes(writer: GGUFWriter, *, conv_kernel: int, inner_size: int, state_size: int, time_step_rank: int,
                   group_count: int) -> None:
    """A hybrid's recurrent layers' sizes under the ssm.* keys llama.cpp reads for Mamba-2 and Gated DeltaNet alike."""
    writer.add_ssm_conv_kernel(conv_kernel)
    writer.add_ssm_inner_size(inner_size)
    writer.add_ssm_state_size(state_size)
    writer.add_ssm_time_step_rank(time_step_rank)
    writer.add_ssm_group_count(group_count)


def _qwen35_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """The Gated DeltaNet's sizes under llama.cpp's ssm.* names, which layers are recurrent, the M-RoPE sections."""
    delta = _delta_net(config)
    _add_ssm_sizes(writer, conv_kernel=delta.conv_kernel, inner_size=delta.value_dim, state_size=delta.key_head_dim,
                   time_step_rank=delta.value_heads, group_count=delta.key_heads)
    writer.add_array(RECURRENT_LAYERS_KEY.format(arch=writer.arch), [kind == LINEAR_ATTENTION for kind in config.layer_types])
    writer.add_rope_dimension_sections(_mrope_sections(config))


def _tiled_value_heads(weights: np.ndarray, delta: DeltaNetSizes, head_size: int, axis: int = 0) -> np.ndarray:
    """Value heads along `axis` in llama.cpp's order. transformers groups them by the key head they share
    (k0: v0 v1, k1: v2 v3) and repeats each key head in place; ggml repeats the key heads tiled (k0 k1 k0 k1),
    so value head j of key head k moves to j * key_heads + k."""
    moved = np.moveaxis(weights, axis, 0)
    per_key = delta.value_heads // delta.key_heads
    tiled = moved.reshape(delta.key_heads, per_key, head_size, *moved.shape[1:]).swapaxes(0, 1).reshape(moved.shape)
    return np.moveaxis(tiled, 0, axis)


def _qwen35_rewrites(config: ModelConfig) -> dict[str, TensorRewrite]:
    """Qwen 3.5's Gated DeltaNet as llama.cpp's qwen35 graph reads it: each value head's rows (out_proj's columns) in
    its order, A as -exp(A_log), the time-step bias under the name gguf's map knows."""
    delta = _delta_net(config)
    qk_rows = 2 * delta.key_dim

    def value_heads(head_size: int, axis: int = 0) -> Callable[[np.ndarray], np.ndarray]:
        return lambda weights: _tiled_value_heads(weights, delta, head_size, axis)

    def value_rows(weights: np.ndarray) -> np.ndarray:
        """The q, k and v rows of the fused projection or the convolution, the v rows reordered."""
        return np.concatenate([weights[:qk_rows], _tiled_value_heads(weights[qk_rows:], delta, delta.value_head_dim)])

    one_per_head = value_heads(1)
    return {
        "linear_attn.in_proj_qkv.weight": TensorRewrite(value_rows),
        "linear_attn.conv1d.weight": TensorRewrite(value_rows),
        "linear_attn.in_proj_z.weight": TensorRewrite(value_heads(delta.value_head_dim)),
        "linear_attn.out_proj.weight": TensorRewrite(value_heads(delta.value_head_dim, axis=1)),
        "linear_attn.in_proj_a.weight": TensorRewrite(one_per_head),
        "linear_attn.in_proj_b.weight": TensorRewrite(one_per_head),
        "linear_attn.dt_bias": TensorRewrite(one_per_head, renamed="linear_attn.dt_proj.bias"),
        "linear_attn.A_log": TensorRewrite(lambda weights: -np.exp(one_per_head(weights))),
    }


def _check_granite(config: ModelConfig) -> None:
    # llama.cpp's granite graph sizes heads as hidden / heads and ignores a head_dim.
    if config.head_dim != config.hidden_size // config.n_heads:
        raise UnsupportedModelError(
            f"this Granite checkpoint's head_dim {config.head_dim} is not hidden_size / heads; llama.cpp assumes it is"
        )


def _granite_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Granite's multipliers under llama.cpp's names (its logit scale divides the logits)."""
    raw = config.raw
    writer.add_attention_scale(float(raw.get("attention_multiplier", 1.0 / math.sqrt(config.head_dim))))
    writer.add_embedding_scale(float(raw.get("embedding_multiplier", 1.0)))
    writer.add_residual_scale(float(raw.get("residual_multiplier", 1.0)))
    writer.add_logit_scale(float(raw.get("logits_scaling", 1.0)))


def _granite4_variant(config: ModelConfig) -> Architecture:
    """Granite 4's row as llama.cpp's converter picks it, by whether some layers are Mamba-2's and whether it has experts."""
    # transformers builds such a shared MLP 0 wide (it adds nothing) and saves its empty tensors, which llama.cpp's graphs do not read.
    if config.n_experts and not config.shared_expert_intermediate_size:
        raise UnsupportedModelError(
            "this Granite 4 checkpoint has experts but no shared expert (shared_intermediate_size 0); localchat converts Granite 4's "
            "mixtures of experts with one, as IBM ships them"
        )
    hybrid = any(config.kv_heads_of(layer) == 0 for layer in range(config.n_layers))
    return GRANITE4_VARIANTS[hybrid, bool(config.n_experts)]


def _granite4_mlp_rewrites(config: ModelConfig) -> dict[str, TensorRewrite]:
    """Granite 4's MLP as llama.cpp reads it: its own, or the shared expert where it has experts."""
    return GRANITE4_MOE_REWRITES if config.n_experts else GRANITE4_MLP_REWRITES


def _mamba2(config: ModelConfig) -> Mamba2Sizes:
    if config.mamba2 is None:  # transformers' class gives them to every Granite 4 config
        raise ModelError(f"this {config.architecture} checkpoint's config.json lacks its Mamba-2 layers' sizes (mamba_n_heads...); it is incomplete")
    return config.mamba2


def _check_granite4_hybrid(config: ModelConfig) -> None:
    """What llama.cpp's granitehybrid graph fixes: Granite's heads, attention without RoPE, Mamba-2's time steps unclamped."""
    _check_granite(config)
    _mamba2(config)
    if config.raw.get("position_embedding_type") == "rope":
        raise UnsupportedModelError(
            "this Granite 4 hybrid turns its attention by RoPE (position_embedding_type 'rope'); llama.cpp's granitehybrid graph runs hybrids without"
        )
    limit = config.raw.get("time_step_limit")
    if limit is not None and (not isinstance(limit, (list, tuple)) or tuple(limit) != UNCLAMPED_TIME_STEPS):
        raise UnsupportedModelError(
            f"this Granite 4 checkpoint clamps its Mamba-2 time steps to {limit} (time_step_limit); llama.cpp's granitehybrid graph does not"
        )


def _granite4_hybrid_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Granite's multipliers, the Mamba-2 layers' sizes under llama.cpp's ssm.* names, and no RoPE: llama.cpp reads
    rope.scaling.finetuned as Granite's switch for it."""
    _granite_metadata(config, writer)
    mamba = _mamba2(config)
    _add_ssm_sizes(writer, conv_kernel=mamba.conv_kernel, inner_size=mamba.inner_size, state_size=mamba.state_size,
                   time_step_rank=mamba.heads, group_count=mamba.groups)
    writer.add_rope_scaling_finetuned(False)


def _granite4_hybrid_rewrites(config: ModelConfig) -> dict[str, TensorRewrite]:
    """Granite 4's MLP as llama.cpp's, and its Mamba-2 layers as llama.cpp's mamba2 layer reads them: A as -exp(A_log), A and D
    one-column matrices (heads x 1), the gated norm's weights a row per group, the time-step bias under the name gguf's map knows."""
    mamba = _mamba2(config)
    column, by_group = (mamba.heads, 1), (mamba.groups, mamba.inner_size // mamba.groups)
    return {
        **_granite4_mlp_rewrites(config),
        "mamba.A_log": TensorRewrite(lambda weights: -np.exp(weights).reshape(column), shape=column),
        "mamba.D": TensorRewrite(lambda weights: weights.reshape(column), shape=column),
        "mamba.norm.weight": TensorRewrite(lambda weights: weights.reshape(by_group), shape=by_group),
        "mamba.dt_bias": TensorRewrite(renamed="mamba.dt_proj.bias"),
    }


def _check_smollm3(config: ModelConfig) -> None:
    expected = [int((i + 1) % SMOLLM3_NO_ROPE_STEP != 0) for i in range(config.n_layers)]
    if config.raw.get("no_rope_layers", expected) != expected:
        raise UnsupportedModelError(
            f"this SmolLM3 checkpoint's no_rope_layers differ from llama.cpp's fixed pattern "
            f"(no RoPE on every {SMOLLM3_NO_ROPE_STEP}th layer); llama.cpp cannot run it"
        )


def _check_olmoe(config: ModelConfig) -> None:
    # llama.cpp sizes OLMoE's key norm for as many key/value heads as query heads.
    if config.n_kv_heads != config.n_heads:
        raise UnsupportedModelError(
            f"this OLMoE checkpoint shares {config.n_kv_heads} key/value heads among {config.n_heads}; "
            "llama.cpp's olmoe graph needs one per query head"
        )


def _phi3_original_context(config: ModelConfig) -> int:
    rope = config.rope
    return int(rope.scaling.get("original_max_position_embeddings") or config.raw.get("original_max_position_embeddings")
               or config.context_length)


def _phi3_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Phi-3's original context; LongRoPE's attention factor, as transformers computes it."""
    original = _phi3_original_context(config)
    writer.add_rope_scaling_orig_ctx_len(original)
    # llama.cpp switches Phi-3's sliding window off; 0 marks Phi-4, which has none.
    writer.add_sliding_window(int(config.sliding_window or 0))
    if config.rope.scaling_type in LONGROPE_TYPES:
        scale = config.context_length / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)


def _longrope_factors(config: ModelConfig) -> list[PlannedTensor]:
    """LongRoPE's per-dimension factors (llama.cpp picks the long ones past the original context)."""
    if config.rope.scaling_type not in LONGROPE_TYPES:
        return []
    tensors = []
    for name, key in (("rope_factors_long.weight", "long_factor"), ("rope_factors_short.weight", "short_factor")):
        factors = np.asarray(config.rope.scaling[key], dtype=np.float32)
        if factors.shape != (config.rope_dimensions // 2,):
            raise UnsupportedModelError(
                f"this checkpoint's RoPE {key} has {factors.size} values for {config.rope_dimensions} rotated dimensions; "
                f"{config.rope_dimensions // 2} expected"
            )
        tensors.append(PlannedTensor(name, factors.shape, data=factors))
    return tensors


def _check_rope_numbers(rope: RopeSettings, keys: tuple[str, ...], family: str) -> None:
    """The RoPE settings `keys` of a `family` checkpoint, each a number >= 0 where given."""
    for key in keys:
        value = rope.scaling.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0):
            raise ModelError(f"this {family} checkpoint's rope_parameters give {key} {value!r}, expected a number >= 0; the config.json is corrupt")


def _check_yarn_rounded(config: ModelConfig, family: str, graph: str) -> None:
    """YaRN's correction range rounded outwards, as llama.cpp's `graph` graph always rounds it."""
    if config.rope.scaling.get("truncate", True) is not True:
        raise UnsupportedModelError(
            f"this {family} checkpoint's YaRN keeps its correction range unrounded (truncate false); llama.cpp's {graph} graph always rounds it"
        )


def _check_yarn_default_bounds(config: ModelConfig, family: str, graph: str) -> None:
    """YaRN's ramp between the default bounds, the only ones llama.cpp's `graph` graph runs (it reads none from the GGUF)."""
    scaling = config.rope.scaling
    bounds = (float(scaling.get("beta_fast") or YARN_BETA_FAST), float(scaling.get("beta_slow") or YARN_BETA_SLOW))
    if bounds != (YARN_BETA_FAST, YARN_BETA_SLOW):
        raise UnsupportedModelError(
            f"this {family} checkpoint's YaRN ramps between beta_fast {bounds[0]:g} and beta_slow {bounds[1]:g}; llama.cpp's {graph} graph "
            f"reads no bounds and ramps between {YARN_BETA_FAST:g} and {YARN_BETA_SLOW:g}"
        )


def _check_ministral3(config: ModelConfig) -> None:
    """What llama.cpp's mistral3 graph fixes of YaRN as transformers reads it from rope_parameters: the correction
    range rounded outwards, the attention factor derived from the factor and mscale_all_dim with mscale 1."""
    scaling = config.rope.scaling
    _check_rope_numbers(config.rope, MINISTRAL3_ROPE_NUMBERS, "Ministral 3")
    if scaling.get("llama_4_scaling_beta") is None:
        raise ModelError("this Ministral 3 checkpoint's rope_parameters lack llama_4_scaling_beta, which transformers needs; the config.json is incomplete")
    _check_yarn_rounded(config, "Ministral 3", "mistral3")
    if scaling.get("attention_factor") is not None:
        raise UnsupportedModelError(
            "this Ministral 3 checkpoint gives YaRN's attention_factor; llama.cpp's mistral3 graph derives it from the factor and mscale_all_dim"
        )
    if scaling.get("mscale") and scaling.get("mscale_all_dim") and scaling["mscale"] != 1:
        raise UnsupportedModelError(f"this Ministral 3 checkpoint's YaRN mscale is {scaling['mscale']}; llama.cpp's mistral3 graph assumes 1")


def _ministral3_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """YaRN's ramp and attention factor as llama.cpp's mistral3 graph reads them (add_rope_metadata writes the factor
    and original context), and the attention temperature: queries times 1 + beta * log(1 + floor(position / original context))."""
    scaling = config.rope.scaling
    writer.add_rope_scaling_yarn_beta_fast(float(scaling.get("beta_fast") or YARN_BETA_FAST))
    writer.add_rope_scaling_yarn_beta_slow(float(scaling.get("beta_slow") or YARN_BETA_SLOW))
    # transformers' attention factor: mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are given, else
    # mscale(factor); llama.cpp's: mscale(factor) / mscale(factor, log multiplier), or mscale(factor) without one.
    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        writer.add_rope_scaling_yarn_log_mul(float(scaling["mscale_all_dim"]))
    writer.add_attn_temperature_scale(float(scaling["llama_4_scaling_beta"]))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for a context `factor` times the original (transformers' and llama.cpp's get_mscale)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_attention_factor(rope: RopeSettings) -> float:
    """What transformers' YaRN multiplies cos and sin by: attention_factor where given, else derived from the factor
    (and from mscale over mscale_all_dim, where both are given)."""
    factor = float(rope.scaling["factor"])
    if (given := rope.scaling.get("attention_factor")) is not None:
        return float(given)
    mscale, mscale_all_dim = rope.scaling.get("mscale"), rope.scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all_dim))
    return _yarn_mscale(factor)


def _check_olmo3(config: ModelConfig) -> None:
    """What llama.cpp's olmo2 graph fixes for OLMo 3: sliding-window and full-attention layers alone, the sliding ones
    turned by unscaled RoPE at the global base, YaRN's ramp between its default bounds (it reads no others), whole heads turned."""
    if unknown := sorted(set(config.layer_types) - {"sliding_attention", "full_attention"}):
        raise UnsupportedModelError(
            f"this OLMo 3 checkpoint has layers of type '{unknown[0]}'; llama.cpp's olmo2 graph runs sliding_attention and full_attention layers only"
        )
    if config.sliding_window is None and "sliding_attention" in config.layer_types:
        raise UnsupportedModelError(
            "this OLMo 3 checkpoint has sliding_attention layers but no sliding_window; llama.cpp's olmo2 graph would turn them as its full layers"
        )
    local = config.rope_local if "sliding_attention" in config.layer_types else None
    if local is not None and (local.scaling_type != "default" or local.theta != config.rope.theta):
        raise UnsupportedModelError(
            f"this OLMo 3 checkpoint turns its sliding-window layers by RoPE '{local.scaling_type}' at base {local.theta:g}; llama.cpp's "
            f"olmo2 graph turns them by unscaled RoPE at the full layers' base ({config.rope.theta:g})"
        )
    if config.rope_dimensions != config.head_dim:
        raise UnsupportedModelError(
            f"this OLMo 3 checkpoint turns {config.rope_dimensions} of each head's {config.head_dim} dimensions by RoPE; llama.cpp's olmo2 graph turns them all"
        )
    if config.rope.scaling_type != "yarn":
        return
    _check_rope_numbers(config.rope, OLMO3_ROPE_NUMBERS, "OLMo 3")
    _check_yarn_rounded(config, "OLMo 3", "olmo2")
    _check_yarn_default_bounds(config, "OLMo 3", "olmo2")


def _olmo3_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """The window and which layers slide (llama.cpp's olmo2 graph turns those by unscaled RoPE), and YaRN's attention
    factor as transformers has it over the one llama.cpp derives from the factor (1 for the releases)."""
    _add_sliding_layers(config, writer)
    if config.rope.scaling_type == "yarn":
        writer.add_rope_scaling_attn_factors(_yarn_attention_factor(config.rope) / _yarn_mscale(float(config.rope.scaling["factor"])))


def _check_attention_kinds(config: ModelConfig, family: str, graph: str) -> None:
    """Layers that attend over a window or over the whole context alone, which llama.cpp's graphs of models with sliding-window
    layers (exaone4, cohere2, gpt-oss) run."""
    if unknown := sorted(set(config.layer_types) - {"sliding_attention", "full_attention"}):
        raise UnsupportedModelError(
            f"this {family} checkpoint has layers of type '{unknown[0]}'; llama.cpp's {graph} graph runs sliding_attention and full_attention layers only"
        )


def _check_attention_kinds_and_square_heads(config: ModelConfig, family: str, graph: str) -> None:
    """What llama.cpp's exaone4 and cohere2 graphs fix: the layers' kinds, and heads as wide as the model together (their
    attention output is square)."""
    _check_attention_kinds(config, family, graph)
    if config.n_heads * config.head_dim != config.hidden_size:
        raise UnsupportedModelError(
            f"this {family} checkpoint's {config.n_heads} heads of {config.head_dim} are not hidden_size ({config.hidden_size}) wide together; "
            f"llama.cpp's {graph} graph needs them to be"
        )


def _check_exaone4(config: ModelConfig) -> None:
    """What llama.cpp's exaone4 graph fixes: heads as wide as the model together (its attention output is square),
    RoPE over whole heads, and sliding windows in 64-layer models alone. transformers turns RoPE in every layer where
    the config gives no sliding_window, else in the sliding-window layers alone, as llama.cpp does in those models."""
    _check_attention_kinds_and_square_heads(config, "EXAONE 4", "exaone4")
    if config.rope_dimensions != config.head_dim:
        raise UnsupportedModelError(
            f"this EXAONE 4 checkpoint turns {config.rope_dimensions} of each head's {config.head_dim} dimensions by RoPE; llama.cpp's exaone4 graph turns them all"
        )
    window = config.sliding_window
    if window is None and "sliding_attention" in config.layer_types:
        raise ModelError("this EXAONE 4 checkpoint has sliding_attention layers but no sliding_window; the config.json is inconsistent")
    if config.n_layers == EXAONE4_HYBRID_LAYERS and window is None:
        raise UnsupportedModelError(
            f"this EXAONE 4 checkpoint has {EXAONE4_HYBRID_LAYERS} layers and no sliding_window; llama.cpp's exaone4 graph takes such a model "
            "for the 32B's hybrid, turning RoPE in sliding-window layers alone, where transformers turns it in every layer"
        )
    if config.n_layers != EXAONE4_HYBRID_LAYERS and window is not None:
        raise UnsupportedModelError(
            f"this EXAONE 4 checkpoint has {config.n_layers} layers and sliding_window={window}; llama.cpp's exaone4 graph slides windows in "
            f"{EXAONE4_HYBRID_LAYERS}-layer models alone and turns RoPE in every layer of others, where transformers turns it in sliding-window layers alone"
        )


def _exaone4_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """The window and which layers slide, where they do (llama.cpp's default pattern, 3 in 4, is the 32B's)."""
    _add_sliding_layers(config, writer)


def _add_sliding_layers(config: ModelConfig, writer: GGUFWriter) -> None:
    """The window and which layers slide, as a per-layer pattern; nothing where no layer slides: llama.cpp aborts on a
    window without sliding-window layers (GGML_ASSERT(is_swa_any()))."""
    sliding = [kind == "sliding_attention" for kind in config.layer_types]
    if config.sliding_window is not None and any(sliding):
        writer.add_sliding_window(config.sliding_window)
        writer.add_sliding_window_pattern(sliding)


def _check_cohere2(config: ModelConfig) -> None:
    """What llama.cpp's cohere2 graph fixes: its layers' kinds and heads (as EXAONE 4's), and sliding-window layers within
    a window, which it turns by RoPE (as transformers does) and without which it loads no model."""
    _check_attention_kinds_and_square_heads(config, "Cohere2", "cohere2")
    if config.sliding_window is None or "sliding_attention" not in config.layer_types:
        raise UnsupportedModelError(
            "this Cohere2 checkpoint has no sliding_attention layers with a sliding_window; llama.cpp's cohere2 graph turns RoPE in "
            "such layers alone and loads no model without them, where transformers turns it nowhere"
        )


def _cohere2_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """The window and which layers slide, the LayerNorm's epsilon (llama.cpp reads no RMSNorm's), the logits' scale."""
    _add_sliding_layers(config, writer)
    writer.add_layer_norm_eps(float(config.raw["layer_norm_eps"]))
    writer.add_logit_scale(float(config.raw["logit_scale"]))


def _check_seed_oss(config: ModelConfig) -> None:
    if config.rope_dimensions != config.head_dim:
        raise UnsupportedModelError(
            f"this Seed-OSS checkpoint turns {config.rope_dimensions} of each head's {config.head_dim} dimensions by RoPE; llama.cpp's seed_oss graph turns them all"
        )


def _check_glm4moe(config: ModelConfig) -> None:
    """What llama.cpp's glm4moe graph fixes: experts chosen among all of them (it reads no groups), shared experts beside them."""
    groups, kept = config.raw.get("n_group") or 1, config.raw.get("topk_group") or 1
    if kept < groups:
        raise UnsupportedModelError(
            f"this GLM-4.5 checkpoint chooses experts within {kept} of {groups} groups (topk_group, n_group); llama.cpp's glm4moe graph chooses among all"
        )
    if not config.shared_experts:
        raise UnsupportedModelError("this GLM-4.5 checkpoint has no shared experts (n_shared_experts 0); llama.cpp's glm4moe graph runs them beside the routed ones")


def _glm4moe_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Its leading dense layers, and how its router weighs the experts it chooses: their sigmoid scores, renormalised or
    not (norm_topk_prob), times routed_scaling_factor (transformers gives both where the config does not)."""
    writer.add_leading_dense_block_count(config.dense_layers)
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    writer.add_expert_weights_scale(float(config.raw["routed_scaling_factor"]))
    writer.add_expert_weights_norm(bool(config.raw["norm_topk_prob"]))


def _latent_attention(config: ModelConfig) -> LatentAttentionSizes:
    if config.latent_attention is None:  # transformers' class gives them to every DeepSeek config
        raise ModelError(f"this {config.architecture} checkpoint's config.json lacks its latent attention's sizes (kv_lora_rank...); it is incomplete")
    return config.latent_attention


def _deepseek_query_variant(config: ModelConfig) -> Architecture:
    """DeepSeek's row with its queries' tensors, which differ by whether they go through a latent of their own."""
    row = ARCHITECTURES[config.architecture]
    queries = DEEPSEEK_QUERIES[bool(_latent_attention(config).q_lora_rank)]
    return replace(row, layer_tensors=row.layer_tensors + queries, dense_layer_tensors=row.dense_layer_tensors + queries, variant=None)


def _check_deepseek_yarn(config: ModelConfig) -> None:
    """YaRN as llama.cpp's deepseek2 graph runs it: its ramp between the default bounds, rounded outwards, and attention scaled by
    mscale_all_dim alone, which is transformers' scale where mscale equals it (as in DeepSeek's releases)."""
    scaling, family = config.rope.scaling, config.architecture
    _check_rope_numbers(config.rope, OLMO3_ROPE_NUMBERS, family)
    if scaling.get("attention_factor") is not None:
        raise UnsupportedModelError(f"this {family} checkpoint gives YaRN's attention_factor; llama.cpp's deepseek2 graph derives it from mscale_all_dim")
    _check_yarn_rounded(config, family, "deepseek2")
    _check_yarn_default_bounds(config, family, "deepseek2")
    mscale, all_dims = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if not all_dims or mscale != all_dims:
        raise UnsupportedModelError(
            f"this {family} checkpoint's YaRN has mscale {mscale} and mscale_all_dim {all_dims}; llama.cpp's deepseek2 graph scales attention "
            "as transformers does only where both are given and equal, as in DeepSeek's releases"
        )


def _check_deepseek(config: ModelConfig) -> None:
    """What llama.cpp's deepseek2 graph fixes for DeepSeek V2 and V3: shared experts beside the routed ones, queries projected
    directly in models of DeepSeek-V2-Lite's size, YaRN's attention scale from mscale_all_dim."""
    latent, family = _latent_attention(config), config.architecture
    if not config.shared_experts:
        raise UnsupportedModelError(f"this {family} checkpoint has no shared experts (n_shared_experts 0); llama.cpp's deepseek2 graph runs them beside the routed ones")
    lite = config.n_layers in DEEPSEEK2_LITE_LAYERS or (config.n_layers == 48 and config.vocab_size == DEEPSEEK2_LITE_VOCAB)
    if lite and latent.q_lora_rank:
        raise UnsupportedModelError(
            f"this {family} checkpoint has {config.n_layers} layers and projects its queries through a latent (q_lora_rank {latent.q_lora_rank}); "
            "llama.cpp's deepseek2 graph takes such a model for DeepSeek-V2-Lite's kind and projects them directly"
        )
    if config.rope.scaling_type == "yarn":
        _check_deepseek_yarn(config)


def _check_deepseek2(config: ModelConfig) -> None:
    """DeepSeek V2's, and its router's choice: transformers' takes the best experts (greedy) or the best within the best groups,
    each group ranked by its best expert (group_limited_greedy), where llama.cpp's graph ranks a group by its best two."""
    _check_deepseek(config)
    method = config.raw.get("topk_method") or "greedy"
    groups, kept = config.raw.get("n_group") or 1, config.raw.get("topk_group") or 1
    if method not in ("greedy", "group_limited_greedy"):
        raise UnsupportedModelError(
            f"this DeepSeek-V2 checkpoint chooses experts by '{method}' (topk_method); transformers' DeepSeek-V2 and llama.cpp's deepseek2 graph "
            "choose them 'greedy' or 'group_limited_greedy'"
        )
    if method == "group_limited_greedy" and kept < groups:
        raise UnsupportedModelError(
            f"this DeepSeek-V2 checkpoint chooses experts within {kept} of {groups} groups ranked by their best expert (group_limited_greedy); "
            "llama.cpp's deepseek2 graph ranks groups by their best two"
        )


def _check_deepseek3(config: ModelConfig) -> None:
    """DeepSeek V3's, and its groups of experts: as many experts in each, two or more (a group's rank is its best two's scores)."""
    _check_deepseek(config)
    groups = config.raw.get("n_group") or 1
    if config.n_experts % groups or (groups > 1 and config.n_experts // groups < 2):
        raise ModelError(f"this DeepSeek-V3 checkpoint's {config.n_experts} experts do not make {groups} groups of two or more (n_group); the config.json is inconsistent")


def _add_deepseek_routing(config: ModelConfig, writer: GGUFWriter, gating: ExpertGatingFuncType) -> None:
    """Its leading dense layers; its router's scores (`gating`), renormalised or not (norm_topk_prob), times routed_scaling_factor
    (transformers gives both where the config does not); YaRN's attention scale as llama.cpp's converter writes it: a tenth of
    mscale_all_dim, which llama.cpp's deepseek2 loader multiplies back."""
    writer.add_leading_dense_block_count(config.dense_layers)
    writer.add_expert_gating_func(gating)
    writer.add_expert_weights_scale(float(config.raw["routed_scaling_factor"]))
    writer.add_expert_weights_norm(bool(config.raw.get("norm_topk_prob")))
    if config.rope.scaling_type == "yarn":
        writer.add_rope_scaling_yarn_log_mul(0.1 * float(config.rope.scaling["mscale_all_dim"]))


def _deepseek2_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Its experts chosen by softmax over all of them."""
    _add_deepseek_routing(config, writer, ExpertGatingFuncType.SOFTMAX)


def _deepseek3_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Its experts chosen by sigmoid scores plus a bias per expert, within topk_group of n_group groups (llama.cpp ranks them by
    their best two, as transformers does)."""
    _add_deepseek_routing(config, writer, ExpertGatingFuncType.SIGMOID)
    writer.add_expert_group_count(int(config.raw.get("n_group") or 1))
    writer.add_expert_group_used_count(int(config.raw.get("topk_group") or 1))


def _deepseek_rewrites(config: ModelConfig) -> dict[str, TensorRewrite]:
    """kv_b_proj as llama.cpp's converter splits it for attention over the latent: each head's key rows turned (attn_k_b: the
    latent's width by the key's), and its value rows (attn_v_b); V3's expert bias under the name gguf's map knows (exp_probs_b.bias)."""
    latent = _latent_attention(config)
    heads, keys, rank = config.n_heads, latent.qk_nope_head_dim, latent.kv_lora_rank

    def per_head(weights: np.ndarray) -> np.ndarray:
        return weights.reshape(heads, keys + latent.v_head_dim, rank)

    split = (TensorRewrite(lambda weights: per_head(weights)[:, :keys].transpose(0, 2, 1), "self_attn.k_b_proj.weight", (heads, rank, keys)),
             TensorRewrite(lambda weights: per_head(weights)[:, keys:], "self_attn.v_b_proj.weight", (heads, latent.v_head_dim, rank)))
    return {"self_attn.kv_b_proj.weight": TensorRewrite(into=split), **GLM4MOE_REWRITES}


def _check_ernie4_5(config: ModelConfig) -> None:
    if config.rope_dimensions != config.head_dim:
        raise UnsupportedModelError(
            f"this {config.architecture} checkpoint turns {config.rope_dimensions} of each head's {config.head_dim} dimensions by RoPE; "
            "llama.cpp's ernie4_5 graphs turn them all"
        )


def _check_ernie4_5_moe(config: ModelConfig) -> None:
    """What llama.cpp's ernie4_5-moe graph fixes beyond the dense one's: experts in every layer from the first routed one to the
    last, and the chosen experts' weights divided by their sum, which transformers clamps from below by moe_norm_min. That sum is
    at least moe_k / moe_num_experts (the top k of n softmax scores), so a moe_norm_min up to it never acts."""
    _check_ernie4_5(config)
    last = config.raw.get("moe_layer_end_index", -1)
    if last not in (-1, config.n_layers - 1):
        raise UnsupportedModelError(
            f"this ERNIE 4.5 checkpoint's experts end at layer {last} (moe_layer_end_index) of {config.n_layers}; llama.cpp's "
            "ernie4_5-moe graph routes every layer after its leading dense ones"
        )
    floor = config.raw.get("moe_norm_min", 0.0)
    if not isinstance(floor, (int, float)) or floor > config.n_experts_used / config.n_experts:
        raise UnsupportedModelError(
            f"this ERNIE 4.5 checkpoint's moe_norm_min is {floor!r}, which may exceed the sum of its chosen experts' weights "
            f"({config.n_experts_used} of {config.n_experts}); llama.cpp's ernie4_5-moe graph divides by that sum alone"
        )


def _ernie4_5_moe_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """Its leading dense layers and routed ones after them, and its shared experts' width (llama.cpp's graph runs them where it
    is not 0): moe_num_shared_experts times a routed expert's, as transformers builds them."""
    writer.add_leading_dense_block_count(config.dense_layers)
    writer.add_interleave_moe_layer_step(int(config.raw.get("moe_layer_interval", 1)))
    if config.shared_experts:
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)


def _check_gpt_oss(config: ModelConfig) -> None:
    """What llama.cpp's gpt-oss graph fixes: sliding-window and full-attention layers, some of them sliding (it loads no model
    without), whole heads turned, and YaRN's ramp between its default bounds (it reads no others). transformers leaves YaRN's
    correction range unrounded where the config says truncate false, as gpt-oss's does, and llama.cpp rounds it outwards: this
    is how llama.cpp runs every gpt-oss, a ramp a fraction of a pair wider (8-18 of the 32 pairs, not 8.1-17.4), and is accepted."""
    _check_attention_kinds(config, "gpt-oss", "gpt-oss")
    if config.sliding_window is None or "sliding_attention" not in config.layer_types:
        raise UnsupportedModelError(
            "this gpt-oss checkpoint has no sliding_attention layers with a sliding_window; llama.cpp's gpt-oss graph loads no model without them"
        )
    if config.rope_dimensions != config.head_dim:
        raise UnsupportedModelError(
            f"this gpt-oss checkpoint turns {config.rope_dimensions} of each head's {config.head_dim} dimensions by RoPE; llama.cpp's gpt-oss graph turns them all"
        )
    if config.rope.scaling_type != "yarn":
        return
    _check_rope_numbers(config.rope, OLMO3_ROPE_NUMBERS, "gpt-oss")
    _check_yarn_default_bounds(config, "gpt-oss", "gpt-oss")


def _gpt_oss_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    """The window and which layers slide, the experts' width (llama.cpp sizes their stacks by it), and YaRN's attention factor
    as transformers has it over the one llama.cpp derives from the factor (1 for the releases)."""
    _add_sliding_layers(config, writer)
    writer.add_expert_feed_forward_length(config.expert_intermediate_size)
    if config.rope.scaling_type == "yarn":
        writer.add_rope_scaling_attn_factors(_yarn_attention_factor(config.rope) / _yarn_mscale(float(config.rope.scaling["factor"])))


LLAMA = Architecture(MODEL_ARCH.LLAMA, permute_qk=True)
GEMMA3 = Architecture(MODEL_ARCH.GEMMA3, norm_offset=1.0, check=_check_gemma3, metadata=_gemma3_metadata)
# Gemma 4's dense models (E2B, E4B, 31B). Its norms multiply by the weight itself; its mixture of experts (26B-A4B) is not converted yet.
GEMMA4 = Architecture(
    MODEL_ARCH.GEMMA4,
    layer_tensors=GEMMA4_LAYER,
    fixed=(FixedSetting("enable_moe_block", False, False), FixedSetting("attention_bias", False, False),
           FixedSetting("hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh")),
    rope_scalings=("default", "proportional"),
    check=_check_gemma4,
    metadata=_gemma4_metadata,
    extra_tensors=_proportional_rope_factors,
    bare_tensors=("layer_scalar",),
    tokenizer_model="gemma4",
)
# Ministral 3: LLaMA's layers with YaRN and an attention temperature by position, which transformers reads from
# YaRN's settings (llama.cpp's converter takes YaRN only); llama.cpp's mistral3 graph attends over the whole context.
MINISTRAL3 = Architecture(
    MODEL_ARCH.MISTRAL3, permute_qk=True, fixed=(FixedSetting("sliding_window", None, None),), rope_scalings=("yarn",),
    check=_check_ministral3, metadata=_ministral3_metadata,
)
# The activation (SwiGLU's) that llama.cpp's graphs of the families below hard-code.
SILU = FixedSetting("hidden_act", "silu", "silu")
# llama.cpp's gpt-oss graph clamps its experts' SwiGLU at these (swiglu_limit, swiglu_alpha), which it reads from no key.
GPT_OSS_SWIGLU = (FixedSetting("swiglu_limit", 7.0, 7.0), FixedSetting("swiglu_alpha", 1.702, 1.702))
# Qwen 3.5's dense models: Gated DeltaNet (linear attention) layers and gated full-attention ones (every 4th in its
# releases), which the GGUF lists; its norms multiply by 1 + weight, but for the DeltaNet's gated one. llama.cpp's qwen35
# graph reads no per-dimension RoPE factors (Llama 3's scaling) and no attention output bias.
QWEN35 = Architecture(
    MODEL_ARCH.QWEN35,
    norm_offset=1.0,
    norms_without_offset=("ssm_norm.weight",),
    layer_tensors=QWEN35_LAYER,
    fixed=(FixedSetting("attention_bias", False, False), SILU),
    rope_scalings=("default", "linear", "yarn"),
    check=_check_qwen35,
    metadata=_qwen35_metadata,
    squeezed_tensors=("linear_attn.conv1d.weight",),
    rewrites=_qwen35_rewrites,
)
# Qwen 3.5's mixtures of experts: its dense models' layers with experts in every layer, a softmax router whose chosen experts'
# weights are renormalised, and a shared expert gated by a sigmoid, as llama.cpp's qwen35moe graph runs them.
QWEN35MOE = replace(QWEN35, gguf_arch=MODEL_ARCH.QWEN35MOE, layer_tensors=QWEN35_LAYER[:2] + ROUTED_EXPERTS + SHARED_EXPERT)
# Granite 4's models that attend in every layer (micro, 1b, 350m), as llama.cpp's converter writes them: Granite's graph,
# which turns every layer by RoPE.
GRANITE4 = Architecture(
    MODEL_ARCH.GRANITE,
    permute_qk=True,
    layer_tensors=ATTENTION + GRANITE4_LAYER[1:],
    fixed=(SILU, FixedSetting("position_embedding_type", "rope", None)),
    check=_check_granite,
    metadata=_granite_metadata,
    rewrites=_granite4_mlp_rewrites,
)
# Granite 4's hybrids (h-micro, h-1b, h-350m): Mamba-2 layers, which the GGUF tells apart by their 0 key/value heads, between
# attention layers without RoPE. llama.cpp's Mamba-2 layer is twice the model wide, adds a convolution bias and no projection biases.
GRANITE4_HYBRID = Architecture(
    MODEL_ARCH.GRANITE_HYBRID,
    permute_qk=True,
    layer_tensors=GRANITE4_LAYER,
    fixed=(SILU, FixedSetting("mamba_expand", 2, 2), FixedSetting("mamba_conv_bias", True, True), FixedSetting("mamba_proj_bias", False, False)),
    check=_check_granite4_hybrid,
    metadata=_granite4_hybrid_metadata,
    squeezed_tensors=("mamba.conv1d.weight",),
    rewrites=_granite4_hybrid_rewrites,
    variant=_granite4_variant,
)
# Granite 4's mixtures of experts (h-tiny, h-small; granitemoe where every layer attends): their MLP is the shared expert beside
# the routed ones, which llama.cpp's graphs pick and weigh as transformers does (a softmax over the chosen experts' logits).
GRANITE4_HYBRID_MOE = replace(GRANITE4_HYBRID, layer_tensors=GRANITE4_LAYER + GRANITE4_EXPERTS)
GRANITE4_MOE = replace(GRANITE4, gguf_arch=MODEL_ARCH.GRANITE_MOE, layer_tensors=GRANITE4.layer_tensors + GRANITE4_EXPERTS)
# Granite 4's rows by whether some layers are Mamba-2's and whether it has experts.
GRANITE4_VARIANTS = {(False, False): GRANITE4, (True, False): GRANITE4_HYBRID, (False, True): GRANITE4_MOE, (True, True): GRANITE4_HYBRID_MOE}
# llama.cpp's MoE graphs route every layer (no dense layers between routed ones).
EVERY_LAYER_ROUTED = (FixedSetting("decoder_sparse_step", 1, 1), FixedSetting("mlp_only_layers", [], []))
# Qwen's switch for sliding-window attention in its upper layers (off in Qwen's releases).
NO_SLIDING_WINDOW = FixedSetting("use_sliding_window", False, False)
ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": LLAMA,
    # Mistral is LLaMA to llama.cpp; its sliding window is wider than any context it is run with.
    "MistralForCausalLM": LLAMA,
    "Ministral3ForCausalLM": MINISTRAL3,
    # Ministral 3 as Mistral ships it, with a vision tower: its text model, as for Gemma 3.
    "Mistral3ForConditionalGeneration": MINISTRAL3,
    # llama.cpp's qwen2 and qwen3 graphs attend over the whole context in every layer.
    "Qwen2ForCausalLM": Architecture(MODEL_ARCH.QWEN2, fixed=(NO_SLIDING_WINDOW,)),
    "Qwen3ForCausalLM": Architecture(MODEL_ARCH.QWEN3, fixed=(NO_SLIDING_WINDOW,)),
    "Qwen3_5ForCausalLM": QWEN35,
    # Qwen 3.5 as Qwen ships it, with a vision tower: its text model, as for Gemma 3.
    "Qwen3_5ForConditionalGeneration": QWEN35,
    "Qwen3_5MoeForCausalLM": QWEN35MOE,
    "Qwen3_5MoeForConditionalGeneration": QWEN35MOE,
    "Gemma3ForCausalLM": GEMMA3,
    # Gemma 3 4B and up, which also read images: their text model (checkpoint.WRAPPERS finds it).
    "Gemma3ForConditionalGeneration": GEMMA3,
    "Gemma4ForCausalLM": GEMMA4,
    # Gemma 4 that also sees (and E2B, E4B hear): its text model, as for Gemma 3.
    "Gemma4ForConditionalGeneration": GEMMA4,
    # llama.cpp's gemma2 graph has no output matrix of its own: it reads the embeddings.
    "Gemma2ForCausalLM": Architecture(
        MODEL_ARCH.GEMMA2, norm_offset=1.0, fixed=(FixedSetting("tie_word_embeddings", True, True),), check=_check_gemma2,
        metadata=_gemma2_metadata,
    ),
    # Phi-3 and Phi-4: fused QKV and gate/up matrices, which llama.cpp's phi3 graph takes as they are.
    "Phi3ForCausalLM": Architecture(
        MODEL_ARCH.PHI3,
        layer_tensors=("input_layernorm.weight", "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
                       "mlp.gate_up_proj.weight", "mlp.down_proj.weight"),
        rope_scalings=("default", *LONGROPE_TYPES),
        metadata=_phi3_metadata,
        extra_tensors=_longrope_factors,
    ),
    "GraniteForCausalLM": Architecture(MODEL_ARCH.GRANITE, permute_qk=True, check=_check_granite, metadata=_granite_metadata),
    # Granite 4: its hybrids and, in the same class, its models that attend in every layer and its mixtures of experts
    # (GRANITE4_HYBRID.variant picks).
    "GraniteMoeHybridForCausalLM": GRANITE4_HYBRID,
    "SmolLM3ForCausalLM": Architecture(
        MODEL_ARCH.SMOLLM3, permute_qk=True, fixed=(FixedSetting("use_sliding_window", False, False),), check=_check_smollm3
    ),
    # OLMo 2 normalises after attention and after the MLP, not before.
    "Olmo2ForCausalLM": Architecture(MODEL_ARCH.OLMO2, layer_tensors=OLMO2_LAYER),
    # OLMo 3: OLMo 2's layers, those of a sliding window listed (three in four in its releases) and turned by unscaled RoPE,
    # the others by YaRN in its long-context releases. llama.cpp's olmo2 graph reads an output matrix of its own, no
    # attention biases and no per-dimension RoPE factors (Llama 3's scaling).
    "Olmo3ForCausalLM": Architecture(
        MODEL_ARCH.OLMO2,
        layer_tensors=OLMO2_LAYER,
        fixed=(FixedSetting("tie_word_embeddings", False, False), FixedSetting("attention_bias", False, False), SILU),
        rope_scalings=("default", "linear", "yarn"),
        check=_check_olmo3,
        metadata=_olmo3_metadata,
    ),
    # EXAONE 4.0: OLMo 2's post-norms with per-head query and key norms; the 32B's sliding-window layers listed.
    "Exaone4ForCausalLM": Architecture(
        MODEL_ARCH.EXAONE4,
        layer_tensors=EXAONE4_LAYER,
        fixed=(SILU,),
        check=_check_exaone4,
        metadata=_exaone4_metadata,
    ),
    # Cohere's Command R7B and Command A: attention and the MLP side by side from one LayerNorm (no bias), RoPE (on adjacent
    # pairs, as llama.cpp's cohere2 graph turns them) in the sliding-window layers alone, the logits scaled, the head tied.
    # llama.cpp's graph reads no attention biases (its converter drops them, zero in the releases) and no RoPE scaling.
    "Cohere2ForCausalLM": Architecture(
        MODEL_ARCH.COHERE2,
        fixed=(FixedSetting("tie_word_embeddings", True, True), FixedSetting("attention_bias", False, False), SILU),
        rope_scalings=("default",),
        check=_check_cohere2,
        metadata=_cohere2_metadata,
    ),
    # ByteDance's Seed-OSS: LLaMA's layers with query, key and value biases, heads of their own width (head_dim). llama.cpp's
    # seed_oss graph reads no attention output or MLP biases and no per-dimension RoPE factors (Llama 3's scaling).
    "SeedOssForCausalLM": Architecture(
        MODEL_ARCH.SEED_OSS,
        fixed=(FixedSetting("attention_out_bias", False, False), FixedSetting("mlp_bias", False, False), SILU),
        rope_scalings=("default", "linear"),
        check=_check_seed_oss,
    ),
    # GLM-4 (GLM-4-9B-0414, GLM-Z1): norms before and after attention and the MLP, query, key and value biases, RoPE on adjacent
    # pairs of part of each head, as llama.cpp's glm4 graph turns them. It reads no per-dimension RoPE factors (Llama 3's scaling),
    # and no YaRN settings beyond its factor and original context: YaRN is refused.
    "Glm4ForCausalLM": Architecture(MODEL_ARCH.GLM4, layer_tensors=GLM4_LAYER, fixed=(SILU,), rope_scalings=("default", "linear")),
    # GLM-4.5, GLM-4.5-Air, GLM-4.6: dense leading layers (first_k_dense_replace), then experts chosen by sigmoid scores plus a
    # bias per expert beside shared experts; RoPE on halves of part of each head, query and key norms where use_qk_norm. Its
    # layers that predict further tokens (multi-token prediction) are kept, as llama.cpp's converter keeps them (its graph skips them).
    "Glm4MoeForCausalLM": Architecture(
        MODEL_ARCH.GLM4_MOE,
        layer_tensors=GLM4MOE_LAYER + GLM4MOE_EXPERTS,
        dense_layer_tensors=GLM4MOE_LAYER + GATED_MLP,
        fixed=(SILU,),
        rope_scalings=("default", "linear"),
        check=_check_glm4moe,
        metadata=_glm4moe_metadata,
        rewrites=lambda config: GLM4MOE_REWRITES,
    ),
    # Baidu's ERNIE 4.5 0.3B: LLaMA's layers with heads of their own width (head_dim) and RoPE on adjacent pairs, as llama.cpp's
    # ernie4_5 graph turns them (no reordered rows). It reads no biases (use_bias), no per-dimension RoPE factors (Llama 3's
    # scaling) and no YaRN settings beyond its factor and original context.
    "Ernie4_5ForCausalLM": Architecture(
        MODEL_ARCH.ERNIE4_5,
        fixed=(FixedSetting("use_bias", False, False), SILU),
        rope_scalings=("default", "linear"),
        check=_check_ernie4_5,
        space_prefix_from_tokenizer_config=True,
    ),
    # ERNIE 4.5's mixtures of experts (21B-A3B, 300B-A47B): leading dense layers (moe_layer_start_index), then experts chosen
    # by softmax scores plus a bias per expert (moe_statics), their weights renormalised, beside shared experts. llama.cpp's
    # ernie4_5-moe graph loads experts for every layer after the dense ones: a config routing every other one is refused. Its
    # multi-token-prediction layers are left out, as llama.cpp's converter leaves them.
    "Ernie4_5_MoeForCausalLM": Architecture(
        MODEL_ARCH.ERNIE4_5_MOE,
        layer_tensors=ATTENTION + ROUTED_EXPERTS,
        dense_layer_tensors=ATTENTION + GATED_MLP,
        fixed=(FixedSetting("use_bias", False, False), SILU, FixedSetting("moe_layer_interval", 1, 1)),
        rope_scalings=("default", "linear"),
        check=_check_ernie4_5_moe,
        metadata=_ernie4_5_moe_metadata,
        rewrites=_ernie4_5_moe_rewrites,
        space_prefix_from_tokenizer_config=True,
        left_out=ERNIE4_5_MTP_PREFIXES,
    ),
    # OpenAI's gpt-oss (20b, 120b): attention with biases and a sink per head, sliding-window and full layers alternating, YaRN;
    # in every layer a softmax over the chosen experts' logits (a router with a bias), experts with biases and a clamped SwiGLU.
    # llama.cpp's gpt-oss graph reads an output matrix of its own and an attention output bias, whatever the config says.
    "GptOssForCausalLM": Architecture(
        MODEL_ARCH.GPT_OSS,
        layer_tensors=GPT_OSS_LAYER,
        fixed=(FixedSetting("attention_bias", True, True), FixedSetting("tie_word_embeddings", False, False), *GPT_OSS_SWIGLU),
        rope_scalings=("default", "linear", "yarn"),
        check=_check_gpt_oss,
        metadata=_gpt_oss_metadata,
        bare_tensors=("sinks",),
        rewrites=_gpt_oss_rewrites,
        variant=_gpt_oss_variant,
    ),
    # DeepSeek-V2 and V2-Lite: multi-head latent attention (keys and values through one latent shared by the heads, queries directly
    # or through a latent of their own), RoPE on adjacent pairs of part of each head (YaRN in the releases), leading dense layers,
    # then experts chosen by softmax beside shared experts, as llama.cpp's deepseek2 graph runs them. transformers' router never
    # renormalises the chosen experts' weights, whatever norm_topk_prob says, where llama.cpp's would.
    "DeepseekV2ForCausalLM": Architecture(
        MODEL_ARCH.DEEPSEEK2,
        layer_tensors=DEEPSEEK_LAYER + DEEPSEEK2_EXPERTS,
        dense_layer_tensors=DEEPSEEK_LAYER + GATED_MLP,
        fixed=(SILU, FixedSetting("attention_bias", False, False), FixedSetting("mlp_bias", False, False),
               FixedSetting("norm_topk_prob", False, False), FixedSetting("scoring_func", "softmax", "softmax"),
               FixedSetting("moe_layer_freq", 1, 1)),
        rope_scalings=("default", "yarn"),
        check=_check_deepseek2,
        metadata=_deepseek2_metadata,
        rewrites=_deepseek_rewrites,
        drops_nextn_layers=True,
        variant=_deepseek_query_variant,
    ),
    # DeepSeek-V3 and R1 and the models built on them (Moonlight, Kimi K2): V2's layers, experts chosen by sigmoid scores plus a bias
    # per expert within the best groups, renormalised or not and scaled, RoPE on adjacent pairs as DeepSeek turns them (rope_interleave).
    # Its multi-token-prediction layer is left out, as llama.cpp's converter leaves it.
    "DeepseekV3ForCausalLM": Architecture(
        MODEL_ARCH.DEEPSEEK2,
        layer_tensors=DEEPSEEK_LAYER + GLM4MOE_EXPERTS,
        dense_layer_tensors=DEEPSEEK_LAYER + GATED_MLP,
        fixed=(SILU, FixedSetting("attention_bias", False, False), FixedSetting("rope_interleave", True, True),
               FixedSetting("scoring_func", "sigmoid", "sigmoid"), FixedSetting("moe_layer_freq", 1, 1)),
        rope_scalings=("default", "yarn"),
        check=_check_deepseek3,
        metadata=_deepseek3_metadata,
        rewrites=_deepseek_rewrites,
        drops_nextn_layers=True,
        variant=_deepseek_query_variant,
    ),
    # LFM2 and LFM2.5's dense models: gated short convolutions between attention layers, which the GGUF tells apart by
    # their 0 key/value heads; the final norm is its embedding_norm. llama.cpp's lfm2 graph reads no per-dimension
    # RoPE factors (Llama 3's scaling), nor convolution biases.
    "Lfm2ForCausalLM": Architecture(
        MODEL_ARCH.LFM2,
        layer_tensors=LFM2_LAYER,
        fixed=(FixedSetting("conv_bias", False, False),),
        rope_scalings=("default", "linear", "yarn"),
        check=_check_lfm2,
        metadata=_lfm2_metadata,
        squeezed_tensors=("conv.conv.weight",),
    ),
    # LFM2-MoE: LFM2's layers, the first num_dense_layers with its MLP, the others with experts chosen by a sigmoid router plus
    # a bias per expert. llama.cpp's lfm2moe graph always reads that bias and renormalises the chosen experts' weights, and
    # scales them by nothing.
    "Lfm2MoeForCausalLM": Architecture(
        MODEL_ARCH.LFM2MOE,
        layer_tensors=LFM2MOE_LAYER,
        dense_layer_tensors=LFM2_LAYER,
        fixed=(FixedSetting("conv_bias", False, False), FixedSetting("use_expert_bias", True, True),
               FixedSetting("norm_topk_prob", True, True), FixedSetting("routed_scaling_factor", 1.0, 1.0)),
        rope_scalings=("default", "linear", "yarn"),
        check=_check_lfm2,
        metadata=_lfm2moe_metadata,
        squeezed_tensors=("conv.conv.weight",),
        rewrites=lambda config: LFM2MOE_REWRITES,
    ),
    # Mixtures of experts. llama.cpp renormalises the chosen experts' weights for Mixtral and
    # Qwen3-MoE, not for Qwen2-MoE or OLMoE: a checkpoint's norm_topk_prob must say the same.
    "MixtralForCausalLM": Architecture(MODEL_ARCH.LLAMA, permute_qk=True, layer_tensors=ATTENTION + MIXTRAL_EXPERTS),
    "Qwen2MoeForCausalLM": Architecture(
        MODEL_ARCH.QWEN2MOE,
        layer_tensors=ATTENTION + ROUTED_EXPERTS + SHARED_EXPERT,
        fixed=(FixedSetting("norm_topk_prob", False, False), *EVERY_LAYER_ROUTED),
    ),
    "Qwen3MoeForCausalLM": Architecture(
        MODEL_ARCH.QWEN3MOE,
        layer_tensors=ATTENTION + ROUTED_EXPERTS,
        fixed=(FixedSetting("norm_topk_prob", True, False), *EVERY_LAYER_ROUTED),
    ),
    "OlmoeForCausalLM": Architecture(
        MODEL_ARCH.OLMOE,
        layer_tensors=ATTENTION + ROUTED_EXPERTS,
        fixed=(FixedSetting("norm_topk_prob", False, False), FixedSetting("clip_qkv", None, None)),
        check=_check_olmoe,
    ),
}


def architecture_for(config: ModelConfig) -> Architecture:
    """The table's row for the checkpoint, after the checks its settings must pass."""
    try:
        arch = ARCHITECTURES[config.architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(
            f"cannot convert architecture {config.architecture}; supported: {supported}"
        ) from None
    if arch.variant is not None:
        arch = arch.variant(config)
    for setting in arch.fixed:
        if (value := config.raw.get(setting.key, setting.default)) != setting.value:
            raise UnsupportedModelError(
                f"this {config.architecture} checkpoint has {setting.key}={value!r}; llama.cpp's {arch.gguf_name} graph "
                f"implements only {setting.key}={setting.value!r}, so it cannot run it"
            )
    if arch.routed != bool(config.n_experts):
        kind = "has no experts" if arch.routed else f"has {config.n_experts} experts"
        raise UnsupportedModelError(f"this {config.architecture} checkpoint's config.json {kind}; the config.json is inconsistent")
    if config.rope.scaling_type not in arch.rope_scalings:
        raise UnsupportedModelError(
            f"RoPE scaling '{config.rope.scaling_type}' is not supported for {config.architecture}; "
            f"supported: {', '.join(arch.rope_scalings)}"
        )
    if arch.check is not None:
        arch.check(config)
    return arch


def _permute_for_llama_rope(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """HF's half-split rotary layout -> llama.cpp's interleaved pairs, per head."""
    shape = weights.shape
    return weights.reshape(n_heads, 2, shape[0] // n_heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def rope_permuted_heads(arch: Architecture, config: ModelConfig, gguf_name: str) -> int:
    """The heads whose rows llama.cpp's rotation wants reordered in this tensor (LLaMA's Q and K,
    their biases and their LoRA B matrices); 0 for none."""
    kind = gguf_name.split(".")[-2]
    if not arch.permute_qk or kind not in ("attn_q", "attn_k"):
        return 0
    return config.n_heads if kind == "attn_q" else config.n_kv_heads


def transform(planned: PlannedTensor, weights: np.ndarray) -> np.ndarray:
    if planned.permute_heads:
        weights = _permute_for_llama_rope(weights, planned.permute_heads)
    if planned.add:
        weights = weights + np.float32(planned.add)
    if planned.rewrite is not None:
        weights = planned.rewrite(weights)
    return weights


def _llama3_rope_factors(config: ModelConfig, rope: RopeSettings) -> np.ndarray:
    """Llama 3.1's frequency-dependent RoPE scaling, as the per-dimension factors llama.cpp reads."""
    factor = float(rope.scaling["factor"])
    low = float(rope.scaling.get("low_freq_factor", 1.0))
    high = float(rope.scaling.get("high_freq_factor", 4.0))
    original = float(rope.scaling.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / rope.theta ** (np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim)
    wavelengths = 2 * math.pi / freqs
    smooth = (original / wavelengths - low) / (high - low)
    factors = np.where(
        wavelengths < original / high,
        1.0,
        np.where(wavelengths > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)),
    )
    return factors.astype(np.float32)


def add_rope_metadata(config: ModelConfig, writer: GGUFWriter) -> list[PlannedTensor]:
    """RoPE keys for the global layers; returns tensors the scaling needs (Llama 3's factors).
    `architecture_for` has refused scalings the architecture does not run; LongRoPE is Phi-3's row's."""
    rope = config.rope
    writer.add_rope_freq_base(rope.theta)
    if rope.scaling_type == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope.scaling["factor"]))
    elif rope.scaling_type == "yarn":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope.scaling["factor"]))
        original = rope.scaling.get("original_max_position_embeddings", config.context_length)
        writer.add_rope_scaling_orig_ctx_len(int(original))
    elif rope.scaling_type == "llama3":
        factors = _llama3_rope_factors(config, rope)
        return [PlannedTensor("rope_freqs.weight", factors.shape, data=factors)]
    return []


def _add_expert_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    writer.add_expert_count(config.n_experts)
    writer.add_expert_used_count(config.n_experts_used)
    # Mixtral's experts are intermediate_size wide, which llama.cpp reads as the FFN length.
    if config.raw.get("moe_intermediate_size") is not None:
        writer.add_expert_feed_forward_length(config.expert_intermediate_size)
    # GLM-4.5 counts its shared experts, each as wide as a routed one; the others give the shared expert's width.
    if config.shared_experts:
        writer.add_expert_shared_count(config.shared_experts)
    elif config.shared_expert_intermediate_size:
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)


def _one_or_per_layer(values: list[int]) -> int | list[int]:
    """One GGUF value where every layer has the same, else one per layer (llama.cpp reads either)."""
    return values[0] if len(set(values)) == 1 else values


def _add_latent_attention_heads(latent: LatentAttentionSizes, writer: GGUFWriter) -> None:
    """Multi-head latent attention as llama.cpp's converter writes it: one key/value head (the latent, which every query head
    attends over), keys as wide as the latent and the part RoPE turns, values as the latent; each head's own sizes under *_mla.
    llama.cpp reads q_lora_rank in any model but DeepSeek-V2-Lite's kind (DEEPSEEK2_LITE_LAYERS), where its converter writes none
    for queries projected directly and llama.cpp could not load it: 0 says so."""
    writer.add_head_count_kv(1)
    writer.add_key_length(latent.kv_lora_rank + latent.qk_rope_head_dim)
    writer.add_value_length(latent.kv_lora_rank)
    writer.add_rope_dimension_count(latent.qk_rope_head_dim)
    writer.add_q_lora_rank(latent.q_lora_rank)
    writer.add_kv_lora_rank(latent.kv_lora_rank)
    writer.add_key_length_mla(latent.qk_head_dim)
    writer.add_value_length_mla(latent.v_head_dim)


def add_hparams(config: ModelConfig, arch: Architecture, writer: GGUFWriter) -> list[PlannedTensor]:
    """The model's hyperparameters as GGUF keys; returns any tensors they imply."""
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.hidden_size)
    # Layers that predict further tokens follow the others, as llama.cpp's converter writes them and its graphs skip them.
    nextn_layers = 0 if arch.drops_nextn_layers else config.nextn_layers
    writer.add_block_count(config.n_layers + nextn_layers)
    if nextn_layers:
        writer.add_nextn_predict_layers(nextn_layers)
    writer.add_feed_forward_length(_one_or_per_layer([config.intermediate_size_of(i) for i in range(config.n_layers)]))
    writer.add_head_count(config.n_heads)
    if config.latent_attention is not None:
        _add_latent_attention_heads(config.latent_attention, writer)
    else:
        writer.add_head_count_kv(_one_or_per_layer([config.kv_heads_of(i) for i in range(config.n_layers)]))
        # The global layers' head size (llama.cpp's key_length_swa gives the others' where they differ).
        writer.add_key_length(config.global_head_dim)
        writer.add_value_length(config.global_head_dim)
        writer.add_rope_dimension_count(config.rope_dimensions)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if config.n_experts:
        _add_expert_metadata(config, writer)
    extra = add_rope_metadata(config, writer)
    if arch.metadata is not None:
        arch.metadata(config, writer)
    if arch.extra_tensors is not None:
        extra += arch.extra_tensors(config)
    return extra


def _check_layer_tensors(checkpoint: Checkpoint, arch: Architecture) -> None:
    """Every layer has the architecture's tensors, every expert's among them."""
    config = checkpoint.config
    for layer in range(config.n_layers):
        for key in arch.dense_layer_tensors if layer < config.dense_layers else arch.layer_tensors:
            names = [key.replace("*", str(e)) for e in range(config.n_experts)] if "*" in key else [key]
            for name in names:
                if f"{LAYER_PREFIX}{layer}.{name}" not in checkpoint.tensors:
                    raise ModelError(f"{checkpoint.folder} lacks {LAYER_PREFIX}{layer}.{name}; are all weight files there?")


def _stacking_order(refs: list[TensorRef]) -> list[TensorRef]:
    """One expert's tensors in expert order (llama.cpp's `_exps` tensors stack them so)."""
    return sorted(refs, key=lambda ref: int(EXPERT_INDEX.search(ref.name)[1]))  # type: ignore[index]


def plan_tensors(checkpoint: Checkpoint, arch: Architecture) -> list[PlannedTensor]:
    """Every checkpoint tensor with its GGUF name and transform, in checkpoint order; an expert's
    tensors become one stacked tensor per layer and matrix, where the first of them was."""
    config = checkpoint.config
    _check_layer_tensors(checkpoint, arch)
    name_map = get_tensor_name_map(arch.gguf_arch, config.n_layers + config.nextn_layers)
    rewrites = arch.rewrites(config) if arch.rewrites is not None else {}
    groups: dict[str, list[TensorRef]] = {}
    for ref in checkpoint:
        if ref.name.endswith(IGNORED_SUFFIXES) or ref.name.startswith(arch.left_out):
            continue
        if arch.drops_nextn_layers and (layer_key(ref.name)[0] or 0) >= config.n_layers:
            continue
        if config.tie_word_embeddings and ref.name == "lm_head.weight":
            continue  # the same matrix as the embeddings; llama.cpp reuses token_embd
        name = ref.name + ".weight" if ref.name.endswith(arch.bare_tensors) else ref.name
        groups.setdefault(EXPERT_INDEX.sub(".experts.", name), []).append(ref)
    # An MXFP4 matrix's scales go with its packed values.
    mxfp4_scales = {name.removesuffix(MXFP4_PARTS[1]) + MXFP4_PARTS[0]: _stacking_order(groups.pop(name))
                    for name in list(groups) if config.mxfp4 and name.endswith(MXFP4_PARTS[1])}
    # Each tensor with its rewrite, a fused one's blocks each with one of their own.
    rewritten: list[tuple[str, list[TensorRef], TensorRewrite | None]] = []
    for name, refs in groups.items():
        rewrite = rewrites.get(layer_key(name)[1])
        if rewrite is not None and (rewrite.split_into or rewrite.into):
            rewritten += [(name, refs, part) for part in rewrite.parts(refs[0].shape)]
        else:
            rewritten.append((name, refs, rewrite))
    planned = []
    for name, refs, rewrite in rewritten:
        layer, _ = layer_key(name)
        mapped = f"{LAYER_PREFIX}{layer}.{rewrite.renamed}" if rewrite is not None and rewrite.renamed else name
        gguf_name = name_map.get_name(mapped, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UnsupportedModelError(
                f"tensor '{refs[0].name}' has no {arch.gguf_name} counterpart in llama.cpp; "
                f"is this a plain {config.architecture} checkpoint?"
            )
        if stacked := EXPERT_INDEX.search(refs[0].name) is not None:
            refs = _stacking_order(refs)
        heads = rope_permuted_heads(arch, config, gguf_name)
        add = arch.norm_offset if gguf_name.endswith("norm.weight") and not gguf_name.endswith(arch.norms_without_offset) else 0.0
        shape = (len(refs), *refs[0].shape) if stacked else refs[0].shape
        if name.endswith(arch.squeezed_tensors):
            shape = tuple(n for n in shape if n != 1)
        if rewrite is not None and rewrite.shape is not None:
            shape = (len(refs), *rewrite.shape) if stacked else rewrite.shape
        scales = tuple(mxfp4_scales.get(name, ()))
        if scales:  # in values: a block of packed values holds MXFP4_BLOCK of them
            shape = (*shape[:-2], shape[-2] * MXFP4_BLOCK)
        planned.append(PlannedTensor(gguf_name, shape, tuple(refs), stacked, permute_heads=heads, add=add,
                                     rewrite=rewrite.values if rewrite is not None else None, scales=scales))
    return planned
