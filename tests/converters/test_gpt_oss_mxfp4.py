"""gpt-oss as OpenAI ships it: its experts' matrices in MXFP4 (packed E2M1 values and a power-of-two scale per 32), written
to the GGUF as GGML's MXFP4, value for value, at every output type; everything else as the output type says."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from greedy_reference import GREEDY_TOKENS, WITHOUT_COMBINING_MARKS, converted_runs_like_transformers, gguf_contents, load
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.verify import BOUNDS, greedy_continuation

WEIGHTS = "model.safetensors"
# E2M1's magnitudes, by their 3-bit code; bit 3 is the sign.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
BLOCK = 32
SCALE_BIAS = 127
# The experts' matrices as transformers stores them (input rows by output columns) and as the release stores them in MXFP4.
EXPERT_MATRICES = ("gate_up_proj", "down_proj")
EXPERT_STACKS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
# The experts' weights are the tiny gpt-oss's times this before rounding: the rounded model is another, and at this gain its greedy
# tokens in transformers meet no near tie (measured: the first comes at step 5 at a gain of 1, 16 at 0.75, none in 24 at 1.5).
EXPERT_GAIN = 1.5
# llama.cpp multiplies MXFP4 weights by activations rounded to Q8_0 (MXFP4's dot-product partner type): its perplexity of the F32
# file is held to Q8_0's bound (measured: 2.1% off transformers' on a text it finds very unlikely, 3 x 10^11).
MXFP4_PERPLEXITY = BOUNDS["q8_0"].perplexity


def _mxfp4(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`weights` (... x rows x columns) in MXFP4 along its columns, as the release packs them: (blocks: ... x rows x groups x
    16 bytes, value 2k in byte k's low nibble and 2k + 1 in its high one; E8M0 scales: ... x rows x groups; the values they hold)."""
    groups = weights.reshape(*weights.shape[:-1], -1, BLOCK)
    largest = np.abs(groups).max(axis=-1, keepdims=True)
    exponent = np.floor(np.log2(np.maximum(largest, 1e-30))).astype(np.int32) - 2  # the largest rounds to 4 or 6 (clipped from up to 8)
    scale = np.exp2(exponent).astype(np.float32)
    magnitude = np.argmin(np.abs(np.abs(groups / scale)[..., None] - E2M1), axis=-1)
    codes = (magnitude | np.where(groups < 0, 8, 0)).astype(np.uint8)
    values = np.where(groups < 0, -E2M1[magnitude], E2M1[magnitude]) * scale
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent[..., 0] + SCALE_BIAS).astype(np.uint8), values.reshape(weights.shape).astype(np.float32)


