"""Reads a Hugging Face checkpoint folder: its config, normalised, and its tensors, lazily.

Shared by every target format. Tensors come straight out of memory-mapped safetensors files
(sharded or not), one at a time; nothing here needs torch. bf16, which numpy lacks, is read as
uint16 and widened with a bit shift; FP8 is read as bytes, decoded by a table and multiplied by its scale;
MXFP4 (gpt-oss's experts) is read as bytes and left packed.
"""

from __future__ import annotations

import copy
import json
import math
import mmap
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import yaml

from localchat.errors import ModelError

SAFETENSORS_INDEX = "model.safetensors.index.json"
# safetensors dtype -> numpy dtype of the stored bytes (bf16 stays raw uint16 until widened).
STORED_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
}
# A safetensors header larger than this is corrupt, not a real checkpoint.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# Optional config.json numbers the converters read (Gemma's soft-capping and attention scale, Cohere's logit scale and LayerNorm epsilon).
OPTIONAL_NUMBERS = ("final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar", "logit_scale", "layer_norm_eps")
# RoPE settings the converters read as numbers.
ROPE_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "partial_rotary_factor")
# What each RoPE scaling must give, beyond its base; the others need a `factor`.
ROPE_NEEDS = {"longrope": ("long_factor", "short_factor"), "su": ("long_factor", "short_factor"),
              "proportional": ("partial_rotary_factor",)}
# One global layer in every this many, the others sliding-window, where a config.json lists no layer_types.
GLOBAL_LAYER_EVERY = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6, "Gemma3ForConditionalGeneration": 6}
# transformers' max_window_layers when a Qwen config.json gives none.
QWEN_MAX_WINDOW_LAYERS = 28
# Names of Phi-3's LongRoPE scaling ("su" in older configs).
LONGROPE_TYPES = ("longrope", "su")
# config.json keys giving the number of routed experts and of those used per token (mixtures of experts).
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
EXPERTS_USED_KEYS = ("num_experts_per_tok", "moe_k")
# config.json keys giving the shared expert's width (Qwen2-MoE's; Granite 4's shared MLP, the shared expert of its mixtures of experts).
SHARED_EXPERT_WIDTH_KEYS = ("shared_expert_intermediate_size", "shared_intermediate_size")
# config.json keys giving how many leading layers of a mixture of experts are dense (LFM2-MoE's, GLM-4.5's, ERNIE 4.5's).
DENSE_LAYERS_KEYS = ("num_dense_layers", "first_k_dense_replace", "moe_layer_start_index")
# config.json keys counting shared experts, each as wide as a routed one (GLM-4.5's, ERNIE 4.5's).
SHARED_EXPERT_COUNT_KEYS = ("n_shared_experts", "moe_num_shared_experts")
# config.json keys giving the RMSNorm epsilon (LFM2's is `norm_eps`).
RMS_NORM_EPS_KEYS = ("rms_norm_eps", "norm_eps")
# The config.json key giving a dense model's MLP width where it is not intermediate_size (Granite 4's dense models: their shared
# MLP's; their intermediate_size is the experts' their mixtures of experts have, which llama.cpp reads as the FFN length).
MLP_WIDTH_KEYS = {"GraniteMoeHybridForCausalLM": "shared_intermediate_size"}
# The layer type of Qwen 3.5's Gated DeltaNet layers, which llama.cpp lists as recurrent (attention.recurrent_layers).
LINEAR_ATTENTION = "linear_attention"
# Layer types that keep a recurrent state instead of keys and values where llama.cpp marks them with 0 key/value heads, by
# architecture: LFM2's short convolutions, Granite 4's Mamba-2 layers ("mamba" in its hub configs, as transformers 5 writes them otherwise).
RECURRENT_LAYER_TYPES = {"Lfm2ForCausalLM": ("conv",), "Lfm2MoeForCausalLM": ("conv",), "GraniteMoeHybridForCausalLM": ("mamba", LINEAR_ATTENTION)}
# transformers writes the floats JSON lacks as tagged objects ({"__float__": "Infinity"}: Granite 4's time_step_limit).
TAGGED_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
# Architectures whose q_proj also gives each head's output gate (Qwen 3.5's full attention): twice the query rows.
GATED_QUERY_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
                             "Qwen3_5MoeForConditionalGeneration")


@dataclass(frozen=True)
class Wrapper:
    """A class that wraps a text model with another part (a vision tower): where its text model's
    config and tensors are, and what is left out. Converted as llama.cpp's convert_hf_to_gguf.py
    does: the language model alone, its config filled with transformers' defaults for it."""

    config_key: str  # the text model's config.json object
    config_class: str  # transformers' class for it, whose defaults fill the keys the object omits
    # Tensor-name prefixes (transformers 4's and 5's layouts) -> the text model's own.
    prefixes: tuple[tuple[str, str], ...]
    skipped: tuple[str, ...]  # prefixes of the other part's tensors
    left_out: str  # what is not converted, for the notice
    # The text model's model_type, where the class wraps others too (converted for this one only).
    text_model_type: str | None = None


GEMMA3_TEXT_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                        ("model.language_model.", "model."))
WRAPPERS: dict[str, Wrapper] = {
    "Gemma3ForConditionalGeneration": Wrapper(
        "text_config", "Gemma3TextConfig", GEMMA3_TEXT_PREFIXES,
        ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."),
        "its vision tower and image projector",
    ),
    # Gemma 4 exists in transformers 5's layout only; E2B and E4B also hear (an audio tower).
    "Gemma4ForConditionalGeneration": Wrapper(
        "text_config", "Gemma4TextConfig", (("model.language_model.", "model."),),
        ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."),
        "its vision and audio towers and their projections",
    ),
    # Ministral 3 (3B, 8B, 14B), its text model where Gemma 3's is; Mistral Small 3.1's ('mistral') is another.
    "Mistral3ForConditionalGeneration": Wrapper(
        "text_config", "Ministral3Config", GEMMA3_TEXT_PREFIXES,
        ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."),
        "its vision tower and image projector", text_model_type="ministral3",
    ),
    # Qwen 3.5 (all its dense sizes ship so): its multi-token-prediction layer is left out too, which llama.cpp's
    # converter keeps for drafting and its main graph never runs.
    "Qwen3_5ForConditionalGeneration": Wrapper(
        "text_config", "Qwen3_5TextConfig", (("model.language_model.", "model."),), ("model.visual.", "mtp."),
        "its vision tower and its multi-token-prediction layer",
    ),
    # Qwen 3.5's mixtures of experts, likewise (all their sizes ship so).
    "Qwen3_5MoeForConditionalGeneration": Wrapper(
        "text_config", "Qwen3_5MoeTextConfig", (("model.language_model.", "model."),), ("model.visual.", "mtp."),
        "its vision tower and its multi-token-prediction layer",
    ),
}
# A wrapper's own keys that transformers reads, not its text model's: transformers 5 writes the text class's
# tie_word_embeddings in text_config (false for Ministral 3) and ties the head as the outer one says (Mistral 3's default: true).
WRAPPER_KEYS = ("tie_word_embeddings",)
# Text models whose config.json transformers completes with defaults that shape the model (Gemma 4's
# global head size and RoPE), filled in by the named config class as for a wrapper's text_config.
# LFM2's first configs name its attention layers (full_attn_idxs) and MLP width (block_ff_dim) otherwise, and
# leave its RoPE base (10^6) to the class. Ministral 3's class gives YaRN and the attention temperature where rope_parameters is absent.
# Qwen 3.5's gives its layer types (from full_attention_interval), its linear attention's sizes and RoPE's share of the head.
# EXAONE 4's gives a sliding window (4096) where the config omits it, and with it the layer types of its pattern.
# OLMo 3's gives its window (4096), layer types (three sliding in four) and RoPE per layer type: a hub config's rope_scaling
# (YaRN) turns its full layers alone, and its sliding ones turn at transformers' default base (5 x 10^5), whatever rope_theta says.
# Granite 4's gives its Mamba-2 layers' sizes and its layer types (all Mamba-2 where none are given).
# Cohere2's gives its layer types from sliding_window_pattern (Command R7B's hub config), its window, logit scale and LayerNorm
# epsilon; Seed-OSS's its head size (128, not hidden_size / heads).
# GLM-4's gives its head size (128) and GLM-4's and GLM-4.5's the share of the head RoPE turns (half) where a config omits them.
# gpt-oss's gives its layer types (sliding and full alternating), its head size (64), its YaRN and its clamped SwiGLU's settings.
# ERNIE 4.5's gives its head size (128, not hidden_size / heads), its RoPE base (5 x 10^5) and its mixtures of experts' layout
# (routed layers from moe_layer_start_index to the last, every moe_layer_interval-th) where a config omits them.
FILLED_BY_TRANSFORMERS: dict[str, str] = {"Gemma4ForCausalLM": "Gemma4TextConfig", "Lfm2ForCausalLM": "Lfm2Config",
                                          "Ministral3ForCausalLM": "Ministral3Config", "Qwen3_5ForCausalLM": "Qwen3_5TextConfig",
                                          "Exaone4ForCausalLM": "Exaone4Config", "Olmo3ForCausalLM": "Olmo3Config",
                                          "GraniteMoeHybridForCausalLM": "GraniteMoeHybridConfig", "Lfm2MoeForCausalLM": "Lfm2MoeConfig",
                                          "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig", "Cohere2ForCausalLM": "Cohere2Config",
                                          "SeedOssForCausalLM": "SeedOssConfig", "Glm4ForCausalLM": "Glm4Config",
                                          "Glm4MoeForCausalLM": "Glm4MoeConfig", "GptOssForCausalLM": "GptOssConfig",
                                          "Ernie4_5ForCausalLM": "Ernie4_5Config", "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeConfig",
                                          "DeepseekV2ForCausalLM": "DeepseekV2Config", "DeepseekV3ForCausalLM": "DeepseekV3Config"}
