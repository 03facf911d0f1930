"""Damaged ONNX model folders: a corrupted graph, missing or cut external data, a marker that is not
JSON or lacks fields, a missing tokenizer. Each is one ModelError naming the problem, never a
traceback, and `localchat run` ends with one line on stderr."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from localchat.engine import Engine
from localchat.errors import LocalchatError, ModelError
from localchat.models import ONNX_MARKER
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

GRAPH, DATA, TOKENIZER = "model.onnx", "model.onnx.data", "tokenizer.json"
FUZZ_CASES = 60


def _marker(folder: Path, **changes: object) -> None:
    """Rewrite the marker with `changes`; a value of ... removes the field."""
    meta = json.loads((folder / ONNX_MARKER).read_text())
    meta.update(changes)
    (folder / ONNX_MARKER).write_text(json.dumps({k: v for k, v in meta.items() if v is not ...}))


def _cut(path: Path, keep: float) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(data)


# damage -> what the one line must say
DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "graph not protobuf": (_write(GRAPH, b"\x08\xff" * 500), "onnxruntime could not load"),
    "graph cut in half": (lambda f: _cut(f / GRAPH, 0.5), "onnxruntime could not load"),
    "graph missing": (lambda f: (f / GRAPH).unlink(), "has no model.onnx"),
    "external data missing": (lambda f: (f / DATA).unlink(), "External data path does not exist"),
    "external data cut": (lambda f: _cut(f / DATA, 0.5), "out of bounds"),
    "external data one byte short": (lambda f: os.truncate(f / DATA, (f / DATA).stat().st_size - 1), "out of bounds"),
    "marker not JSON": (_write(ONNX_MARKER, b'{"format_version": 1,'), "cannot be read"),
    "marker not UTF-8": (_write(ONNX_MARKER, b'{"name": "\xff"}'), "cannot be read"),
    "marker not an object": (_write(ONNX_MARKER, b"[1, 2]"), "not a JSON object"),
    "marker of an earlier version": (lambda f: _marker(f, format_version=1), "another localchat version"),
    "marker without n_layers": (lambda f: _marker(f, n_layers=...), "has no 'n_layers'"),
    "marker without graph": (lambda f: _marker(f, graph=...), "has no 'graph'"),
    "n_layers not a number": (lambda f: _marker(f, n_layers="two"), "'n_layers' must be a positive integer"),
    "graph outside the folder": (lambda f: _marker(f, graph="../model.onnx"), "'graph' must be a file name"),
    "one layer more than the graph": (lambda f: _marker(f, n_layers=3), "does not match"),
    "one layer fewer than the graph": (lambda f: _marker(f, n_layers=1), "does not match"),
    "head_dim not the graph's": (lambda f: _marker(f, head_dim=8), "does not match"),
    "n_vocab not the graph's": (lambda f: _marker(f, n_vocab=100), "does not match"),
    "marker without rope_frequencies": (lambda f: _marker(f, rope_frequencies=...), "has no 'rope_frequencies'"),
    "rope_frequencies not a table": (lambda f: _marker(f, rope_frequencies=[0.5]), "'rope_frequencies' must be lists"),
    "rope_frequencies of another kind": (lambda f: _marker(f, rope_frequencies={"global": [1.0], "other": [1.0]}), "'rope_frequencies' must be lists"),
    "rope_frequencies of a kind the graph lacks": (lambda f: _marker(f, rope_frequencies={"global": [1.0], "local": [1.0]}), "lacks or adds rotary.local.cos"),
    "bos_id past the vocabulary": (lambda f: _marker(f, bos_id=10**6), "beyond the 640-token vocabulary"),
    "tokenizer missing": (lambda f: (f / TOKENIZER).unlink(), "has no tokenizer.json"),
    "tokenizer not JSON": (_write(TOKENIZER, b"not json"), "is not a tokenizer"),
    "tokenizer JSON but no tokenizer": (_write(TOKENIZER, b'{"version": "1.0"}'), "is not a tokenizer"),
}


@pytest.fixture
def folder(onnx_model: Callable[[str, str], Path], tmp_path: Path) -> Path:
    """A writable copy of tiny Llama at fp32."""
    return Path(shutil.copytree(onnx_model("llama", "fp32"), tmp_path / "model"))


def _load_and_reply(folder: Path, settings: Settings) -> str:
    with Engine.load(str(folder), settings, PlanRequest(n_ctx=256)) as engine:
        return engine.new_chat().send("hi", GenerationSettings(max_tokens=2)).text()


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_folder_is_one_model_error(folder: Path, settings: Settings, case: str) -> None:
    damage, message = DAMAGE[case]
    damage(folder)
    with pytest.raises(ModelError, match=re.escape(message)) as error:
        _load_and_reply(folder, settings)
    assert str(folder) in str(error.value) and "\n" not in str(error.value)


def test_the_undamaged_copy_loads_and_replies(folder: Path, settings: Settings) -> None:
    """The damage above is what fails, not the copy."""
    assert isinstance(_load_and_reply(folder, settings), str)


def test_random_damage_to_the_graph_loads_or_is_one_error(folder: Path, settings: Settings) -> None:
    graph = (folder / GRAPH).read_bytes()
    rng = random.Random(14)
    outcomes: dict[str, str] = {}
    for case in range(FUZZ_CASES):
        data = bytearray(graph)
        at = rng.randrange(len(data))
        operation = rng.choice(["flip", "flip", "set", "cut", "delete"])
        if operation == "flip":
            data[at] ^= 1 << rng.randrange(8)
        elif operation == "set":
            data[at : at + 4] = bytes([rng.choice([0x00, 0x7F, 0xFF])]) * len(data[at : at + 4])
        elif operation == "cut":
            del data[at:]
        else:
            del data[at : at + rng.randint(1, 16)]
        (folder / GRAPH).write_bytes(bytes(data))
        try:
            with Engine.load(str(folder), settings, PlanRequest(n_ctx=256)) as engine:
                # Evaluation only: a damaged graph may compute NaN logits, which sampling must
                # survive (the sampler's own concern), but running it must not raise.
                engine.backend.evaluate(0, engine.backend.tokenize("hi there", add_bos=True, special=False), 0)
            outcomes[f"{case} {operation} at {at}"] = "loaded"
        except LocalchatError as error:
            assert "\n" not in str(error), error
            outcomes[f"{case} {operation} at {at}"] = "refused"
    # Most damage is caught by onnxruntime's protobuf and graph checks.
    assert list(outcomes.values()).count("refused") > FUZZ_CASES // 2, outcomes


@pytest.mark.parametrize("case", ["external data cut", "marker without n_layers", "tokenizer missing", "graph not protobuf"])
def test_a_damaged_folder_ends_localchat_run_with_one_line(folder: Path, localchat_home: Path, case: str) -> None:
    damage, message = DAMAGE[case]
    damage(folder)
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "run", "-m", str(folder), "-n", "2", "hi"],
        capture_output=True, text=True, env={**os.environ, "LOCALCHAT_HOME": str(localchat_home)}, timeout=300, check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
