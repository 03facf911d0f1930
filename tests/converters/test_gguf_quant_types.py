"""Every `--quant` the README lists makes a GGUF llama.cpp loads, at the -o path, through
`localchat convert`; a failed conversion leaves nothing behind."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from localchat.converters.gguf import convert_checkpoint
from localchat.converters.gguf_choices import QUANT_TYPES
from localchat.cli import main
from localchat.engine import Engine
from localchat.errors import ModelError
from localchat.gguf_file import read_gguf_header
from localchat.planner import PlanRequest
from localchat.settings import Settings

FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}


def _matrix_types(path: Path) -> set[GGMLQuantizationType]:
    return {GGMLQuantizationType(t.tensor_type) for t in GGUFReader(path).tensors if len(t.shape) > 1}


@pytest.mark.parametrize("quant", QUANT_TYPES)
def test_each_quant_writes_a_loadable_gguf_into_a_new_folder(
    quant: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "new" / "folder" / f"tiny-{quant}.gguf"
    assert main(["convert", str(tiny_checkpoint("llama")), "--to", "gguf", "--quant", quant, "-o", str(output)]) == 0
    assert f"wrote {output}" in capsys.readouterr().out
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [output]  # no .incomplete or float intermediate
    choice = QUANT_TYPES[quant]
    types = _matrix_types(output)
    if choice.float_type is not None:
        assert types == {choice.float_type}  # f32 was written as f16 once (F32 is 0, taken as "none")
    else:
        assert not types & FLOAT_TYPES  # quantized (K-quants fall back for 64-wide rows: still not float)
    assert read_gguf_header(output).get("general.file_type") == int(choice.file_type)
    with Engine.load(str(output), settings, PlanRequest(n_ctx=256)) as engine:
        tokens = engine.backend.tokenize("The quick brown fox jumps over the lazy dog.", add_bos=True, special=False)
        assert np.isfinite(engine.backend.score(0, tokens).perplexity)


def test_failed_conversion_into_a_new_folder_leaves_nothing(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint("llama"), broken)
    (broken / "tokenizer.json").unlink()  # found only after the output folder is made
    target = tmp_path / "out" / "deeper"
    with pytest.raises(ModelError, match="no tokenizer.json or tokenizer.model"):
        convert_checkpoint(broken, target / "x.gguf", "f32", threads=1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("phase", ["writing", "quantizing"])
def test_interrupted_quantization_leaves_nothing(phase: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    def interrupt(done: int, total: int, what: str) -> None:
        if what.startswith("quantizing") == (phase == "quantizing"):
            raise KeyboardInterrupt

    output = tmp_path / "out" / "x.gguf"
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(tiny_checkpoint("llama"), output, "q4_k_m", threads=1, progress=interrupt)
    assert not (tmp_path / "out").exists()
