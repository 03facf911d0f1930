"""End to end: real checkpoints -> GGUF -> llama.cpp, compared with transformers."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from checkpoint_fixtures import TINY_ARCHITECTURES
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.verify import verify_gguf, verify_text
from localchat.engine import Engine
from localchat.gguf_file import read_gguf_header
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.backends.base import ARGMAX
from localchat.settings import Settings



def _checks(report) -> dict[str, bool | None]:
    return {check.name: check.passed for check in report.checks}


@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_tiny_checkpoint_converts_to_f16_and_matches_transformers(
    name: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    result = convert_checkpoint(tiny_checkpoint(name), tmp_path / f"{name}.gguf", "f16", threads=2)
    # Gemma's 262k-token vocabulary makes every position costly: its first lines are enough.
    text = "\n".join(verify_text().splitlines()[:5]) if name == "gemma3" else None
    report = verify_gguf(result.output, tiny_checkpoint(name), "f16", text)
    assert _checks(report) == {"tokenization": True, "top-1 agreement": True, "greedy continuation": True, "perplexity": True}, report.table()


# (tiny checkpoint, target, quantization) whose tokenizer files made a library print a line at every conversion:
# gguf's SpecialVocab on the BPE post-processor of the tiny ones, and on the "<bos>" separator of Gemma's.
TERMINAL_CASES = [("llama", "gguf", "f16"), ("gemma3", "gguf", "f16"), ("llama", "onnx", "int4")]


@pytest.mark.parametrize(("name", "target", "quant"), TERMINAL_CASES)
def test_conversion_prints_only_its_progress_and_summary(
    name: str, target: str, quant: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    """In a process of its own: pytest's log capture would take in what Python's logging prints on a terminal."""
    output = tmp_path / f"out.{target}"
    converted = subprocess.run([sys.executable, "-m", "localchat", "convert", str(tiny_checkpoint(name)), "--to", target,
                                "--quant", quant, "--threads", "2", "-o", str(output)], check=False, capture_output=True, text=True, timeout=300)
    assert converted.returncode == 0, converted.stderr
    assert converted.stdout.startswith(f"wrote {output} ") and converted.stdout.count("\n") == 1, converted.stdout
    stray = [line for line in re.split(r"[\r\n]", converted.stderr) if line.strip() and not line.startswith(("writing", "quantizing"))]
    assert stray == []


@pytest.fixture(scope="module")
def gemma_q8_0(gemma_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_checkpoint(gemma_checkpoint, tmp_path_factory.mktemp("gemma") / "gemma-Q8_0.gguf", "q8_0", threads=2).output


def test_gemma_q8_0_continues_like_transformers(gemma_q8_0: Path, gemma_checkpoint: Path) -> None:
    report = verify_gguf(gemma_q8_0, gemma_checkpoint, "q8_0")
    assert report.passed, report.table()
    assert _checks(report)["greedy continuation"] and _checks(report)["tokenization"]
    assert report.perplexity < report.reference_perplexity * 1.02


def test_gemma_metadata_carries_tokenizer_settings(gemma_q8_0: Path, gemma_checkpoint: Path) -> None:
    header = read_gguf_header(gemma_q8_0)
    assert header.architecture == "gemma3"
    assert header.get("general.file_type") == 7
    assert header.get("tokenizer.ggml.model") == "llama"
    assert header.get("tokenizer.ggml.add_bos_token") is True
    assert (header.get("tokenizer.ggml.bos_token_id"), header.get("tokenizer.ggml.eos_token_id")) == (2, 1)
    assert header.get("tokenizer.ggml.eot_token_id") == 106
    assert header.get("gemma3.attention.sliding_window") == 512
    assert header.get("tokenizer.chat_template") == (gemma_checkpoint / "chat_template.jinja").read_text()


def test_gemma_q4_k_m_loads_and_answers(gemma_checkpoint: Path, tmp_path: Path) -> None:
    output = convert_checkpoint(gemma_checkpoint, tmp_path / "gemma-Q4_K_M.gguf", "q4_k_m", threads=2).output
    assert read_gguf_header(output).get("general.file_type") == 15
    with Engine.load(str(output), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=512)) as engine:
        settings = GenerationSettings(max_tokens=12, sampler=ARGMAX)
        # Gemma 3 270M is a base model: it completes text rather than chatting.
        prompt = engine.backend.tokenize("The capital of France is", add_bos=True, special=False)
        answer = "".join(engine.sessions[0].generate(prompt, settings))
    assert "France" in answer
