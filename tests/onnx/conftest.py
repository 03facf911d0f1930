"""ONNX models converted once per run: tiny random checkpoints of each architecture and the real
Gemma 3 270M, at the precisions the tests need.

The checkpoints themselves come from tests/checkpoint_fixtures.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localchat.converters.onnx import convert_to_onnx
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.settings import Settings



@pytest.fixture(scope="session")
def onnx_model(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Callable[[str], Path],
               gemma_checkpoint: Path) -> Callable[[str, str], Path]:
    """`onnx_model(name, quant)`: the tiny checkpoint `name` (or "gemma-270m") converted once."""
    made: dict[tuple[str, str], Path] = {}

    def convert(name: str, quant: str) -> Path:
        if (name, quant) not in made:
            source = gemma_checkpoint if name == "gemma-270m" else tiny_checkpoint(name)
            output = tmp_path_factory.mktemp("onnx") / f"{name}-{quant}"
            convert_to_onnx(source, output, quant)
            made[name, quant] = output
        return made[name, quant]

    return convert


@pytest.fixture(scope="session")
def gemma_engine(onnx_model: Callable[[str, str], Path], settings: Settings) -> Iterator[Engine]:
    """The real Gemma 3 270M at int4 in onnxruntime, 2 sequences of 2k tokens."""
    with Engine.load(str(onnx_model("gemma-270m", "int4")), settings, PlanRequest(n_ctx=2048, n_seq=2)) as engine:
        yield engine
