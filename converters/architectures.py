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
from dataclasses import dataclass, field

import numpy as np
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, RopeScalingType, get_tensor_name_map

from localchat.converters.checkpoint import (
    EXPERT_INDEX,
    LAYER_PREFIX,
    LONGROPE_TYPES,
    Checkpoint,
    ModelConfig,
    RopeSettings,
    TensorRef,
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
# The routers stay F32 at every quantization, as llama.cpp's converter and quantizer keep them.
F32_TENSORS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")
# RoPE scalings llama.cpp applies to any architecture from GGUF keys (LongRoPE is Phi-3's own).
ROPE_SCALINGS = ("default", "linear", "yarn", "llama3")
# llama.cpp's Gemma 3 graph fixes these; a checkpoint that differs cannot run there.
GEMMA3_SWA_PATTERN = 6
GEMMA3_SWA_ROPE_THETA = 10000.0
GEMMA2_SWA_PATTERN = 2
GEMMA2_DEFAULT_WINDOW = 4096
# llama.cpp's SmolLM3 graph leaves RoPE out of every 4th layer.
SMOLLM3_NO_ROPE_STEP = 4
# Gemma 4's layer tensors. Its last layers may keep no keys and values of its own (no k_proj, k_norm,
# v_proj) and its global layers may take their values from the keys (no v_proj): only these are in every layer.
GEMMA4_LAYER = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_norm.weight", "self_attn.o_proj.weight",
                "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight",
                *GATED_MLP)
# A frequency divisor that stops a RoPE pair turning: Gemma 4's proportional RoPE leaves the pairs past its
# share of the head unrotated, and llama.cpp's rotation reads that as a per-pair factor (rope_freqs).
UNROTATED_FREQ_FACTOR = 1e30


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

    @property
    def keeps_f32(self) -> bool:
        """Vectors (norms, biases, RoPE factors) and routers stay F32 at every quantization."""
        return len(self.shape) == 1 or self.gguf_name.endswith(F32_TENSORS)


Metadata = Callable[[ModelConfig, GGUFWriter], None]
ExtraTensors = Callable[[ModelConfig], list[PlannedTensor]]


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture maps onto a llama.cpp one."""

    gguf_arch: MODEL_ARCH
    # llama.cpp's LLaMA graph rotates interleaved pairs; HF rotates halves: Q and K rows are reordered.
    permute_qk: bool = False
    # Gemma's RMSNorm multiplies by (1 + weight); llama.cpp by weight.
    norm_offset: float = 0.0
    # Tensors every layer must have; an expert's tensors make the model a mixture of experts.
    layer_tensors: tuple[str, ...] = ATTENTION + GATED_MLP
    fixed: tuple[FixedSetting, ...] = ()
    rope_scalings: tuple[str, ...] = ROPE_SCALINGS
    check: Callable[[ModelConfig], None] | None = None
    metadata: Metadata | None = None
    extra_tensors: ExtraTensors | None = None
    # Checkpoint tensors saved without a .weight suffix (Gemma 4's layer_scalar buffers), given one in the GGUF.
    bare_tensors: tuple[str, ...] = ()
    # llama.cpp's tokenizer model when the architecture has its own (tokenizer.ggml.model), else read from the files.
    tokenizer_model: str | None = None

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
# llama.cpp's MoE graphs route every layer (no dense layers between routed ones).
EVERY_LAYER_ROUTED = (FixedSetting("decoder_sparse_step", 1, 1), FixedSetting("mlp_only_layers", [], []))
# Qwen's switch for sliding-window attention in its upper layers (off in Qwen's releases).
NO_SLIDING_WINDOW = FixedSetting("use_sliding_window", False, False)
ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": LLAMA,
    # Mistral is LLaMA to llama.cpp; its sliding window is wider than any context it is run with.
    "MistralForCausalLM": LLAMA,
    # llama.cpp's qwen2 and qwen3 graphs attend over the whole context in every layer.
    "Qwen2ForCausalLM": Architecture(MODEL_ARCH.QWEN2, fixed=(NO_SLIDING_WINDOW,)),
    "Qwen3ForCausalLM": Architecture(MODEL_ARCH.QWEN3, fixed=(NO_SLIDING_WINDOW,)),
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
    "SmolLM3ForCausalLM": Architecture(
        MODEL_ARCH.SMOLLM3, permute_qk=True, fixed=(FixedSetting("use_sliding_window", False, False),), check=_check_smollm3
    ),
    # OLMo 2 normalises after attention and after the MLP, not before.
    "Olmo2ForCausalLM": Architecture(
        MODEL_ARCH.OLMO2,
        layer_tensors=ATTENTION[1:] + GATED_MLP + ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight"),
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
    if config.shared_expert_intermediate_size:
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)


def _one_or_per_layer(values: list[int]) -> int | list[int]:
    """One GGUF value where every layer has the same, else one per layer (llama.cpp reads either)."""
    return values[0] if len(set(values)) == 1 else values


def add_hparams(config: ModelConfig, arch: Architecture, writer: GGUFWriter) -> list[PlannedTensor]:
    """The model's hyperparameters as GGUF keys; returns any tensors they imply."""
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(_one_or_per_layer([config.intermediate_size_of(i) for i in range(config.n_layers)]))
    writer.add_head_count(config.n_heads)
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
        for key in arch.layer_tensors:
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
    name_map = get_tensor_name_map(arch.gguf_arch, config.n_layers)
    groups: dict[str, list[TensorRef]] = {}
    for ref in checkpoint:
        if ref.name.endswith(IGNORED_SUFFIXES):
            continue
        if config.tie_word_embeddings and ref.name == "lm_head.weight":
            continue  # the same matrix as the embeddings; llama.cpp reuses token_embd
        name = ref.name + ".weight" if ref.name.endswith(arch.bare_tensors) else ref.name
        groups.setdefault(EXPERT_INDEX.sub(".experts.", name), []).append(ref)
    planned = []
    for name, refs in groups.items():
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UnsupportedModelError(
                f"tensor '{refs[0].name}' has no {arch.gguf_name} counterpart in llama.cpp; "
                f"is this a plain {config.architecture} checkpoint?"
            )
        if stacked := EXPERT_INDEX.search(refs[0].name) is not None:
            refs = _stacking_order(refs)
        heads = rope_permuted_heads(arch, config, gguf_name)
        add = arch.norm_offset if gguf_name.endswith("norm.weight") else 0.0
        shape = (len(refs), *refs[0].shape) if stacked else refs[0].shape
        planned.append(PlannedTensor(gguf_name, shape, tuple(refs), stacked, permute_heads=heads, add=add))
    return planned
