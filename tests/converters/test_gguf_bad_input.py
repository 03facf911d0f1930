"""Inputs a user can get wrong: each is a LocalchatError with a message saying what to do, and
nothing is left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from localchat.cli import main
from localchat.converters import cli
from localchat.converters.architectures import ARCHITECTURES
from localchat.converters.checkpoint import locate_checkpoint
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.tokenizer import TokenizerError, bpe_pre_tokenizer
from localchat.errors import LocalchatError, ModelError


@pytest.fixture
def llama_copy(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> Path:
    folder = tmp_path / "llama"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    return folder


def _convert(folder: Path, output: Path, **options) -> None:
    convert_checkpoint(folder, output, "f16", threads=1, **options)


def test_missing_config(llama_copy: Path, tmp_path: Path) -> None:
    (llama_copy / "config.json").unlink()
    with pytest.raises(ModelError, match="has no config.json"):
        _convert(llama_copy, tmp_path / "out.gguf")


def test_unknown_architecture_lists_the_supported_ones(llama_copy: Path, tmp_path: Path) -> None:
    config = json.loads((llama_copy / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError) as raised:
        _convert(llama_copy, tmp_path / "out.gguf")
    assert str(raised.value) == f"cannot convert architecture FalconForCausalLM; supported: {', '.join(sorted(ARCHITECTURES))}"
    assert "\n" not in str(raised.value)


def test_truncated_safetensors(llama_copy: Path, tmp_path: Path) -> None:
    weights = llama_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelError, match="model.safetensors is truncated.*download it again"):
        _convert(llama_copy, tmp_path / "out.gguf")


def test_missing_tokenizer(llama_copy: Path, tmp_path: Path) -> None:
    (llama_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="no tokenizer.json or tokenizer.model"):
        _convert(llama_copy, tmp_path / "out.gguf")
    assert list(tmp_path.glob("out.gguf*")) == []


def test_folder_without_weights(llama_copy: Path, tmp_path: Path) -> None:
    (llama_copy / "model.safetensors").rename(llama_copy / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"no \*.safetensors weights \(found pytorch_model.bin"):
        _convert(llama_copy, tmp_path / "out.gguf")


def test_existing_output_needs_force(llama_copy: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.gguf"
    output.write_text("keep me")
    with pytest.raises(LocalchatError, match="already exists; pass --force"):
        _convert(llama_copy, output)
    assert output.read_text() == "keep me"
    _convert(llama_copy, output, force=True)
    assert output.read_bytes()[:4] == b"GGUF"


def test_interrupted_conversion_leaves_nothing(llama_copy: Path, tmp_path: Path) -> None:
    def interrupt(done: int, total: int, what: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(llama_copy, tmp_path / "out.gguf", "q8_0", threads=1, progress=interrupt)
    assert list(tmp_path.glob("out.gguf*")) == []


# `localchat convert` whose progress bar, at its first report (a tensor is written), says so on stdout and
# then waits on stdin: the conversion is caught while it writes, whatever the machine's speed.
PAUSED_WHILE_WRITING = """
import runpy, sys
from localchat.converters import cli

class PausedWhileWriting(cli.ProgressBar):
    def __call__(self, done, total, what):
        print("writing", flush=True)
        sys.stdin.read()

cli.ProgressBar = PausedWhileWriting
runpy.run_module("localchat", run_name="__main__", alter_sys=True)
"""


def test_sigterm_while_writing_leaves_nothing(llama_copy: Path, tmp_path: Path) -> None:
    """`localchat convert` ended by SIGTERM (a service stopped, `kill`) removes its .incomplete file, as after Ctrl-C."""
    output = tmp_path / "out.gguf"
    converting = subprocess.Popen([sys.executable, "-c", PAUSED_WHILE_WRITING, "convert", str(llama_copy), "--to", "gguf",
                                   "--quant", "f16", "-o", str(output)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert converting.stdout is not None and converting.stdout.readline() == b"writing\n"
        assert (tmp_path / "out.gguf.incomplete").is_file()
        converting.send_signal(signal.SIGTERM)
        _, stderr = converting.communicate(timeout=120)
    finally:
        converting.kill()
    assert converting.returncode == 143 and b"Traceback" not in stderr, stderr.decode()  # 128 + SIGTERM, as a shell reports it
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama"]


def _read_only_folder(tmp_path: Path, name: str) -> str:
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    if os.access(folder, os.W_OK):
        pytest.skip("this user writes into read-only folders (root)")
    return str(folder / name)


# An -o a user can get wrong -> (the -o given, from pytest's folder and the output's name; what the one error line says).
BAD_OUTPUTS: dict[str, tuple[Callable[[Path, str], str], str]] = {
    "empty": (lambda tmp_path, name: "", "-o is empty"),
    # /proc takes no new files, even from root; its disk is 0 bytes, so this was reported as a full disk.
    "in /proc": (lambda tmp_path, name: f"/proc/{name}", r"cannot write .*/proc\b.*; choose another path with -o"),
    "read-only folder": (_read_only_folder, r"cannot write .*read-only \(Permission denied\); choose another path with -o"),
}
# Target -> (output name, a quick quantization), for each of BAD_OUTPUTS.
TARGET_OUTPUTS = {"gguf": ("out.gguf", "f16"), "onnx": ("out-onnx", "fp32")}


@pytest.mark.parametrize("target", TARGET_OUTPUTS)
@pytest.mark.parametrize("bad_output", BAD_OUTPUTS)
def test_bad_output_is_one_error_line_and_leaves_nothing(
    bad_output: str, target: str, llama_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given, message = BAD_OUTPUTS[bad_output]
    name, quant = TARGET_OUTPUTS[target]
    output = given(tmp_path, name)
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    assert main(["convert", str(llama_copy), "--to", target, "--quant", quant, "-o", output]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: error: "), lines
    assert re.search(message, lines[0]), lines[0]
    assert sorted(tmp_path.rglob("*")) == before


def test_unknown_pre_tokenizer_regex_is_explained() -> None:
    tokenizer_json = {
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"\p{L}+|\d"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            ],
        }
    }
    with pytest.raises(TokenizerError, match=r"split regex '\\\\p\{L\}\+\|\\\\d' matches none of llama.cpp's pre-tokenizers"):
        bpe_pre_tokenizer(tokenizer_json)


def test_digits_kept_in_runs_are_refused_in_one_line() -> None:
    """Command R's shape but with runs of digits kept whole, which llama.cpp's command-r would split."""
    tokenizer_json = {
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }
    }
    with pytest.raises(TokenizerError, match=r"Digits step keeps runs of digits together \(individual_digits false\)") as raised:
        bpe_pre_tokenizer(tokenizer_json)
    assert "\n" not in str(raised.value)


def test_offline_hub_id_says_what_to_download(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="download config.json.*from https://huggingface.co/someone/missing-model into a folder"):
        locate_checkpoint("someone/missing-model")


def test_cli_converts_and_verifies(tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    output = tmp_path / "tiny.gguf"
    args = parser.parse_args(["convert", str(tiny_checkpoint("qwen3")), "--to", "gguf", "--quant", "f16", "-o", str(output), "--verify"])
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert f"wrote {output}" in printed
    assert "greedy continuation  pass" in printed
