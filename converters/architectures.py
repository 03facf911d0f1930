"""What each supported architecture needs to become GGUF: a table of per-architecture quirks and
one loop that maps Hugging Face tensor names to GGUF names with gguf's TensorNameMap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, RopeScalingType, get_tensor_name_map

from localchat.converters.checkpoint import Checkpoint, ModelConfig, RopeSettings, TensorRef
from localchat.errors import ModelError

# Present in some checkpoints, recomputed by llama.cpp.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# llama.cpp's Gemma 3 graph fixes these; a checkpoint that differs cannot run there.
GEMMA3_SWA_PATTERN = 6
GEMMA3_SWA_ROPE_THETA = 10000.0


class UnsupportedModelError(ModelError):
    """A checkpoint whose architecture or settings llama.cpp cannot run."""


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture maps onto a llama.cpp one."""

    gguf_arch: MODEL_ARCH
    # llama.cpp's LLaMA graph rotates interleaved pairs; HF rotates halves: Q and K rows are reordered.
    permute_qk: bool = False
    # Gemma's RMSNorm multiplies by (1 + weight); llama.cpp by weight.
    norm_offset: float = 0.0
    check: Callable[[ModelConfig], None] | None = None
    metadata: Callable[[ModelConfig, GGUFWriter], None] | None = None

    @property
    def gguf_name(self) -> str:
        return MODEL_ARCH_NAMES[self.gguf_arch]


def _check_gemma3(config: ModelConfig) -> None:
    expected_types = tuple(
        "full_attention" if (i + 1) % GEMMA3_SWA_PATTERN == 0 else "sliding_attention" for i in range(config.n_layers)
    )
    if config.layer_types != expected_types:
        raise UnsupportedModelError(
            f"this Gemma 3 checkpoint's layer_types differ from llama.cpp's fixed pattern "
            f"(every {GEMMA3_SWA_PATTERN}th layer global); llama.cpp cannot run it"
        )
    if config.rope_local is not None and config.rope_local.theta != GEMMA3_SWA_ROPE_THETA:
        raise UnsupportedModelError(
            f"this Gemma 3 checkpoint's sliding-window RoPE base is {config.rope_local.theta:g}; "
            f"llama.cpp fixes it at {GEMMA3_SWA_ROPE_THETA:g}"
        )
    # llama.cpp scales attention by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 62-layer 27B.
    expected_scalar = config.hidden_size // config.n_heads if config.n_layers == 62 else config.head_dim
    scalar = config.raw.get("query_pre_attn_scalar", expected_scalar)
    if scalar != expected_scalar:
        raise UnsupportedModelError(
            f"this Gemma 3 checkpoint's query_pre_attn_scalar is {scalar}; llama.cpp assumes {expected_scalar}"
        )
    if config.raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("this Gemma 3 checkpoint uses bidirectional attention (an embedding model); convert a causal LM")


def _gemma3_metadata(config: ModelConfig, writer: GGUFWriter) -> None:
    if config.sliding_window:
        writer.add_sliding_window(int(config.sliding_window))
    if config.rope_local is not None:
        writer.add_rope_freq_base_swa(config.rope_local.theta)
    if softcap := config.raw.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(softcap))


LLAMA = Architecture(MODEL_ARCH.LLAMA, permute_qk=True)
ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": LLAMA,
    # Mistral is LLaMA to llama.cpp; its sliding window is wider than any context it is run with.
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": Architecture(MODEL_ARCH.QWEN2),
    "Qwen3ForCausalLM": Architecture(MODEL_ARCH.QWEN3),
    "Gemma3ForCausalLM": Architecture(
        MODEL_ARCH.GEMMA3, norm_offset=1.0, check=_check_gemma3, metadata=_gemma3_metadata
    ),
}


def architecture_for(config: ModelConfig) -> Architecture:
    try:
        arch = ARCHITECTURES[config.architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(
            f"cannot convert architecture {config.architecture}; supported: {supported}"
        ) from None
    if arch.check is not None:
        arch.check(config)
    return arch


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor: where it comes from and what to do to it on the way."""

    gguf_name: str
    shape: tuple[int, ...]
    source: TensorRef | None = None
    permute_heads: int = 0  # reorder rows of this many heads (LLaMA Q/K)
    add: float = 0.0  # Gemma norms
    data: np.ndarray | None = field(default=None, compare=False)  # generated tensors (rope_freqs)

    @property
    def is_vector(self) -> bool:
        return len(self.shape) == 1


def _permute_for_llama_rope(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """HF's half-split rotary layout -> llama.cpp's interleaved pairs, per head."""
    shape = weights.shape
    return weights.reshape(n_heads, 2, shape[0] // n_heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


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
    """RoPE keys for the global layers; returns tensors the scaling needs (Llama 3's factors)."""
    rope = config.rope
    writer.add_rope_freq_base(rope.theta)
    if rope.scaling_type == "default":
        return []
    if rope.scaling_type == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope.scaling["factor"]))
        return []
    if rope.scaling_type == "yarn":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope.scaling["factor"]))
        original = rope.scaling.get("original_max_position_embeddings", config.context_length)
        writer.add_rope_scaling_orig_ctx_len(int(original))
        return []
    if rope.scaling_type == "llama3":
        factors = _llama3_rope_factors(config, rope)
        return [PlannedTensor("rope_freqs.weight", factors.shape, data=factors)]
    raise UnsupportedModelError(
        f"RoPE scaling '{rope.scaling_type}' is not supported; supported: default, linear, yarn, llama3"
    )


def add_hparams(config: ModelConfig, arch: Architecture, writer: GGUFWriter) -> list[PlannedTensor]:
    """The model's hyperparameters as GGUF keys; returns any tensors they imply."""
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.n_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    extra = add_rope_metadata(config, writer)
    if arch.metadata is not None:
        arch.metadata(config, writer)
    return extra


def plan_tensors(checkpoint: Checkpoint, arch: Architecture) -> list[PlannedTensor]:
    """Every checkpoint tensor with its GGUF name and transform, in checkpoint order."""
    config = checkpoint.config
    name_map = get_tensor_name_map(arch.gguf_arch, config.n_layers)
    planned = []
    for ref in checkpoint:
        if ref.name.endswith(IGNORED_SUFFIXES):
            continue
        if config.tie_word_embeddings and ref.name == "lm_head.weight":
            continue  # the same matrix as the embeddings; llama.cpp reuses token_embd
        gguf_name = name_map.get_name(ref.name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UnsupportedModelError(
                f"tensor '{ref.name}' has no {arch.gguf_name} counterpart in llama.cpp; "
                f"is this a plain {config.architecture} checkpoint?"
            )
        heads = 0
        if arch.permute_qk and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = config.n_heads if gguf_name.split(".")[-2] == "attn_q" else config.n_kv_heads
        add = arch.norm_offset if gguf_name.endswith("norm.weight") else 0.0
        planned.append(PlannedTensor(gguf_name, ref.shape, ref, permute_heads=heads, add=add))
    return planned
