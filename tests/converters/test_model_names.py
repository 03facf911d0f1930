"""The name a converted model carries (general.name and its parts in a GGUF file, the ONNX marker's name and
finetune), as llama.cpp's converter finds it: localchat.sampling_defaults gives a model its family's sampler by
these, so a converted Gemma 3 270M base keeps the repetition control the packaged one has."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from localchat.backends.onnx import sampling_metadata
from localchat.converters.checkpoint import Checkpoint, model_metadata
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.onnx import convert_to_onnx
from localchat.gguf_file import read_gguf_header
from localchat.onnx_format import ONNX_MARKER
from localchat.sampling_defaults import sampler_defaults


def _linked(checkpoint: Path, folder: Path, config: dict[str, object] | None = None) -> Path:
    """`checkpoint`'s files in `folder` (linked), with `config` over its config.json."""
    folder.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.is_file() and path.name != "config.json":
            (folder / path.name).symlink_to(path)
    (folder / "config.json").write_text(json.dumps(json.loads((checkpoint / "config.json").read_text()) | (config or {})))
    return folder


def _family(metadata: dict[str, str]) -> str:
    return sampler_defaults(metadata).source


def test_a_hub_snapshot_is_named_by_its_repo_and_a_checkpoint_by_its_name_or_path(gemma_checkpoint: Path, tmp_path: Path) -> None:
    params = sum(math.prod(tensor.shape) for tensor in Checkpoint(gemma_checkpoint).tensors.values())
    snapshot = _linked(gemma_checkpoint, tmp_path / "hub" / "models--google--gemma-3-270m" / "snapshots" / "0123abcd")
    named = model_metadata(Checkpoint(snapshot), params)
    assert (named.name, named.organization, named.basename, named.size_label, named.finetune) == (
        "Gemma 3 270m", "Google", "gemma-3", "270M", None)
    assert _family({"general.name": named.name, "general.finetune": ""}) == "family: Gemma 3 270M base"

    smol = _linked(gemma_checkpoint, tmp_path / "elsewhere", {"_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    named = model_metadata(Checkpoint(smol), 134_515_008)
    assert (named.name, named.finetune, named.size_label) == ("SmolLM2 135M Instruct", "Instruct", "135M")
    assert _family({"general.name": named.name, "general.finetune": named.finetune or ""}) == "family: SmolLM2"
    # A training run's path is no name: the folder's is taken.
    trained = _linked(gemma_checkpoint, tmp_path / "my-gemma-3-270m", {"_name_or_path": "/fsx/runs/x/checkpoint-500"})
    assert model_metadata(Checkpoint(trained), params).name == "My Gemma 3 270m"


def test_both_converters_write_the_name(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint("llama")
    expected = model_metadata(Checkpoint(checkpoint), sum(math.prod(t.shape) for t in Checkpoint(checkpoint).tensors.values()))
    header = read_gguf_header(convert_checkpoint(checkpoint, tmp_path / "tiny.gguf", "f16", threads=2).output)
    named = [header.get(f"general.{key}") for key in ("name", "basename", "size_label", "finetune")]
    assert named == [expected.name, expected.basename, expected.size_label, expected.finetune] and expected.name
    onnx = tmp_path / "tiny-onnx"
    convert_to_onnx(checkpoint, onnx, "fp32")
    marker = json.loads((onnx / ONNX_MARKER).read_text())
    assert (marker["name"], marker.get("finetune")) == (expected.name, expected.finetune)

    # An ONNX model's family is found by its marker's name, as a GGUF file's by general.name.
    (onnx / ONNX_MARKER).write_text(json.dumps(marker | {"name": "Gemma 3 270m", "finetune": None}))
    (onnx / "generation_config.json").unlink(missing_ok=True)
    assert _family(sampling_metadata(onnx)) == "family: Gemma 3 270M base"