def _mxfp4_and_dequantized_copies(source: Path, folder: Path) -> tuple[Path, Path]:
    """`source` with its experts' matrices in MXFP4 as the release ships them, and with the same values in float32:
    (MXFP4 checkpoint, float32 checkpoint)."""
    from safetensors.numpy import load_file, save_file

    packed, dequantized = folder / "mxfp4", folder / "dequantized"
    shutil.copytree(source, packed)
    shutil.copytree(source, dequantized)
    packed_tensors, float_tensors = {}, {}
    for name, tensor in load_file(source / WEIGHTS).items():
        if name.endswith(EXPERT_MATRICES):
            blocks, scales, values = _mxfp4(EXPERT_GAIN * np.swapaxes(tensor, -1, -2))  # output rows by input columns
            # C order: numpy keeps the turned matrix's order, and safetensors writes the memory as it lies.
            packed_tensors |= {f"{name}_blocks": np.ascontiguousarray(blocks), f"{name}_scales": np.ascontiguousarray(scales)}
            float_tensors[name] = np.ascontiguousarray(np.swapaxes(values, -1, -2))
        else:
            packed_tensors[name] = float_tensors[name] = tensor
    save_file(packed_tensors, packed / WEIGHTS)
    save_file(float_tensors, dequantized / WEIGHTS)
    config = json.loads((packed / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    (packed / "config.json").write_text(json.dumps(config))
    return packed, dequantized


@pytest.fixture(scope="module")
def mxfp4_gpt_oss(tiny_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _mxfp4_and_dequantized_copies(tiny_checkpoint("gpt-oss"), tmp_path_factory.mktemp("gpt-oss-mxfp4"))


def _tensor_types(path: Path) -> dict[str, str]:
    from gguf import GGUFReader

    return {tensor.name: tensor.tensor_type.name for tensor in GGUFReader(path).tensors}


def test_mxfp4_experts_are_written_as_ggml_mxfp4_value_for_value(mxfp4_gpt_oss: tuple[Path, Path], tmp_path: Path) -> None:
    """Each expert stack is GGML's MXFP4 holding the checkpoint's values exactly (gate and up rows apart), as gguf's own
    MXFP4 decoder reads them; the other matrices F32 as asked."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    packed, dequantized = mxfp4_gpt_oss
    output = convert_checkpoint(packed, tmp_path / "mxfp4.gguf", "f32", threads=2).output
    float_weights = load_file(dequantized / WEIGHTS)
    tensors = {tensor.name: tensor for tensor in GGUFReader(output).tensors}
    for layer in range(2):
        gate_up = np.swapaxes(float_weights[f"model.layers.{layer}.mlp.experts.gate_up_proj"], -1, -2)
        expected = {"ffn_gate_exps.weight": gate_up[:, 0::2], "ffn_up_exps.weight": gate_up[:, 1::2],
                    "ffn_down_exps.weight": np.swapaxes(float_weights[f"model.layers.{layer}.mlp.experts.down_proj"], -1, -2)}
        for stack, values in expected.items():
            tensor = tensors[f"blk.{layer}.{stack}"]
            assert tensor.tensor_type == GGMLQuantizationType.MXFP4
            np.testing.assert_array_equal(dequantize(tensor.data, GGMLQuantizationType.MXFP4).reshape(values.shape), values)
    assert tensors["blk.0.attn_q.weight"].tensor_type == GGMLQuantizationType.F32


def test_mxfp4_gpt_oss_runs_as_transformers_runs_it_dequantized(mxfp4_gpt_oss: tuple[Path, Path], tmp_path: Path) -> None:
    """Converted from MXFP4, llama.cpp's greedy tokens are transformers' on the dequantized checkpoint up to the first near
    tie, its perplexity within MXFP4's bounds."""
    packed, dequantized = mxfp4_gpt_oss
    converted_runs_like_transformers(packed, tmp_path / "mxfp4.gguf", "f32", WITHOUT_COMBINING_MARKS, reference_checkpoint=dequantized,
                                     perplexity_bound=MXFP4_PERPLEXITY)


@pytest.mark.parametrize(("quant", "matrices"), [("q8_0", "Q8_0"), ("q4_k_m", "Q4_K")])
def test_mxfp4_experts_stay_mxfp4_when_quantized(mxfp4_gpt_oss: tuple[Path, Path], quant: str, matrices: str, tmp_path: Path) -> None:
    """At a quantized type the experts' stacks are the F32 file's MXFP4 bytes (llama.cpp's quantizer does not requantize them),
    the other matrices quantized; llama.cpp loads and runs the file. (Its tokens are not transformers': this tiny model parts
    from transformers' at step 0 at Q8_0 from the dequantized float checkpoint too.)"""
    packed, _ = mxfp4_gpt_oss
    exact = gguf_contents(convert_checkpoint(packed, tmp_path / "mxfp4-f32.gguf", "f32", threads=2).output)[1]
    output = convert_checkpoint(packed, tmp_path / f"mxfp4-{quant}.gguf", quant, threads=2).output
    types, quantized = _tensor_types(output), gguf_contents(output)[1]
    stacks = [f"blk.{layer}.{stack}" for layer in range(2) for stack in EXPERT_STACKS]
    assert {types[name] for name in stacks} == {"MXFP4"}
    assert all(quantized[name] == exact[name] for name in stacks)
    assert types["blk.0.attn_q.weight"] == matrices
    with load(output) as engine:
        prompt = engine.backend.tokenize("The sea", add_bos=True, special=False)
        assert len(greedy_continuation(engine.backend, prompt, GREEDY_TOKENS)) == GREEDY_TOKENS


# An MXFP4 checkpoint that is not whole or not shaped as its config says, by what is done to its tensors, and the line refusing it.
BROKEN_MXFP4 = {
    "scales missing": (lambda tensors: tensors.pop("model.layers.1.mlp.experts.down_proj_scales"),
                       r"lacks model\.layers\.1\.mlp\.experts\.0\.down_proj_scales; are all weight files there\?"),
    "blocks of 64 values": (lambda tensors: tensors.update({"model.layers.0.mlp.experts.down_proj_blocks":
                                                            tensors["model.layers.0.mlp.experts.down_proj_blocks"].reshape(4, 256, 4, 32)}),
                            r"'model\.layers\.0\.mlp\.experts\.0\.down_proj_blocks' has shape \[256, 4, 32\] but config\.json implies \[256, 8, 16\]"),
    "float scales": (lambda tensors: tensors.update({"model.layers.0.mlp.experts.gate_up_proj_scales":
                                                     tensors["model.layers.0.mlp.experts.gate_up_proj_scales"].astype(np.float32)}),
                     r"'model\.layers\.0\.mlp\.experts\.0\.gate_up_proj_scales' is F32; weights must be U8 \(MXFP4\)"),
}


@pytest.mark.parametrize("broken", BROKEN_MXFP4)
def test_broken_mxfp4_checkpoint_is_refused_in_one_line(mxfp4_gpt_oss: tuple[Path, Path], broken: str, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    from localchat.errors import ModelError

    folder = tmp_path / "broken"
    shutil.copytree(mxfp4_gpt_oss[0], folder)
    tensors = load_file(folder / WEIGHTS)
    edit, message = BROKEN_MXFP4[broken]
    edit(tensors)
    save_file(tensors, folder / WEIGHTS)
    with pytest.raises(ModelError, match=message) as raised:
        convert_checkpoint(folder, tmp_path / "out.gguf", "f32", threads=2)
    assert "\n" not in str(raised.value)
    assert not list(tmp_path.glob("out.gguf*"))