# DeepSeek V2's and V3's give their routers' settings (V3's: groups, scaling, renormalisation) where a config omits them.
# Per-layer overrides (transformers 5's `per_layer_config`) the converters read; any other is refused.
PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32: bf16 is the top half of a float32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _e4m3fn_values() -> np.ndarray:
    """The float32 value of each FP8 E4M3 byte: 4 exponent bits (bias 7), 3 mantissa bits, subnormals at
    exponent 0, no infinities ("fn") and NaN where all seven low bits are set."""
    codes = np.arange(256)
    exponent, mantissa = (codes >> 3) & 0xF, (codes & 0x7) / 8
    magnitude = np.where(exponent == 0, mantissa * 2.0**-6, (1 + mantissa) * 2.0 ** (exponent - 7))
    values = np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values


# FP8 dtype -> the float32 value of each of its 256 bytes (E5M2 is the top byte of a float16).
FP8_VALUES: dict[str, np.ndarray] = {
    "F8_E4M3": _e4m3fn_values(),
    "F8_E5M2": (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float32),
}
# quant_method -> what follows a weight's name in its scale's ("x.weight_scale_inv"), for the methods whose FP8 weights
# are read as llama.cpp's converter reads them: the weight times its scale (per block, row or tensor).
FP8_SCALE_SUFFIXES = {"fp8": "_scale_inv", "compressed-tensors": "_scale"}
# Quantization methods localchat does not read whose models ship in no other precision, and how to get a checkpoint it reads.
DEQUANTIZE_FIRST = {
    "mxfp4": "localchat reads MXFP4 experts of gpt-oss only: load the model with transformers' from_pretrained(..., "
             "quantization_config=Mxfp4Config(dequantize=True)), save_pretrained it and convert that bf16 folder",
}
# MXFP4 (OCP microscaling, as gpt-oss ships its experts): the architectures whose MXFP4 checkpoints are read, and the dtype and
# name suffixes of each matrix's packed values and scales; a block of MXFP4_BLOCK values shares one scale.
MXFP4_METHOD = "mxfp4"
MXFP4_ARCHITECTURES = ("GptOssForCausalLM",)
MXFP4_DTYPE = "U8"
MXFP4_PARTS = ("_blocks", "_scales")
MXFP4_BLOCK = 32
# Scales of activations and of the KV cache, for FP8 matrix products; weights do not need them (nor does llama.cpp).
ACTIVATION_SCALE_SUFFIXES = (".activation_scale", "_activation_scale", ".input_scale", ".k_scale", ".v_scale")
# compressed-tensors' weight strategies of FP8 checkpoints: a scale per tensor, per output row, or per block.
FP8_STRATEGIES = ("tensor", "channel", "block")


def _quant_method(config: dict[str, Any]) -> str | None:
    quantization = config.get("quantization_config")
    return quantization.get("quant_method") if isinstance(quantization, dict) else None


@dataclass(frozen=True)
class Fp8Scaling:
    """How a checkpoint's FP8 weights are scaled (its quantization_config): each weight has a scale tensor named
    after it, one value per `block` of (rows, columns), the last blocks partial, else per row or for the whole tensor."""

    method: str
    scale_suffix: str
    block: tuple[int, int] | None

    def scale_shapes(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The shapes a scale of a weight of `shape` may have."""
        if self.block is not None:
            return (tuple(-(-n // size) for n, size in zip(shape, self.block)),) if len(shape) == 2 else ()
        return (), (1,), (1, 1), (shape[0],), (shape[0], 1)

    @classmethod
    def from_config(cls, config: dict[str, Any], source: Path) -> Fp8Scaling | None:
        """The scaling of config.json's quantization_config, None without one or for gpt-oss's MXFP4 (read as such); a method
        whose weights localchat cannot dequantize (GPTQ, AWQ, bitsandbytes, others' MXFP4, ...) is refused here, before any
        tensor is read."""
        quantization = config.get("quantization_config")
        if quantization is None:
            return None
        method = _quant_method(config)
        if method == MXFP4_METHOD and config["architectures"][0] in MXFP4_ARCHITECTURES:
            return None  # read as MXFP4, not dequantized
        if method == "fp8":
            block = quantization.get("weight_block_size")
        elif method == "compressed-tensors":
            block = _compressed_tensors_fp8_block(quantization, source)
        elif method in DEQUANTIZE_FIRST:
            raise ModelError(f"{source}: the weights are quantized with {method!r}, which localchat does not convert; {DEQUANTIZE_FIRST[method]}")
        else:
            raise ModelError(
                f"{source}: the weights are quantized with {method!r}, which localchat cannot dequantize (it reads FP8 checkpoints: "
                f"{', '.join(map(repr, FP8_SCALE_SUFFIXES))}); convert the model's unquantized release"
            )
        if block is not None and not (isinstance(block, list) and len(block) == 2 and all(_is_count(n) and n > 0 for n in block)):
            raise ModelError(f"{source}: the FP8 block size is {block!r}, expected [rows, columns]; the config.json is corrupt")
        return cls(method, FP8_SCALE_SUFFIXES[method], tuple(block) if block is not None else None)


def _compressed_tensors_fp8_block(quantization: dict[str, Any], source: Path) -> list[int] | None:
    """The block size of a compressed-tensors FP8 checkpoint (None for a scale per row or per tensor); any other
    compressed-tensors format (integers, packed 4-bit, several groups) is refused."""
    groups = quantization.get("config_groups")
    weights = next(iter(groups.values()), None) if isinstance(groups, dict) and len(groups) == 1 else None
    weights = weights.get("weights") if isinstance(weights, dict) else None
    if not (quantization.get("format") == "float-quantized" and isinstance(weights, dict) and weights.get("type") == "float"
            and weights.get("num_bits") == 8 and weights.get("strategy") in FP8_STRATEGIES):
        raise ModelError(
            f"{source}: the weights are quantized with compressed-tensors' {quantization.get('format')!r} format, which localchat "
            "cannot dequantize (it reads FP8 checkpoints: one group of 8-bit floats); convert the model's unquantized release"
        )
    return weights.get("block_structure") if weights["strategy"] == "block" else None


def dequantize_fp8(weights: np.ndarray, scale: np.ndarray, block: tuple[int, int] | None) -> None:
    """Multiply decoded FP8 `weights`, in place, by their scale: one value per block (the last blocks partial),
    per row or for the whole tensor, as llama.cpp's converter does."""
    if block is None:
        weights *= scale.reshape(scale.shape + (1,) * (weights.ndim - scale.ndim))
        return
    rows, columns = block
    for i, row_scales in enumerate(scale):  # a block row at a time: no full-size copy of the scales
        weights[i * rows : (i + 1) * rows] *= np.repeat(row_scales, columns)[: weights.shape[1]]


@dataclass(frozen=True)
class RopeSettings:
    """One RoPE configuration: base frequency and optional scaling (`type` "linear", "llama3", ...)."""

    theta: float
    scaling_type: str = "default"
    scaling: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any], default_theta: float) -> RopeSettings:
        scaling_type = values.get("rope_type") or values.get("type") or "default"
        extra = {k: v for k, v in values.items() if k not in ("rope_theta", "rope_type", "type")}
        rope = cls(float(values.get("rope_theta", default_theta)), str(scaling_type), extra)
        numbers = [rope.theta, *(extra[k] for k in ROPE_NUMBERS if k in extra)]
        # LongRoPE (Phi-3, Phi-4 mini) gives per-dimension factors instead of one, proportional RoPE (Gemma 4) its share of the head.
        needed = ROPE_NEEDS.get(str(scaling_type), ("factor",))
        if scaling_type != "default" and not all(key in extra for key in needed):
            raise ValueError(f"RoPE scaling '{scaling_type}' without {' and '.join(needed)}")
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) and n > 0 for n in numbers):
            raise ValueError("RoPE settings must be positive numbers")
        return rope


