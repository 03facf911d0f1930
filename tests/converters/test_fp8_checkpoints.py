"""FP8 checkpoints (Ministral 3's, Qwen's and DeepSeek's "-FP8" releases): their weights dequantized to float32 as
llama.cpp's converter does, so that they convert tensor for tensor like the same weights in float32 and run in llama.cpp.
Weights quantized otherwise (GPTQ, AWQ, ...) are refused in one line: tests/converters/test_bad_checkpoints.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from greedy_reference import GREEDY_TOKENS, compared_until_near_tie, gguf_contents, load, reference_run
from localchat.converters.checkpoint import FP8_VALUES
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.onnx import convert_to_onnx
from localchat.converters.verify import greedy_continuation

WEIGHTS = "model.safetensors"
# Blocks smaller than the tiny Llama's matrices and dividing none of 64, 128 or its 600-token vocabulary: every
# matrix has several blocks and partial ones in both directions.
BLOCK = [48, 48]
# E4M3's largest finite value: a block's (row's, tensor's) largest weight is scaled to it.
E4M3_MAX = 448.0
COMPRESSED_TENSORS_GROUP = {"group_0": {"targets": ["Linear"], "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                                        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}


@dataclass(frozen=True)
class Scaling:
    """An FP8 release's layout: its quantization_config, what follows a weight's name in its scale's, the rows and
    columns one scale covers (None: all of them) with the shape it is saved in, and its matrices' activation scales."""

    quantization: dict[str, Any]
    scale_suffix: str
    block: tuple[int | None, int | None]
    saved_shape: Callable[[tuple[int, int]], tuple[int, ...]]
    activation_suffix: str


SCALINGS = {
    "fp8 blocks (DeepSeek, Qwen)": Scaling({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": BLOCK},
                                           "_scale_inv", (BLOCK[0], BLOCK[1]), lambda shape: shape, ".activation_scale"),
    "fp8 per tensor (Ministral 3)": Scaling({"quant_method": "fp8", "activation_scheme": "static", "dequantize": False, "weight_block_size": None},
                                            "_scale_inv", (None, None), lambda shape: (), ".activation_scale"),
    "compressed-tensors per row": Scaling({"quant_method": "compressed-tensors", "format": "float-quantized",
                                           "config_groups": COMPRESSED_TENSORS_GROUP}, "_scale", (1, None), lambda shape: shape, ".input_scale"),
}


def _quantized(weight, block: tuple[int | None, int | None]):
    """`weight` as FP8 E4M3, its float32 scales (one per block, the last ones partial) and those scales spread over
    the weight, with torch."""
    import torch

    rows, columns = weight.shape
    block_rows, block_columns = block[0] or rows, block[1] or columns
    scales = torch.empty(-(-rows // block_rows), -(-columns // block_columns))
    for i, j in np.ndindex(*scales.shape):
        scales[i, j] = weight[i * block_rows : (i + 1) * block_rows, j * block_columns : (j + 1) * block_columns].abs().max() / E4M3_MAX
    spread = scales.repeat_interleave(block_rows, 0).repeat_interleave(block_columns, 1)[:rows, :columns]
    return (weight / spread).to(torch.float8_e4m3fn), scales, spread


def _fp8_and_float32_copies(source: Path, folder: Path, scaling: Scaling) -> tuple[Path, Path]:
    """`source` with each matrix in FP8 and its scale (and an activation scale) as a release ships it, and with the
    same weights dequantized by torch, in float32: (FP8 checkpoint, float32 checkpoint)."""
    import torch
    from safetensors.torch import load_file, save_file

    fp8, float32 = folder / "fp8", folder / "float32"
    shutil.copytree(source, fp8)
    shutil.copytree(source, float32)
    fp8_tensors, float32_tensors = {}, {}
    for name, tensor in load_file(source / WEIGHTS).items():
        tensor = tensor.float()
        if tensor.ndim != 2:
            fp8_tensors[name] = float32_tensors[name] = tensor
            continue
        weight, scales, spread = _quantized(tensor, scaling.block)
        fp8_tensors[name] = weight
        fp8_tensors[name + scaling.scale_suffix] = scales.reshape(scaling.saved_shape(tuple(scales.shape)))
        fp8_tensors[name.removesuffix(".weight") + scaling.activation_suffix] = torch.tensor(0.05)
        float32_tensors[name] = weight.float() * spread
    save_file(fp8_tensors, fp8 / WEIGHTS)
    save_file(float32_tensors, float32 / WEIGHTS)
    config = json.loads((fp8 / "config.json").read_text())
    (fp8 / "config.json").write_text(json.dumps({**config, "quantization_config": scaling.quantization}))
    return fp8, float32


def test_fp8_bytes_decode_as_torch_does() -> None:
    import torch

    codes = torch.arange(256, dtype=torch.uint8)
    for dtype, torch_dtype in {"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}.items():
        np.testing.assert_array_equal(FP8_VALUES[dtype], codes.view(torch_dtype).float().numpy())


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_checkpoint_converts_like_its_weights_in_float32(
    scaling: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    """Tensor for tensor the dequantized float32 checkpoint's GGUF; no scale becomes a GGUF tensor."""
    fp8, float32 = _fp8_and_float32_copies(tiny_checkpoint("llama"), tmp_path, SCALINGS[scaling])
    ours = convert_checkpoint(fp8, tmp_path / "fp8.gguf", "f32", threads=2)
    keys, tensors = gguf_contents(ours.output)
    assert (keys, tensors) == gguf_contents(convert_checkpoint(float32, tmp_path / "float32.gguf", "f32", threads=2).output)
    assert not [name for name in tensors if "scale" in name]


def test_fp8_checkpoint_converts_to_onnx_like_its_weights_in_float32(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The graph and its weights byte for byte the float32 checkpoint's (the JSON files name the source and copy its config);
    the config without the quantization_config, as the weights are no longer FP8."""
    fp8, float32 = _fp8_and_float32_copies(tiny_checkpoint("llama"), tmp_path, SCALINGS["fp8 blocks (DeepSeek, Qwen)"])
    ours, theirs = (convert_to_onnx(source, tmp_path / f"{source.name}-onnx", "fp32").output for source in (fp8, float32))
    model_files = sorted(path.relative_to(ours) for path in ours.rglob("*") if path.is_file() and path.suffix != ".json")
    assert model_files == sorted(path.relative_to(theirs) for path in theirs.rglob("*") if path.is_file() and path.suffix != ".json")
    assert [name for name in model_files if (ours / name).read_bytes() != (theirs / name).read_bytes()] == []
    assert "quantization_config" not in json.loads((ours / "config.json").read_text())


def test_fp8_checkpoint_runs_in_llama_cpp_like_its_weights_in_transformers(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """llama.cpp's greedy tokens from the block-scaled FP8 checkpoint, converted, are transformers' from its float32 weights."""
    fp8, float32 = _fp8_and_float32_copies(tiny_checkpoint("llama"), tmp_path, SCALINGS["fp8 blocks (DeepSeek, Qwen)"])
    output = convert_checkpoint(fp8, tmp_path / "fp8.gguf", "f16", threads=2).output
    reference = reference_run(float32)
    with load(output) as engine:
        compared_until_near_tie(reference, greedy_continuation(engine.backend, reference.prompt, GREEDY_TOKENS))
