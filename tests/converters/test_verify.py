"""`convert --verify`'s verdicts: each says what it compared against what bound, a check that
could not run is SKIPPED (never a pass), and the perplexity check catches a wrong conversion."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from localchat.converters.gguf import convert_checkpoint
from localchat.converters.gguf_choices import QUANT_TYPES
from localchat.converters.verify import BOUNDS, Check, VerifyReport, perplexity_check, verify_gguf
from localchat.cli import main


def test_every_gguf_type_has_bounds_that_widen_as_bits_shrink() -> None:
    assert set(BOUNDS) == set(QUANT_TYPES)
    by_bits = sorted(BOUNDS, key=lambda quant: -QUANT_TYPES[quant].bits_per_weight)
    for wider, narrower in itertools.pairwise(by_bits):
        assert BOUNDS[narrower].perplexity >= BOUNDS[wider].perplexity, (wider, narrower)
        assert BOUNDS[narrower].top1 <= BOUNDS[wider].top1, (wider, narrower)


@pytest.mark.parametrize(
    ("perplexity", "reference", "passed"),
    [(20.1, 20.0, True), (20.3, 20.0, False), (19.7, 20.0, False), (float("nan"), 20.0, False), (float("inf"), None, False)],
)
def test_perplexity_is_compared_with_transformers_within_the_bound_either_way(
    perplexity: float, reference: float | None, passed: bool
) -> None:
    check = perplexity_check(perplexity, reference, 0.01, 100, "no reference")
    assert check.passed is passed
    if reference is not None and math.isfinite(perplexity):
        assert "vs 20.000 in transformers" in check.detail and "bound ±1.0%" in check.detail


def test_perplexity_without_a_reference_is_skipped_with_the_reason() -> None:
    check = perplexity_check(20.0, None, 0.01, 100, "torch and transformers are not installed")
    assert check.passed is None
    assert "20.000 on 100 tokens" in check.detail and "torch and transformers are not installed" in check.detail


def _report(*verdicts: bool | None) -> VerifyReport:
    return VerifyReport(tuple(Check(f"check {i}", v, "detail") for i, v in enumerate(verdicts)), 20.0, None)


def test_a_skipped_check_is_not_a_pass() -> None:
    skipped = _report(True, None)
    assert not skipped.passed and not skipped.failed
    assert "SKIPPED" in skipped.table()
    assert skipped.summary() == "verify: NOT fully verified: 1 of 2 checks passed, 1 SKIPPED (check 1)"
    failed = _report(True, None, False)
    assert failed.failed and failed.summary() == "verify: FAILED 1 of 3 checks (check 2)"
    assert _report(True, True).passed and _report(True, True).summary() == "verify: all 2 checks passed"


def _scale_tensor(folder: Path, name: str, factor: float) -> None:
    """Multiply one float32 tensor of model.safetensors in place (a converter bug's stand-in)."""
    path = folder / "model.safetensors"
    raw = bytearray(path.read_bytes())
    length = struct.unpack("<Q", raw[:8])[0]
    entry = json.loads(raw[8 : 8 + length])[name]
    begin, end = (8 + length + offset for offset in entry["data_offsets"])
    values = np.frombuffer(bytes(raw[begin:end]), dtype=np.float32) * np.float32(factor)
    raw[begin:end] = values.astype(np.float32).tobytes()
    path.write_bytes(bytes(raw))


def test_perplexity_check_fails_a_subtly_wrong_conversion(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    source = tiny_checkpoint("llama")
    wrong = tmp_path / "wrong"
    shutil.copytree(source, wrong)
    # A norm 10% off (as with a wrong offset): tokenizer, shapes, top-1 and greedy stay right, so
    # only the perplexity can tell (measured +1060%; 2% off still moved it by 40-70%).
    _scale_tensor(wrong, "model.norm.weight", 1.1)
    output = convert_checkpoint(wrong, tmp_path / "wrong.gguf", "f16", threads=1).output
    report = verify_gguf(output, source, "f16")
    checks = {check.name: check for check in report.checks}
    assert checks["tokenization"].passed
    assert checks["perplexity"].passed is False, checks["perplexity"].detail
    assert report.failed


def test_cli_without_transformers_says_skipped_and_exits_0(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import localchat.converters.verify

    # As on a machine without the `convert` extra: only the tokenization can be compared.
    monkeypatch.setattr(localchat.converters.verify, "transformers_available", lambda: False)
    output = tmp_path / "tiny.gguf"
    assert main(["convert", str(tiny_checkpoint("qwen3")), "--to", "gguf", "--quant", "f16", "-o", str(output), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "tokenization         pass" in printed
    for name in ("top-1 agreement", "greedy continuation", "perplexity"):
        line = next(line for line in printed.splitlines() if line.startswith(name))
        assert "SKIPPED" in line and "torch and transformers are not installed" in line, line
    assert "verify: NOT fully verified: 1 of 4 checks passed, 3 SKIPPED" in printed


def test_reference_takes_the_other_models_pick_only_at_a_near_tie(tiny_checkpoint: Callable[[str], Path]) -> None:
    """transformers' greedy continuation follows another model's pick where that pick's logit lies
    within the tie of its top one, and only there; then it goes on greedily from that token."""
    import torch

    from localchat.converters.verify import ReferenceModel

    reference = ReferenceModel(tiny_checkpoint("llama"))
    prompt = [1, 5, 9, 13]
    with torch.inference_mode():
        best = torch.topk(reference.model(torch.tensor([prompt])).logits[0, -1], 2)
    runner_up, gap = int(best.indices[1]), float(best.values[0] - best.values[1])
    followed, steps = reference.greedy_following(prompt, 6, [runner_up], gap * 1.01)
    assert followed[0] == runner_up and steps == [0]
    assert followed[1:] == reference.greedy([*prompt, runner_up], 5)
    assert reference.greedy_following(prompt, 6, [runner_up], gap * 0.99) == (reference.greedy(prompt, 6), [])
