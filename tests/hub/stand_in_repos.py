"""The stand-in hub's repos (made by tests/hub/conftest.py) and the `localchat` command run against it."""

from __future__ import annotations

import subprocess
import sys

TINY = "stand-in/tiny-GGUF"  # Q4_K_S, Q8_0, Q6_K in two parts, a vision projector, a README
BIG = "stand-in/big-GGUF"  # one 40 MiB Q4_K_M file
GATED = "stand-in/gated-GGUF"
CHECKPOINT = "stand-in/checkpoint-only"  # safetensors, no GGUF
GEMMA = "stand-in/gemma-3-270m-GGUF"  # the default model as Q4_K_M, and a small Q8_0
GEMMA_SPLIT = "stand-in/gemma-3-270m-split-GGUF"  # the default model in two parts
BIG_FILE = "big-Q4_K_M.gguf"
# 40 MiB of tensors: several of huggingface_hub's 10 MiB download chunks.
BIG_EMBEDDING = 1024
MIB = 1 << 20


def localchat(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localchat", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)