def _rope_layouts(config: dict[str, Any]) -> tuple[RopeSettings, RopeSettings | None]:
    """Global and sliding-window RoPE from either layout.

    transformers 5 writes `rope_parameters`, flat or nested per layer type (`full_attention`,
    `sliding_attention`); older checkpoints have flat `rope_theta`, `rope_scaling` and, for
    Gemma 3, `rope_local_base_freq`.
    """
    default_theta = float(config.get("rope_theta", 10000.0))
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and "full_attention" in parameters:
        full = RopeSettings.from_dict(parameters["full_attention"], default_theta)
        sliding = parameters.get("sliding_attention")
        return full, RopeSettings.from_dict(sliding, default_theta) if sliding else None
    if isinstance(parameters, dict):
        return RopeSettings.from_dict(parameters, default_theta), None
    full = RopeSettings.from_dict({"rope_theta": default_theta, **(config.get("rope_scaling") or {})}, default_theta)
    local = config.get("rope_local_base_freq")
    return full, RopeSettings.from_dict({"rope_theta": local}, default_theta) if local is not None else None


def _default_layer_types(read: ConfigReader, architecture: str, n_layers: int) -> list[str]:
    """Layer types of a config.json that lists none (transformers 4's), as transformers derives them:
    Gemma's fixed pattern (Gemma 3's hub configs give it as `sliding_window_pattern`), Qwen's
    `use_sliding_window` from `max_window_layers` on."""
    config = read.config
    if (every := GLOBAL_LAYER_EVERY.get(architecture)) is not None:
        every = read.int("sliding_window_pattern", every)
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n_layers)]
    if not (config.get("use_sliding_window") and config.get("sliding_window")):
        return ["full_attention"] * n_layers
    first = config.get("max_window_layers")
    first = first if isinstance(first, int) and not isinstance(first, bool) else QWEN_MAX_WINDOW_LAYERS
    return ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]


def _transformers_defaults(values: dict[str, Any], config_class: str, what: str, source: Path, architecture: str) -> dict[str, Any]:
    """`values` as transformers' config class `config_class` completes them (llama.cpp's converter reads
    configs through transformers too); `what` names the object in errors."""
    try:
        import transformers
    except ImportError:
        raise ModelError(
            f"{source} describes {architecture}, whose {what} omits settings that transformers supplies: pip install 'localchat[convert]'"
        ) from None
    from huggingface_hub.errors import StrictDataclassError  # what transformers 5's config classes raise on a bad field

    try:  # a copy: Gemma 4's class rewrites the lists it is given
        return getattr(transformers, config_class)(**copy.deepcopy(values)).to_dict()
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as error:
        detail = " ".join(str(error).split())
        raise ModelError(f"{source}: {what} is malformed ({detail}); the config.json is corrupt") from None


def _text_config(config: dict[str, Any], wrapper: Wrapper, source: Path) -> dict[str, Any]:
    """A wrapper's config.json as its text model's: the nested object, with the keys it omits
    (Gemma 3 4B's gives only its sizes, and llama.cpp's converter reads them from transformers too) as
    transformers' config class has them; the outer keys (name, dtype) over those, and the wrapper's own over all."""
    architecture = config["architectures"][0]
    text = config.get(wrapper.config_key)
    if not isinstance(text, dict):
        raise ModelError(f"{source} describes {architecture} but has no '{wrapper.config_key}' object; the config.json is corrupt")
    if wrapper.text_model_type is not None and (model_type := text.get("model_type")) != wrapper.text_model_type:
        raise ModelError(
            f"{source} describes {architecture}, a model that also reads images, with a {model_type!r} text model; localchat "
            f"converts its text model where it is {wrapper.text_model_type!r}: convert this one with llama.cpp's convert_hf_to_gguf.py"
        )
    filled = _transformers_defaults(text, wrapper.config_class, f"'{wrapper.config_key}'", source, architecture)
    outer = {k: v for k, v in config.items() if not k.endswith("_config")}
    return {**filled, **outer, **text, **{k: outer[k] for k in WRAPPER_KEYS if k in outer}}


def _per_layer(read: ConfigReader, n_layers: int, key: str, default: int) -> tuple[int, ...]:
    """One value of `key` per layer: transformers 5's sparse `per_layer_config` overrides over `default`."""
    overrides = read.config.get("per_layer_config") or {}
    if not isinstance(overrides, dict) or not all(isinstance(o, dict) for o in overrides.values()):
        raise ModelError(f"{read.source}: 'per_layer_config' is not an object of per-layer objects; the config.json is corrupt")
    values = [default] * n_layers
    for layer, override in overrides.items():
        if not str(layer).isdigit() or int(layer) >= n_layers:
            raise ModelError(f"{read.source}: 'per_layer_config' names layer {layer!r} of {n_layers}; the config.json is corrupt")
        if unknown := sorted(set(override) - set(PER_LAYER_KEYS)):
            raise ModelError(f"{read.source}: 'per_layer_config' overrides {unknown[0]} in layer {layer}; localchat converts per-layer {' and '.join(PER_LAYER_KEYS)} only")
        if key in override:
            values[int(layer)] = ConfigReader(override, read.source).int(key)
    return tuple(values)


