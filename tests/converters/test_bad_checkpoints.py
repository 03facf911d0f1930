"""Checkpoints a user may have broken or half-downloaded, or whose weights are quantized in a way localchat
cannot dequantize: through `localchat convert` each is one ModelError line, for both targets, with no
traceback and no output left; and hundreds of seeded mutations of a safetensors header either convert or
end in a ModelError."""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localchat.converters.gguf import convert_checkpoint
from localchat.converters.onnx import convert_to_onnx
from localchat.cli import main
from localchat.errors import ModelError

WEIGHTS = "model.safetensors"
# A tensor of the tiny Llama whose shape is not square: (kv heads x head dim, hidden) = (32, 64).
K_PROJ = "model.layers.0.self_attn.k_proj.weight"


def read_safetensors(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def safetensors_bytes(header: object, data: bytes, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def _edit_header(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    header, data = read_safetensors(folder / WEIGHTS)
    edit(header)
    (folder / WEIGHTS).write_bytes(safetensors_bytes(header, data))


def _edit_config(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def _truncate(folder: Path) -> None:
    raw = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(raw[:-1000])


def _header_length_past_the_end(folder: Path) -> None:
    raw = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(struct.pack("<Q", len(raw)) + raw[8:])


def _shift_offsets(delta_begin: int, delta_end: int) -> Callable[[dict[str, Any]], None]:
    def edit(header: dict[str, Any]) -> None:
        begin, end = header[K_PROJ]["data_offsets"]
        header[K_PROJ]["data_offsets"] = [begin + delta_begin, end + delta_end]

    return edit


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(entry: dict[str, Any]) -> None:
        entry[key] = value

    return edit


def _quantized_with(quantization: dict[str, Any]) -> Callable[[Path], None]:
    """The checkpoint with `quantization` as its quantization_config and weights that are not read: the refusal
    comes before any tensor is read."""

    def breaks(folder: Path) -> None:
        _edit_config(folder, _set("quantization_config", quantization))
        (folder / WEIGHTS).write_bytes(b"not read")

    return breaks


# Breakage -> (how to break a copy of the tiny Llama checkpoint, what the one error line says).
BREAKAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated weights": (_truncate, f"{WEIGHTS} is truncated: tensor .* download it again"),
    "header length past the end": (_header_length_past_the_end, "truncated or not a safetensors file"),
    "offsets past the end": (lambda f: _edit_header(f, _shift_offsets(10**6, 10**6)), "is truncated: tensor"),
    "offsets reversed": (lambda f: _edit_header(f, lambda h: h[K_PROJ]["data_offsets"].reverse()), r"corrupt header entry \(data_offsets"),
    "offsets overlapping": (lambda f: _edit_header(f, _shift_offsets(-4, -4)), "starts at byte .* the file is corrupt"),
    "unknown dtype": (lambda f: _edit_header(f, lambda h: _set("dtype", "F8_E8M0")(h[K_PROJ])), "dtype 'F8_E8M0', which localchat cannot read"),
    "integer weights": (lambda f: _edit_header(f, lambda h: _set("dtype", "I32")(h[K_PROJ])), "is I32; weights must be float"),
    "shape against bytes": (lambda f: _edit_header(f, lambda h: _set("shape", [32, 63])(h[K_PROJ])), "bytes for shape"),
    "shape against config": (lambda f: _edit_header(f, lambda h: _set("shape", [64, 32])(h[K_PROJ])), "config.json implies"),
    "header not an object": (lambda f: (f / WEIGHTS).write_bytes(safetensors_bytes([1, 2], b"")), "not a JSON object"),
    "config not JSON": (lambda f: (f / "config.json").write_text('{"architectures": ['), r"config.json is not valid JSON"),
    "config without architectures": (lambda f: _edit_config(f, lambda c: c.pop("architectures")), "no 'architectures' entry"),
    "config without hidden_size": (lambda f: _edit_config(f, lambda c: c.pop("hidden_size")), "lacks 'hidden_size'"),
    "config with a text size": (lambda f: _edit_config(f, _set("num_hidden_layers", "2")), "'num_hidden_layers' is '2', expected an integer"),
    "config with an infinite size": (lambda f: _edit_config(f, _set("intermediate_size", float("inf"))), "'intermediate_size' is inf"),
    "config with zero heads": (lambda f: _edit_config(f, _set("num_attention_heads", 0)), "'num_attention_heads' is 0"),
    "config with bad RoPE": (lambda f: _edit_config(f, _set("rope_parameters", {"rope_type": "linear"})), "malformed RoPE settings"),
    "no tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "no tokenizer.json"),
    "tokenizer not JSON": (lambda f: (f / "tokenizer.json").write_text("{"), "tokenizer.json is not valid JSON"),
    "quantized with gptq": (_quantized_with({"quant_method": "gptq", "bits": 4, "group_size": 128}), "quantized with 'gptq'.*cannot dequantize"),
    "quantized with awq": (_quantized_with({"quant_method": "awq", "bits": 4, "version": "gemm"}), "quantized with 'awq'.*cannot dequantize"),
    "quantized with bitsandbytes": (_quantized_with({"quant_method": "bitsandbytes", "load_in_4bit": True}),
                                    "quantized with 'bitsandbytes'.*cannot dequantize"),
    "quantized with mxfp4": (_quantized_with({"quant_method": "mxfp4"}), r"quantized with 'mxfp4'.*does not convert.*Mxfp4Config\(dequantize=True\)"),
    "quantized with compressed-tensors 4-bit": (_quantized_with({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}),
                                                "compressed-tensors' 'pack-quantized' format.*cannot dequantize"),
}
TARGETS = {"gguf": "out.gguf", "onnx": "out-onnx"}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("breakage", BREAKAGES)
def test_broken_checkpoint_is_one_error_line_and_leaves_nothing(
    breakage: str, target: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    breaks, message = BREAKAGES[breakage]
    breaks(folder)
    output = tmp_path / "out" / TARGETS[target]
    capsys.readouterr()
    assert main(["convert", str(folder), "--to", target, "-o", str(output)]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: error: "), captured.err
    assert re.search(message, lines[0]), lines[0]
    assert not output.exists()
    assert list(tmp_path.joinpath("out").rglob("*")) == []



def _nest_as_multimodal(architecture: str) -> Callable[[dict[str, Any]], None]:
    """config.json as an image-reading model's: the language model's sizes under text_config, beside a vision part's."""

    def nest(config: dict[str, Any]) -> None:
        text = {key: config.pop(key) for key in list(config) if key != "architectures"}
        config.update(architectures=[architecture], text_config=text, vision_config={"hidden_size": 1152})

    return nest


# Image-reading models localchat does not convert, by what the refusal says: one with no text model it converts, and
# Mistral 3 around a text model other than Ministral 3's (a Llama here; Mistral Small 3.1's is a 'mistral').
MULTIMODAL_REFUSALS = {"Llama4ForConditionalGeneration": "a model that also reads images or audio",
                       "Mistral3ForConditionalGeneration": "a model that also reads images, with a 'llama' text model"}


@pytest.mark.parametrize("architecture", MULTIMODAL_REFUSALS)
@pytest.mark.parametrize("target", TARGETS)
def test_multimodal_checkpoint_is_named_as_such(
    target: str, architecture: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "config.json lacks 'hidden_size'; ... incomplete", which sent users to download it again."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    _edit_config(folder, _nest_as_multimodal(architecture))
    capsys.readouterr()
    assert main(["convert", str(folder), "--to", target, "-o", str(tmp_path / "out" / TARGETS[target])]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{architecture}, {MULTIMODAL_REFUSALS[architecture]}" in lines[0], lines
    assert "convert_hf_to_gguf.py" in lines[0] and "incomplete" not in lines[0]


# -- fuzzing ------------------------------------------------------------------------

FUZZ_CASES = 400
JUNK = [None, True, -1, 2**70, 1.5, "", "x", [], {}, [1, "2"], [-8, 8], [0, 2**64]]


def _mutate_entry(rng: random.Random, entry: object, header: dict[str, Any], data_size: int) -> str:
    if not isinstance(entry, dict):
        return "non-object entry left alone"
    key = rng.choice(["dtype", "shape", "data_offsets"])
    choice = rng.randrange(6)
    if choice == 0:
        entry.pop(key, None)
        return f"{key} removed"
    if choice == 1:
        entry[key] = rng.choice(JUNK)
        return f"{key} = {entry[key]!r}"
    if key == "dtype":
        entry[key] = rng.choice(["F32", "F16", "BF16", "F64", "I32", "I64", "I8", "U8", "BOOL", "F8_E4M3", "f32", "Q4"])
        return f"dtype = {entry[key]}"
    if key == "shape" and isinstance(entry.get("shape"), list):
        shape = list(entry["shape"])
        kind = rng.randrange(4)
        if kind == 0 and len(shape) > 1:
            shape.reverse()
        elif kind == 1 and shape:
            shape[rng.randrange(len(shape))] += rng.choice([-1, 1, -64, 2**40])
        elif kind == 2:
            shape.append(1) if rng.random() < 0.5 else shape.insert(0, 1)
        else:
            shape = [int(shape[0] * 2), *shape[1:]] if shape else [0]
        entry["shape"] = shape
        return f"shape = {shape}"
    if key == "data_offsets" and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2:
        begin, end = entry["data_offsets"]
        delta = rng.choice([1, 2, 4, 64, 4096, data_size, -1, -4, -64])
        which = rng.randrange(3)
        entry["data_offsets"] = [begin + delta * (which != 1), end + delta * (which != 0)]
        return f"data_offsets = {entry['data_offsets']}"
    other = header[rng.choice(list(header))]
    entry[key] = copy.deepcopy(other.get(key)) if isinstance(other, dict) else None
    return f"{key} copied from another tensor"


def mutate(rng: random.Random, header: dict[str, Any], data: bytes) -> tuple[bytes, str]:
    """One to three random changes to a header (or its length prefix, or the file's length)."""
    done = []
    for _ in range(rng.randint(1, 3)):
        names = [name for name in header if name != "__metadata__"]
        name = rng.choice(names)
        kind = rng.randrange(10)
        if kind < 5:
            done.append(f"{name}: {_mutate_entry(rng, header[name], header, len(data))}")
        elif kind == 5:
            del header[name]
            done.append(f"{name} removed")
        elif kind == 6:
            other = rng.choice(names)
            header[other if rng.random() < 0.5 else f"{name}.copy"] = copy.deepcopy(header[name])
            done.append(f"{name} duplicated")
        elif kind == 7:
            header[rng.choice([f"{name}x", "model.layers.7.mlp.up_proj.weight", "lm_head.weight", "model.norm.weight"])] = header.pop(name)
            done.append(f"{name} renamed")
        elif kind == 8:
            header[name] = rng.choice(JUNK)
            done.append(f"{name} = {header[name]!r}")
        else:
            header["__metadata__"] = rng.choice([{"format": "pt"}, None, [1], "x"])
            done.append("metadata changed")
    text = json.dumps(header).encode()
    length, tail = len(text), data
    ending = rng.randrange(8)
    if ending == 0:
        length += rng.choice([-1, 1, -len(text), 2**40, len(data)])
        done.append(f"header length {length}")
    elif ending == 1:
        tail = data[: rng.randrange(len(data))]
        done.append(f"data cut to {len(tail)}")
    elif ending == 2:
        tail = data + b"\0" * rng.choice([1, 8, 4096])
        done.append("data extended")
    elif ending == 3:
        at = rng.randrange(len(text))
        text = text[:at] + bytes([rng.randrange(256)]) + text[at + 1 :]
        done.append(f"header byte {at} changed")
    return struct.pack("<Q", length) + text + tail, "; ".join(done)


def test_fuzzed_safetensors_headers_convert_or_raise_model_error(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    source = tiny_checkpoint("llama")
    header, data = read_safetensors(source / WEIGHTS)
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for path in source.iterdir():
        if path.name != WEIGHTS:
            (folder / path.name).symlink_to(path)
    outcomes: Counter[str] = Counter()
    for seed in range(FUZZ_CASES):
        rng = random.Random(seed)
        weights, what = mutate(rng, copy.deepcopy(header), data)
        (folder / WEIGHTS).write_bytes(weights)
        # Every case goes through the GGUF converter; every tenth also through the ONNX one.
        targets = {"gguf": tmp_path / "out.gguf", **({"onnx": tmp_path / "out-onnx"} if seed % 10 == 0 else {})}
        for target, output in targets.items():
            try:
                if target == "gguf":
                    convert_checkpoint(folder, output, "f16", threads=1)
                else:
                    convert_to_onnx(folder, output, "fp32")
            except ModelError as error:
                outcomes[f"{target} refused"] += 1
                assert "\n" not in str(error) and not output.exists(), f"seed {seed} ({what})"
            except Exception as error:  # anything else is a defect: name the mutation that found it
                raise AssertionError(f"seed {seed} ({what}) -> {target}: {type(error).__name__}: {error}") from error
            else:
                outcomes[f"{target} converted"] += 1
                shutil.rmtree(output) if output.is_dir() else output.unlink()
            assert not list(tmp_path.glob("*.incomplete")), f"seed {seed} ({what})"
    # The mutations reach both outcomes, so the test cannot pass by refusing (or accepting) everything.
    assert outcomes["gguf refused"] > FUZZ_CASES / 2 and outcomes["gguf converted"] > 0, outcomes
