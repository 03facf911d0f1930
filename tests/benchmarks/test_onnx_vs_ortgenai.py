"""benchmarks/onnx_vs_ortgenai.py without onnxruntime-genai: one line saying how to install it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "onnx_vs_ortgenai.py"


@pytest.mark.parametrize("which", ["a python without it", "no python at that path"])
def test_without_onnxruntime_genai_it_says_how_to_install_it(which: str, tmp_path: Path) -> None:
    if which == "a python without it" and importlib.util.find_spec("onnxruntime_genai") is not None:
        pytest.skip("this python has onnxruntime-genai")
    python = sys.executable if which == "a python without it" else str(tmp_path / "python")
    done = subprocess.run([sys.executable, str(SCRIPT), "--ortgenai-python", python, "--work", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "pip install onnxruntime-genai==0.18.0" in done.stderr and python in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing built before the check