def _adjusted_mlp_width(read: ConfigReader, intermediate: int) -> int:
    """LFM2's MLP width where `block_auto_adjust_ff_dim` is set, as transformers builds it: two thirds of
    `intermediate`, and given a `block_ffn_dim_multiplier`, times that, rounded up to a multiple of `block_multiple_of`."""
    width = int(2 * intermediate / 3)
    if read.config.get("block_ffn_dim_multiplier") is None:
        return width
    multiple = read.int("block_multiple_of", 256)
    width = int(read.float("block_ffn_dim_multiplier", 1.0) * width)
    return multiple * -(-width // multiple)


class ConfigReader:
    """Typed fields of a config.json, each failure a ModelError naming the field and the file."""

    def __init__(self, config: dict[str, Any], source: Path) -> None:
        self.config = config
        self.source = source

    def _bad(self, key: str, expected: str) -> ModelError:
        return ModelError(f"{self.source}: '{key}' is {self.config.get(key)!r}, expected {expected}; the checkpoint's config.json is corrupt")

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        # An explicit null means "the default", as transformers reads it.
        value = default if self.config.get(key) is None else self.config[key]
        if value is None:
            raise ModelError(f"{self.source} lacks '{key}'; the checkpoint's config.json is incomplete")
        # JSON has no integer type of its own: 2048.0 is an integer, True is not (nor NaN, Infinity).
        integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not integral or value < minimum:
            raise self._bad(key, f"an integer >= {minimum}")
        return int(value)

    def float(self, key: str, default: float) -> float:
        value = default if self.config.get(key) is None else self.config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self._bad(key, "a positive number")
        return float(value)


@dataclass(frozen=True)
class DeltaNetSizes:
    """The sizes of a hybrid's Gated DeltaNet (linear attention) layers: Qwen 3.5's `linear_*` settings."""

    key_heads: int
    value_heads: int  # a multiple of key_heads, each key head shared by as many value heads
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int  # positions the causal convolution over q, k and v spans

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @classmethod
    def read(cls, read: ConfigReader) -> DeltaNetSizes:
        sizes = cls(read.int("linear_num_key_heads"), read.int("linear_num_value_heads"), read.int("linear_key_head_dim"),
                    read.int("linear_value_head_dim"), read.int("linear_conv_kernel_dim"))
        if sizes.value_heads % sizes.key_heads:
            raise ModelError(f"{read.source}: {sizes.value_heads} linear-attention value heads cannot share {sizes.key_heads} key heads evenly; the config.json is corrupt")
        return sizes


@dataclass(frozen=True)
class Mamba2Sizes:
    """The sizes of a hybrid's Mamba-2 layers: Granite 4's `mamba_*` settings."""

    heads: int
    groups: int  # of heads sharing one B and C
    state_size: int
    conv_kernel: int  # positions the causal convolution over x, B and C spans
    inner_size: int  # the heads' width together (mamba_expand times hidden_size)

    @property
    def conv_dim(self) -> int:
        """The convolved x, B and C together."""
        return self.inner_size + 2 * self.groups * self.state_size

    @classmethod
    def read(cls, read: ConfigReader, hidden: int) -> Mamba2Sizes:
        sizes = cls(read.int("mamba_n_heads"), read.int("mamba_n_groups"), read.int("mamba_d_state"), read.int("mamba_d_conv"),
                    read.int("mamba_expand") * hidden)
        if sizes.inner_size % sizes.heads or sizes.heads % sizes.groups:
            raise ModelError(f"{read.source}: {sizes.heads} Mamba heads cannot split {sizes.inner_size} dimensions or share "
                             f"{sizes.groups} groups evenly; the config.json is corrupt")
        return sizes


@dataclass(frozen=True)
class LatentAttentionSizes:
    """The sizes of multi-head latent attention (DeepSeek V2's and V3's): queries projected directly or through a low-rank
    latent, keys and values through one latent shared by all heads, each head's key a part turned by RoPE and a part not."""

    q_lora_rank: int  # 0 where queries are projected directly (q_proj)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def read(cls, read: ConfigReader) -> LatentAttentionSizes:
        return cls(read.int("q_lora_rank", 0, minimum=0), read.int("kv_lora_rank"), read.int("qk_nope_head_dim"),
                   read.int("qk_rope_head_dim"), read.int("v_head_dim"))


@dataclass(frozen=True)
class ModelConfig:
    """config.json with the names and layouts of different transformers versions made uniform."""

    architecture: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    context_length: int
    rope: RopeSettings
    rope_local: RopeSettings | None
    tie_word_embeddings: bool
    sliding_window: int | None
    layer_types: tuple[str, ...]
    raw: dict[str, Any]
    # Mixtures of experts: routed experts per layer, how many each token uses, their hidden size
    # (`moe_intermediate_size`, else `intermediate_size`) and the shared expert's (Qwen2-MoE's, Granite 4's); 0 when dense.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    # Shared experts, each as wide as a routed one, where the config counts them (GLM-4.5's n_shared_experts); 0 where it gives a width.
    shared_experts: int = 0
    # The leading layers of a mixture of experts whose MLP is dense (LFM2-MoE's num_dense_layers); 0 where every layer routes.
    dense_layers: int = 0
    # Layers after the last that predict further tokens (GLM-4.5's multi-token prediction, num_nextn_predict_layers).
    nextn_layers: int = 0
    # Per layer where layers differ (Gemma 4: larger heads and fewer key/value heads in its global
    # layers, double-wide MLPs in the layers that share keys and values); empty where all are alike.
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    layer_intermediate_sizes: tuple[int, ...] = ()
    # The last layers that attend with an earlier layer's keys and values, keeping none of their own (Gemma 4).
    kv_shared_layers: int = 0
    # Width of each layer's own token embedding (Gemma 4's per-layer inputs); 0 for none.
    per_layer_input_size: int = 0
    # Positions each short convolution spans (LFM2's conv_L_cache); 0 for none.
    conv_kernel: int = 0
    # The linear-attention layers' sizes (Qwen 3.5's Gated DeltaNet); None without such layers.
    delta_net: DeltaNetSizes | None = None
    # The Mamba-2 layers' sizes (Granite 4's); None where the config gives none.
    mamba2: Mamba2Sizes | None = None
    # The multi-head latent attention's sizes (DeepSeek's); None for attention with keys and values per head.
    latent_attention: LatentAttentionSizes | None = None
    # How the FP8 weights are scaled (quantization_config); None for a float checkpoint.
    fp8_scaling: Fp8Scaling | None = None
    # Whether the experts' matrices are MXFP4 (gpt-oss's release: quant_method "mxfp4"), the rest float.
    mxfp4: bool = False

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.n_kv_heads

    def intermediate_size_of(self, layer: int) -> int:
        return self.layer_intermediate_sizes[layer] if self.layer_intermediate_sizes else self.intermediate_size

    def has_kv(self, layer: int) -> bool:
        """Whether the layer computes keys and values of its own."""
        return layer < self.n_layers - self.kv_shared_layers

    @property
    def global_head_dim(self) -> int:
        """Head size of the full-attention layers (Gemma 4's differs from its sliding-window layers')."""
        return next((self.head_dim_of(i) for i, kind in enumerate(self.layer_types) if kind == "full_attention"), self.head_dim)

    @property
    def rope_dimensions(self) -> int:
        """Dimensions of a head that RoPE rotates (Phi-4 mini rotates 3/4 of them). Proportional RoPE
        (Gemma 4's global layers) spans the whole head, its unrotated pairs given zero frequencies."""
        if self.rope.scaling_type == "proportional":
            return self.global_head_dim
        factor = self.rope.scaling.get("partial_rotary_factor", self.raw.get("partial_rotary_factor", 1.0))
        return int(self.head_dim * factor)

    @classmethod
    def from_dict(cls, config: object, source: Path) -> ModelConfig:
        if not isinstance(config, dict):
            raise ModelError(f"{source} holds a JSON {type(config).__name__}, not an object; is it a transformers model config?")
        architectures = config.get("architectures")
        if not architectures:
            raise ModelError(f"{source} has no 'architectures' entry; is it a transformers model config?")
        if not isinstance(architectures, list) or not isinstance(architectures[0], str):
            raise ModelError(f"{source}: 'architectures' is {architectures!r}, expected a list of class names; the config.json is corrupt")
        # Read before a wrapper's text_config replaces the outer keys (Ministral 3's is beside it).
        fp8_scaling = Fp8Scaling.from_config(config, source)
        mxfp4 = _quant_method(config) == MXFP4_METHOD
        if (wrapper := WRAPPERS.get(architectures[0])) is not None:
            config = _text_config(config, wrapper, source)
        elif (config_class := FILLED_BY_TRANSFORMERS.get(architectures[0])) is not None:
            config = {**_transformers_defaults(config, config_class, "config.json", source, architectures[0]), **config}
        # Llama 4 and others: the language model's sizes are nested beside a vision or audio part's.
        elif config.get("hidden_size") is None and isinstance(config.get("text_config"), dict):
            raise ModelError(
                f"{source} describes {architectures[0]}, a model that also reads images or audio (its language model in "
                f"'text_config'); localchat converts text-only *ForCausalLM checkpoints (and {', '.join(WRAPPERS)}): convert this one with llama.cpp's "
                "convert_hf_to_gguf.py"
            )
        read = ConfigReader(config, source)
        hidden = read.int("hidden_size")
        n_heads = read.int("num_attention_heads")
        n_layers = read.int("num_hidden_layers")
        n_kv_heads = read.int("num_key_value_heads", n_heads)
        if n_heads % n_kv_heads:
            raise ModelError(f"{source}: {n_heads} attention heads cannot share {n_kv_heads} key/value heads evenly; the config.json is corrupt")
        if config.get("head_dim") is None and hidden % n_heads:
            raise ModelError(f"{source}: hidden_size {hidden} is not a multiple of {n_heads} heads and no head_dim is given")
        try:
            rope, rope_local = _rope_layouts(config)
        except (TypeError, ValueError, AttributeError, KeyError):
            raise ModelError(f"{source} has malformed RoPE settings (rope_parameters, rope_scaling or rope_theta); the config.json is corrupt") from None
        for key in OPTIONAL_NUMBERS:
            if config.get(key) is not None:
                read.float(key, 1.0)
        # 0 for a dense model of a class that has mixtures of experts too (Granite 4's).
        n_experts = next((read.int(key, minimum=0) for key in EXPERT_COUNT_KEYS if config.get(key) is not None), 0)
        n_experts_used = next((read.int(key) for key in EXPERTS_USED_KEYS if config.get(key) is not None), 0) if n_experts else 0
        if n_experts_used > n_experts:
            raise ModelError(f"{source}: {n_experts_used} experts used per token of {n_experts}; the config.json is corrupt")
        layer_types = config.get("layer_types") or _default_layer_types(read, architectures[0], n_layers)
        if not isinstance(layer_types, list) or len(layer_types) != n_layers or not all(isinstance(t, str) for t in layer_types):
            raise ModelError(f"{source}: 'layer_types' does not name one type for each of the {n_layers} layers; the config.json is corrupt")
        head_dim = read.int("head_dim", hidden // n_heads)
        kv_shared = read.int("num_kv_shared_layers", 0, minimum=0)
        if kv_shared >= n_layers:
            raise ModelError(f"{source}: num_kv_shared_layers {kv_shared} leaves none of the {n_layers} layers to compute keys and values; the config.json is corrupt")
        # A mixture of experts without a dense MLP (Qwen 3.5's) gives its experts' width alone, which llama.cpp reads as the FFN length.
        intermediate = (read.int("intermediate_size", config.get("moe_intermediate_size")) if n_experts
                        else read.int(MLP_WIDTH_KEYS.get(architectures[0], "intermediate_size")))
        shared_experts = next((read.int(key, minimum=0) for key in SHARED_EXPERT_COUNT_KEYS if config.get(key) is not None), 0) if n_experts else 0
        if config.get("block_auto_adjust_ff_dim"):
            intermediate = _adjusted_mlp_width(read, intermediate)
        # Gemma 4's double-wide MLP widens the layers that share keys and values, as transformers builds them.
        wide = 2 if config.get("use_double_wide_mlp") else 1
        layer_head_dims = _per_layer(read, n_layers, "head_dim", head_dim)
        layer_kv_heads = _per_layer(read, n_layers, "num_key_value_heads", n_kv_heads)
        if bad := next((h for h in layer_kv_heads if n_heads % h), None):
            raise ModelError(f"{source}: {n_heads} attention heads cannot share {bad} key/value heads evenly; the config.json is corrupt")
        recurrent = RECURRENT_LAYER_TYPES.get(architectures[0], ())
        layer_kv_heads = tuple(0 if kind in recurrent else heads for kind, heads in zip(layer_types, layer_kv_heads))
        return cls(
            architecture=architectures[0],
            vocab_size=read.int("vocab_size"),
            hidden_size=hidden,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            rms_norm_eps=next((read.float(key, 1e-6) for key in RMS_NORM_EPS_KEYS if config.get(key) is not None), 1e-6),
            context_length=read.int("max_position_embeddings", 0, minimum=0),
            rope=rope,
            rope_local=rope_local,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            sliding_window=read.int("sliding_window", 0, minimum=0) or None,  # Qwen2-MoE writes 0 for none
            layer_types=tuple(layer_types),
            raw=config,
            n_experts=n_experts,
            n_experts_used=n_experts_used,
            expert_intermediate_size=read.int("moe_intermediate_size", intermediate) if n_experts else 0,
            shared_expert_intermediate_size=next((read.int(key, minimum=0) for key in SHARED_EXPERT_WIDTH_KEYS if config.get(key) is not None),
                                                 shared_experts * read.int("moe_intermediate_size", intermediate)) if n_experts else 0,
            shared_experts=shared_experts,
            dense_layers=min(next((read.int(key, minimum=0) for key in DENSE_LAYERS_KEYS if config.get(key) is not None), 0), n_layers)
            if n_experts else 0,
            nextn_layers=read.int("num_nextn_predict_layers", 0, minimum=0),
            layer_head_dims=layer_head_dims if len(set(layer_head_dims)) > 1 else (),
            layer_kv_heads=layer_kv_heads if len(set(layer_kv_heads)) > 1 else (),
            layer_intermediate_sizes=tuple(intermediate * (wide if i >= n_layers - kv_shared else 1) for i in range(n_layers))
            if wide > 1 and kv_shared else (),
            kv_shared_layers=kv_shared,
            per_layer_input_size=read.int("hidden_size_per_layer_input", 0, minimum=0),
            conv_kernel=read.int("conv_L_cache", 0, minimum=0),
            # transformers 5 names Granite 4's Mamba-2 layers linear_attention too.
            delta_net=DeltaNetSizes.read(read) if "linear_num_key_heads" in config or (LINEAR_ATTENTION in layer_types and "mamba_n_heads" not in config)
            else None,
            mamba2=Mamba2Sizes.read(read, hidden) if "mamba_n_heads" in config else None,
            latent_attention=LatentAttentionSizes.read(read) if "kv_lora_rank" in config else None,
            fp8_scaling=fp8_scaling,
            mxfp4=mxfp4,
        )


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lies in a safetensors file; nothing is read until `read`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset in `file`
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)  # exact: a corrupt header's huge dims must not wrap around


class _MappedFile:
    """One safetensors file mapped read-only; pages are dropped after each tensor is used."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as stream:
            self.map = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)

    def view(self, ref: TensorRef) -> np.ndarray:
        stored = STORED_DTYPES[ref.dtype]
        return np.frombuffer(self.map, dtype=stored, count=ref.n_elements, offset=ref.start).reshape(ref.shape)

    def release(self, ref: TensorRef) -> None:
        # The kernel keeps the pages in its cache; this only stops them counting as our RSS.
        start = ref.start // mmap.PAGESIZE * mmap.PAGESIZE
        self.map.madvise(mmap.MADV_DONTNEED, start, ref.start + ref.n_bytes - start)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_ref(path: Path, name: str, entry: object, data_start: int, data_size: int) -> TensorRef:
    """One header entry, checked the way the safetensors library checks it."""
    corrupt = f"{path}: tensor '{name}' has a corrupt header entry"
    if not isinstance(entry, dict):
        raise ModelError(f"{corrupt}; download the file again")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in STORED_DTYPES:
        raise ModelError(f"{path}: tensor '{name}' has dtype {dtype!r}, which localchat cannot read; known: {', '.join(STORED_DTYPES)}")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise ModelError(f"{corrupt} (shape {shape!r}); download the file again")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets) or offsets[0] > offsets[1]:
        raise ModelError(f"{corrupt} (data_offsets {offsets!r}); download the file again")
    begin, end = offsets
    if end > data_size:
        raise ModelError(
            f"{path} is truncated: tensor '{name}' ends at byte {data_start + end:,} but the file has {data_start + data_size:,}; "
            "download it again"
        )
    ref = TensorRef(name, dtype, tuple(shape), path, data_start + begin, end - begin)
    if ref.n_elements * STORED_DTYPES[dtype].itemsize != ref.n_bytes:
        raise ModelError(f"{path}: tensor '{name}' has {ref.n_bytes:,} bytes for shape {list(ref.shape)} of {dtype}; the file is corrupt, download it again")
    return ref


def read_safetensors_header(path: Path) -> list[TensorRef]:
    size = path.stat().st_size
    with path.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            raise ModelError(f"{path} is truncated (no safetensors header); download it again")
        header_len = struct.unpack("<Q", prefix)[0]
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise ModelError(f"{path} is truncated or not a safetensors file (header of {header_len:,} bytes); download it again")
        try:
            header = json.loads(stream.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelError(f"{path} has a corrupt safetensors header; download it again") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path} has a corrupt safetensors header (not a JSON object); download it again")
    data_start = 8 + header_len
    refs = [_tensor_ref(path, name, entry, data_start, size - data_start) for name, entry in header.items() if name != "__metadata__"]
    # Tensors tile the data section in order, without gaps or overlaps, to its end.
    expected = data_start
    for ref in sorted(refs, key=lambda r: (r.start, r.n_bytes)):
        if ref.start != expected:
            raise ModelError(f"{path}: tensor '{ref.name}' starts at byte {ref.start:,}, expected {expected:,}; the file is corrupt, download it again")
        expected += ref.n_bytes
    if expected != size:
        raise ModelError(f"{path} has {size - expected:,} bytes after its last tensor; the file is corrupt, download it again")
    return refs


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint file; anything else is a ModelError saying which file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelError(f"{path} is not valid JSON ({error}); download it again") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path} holds a JSON {type(value).__name__}, not an object; download it again")
    return value


# Tensors of the decoders localchat converts, by their name after "model.layers.N." for a layer's
# (an expert's index written "*"): the shapes the config implies for layer `layer`, any one of them.
def expected_shapes(config: ModelConfig, layer: int = 0) -> dict[str, tuple[tuple[int, ...], ...]]:
    hidden, ffn, vocab = config.hidden_size, config.intermediate_size_of(layer), config.vocab_size
    head = config.head_dim_of(layer)
    q, kv = config.n_heads * head, config.kv_heads_of(layer) * head
    expert_ffn, shared_ffn = config.expert_intermediate_size, config.shared_expert_intermediate_size
    # Granite 4's MLP, the shared expert of its mixtures of experts.
    granite_mlp = shared_ffn if config.n_experts else ffn
    per_layer = config.per_layer_input_size
    shapes: dict[str, tuple[int, ...] | tuple[tuple[int, ...], ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "pre_feedforward_layernorm.weight": (hidden,),
        "post_feedforward_layernorm.weight": (hidden,),
        # GLM-4's norms after attention and after the MLP.
        "post_self_attn_layernorm.weight": (hidden,),
        "post_mlp_layernorm.weight": (hidden,),
        # GLM-4.5's layers that predict further tokens: their norms of the token's embedding and the last hidden state, the
        # projection of both together, and their own embeddings, head and its norm where they have them.
        "eh_proj.weight": (hidden, 2 * hidden),
        "enorm.weight": (hidden,),
        "hnorm.weight": (hidden,),
        "embed_tokens.weight": (vocab, hidden),
        "shared_head.head.weight": (vocab, hidden),
        "shared_head.norm.weight": (hidden,),
        # Qwen 3.5's gives each head's output gate beside its query.
        "self_attn.q_proj.weight": (2 * q if config.architecture in GATED_QUERY_ARCHITECTURES else q, hidden),
        "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden),
        "self_attn.qkv_proj.weight": (q + 2 * kv, hidden),
        "self_attn.o_proj.weight": (hidden, q),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.bias": (hidden,),
        # gpt-oss's attention sinks: a logit per head that each query's softmax weighs beside its keys'.
        "self_attn.sinks": (config.n_heads,),
        # Per head (Qwen 3, Gemma 3) or across all heads (OLMo 2, OLMoE).
        "self_attn.q_norm.weight": ((head,), (q,)),
        "self_attn.k_norm.weight": ((head,), (kv,)),
        "mlp.gate_proj.weight": (ffn, hidden),
        "mlp.up_proj.weight": (ffn, hidden),
        "mlp.gate_up_proj.weight": (2 * ffn, hidden),
        "mlp.down_proj.weight": (hidden, ffn),
        # Gemma 4: each layer's scale and its per-layer inputs (one embedding row of every layer's, per token).
        "layer_scalar": (1,),
        "per_layer_input_gate.weight": (per_layer, hidden),
        "per_layer_projection.weight": (hidden, per_layer),
        "post_per_layer_input_norm.weight": (hidden,),
        "model.embed_tokens_per_layer.weight": (vocab, config.n_layers * per_layer),
        "model.per_layer_model_projection.weight": (config.n_layers * per_layer, hidden),
        "model.per_layer_projection_norm.weight": (per_layer,),
        # LFM2: its norms, per-head query and key norms, SwiGLU MLP and gated short convolutions (a depthwise kernel).
        "model.embedding_norm.weight": (hidden,),
        "operator_norm.weight": (hidden,),
        "ffn_norm.weight": (hidden,),
        "self_attn.out_proj.weight": (hidden, q),
        "self_attn.q_layernorm.weight": (head,),
        "self_attn.k_layernorm.weight": (head,),
        "feed_forward.w1.weight": (ffn, hidden),
        "feed_forward.w3.weight": (ffn, hidden),
        "feed_forward.w2.weight": (hidden, ffn),
        "conv.in_proj.weight": (3 * hidden, hidden),
        "conv.out_proj.weight": (hidden, hidden),
        "conv.conv.weight": (hidden, 1, config.conv_kernel),
        # Granite 4's MLP: its gate and up projections fused.
        "shared_mlp.input_linear.weight": (2 * granite_mlp, hidden),
        "shared_mlp.output_linear.weight": (hidden, granite_mlp),
    }
    if (mamba := config.mamba2) is not None:
        shapes |= {
            "mamba.in_proj.weight": (mamba.inner_size + mamba.conv_dim + mamba.heads, hidden),
            "mamba.conv1d.weight": (mamba.conv_dim, 1, mamba.conv_kernel),
            "mamba.conv1d.bias": (mamba.conv_dim,),
            "mamba.dt_bias": (mamba.heads,),
            "mamba.A_log": (mamba.heads,),
            "mamba.D": (mamba.heads,),
            "mamba.norm.weight": (mamba.inner_size,),
            "mamba.out_proj.weight": (hidden, mamba.inner_size),
        }
    if (latent := config.latent_attention) is not None:
        heads, queries = config.n_heads, config.n_heads * latent.qk_head_dim
        shapes |= {
            "self_attn.q_proj.weight": (queries, hidden),
            "self_attn.q_a_proj.weight": (latent.q_lora_rank, hidden),
            "self_attn.q_a_layernorm.weight": (latent.q_lora_rank,),
            "self_attn.q_b_proj.weight": (queries, latent.q_lora_rank),
            "self_attn.kv_a_proj_with_mqa.weight": (latent.kv_lora_rank + latent.qk_rope_head_dim, hidden),
            "self_attn.kv_a_layernorm.weight": (latent.kv_lora_rank,),
            "self_attn.kv_b_proj.weight": (heads * (latent.qk_nope_head_dim + latent.v_head_dim), latent.kv_lora_rank),
            "self_attn.o_proj.weight": (hidden, heads * latent.v_head_dim),
        }
    if (delta := config.delta_net) is not None:
        qkv = 2 * delta.key_dim + delta.value_dim
        shapes |= {
            "linear_attn.in_proj_qkv.weight": (qkv, hidden),
            "linear_attn.in_proj_z.weight": (delta.value_dim, hidden),
            "linear_attn.in_proj_a.weight": (delta.value_heads, hidden),
            "linear_attn.in_proj_b.weight": (delta.value_heads, hidden),
            "linear_attn.conv1d.weight": (qkv, 1, delta.conv_kernel),
            "linear_attn.A_log": (delta.value_heads,),
            "linear_attn.dt_bias": (delta.value_heads,),
            "linear_attn.norm.weight": (delta.value_head_dim,),
            "linear_attn.out_proj.weight": (hidden, delta.value_dim),
        }
    if config.n_experts:
        shapes |= {
            "mlp.gate.weight": (config.n_experts, hidden),
            "block_sparse_moe.gate.weight": (config.n_experts, hidden),
            "mlp.experts.*.gate_proj.weight": (expert_ffn, hidden),
            "mlp.experts.*.up_proj.weight": (expert_ffn, hidden),
            "mlp.experts.*.down_proj.weight": (hidden, expert_ffn),
            "block_sparse_moe.experts.*.w1.weight": (expert_ffn, hidden),
            "block_sparse_moe.experts.*.w3.weight": (expert_ffn, hidden),
            "block_sparse_moe.experts.*.w2.weight": (hidden, expert_ffn),
            # LFM2-MoE's, with the bias its router's choice adds to each expert's score.
            "feed_forward.gate.weight": (config.n_experts, hidden),
            "feed_forward.expert_bias": (config.n_experts,),
            "feed_forward.experts.*.w1.weight": (expert_ffn, hidden),
            "feed_forward.experts.*.w3.weight": (expert_ffn, hidden),
            "feed_forward.experts.*.w2.weight": (hidden, expert_ffn),
            "mlp.shared_expert.gate_proj.weight": (shared_ffn, hidden),
            "mlp.shared_expert.up_proj.weight": (shared_ffn, hidden),
            "mlp.shared_expert.down_proj.weight": (hidden, shared_ffn),
            "mlp.shared_expert_gate.weight": (1, hidden),
            # GLM-4.5's: the bias its router's choice adds to each expert's score, its shared experts as one MLP.
            "mlp.gate.e_score_correction_bias": (config.n_experts,),
            "mlp.shared_experts.gate_proj.weight": (shared_ffn, hidden),
            "mlp.shared_experts.up_proj.weight": (shared_ffn, hidden),
            "mlp.shared_experts.down_proj.weight": (hidden, shared_ffn),
            # ERNIE 4.5's bias of its router's choice, one row of one per expert.
            "mlp.moe_statics.e_score_correction_bias": (1, config.n_experts),
            # Granite 4's router (its experts are read as Mixtral's: STACKED_EXPERTS).
            "block_sparse_moe.router.layer.weight": (config.n_experts, hidden),
            # gpt-oss's router with its bias, and each expert's matrices (input rows by output columns, gate and up alternating)
            # and biases as GPT_OSS_STACKED_EXPERTS reads them.
            "mlp.router.weight": (config.n_experts, hidden),
            "mlp.router.bias": (config.n_experts,),
            "mlp.experts.*.gate_up_proj": (hidden, 2 * expert_ffn),
            "mlp.experts.*.gate_up_proj_bias": (2 * expert_ffn,),
            "mlp.experts.*.down_proj": (expert_ffn, hidden),
            "mlp.experts.*.down_proj_bias": (hidden,),
            # Its release's experts in MXFP4: each row's 4-bit values packed two a byte, 16 bytes a block of 32, and each block's
            # power-of-two scale (MXFP4_DTYPE both).
            "mlp.experts.*.gate_up_proj_blocks": (2 * expert_ffn, hidden // MXFP4_BLOCK, MXFP4_BLOCK // 2),
            "mlp.experts.*.gate_up_proj_scales": (2 * expert_ffn, hidden // MXFP4_BLOCK),
            "mlp.experts.*.down_proj_blocks": (hidden, expert_ffn // MXFP4_BLOCK, MXFP4_BLOCK // 2),
            "mlp.experts.*.down_proj_scales": (hidden, expert_ffn // MXFP4_BLOCK),
        }
    return {key: shape if isinstance(shape[0], tuple) else (shape,) for key, shape in shapes.items()}


FLOAT_DTYPES = ("F32", "F16", "BF16", "F64", *FP8_VALUES)
LAYER_PREFIX = "model.layers."
# An expert's index in a tensor name: "mlp.experts.3.up_proj.weight".
EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")
# A layer's experts' matrices in one tensor, the experts along its first axis (transformers 5's layout, in which Qwen 3.5's
# mixtures of experts ship, but for their FP8 release, and Granite 4's): the names each expert's matrix is read under, each an
# equal block of the expert's rows in order (its gate projection's, then its up projection's, as transformers splits them).
# Granite's take Mixtral's names (w1 gate, w3 up, w2 down).
STACKED_EXPERTS = {"mlp.experts.gate_up_proj": ("mlp.experts.{}.gate_proj.weight", "mlp.experts.{}.up_proj.weight"),
                   "mlp.experts.down_proj": ("mlp.experts.{}.down_proj.weight",),
                   "block_sparse_moe.input_linear.weight": ("block_sparse_moe.experts.{}.w1.weight", "block_sparse_moe.experts.{}.w3.weight"),
                   "block_sparse_moe.output_linear.weight": ("block_sparse_moe.experts.{}.w2.weight",)}
# gpt-oss's stacks share Qwen 3.5's names but not their layout: each expert's matrices stored input rows by output columns, its gate
# and up projections alternating column by column, and a stack of each one's biases beside them. Each expert's is read whole under
# a name of its own, which architectures.GPT_OSS_REWRITES turns and splits as llama.cpp reads them.
GPT_OSS_STACKED_EXPERTS = {"mlp.experts.gate_up_proj": ("mlp.experts.{}.gate_up_proj",),
                           "mlp.experts.gate_up_proj_bias": ("mlp.experts.{}.gate_up_proj_bias",),
                           "mlp.experts.down_proj": ("mlp.experts.{}.down_proj",),
                           "mlp.experts.down_proj_bias": ("mlp.experts.{}.down_proj_bias",),
                           **{f"mlp.experts.{matrix}{part}": (f"mlp.experts.{{}}.{matrix}{part}",)
                              for matrix in ("gate_up_proj", "down_proj") for part in MXFP4_PARTS}}
# The stacks of architectures whose layout differs from STACKED_EXPERTS'.
STACKED_EXPERTS_OF = {"GptOssForCausalLM": GPT_OSS_STACKED_EXPERTS}


def layer_key(name: str) -> tuple[int | None, str]:
    """(layer index, name after "model.layers.N.") of a layer's tensor; (None, name) for others."""
    if name.startswith(LAYER_PREFIX):
        index, _, key = name[len(LAYER_PREFIX):].partition(".")
        if index.isdigit():
            return int(index), key
    return None, name


def _check_tensors(folder: Path, config: ModelConfig, tensors: dict[str, TensorRef]) -> None:
    """Known tensors have the config's shapes and a float dtype; layers of one kind (attention type, own
    keys and values or not, a dense MLP or experts) have the same tensors. Which tensors an architecture needs is its converter's to say."""
    # The layers after the last that predict further tokens (GLM-4.5's) are shaped as the last one, with tensors of their own.
    n_blocks = config.n_layers + config.nextn_layers
    shapes = [expected_shapes(config, min(layer, config.n_layers - 1)) for layer in range(n_blocks)]
    layers: dict[int, set[str]] = {i: set() for i in range(n_blocks)}
    for name, ref in tensors.items():
        index, key = layer_key(name)
        if name.startswith(LAYER_PREFIX):
            if index is None or index >= n_blocks:
                raise ModelError(f"{folder} has tensor '{name}' but config.json says {n_blocks} layers; the checkpoint is inconsistent")
            layers[index].add(key)
        if expert := EXPERT_INDEX.search(key):
            if int(expert[1]) >= config.n_experts:
                raise ModelError(f"{folder} has tensor '{name}' but config.json says {config.n_experts} experts; the checkpoint is inconsistent")
            key = EXPERT_INDEX.sub(".experts.*.", key)
        expected = shapes[index or 0]
        if key not in expected:
            continue  # the converters refuse or ignore tensors they do not know
        # An MXFP4 matrix's packed values and scales are bytes; every other weight a float.
        kind, dtypes = (f"{MXFP4_DTYPE} (MXFP4)", (MXFP4_DTYPE,)) if key.endswith(MXFP4_PARTS) else (f"float ({', '.join(FLOAT_DTYPES)})", FLOAT_DTYPES)
        if ref.dtype not in dtypes:
            raise ModelError(f"{ref.file}: tensor '{name}' is {ref.dtype}; weights must be {kind}")
        if ref.shape not in expected[key]:
            implied = " or ".join(str(list(shape)) for shape in expected[key])
            raise ModelError(
                f"{ref.file}: tensor '{name}' has shape {list(ref.shape)} but config.json implies {implied}; "
                "the checkpoint is inconsistent"
            )
    if "model.embed_tokens.weight" not in tensors:
        raise ModelError(f"{folder} has no token embeddings (model.embed_tokens.weight); are all weight files there?")
    first_of_kind: dict[tuple[str, bool, bool], set[str]] = {}
    for index, names in layers.items():
        kind = config.layer_types[index] if index < config.n_layers else "nextn"
        first = first_of_kind.setdefault((kind, config.has_kv(index), index < config.dense_layers), names)
        if missing := sorted(first - names):
            raise ModelError(f"{folder} lacks {LAYER_PREFIX}{index}.{missing[0]}; are all weight files there?")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
            raise ModelError(f"{index} has no valid 'weight_map'; download it again")
        files = sorted({folder / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelError(f"{folder} lacks {', '.join(missing)} listed in {SAFETENSORS_INDEX}; download every shard")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    others = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    hint = f" (found {', '.join(others)}: only safetensors weights are read)" if others else ""
    raise ModelError(f"{folder} has no *.safetensors weights{hint}; download the model's safetensors files")


class TensorFiles:
    """Tensors of safetensors files, memory-mapped and read one at a time (nothing needs torch)."""

    def __init__(self, tensors: dict[str, TensorRef], scales: dict[str, TensorRef] | None = None,
                 scale_block: tuple[int, int] | None = None) -> None:
        """`scales`: each FP8 weight's scale by the weight's name, one value per `scale_block` (or per row or tensor)."""
        self.tensors = tensors
        self.scales = scales or {}
        self.scale_block = scale_block
        self._files: dict[Path, _MappedFile] = {}

    @classmethod
    def read(cls, paths: list[Path], folder: Path) -> TensorFiles:
        """The tensors of `paths`, each name in one file only."""
        tensors: dict[str, TensorRef] = {}
        for path in paths:
            for ref in read_safetensors_header(path):
                if ref.name in tensors:
                    raise ModelError(f"{folder}: tensor '{ref.name}' is in both {tensors[ref.name].file.name} and {path.name}; remove stray weight files")
                tensors[ref.name] = ref
        return cls(tensors)

    @property
    def n_bytes(self) -> int:
        return sum(ref.n_bytes for ref in self.tensors.values())

    def _mapped(self, ref: TensorRef) -> _MappedFile:
        if ref.file not in self._files:
            self._files[ref.file] = _MappedFile(ref.file)
        return self._files[ref.file]

    def read_stored(self, ref: TensorRef) -> np.ndarray:
        """The tensor as stored, without a copy (bf16 as uint16); valid until `release`."""
        return self._mapped(ref).view(ref)

    def read_float32(self, ref: TensorRef) -> np.ndarray:
        """A float32 copy of the tensor; an FP8 weight times its scale."""
        values = self.float32(ref, self.read_stored(ref))
        if (scale := self.scales.get(ref.name)) is not None:
            dequantize_fp8(values, self.read_float32(scale), self.scale_block)
            self.release(scale)
        return values

    @staticmethod
    def float32(ref: TensorRef, stored: np.ndarray) -> np.ndarray:
        """A float32 copy of `stored`, all or part of `ref` as read by `read_stored` (FP8 as stored, unscaled)."""
        if ref.dtype == "BF16":
            return bf16_to_float32(stored)
        if ref.dtype in FP8_VALUES:
            return FP8_VALUES[ref.dtype][stored]
        return stored.astype(np.float32)

    def release(self, ref: TensorRef) -> None:
        self._mapped(ref).release(ref)

    def __iter__(self) -> Iterator[TensorRef]:
        return iter(self.tensors.values())

    def close(self) -> None:
        # Views handed out keep a map alive through its buffer; drop ours and let them go.
        self._files.clear()


def _each_experts_tensors(folder: Path, tensors: dict[str, TensorRef], stacks: dict[str, tuple[str, ...]]) -> dict[str, TensorRef]:
    """`tensors` with each stack of experts' matrices or vectors (`stacks`: STACKED_EXPERTS or the architecture's own) as one
    tensor per expert and matrix, where it lies in the stack's bytes: the converters read one layout."""
    each: dict[str, TensorRef] = {}
    for name, ref in tensors.items():
        layer, key = layer_key(name)
        if layer is None or (parts := stacks.get(key)) is None:
            each[name] = ref
            continue
        if len(ref.shape) not in (2, 3, 4) or ref.shape[1] % len(parts):
            raise ModelError(f"{ref.file}: tensor '{name}' has shape {list(ref.shape)}, not experts x {len(parts)} equal blocks of rows (x columns); the checkpoint is inconsistent")
        experts, rows, *columns = ref.shape
        block = replace(ref, shape=(rows // len(parts), *columns), n_bytes=ref.n_bytes // (experts * len(parts)))
        for index in range(experts * len(parts)):
            expert_name = f"{LAYER_PREFIX}{layer}.{parts[index % len(parts)].format(index // len(parts))}"
            if expert_name in tensors:
                raise ModelError(f"{folder} has tensor '{expert_name}' and the stack '{name}' that holds it too; remove stray weight files")
            each[expert_name] = replace(block, name=expert_name, start=ref.start + index * block.n_bytes)
    return each


def _text_model_tensors(folder: Path, tensors: dict[str, TensorRef], wrapper: Wrapper) -> dict[str, TensorRef]:
    """A wrapper's tensors under its text model's names; the other part's left out."""
    renamed: dict[str, TensorRef] = {}
    for name, ref in tensors.items():
        if name.startswith(wrapper.skipped):
            continue
        prefix, text_prefix = next(((p, t) for p, t in wrapper.prefixes if name.startswith(p)), ("", ""))
        text_name = text_prefix + name[len(prefix):]
        if text_name in renamed:
            raise ModelError(f"{folder} has tensor '{text_name}' under two names ({renamed[text_name].name}, {name}); remove stray weight files")
        renamed[text_name] = replace(ref, name=text_name)
    return renamed


def _weight_scales(folder: Path, tensors: dict[str, TensorRef], scaling: Fp8Scaling) -> tuple[dict[str, TensorRef], dict[str, TensorRef]]:
    """The model's tensors and, apart, each FP8 weight's scale by the weight's name; activation scales are left out."""
    model: dict[str, TensorRef] = {}
    scales: dict[str, TensorRef] = {}
    for name, ref in tensors.items():
        if name.endswith(".weight" + scaling.scale_suffix):
            scales[name.removesuffix(scaling.scale_suffix)] = ref
        elif not name.endswith(ACTIVATION_SCALE_SUFFIXES):
            model[name] = ref
    for name, scale in scales.items():
        if (weight := model.get(name)) is None:
            raise ModelError(f"{folder} has the scale '{scale.name}' but not its weight '{name}'; are all weight files there?")
        if scale.dtype not in FLOAT_DTYPES or scale.shape not in scaling.scale_shapes(weight.shape):
            raise ModelError(
                f"{scale.file}: scale '{scale.name}' is {scale.dtype} of shape {list(scale.shape)}, which does not scale a "
                f"weight of shape {list(weight.shape)} as quantization_config says ({scaling.method}); the checkpoint is inconsistent"
            )
    return model, scales


def wrapper_notice(config: ModelConfig) -> str | None:
    """What converting a wrapper's text model alone leaves out, as a line for the user; None for a text model."""
    if (wrapper := WRAPPERS.get(config.architecture)) is None:
        return None
    return f"{config.architecture} also reads images: only its text model is converted, not {wrapper.left_out}"


def _tagged_floats(value: Any) -> Any:
    """`value` with transformers' tagged floats ({"__float__": "Infinity"}) as floats, as transformers reads a config.json."""
    if isinstance(value, dict):
        if value.keys() == {"__float__"} and isinstance(tag := value["__float__"], str) and tag in TAGGED_FLOATS:
            return TAGGED_FLOATS[tag]
        return {key: _tagged_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_tagged_floats(item) for item in value]
    return value


def read_config(folder: Path) -> ModelConfig:
    """A checkpoint folder's config.json, read and normalised."""
    config_path = folder / "config.json"
    if not folder.is_dir():
        raise ModelError(f"{folder} is not a folder; give a Hugging Face checkpoint folder or a hub repo id")
    if not config_path.is_file():
        raise ModelError(f"{folder} has no config.json; is it a Hugging Face checkpoint folder?")
    return ModelConfig.from_dict(_tagged_floats(read_json(config_path)), config_path)


class Checkpoint(TensorFiles):
    """A Hugging Face checkpoint folder: `config`, tensor table, and tensors read one at a time."""

    def __init__(self, folder: Path, accept: Callable[[ModelConfig], object] | None = None) -> None:
        """`accept` sees the config first and raises for one its caller cannot convert, before any
        tensor is read (a wrong architecture is named as such, not as a missing tensor)."""
        self.folder = folder
        self.config = read_config(folder)
        if accept is not None:
            accept(self.config)
        tensors = TensorFiles.read(_weight_files(folder), folder).tensors
        if (wrapper := WRAPPERS.get(self.config.architecture)) is not None:
            tensors = _text_model_tensors(folder, tensors, wrapper)
        tensors = _each_experts_tensors(folder, tensors, STACKED_EXPERTS_OF.get(self.config.architecture, STACKED_EXPERTS))
        if (scaling := self.config.fp8_scaling) is not None:
            tensors, scales = _weight_scales(folder, tensors, scaling)
            super().__init__(tensors, scales, scaling.block)
        else:
            super().__init__(tensors)
        _check_tensors(folder, self.config, self.tensors)

    def json_file(self, name: str) -> dict[str, Any] | None:
        """A JSON object file of the checkpoint, None if absent; a corrupt one is a ModelError."""
        path = self.folder / name
        return read_json(path) if path.is_file() else None


def hub_repo_id(folder: Path) -> str | None:
    """The repo id of a snapshot folder in the Hugging Face cache (models--ORG--NAME/snapshots/REVISION), else None."""
    repo = folder.parent.parent.name
    if folder.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    return repo.removeprefix("models--").replace("--", "/")


def model_metadata(checkpoint: Checkpoint, total_params: int) -> gguf.Metadata:
    """The model's name and authorship as llama.cpp's converter finds them (gguf's metadata heuristics over
    config.json's `_name_or_path`, the folder's name and its model card), with a size label from its parameter
    count: name "SmolLM2 135M Instruct", finetune "Instruct", where it was given as
    "HuggingFaceTB/SmolLM2-135M-Instruct" (localchat.sampling_defaults matches families by these). A hub
    snapshot is named by its repo id, not its revision's folder."""
    folder = checkpoint.folder
    repo = hub_repo_id(folder)
    named = {**checkpoint.config.raw, "_name_or_path": repo} if repo is not None else checkpoint.config.raw
    try:
        card = gguf.Metadata.load_model_card(folder)
    except (OSError, ValueError, yaml.YAMLError):  # a model card that cannot be read names nothing
        card = {}
    metadata = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), card, named, None if repo else folder, total_params)
    metadata.name = metadata.name or repo or folder.name
    if metadata.size_label is None and total_params > 0:
        metadata.size_label = gguf.size_label(total_params, 0, 0, 0)
    return metadata


# What a conversion needs from a hub repository: no other weights formats, no extras.
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    SAFETENSORS_INDEX,
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
    "chat_template.jinja",
    # A PEFT adapter's (its base model's config.json is fetched on its own).
    "adapter_config.json",
    # The model card: its license, base models and languages go into the file's general.* metadata.
    "README.md",
]


@dataclass(frozen=True)
class CheckpointSource:
    """Where a checkpoint is, and a name and folder for the output made from it."""

    folder: Path
    name: str
    directory: Path


def locate_checkpoint(spec: str, patterns: list[str] = HUB_PATTERNS) -> CheckpointSource:
    """A local folder as is; otherwise a hub repo id, its files matching `patterns` fetched into
    huggingface_hub's cache."""
    path = Path(spec).expanduser()
    if path.exists():
        return CheckpointSource(path, path.resolve().name, path.resolve().parent)
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise ModelError(f"{spec} is neither a folder nor a Hugging Face repo id (owner/name); check the path")
    from localchat.hub import pull_files
    from localchat.settings import Settings

    try:
        folder = pull_files(spec, patterns, Settings())  # resumable, checksummed, as `localchat pull`
    except ModelError as error:
        files = ", ".join(patterns[:6])
        raise ModelError(
            f"there is no folder {spec} here, and as a Hugging Face repo id: {error}; or download {files} from "
            f"https://huggingface.co/{spec} into a folder and pass that folder instead"
        ) from None
    return CheckpointSource(folder, spec.split("/")[1], Path.cwd())
