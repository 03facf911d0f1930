"""PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) -> GGUF LoRA adapter,
as llama.cpp's convert_lora_to_gguf.py writes one: general.type "adapter", adapter.type "lora",
adapter.lora.alpha, and for each adapted matrix `<gguf name>.lora_a` (rank x input) and
`.lora_b` (output x rank), named and reordered as the base model's own conversion names and
reorders the matrix (LLaMA's Q and K rows).

The base model's config.json (the adapter's base_model_name_or_path, or --base) says which
architecture row applies and what shapes each matrix has: an adapter made for another base model is
refused here, before llama.cpp would refuse it at load.

llama.cpp scales an adapter's product by alpha / rank; PEFT by alpha / rank, alpha / sqrt(rank)
(rsLoRA) or a per-module alpha (alpha_pattern). Where the two differ the ratio is folded into
lora_b, so the adapter computes what PEFT computes at any scale it is applied with.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFType, GGUFWriter, Keys, get_tensor_name_map

from localchat.converters.architectures import Architecture, PlannedTensor, architecture_for, rope_permuted_heads, transform
from localchat.converters.checkpoint import (
    EXPERT_INDEX,
    ModelConfig,
    TensorFiles,
    expected_shapes,
    layer_key,
    locate_checkpoint,
    read_config,
    read_json,
)
from localchat.converters.gguf import FLOAT_ENCODERS, INCOMPLETE_SUFFIX, ConversionResult, check_writable
from localchat.errors import InvalidSettingError, LocalchatError, ModelError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# PEFT names an adapter's tensors after the module it wraps, inside its PeftModel.
PEFT_PREFIX = "base_model.model."
LORA_SUFFIXES = {".lora_A.weight": "a", ".lora_B.weight": "b"}
# Output types for an adapter (its matrices are small; llama.cpp adds their product in F32).
LORA_QUANTS: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
}
DEFAULT_LORA_QUANT = "f16"
# adapter_config.json settings that make an adapter something other than plain LoRA on linear
# layers: (key, the value plain LoRA has, what it means).
UNSUPPORTED_SETTINGS: tuple[tuple[str, object, str], ...] = (
    ("use_dora", False, "a DoRA adapter (use_dora) rescales the weights' columns, which llama.cpp's adapters cannot"),
    ("bias", "none", "the adapter trains biases (bias != 'none'), which llama.cpp's adapters cannot carry"),
    ("fan_in_fan_out", False, "the adapter is for Conv1D layers (fan_in_fan_out), which none of the supported families have"),
    ("target_parameters", None, "LoRA on the experts' fused parameters (target_parameters) is not supported; "
                                "target the attention and dense layers (target_modules)"),
    ("modules_to_save", None, "the adapter carries whole trained modules (modules_to_save), not only LoRA matrices; "
                              "merge it into the model with peft and convert that instead"),
)


@dataclass(frozen=True)
class AdapterConfig:
    """adapter_config.json, checked to be a plain LoRA adapter."""

    alpha: float
    rslora: bool
    alpha_pattern: dict[str, float]
    base_model: str | None

    @classmethod
    def read(cls, folder: Path) -> AdapterConfig:
        path = folder / ADAPTER_CONFIG
        config = read_json(path)
        if (kind := config.get("peft_type", "LORA")) != "LORA":
            raise ModelError(f"{path}: a {kind} adapter; only LoRA adapters convert to GGUF")
        for key, plain, why in UNSUPPORTED_SETTINGS:
            if config.get(key) not in (plain, None, [], {}):
                raise ModelError(f"{path}: {why}")
        alpha = config.get("lora_alpha")
        pattern = config.get("alpha_pattern") or {}
        numbers = [alpha, *pattern.values()] if isinstance(pattern, dict) else [None]
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) for n in numbers):
            raise ModelError(f"{path}: 'lora_alpha' and 'alpha_pattern' must be numbers; the adapter_config.json is corrupt")
        base = config.get("base_model_name_or_path")
        return cls(float(alpha), bool(config.get("use_rslora")), {k: float(v) for k, v in pattern.items()},
                   base if isinstance(base, str) and base else None)

    def scale(self, module: str, rank: int) -> float:
        """PEFT's scaling of `module`'s product (its get_pattern_key: a pattern matching the name's end)."""
        alpha = next((a for p, a in self.alpha_pattern.items() if re.match(rf"(.*\.)?({p})$", module)), self.alpha)
        return alpha / (math.sqrt(rank) if self.rslora else rank)


@dataclass(frozen=True)
class LoraMatrix:
    """One adapted matrix: its GGUF base name and its two factors, ready to write."""

    gguf_name: str
    a: np.ndarray  # rank x input
    b: np.ndarray  # output x rank


def locate_base(adapter: AdapterConfig, base: str | None, adapter_folder: Path) -> ModelConfig:
    """The base model's config: `base` if given, else the adapter's base_model_name_or_path (a
    folder, or a hub repo id whose config.json alone is fetched)."""
    spec = base or adapter.base_model
    if spec is None:
        raise ModelError(
            f"{adapter_folder / ADAPTER_CONFIG} names no base model (base_model_name_or_path); "
            "pass --base with the base model's checkpoint folder or hub id"
        )
    return read_config(locate_checkpoint(spec, ["config.json"]).folder)


def _module_of(name: str, folder: Path) -> tuple[str, str]:
    """(module name in the base model, "a" or "b") of an adapter tensor's name."""
    for suffix, factor in LORA_SUFFIXES.items():
        if name.startswith(PEFT_PREFIX) and name.endswith(suffix):
            return name[len(PEFT_PREFIX):-len(suffix)], factor
    if "lora_embedding" in name:
        raise ModelError(f"{folder}: the adapter adapts the token embeddings ({name}), which localchat cannot convert yet")
    raise ModelError(f"{folder}: tensor '{name}' is not a LoRA matrix (lora_A / lora_B); is this a PEFT LoRA adapter?")


def plan_adapter(files: TensorFiles, config: ModelConfig, arch: Architecture, adapter: AdapterConfig,
                 folder: Path) -> list[LoraMatrix]:
    """Each adapted matrix named, checked against the base model's shapes, reordered and scaled."""
    factors: dict[str, dict[str, Any]] = {}
    for ref in files:
        module, factor = _module_of(ref.name, folder)
        factors.setdefault(module, {})[factor] = ref
    name_map = get_tensor_name_map(arch.gguf_arch, config.n_layers)
    shapes = expected_shapes(config)
    another_base = f"the adapter was made for another base model than {config.architecture} ({config.raw.get('_name_or_path') or 'the one given'})"
    rewritten = arch.rewrites(config) if arch.rewrites is not None else {}
    matrices = []
    for module, pair in factors.items():
        if set(pair) != {"a", "b"}:
            raise ModelError(f"{folder}: {module} has lora_{'B' if 'a' in pair else 'A'} missing; the adapter is incomplete")
        if EXPERT_INDEX.search(module + ".") or ".experts." in module:
            raise ModelError(f"{folder}: LoRA on the experts ({module}) is not supported; target the attention and dense layers")
        index, key = layer_key(module + ".weight")
        gguf_name = name_map.get_name(module + ".weight", try_suffixes=(".weight",))
        tied = module == "lm_head" and config.tie_word_embeddings
        if (index is not None and index >= config.n_layers) or key not in shapes or gguf_name is None or tied:
            raise ModelError(f"{folder}: the adapter adapts {module}, which {config.architecture} has not; {another_base}")
        if key in rewritten:  # the base tensor's heads reordered, or its values changed, on the way to GGUF
            raise ModelError(f"{folder}: LoRA on {module} is not supported (llama.cpp reads that matrix reordered); target the attention and MLP layers")
        a, b = files.read_float32(pair["a"]), files.read_float32(pair["b"])
        out_features, in_features = shapes[key][0]
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != in_features or b.shape[0] != out_features or a.shape[0] != b.shape[1]:
            raise ModelError(
                f"{folder}: {module}'s LoRA matrices are {list(a.shape)} and {list(b.shape)}, but the base model's {module} is "
                f"{out_features} x {in_features}; {another_base}"
            )
        rank = a.shape[0]
        ratio = adapter.scale(module, rank) / (adapter.alpha / rank)
        b = transform(PlannedTensor(gguf_name, b.shape, permute_heads=rope_permuted_heads(arch, config, gguf_name)), b)
        b = b * np.float32(ratio) if ratio != 1.0 else b
        matrices.append(LoraMatrix(gguf_name, a, b))
    if not matrices:
        raise ModelError(f"{folder}/{ADAPTER_WEIGHTS} holds no LoRA matrices; is the adapter complete?")
    return matrices


def _encode(weights: np.ndarray, ggml_type: GGMLQuantizationType) -> tuple[np.ndarray, dict[str, Any]]:
    data = FLOAT_ENCODERS[ggml_type](weights)
    return data, ({"raw_shape": weights.shape, "raw_dtype": ggml_type} if ggml_type == GGMLQuantizationType.BF16 else {})


def convert_adapter(source: Path, output: Path, quant: str = DEFAULT_LORA_QUANT, *, base: str | None = None,
                    force: bool = False) -> ConversionResult:
    """Convert the PEFT LoRA adapter folder `source` into the GGUF adapter `output`."""
    started = time.perf_counter()
    if quant not in LORA_QUANTS:
        raise InvalidSettingError(f"--quant {quant} does not apply to a LoRA adapter; choose one of: {', '.join(LORA_QUANTS)}")
    if output.exists() and not force:
        raise LocalchatError(f"{output} already exists; pass --force to overwrite it or choose another path with -o")
    adapter = AdapterConfig.read(source)
    if not (source / ADAPTER_WEIGHTS).is_file():
        raise ModelError(f"{source} has no {ADAPTER_WEIGHTS}; only safetensors adapters are read")
    config = locate_base(adapter, base, source)
    arch = architecture_for(config)
    files = TensorFiles.read([source / ADAPTER_WEIGHTS], source)
    try:
        matrices = plan_adapter(files, config, arch, adapter, source)
    finally:
        files.close()
    writer = GGUFWriter(None, arch.gguf_name)
    writer.add_type(GGUFType.ADAPTER)
    writer.add_string(Keys.Adapter.TYPE, "lora")
    writer.add_float32(Keys.Adapter.LORA_ALPHA, adapter.alpha)
    writer.add_name(source.resolve().name)
    for matrix in matrices:
        for suffix, weights in ((".lora_a", matrix.a), (".lora_b", matrix.b)):
            data, raw = _encode(weights, LORA_QUANTS[quant])
            writer.add_tensor(matrix.gguf_name + suffix, data, **raw)
    output.parent.mkdir(parents=True, exist_ok=True)
    check_writable(output.parent)
    partial = output.with_name(output.name + INCOMPLETE_SUFFIX)
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return ConversionResult(output, quant, 2 * len(matrices), output.stat().st_size, time.perf_counter() - started)


def is_adapter(folder: Path) -> bool:
    """A PEFT adapter folder, not a model's (some repos hold a merged model beside its adapter)."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()

