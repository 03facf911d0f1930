"""The stand-in Hugging Face hub (tests/hub/stand_in_hub.py) with its repos, made once per run, and
for each test its own Hugging Face cache and localchat home, so the user's are never touched."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest
from hub_files import make_gguf, split_gguf
from stand_in_hub import HubFile, StandInHub, start_hub
from stand_in_repos import (
    BIG,
    BIG_EMBEDDING,
    BIG_FILE,
    CHECKPOINT,
    GATED,
    GEMMA,
    GEMMA_SPLIT,
    TINY,
)

from localchat.settings import Settings


@pytest.fixture(scope="session")
def stand_in_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    hub, stop = start_hub()
    data = tmp_path_factory.mktemp("stand-in-hub")
    types = gguf.LlamaFileType
    q6 = make_gguf(data / "tiny-Q6_K.gguf", types.MOSTLY_Q6_K, seed=3)
    split = split_gguf(q6, data / "Q6_K", "tiny-Q6_K")
    readme = data / "README.md"
    readme.write_text("# tiny\nA stand-in GGUF repo.\n")
    hub.add_repo(TINY, [
        HubFile.from_disk("tiny-Q4_K_S.gguf", make_gguf(data / "tiny-Q4_K_S.gguf", types.MOSTLY_Q4_K_S, seed=1)),
        HubFile.from_disk("tiny-Q8_0.gguf", make_gguf(data / "tiny-Q8_0.gguf", types.MOSTLY_Q8_0, seed=2)),
        *(HubFile.from_disk(f"Q6_K/{part.name}", part) for part in split),
        HubFile.from_disk("mmproj-tiny-F16.gguf", make_gguf(data / "mmproj.gguf", types.MOSTLY_F16, seed=4)),
        HubFile.from_disk("README.md", readme, lfs=False),
    ])
    big = make_gguf(data / BIG_FILE, types.MOSTLY_Q4_K_M, n_embd=BIG_EMBEDDING, n_vocab=4096, seed=5)
    hub.add_repo(BIG, [HubFile.from_disk(BIG_FILE, big)])
    hub.add_repo(GATED, [HubFile.from_disk("gated-Q4_K_M.gguf", data / "tiny-Q4_K_S.gguf")], gated=True)
    config = data / "config.json"
    config.write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    weights = data / "model.safetensors"
    weights.write_bytes(os.urandom(3 * 2**20))
    card = data / "checkpoint-README.md"
    card.write_text("---\nlicense: apache-2.0\n---\n# checkpoint-only\n")
    hub.add_repo(CHECKPOINT, [HubFile.from_disk("config.json", config, lfs=False), HubFile.from_disk("model.safetensors", weights),
                              HubFile.from_disk("README.md", card, lfs=False)])
    yield hub
    stop()


@pytest.fixture
def hub(stand_in_hub: StandInHub) -> Iterator[StandInHub]:
    """The stand-in hub with no faults pending and its counts at zero."""
    stand_in_hub.reset()
    yield stand_in_hub
    stand_in_hub.reset()


@pytest.fixture(scope="session")
def gemma_repos(stand_in_hub: StandInHub, gemma_model: Path, tmp_path_factory: pytest.TempPathFactory) -> StandInHub:
    """The default model as a hub repo (with a small second GGUF), and split into two parts in another."""
    data = tmp_path_factory.mktemp("stand-in-gemma")
    parts = split_gguf(gemma_model, data, "gemma-3-270m-Q4_K_M")
    small = make_gguf(data / "gemma-3-270m-Q8_0.gguf", gguf.LlamaFileType.MOSTLY_Q8_0, seed=6)
    stand_in_hub.add_repo(GEMMA, [
        HubFile.from_disk("gemma-3-270m-Q4_K_M.gguf", gemma_model),
        HubFile.from_disk("gemma-3-270m-Q8_0.gguf", small),
    ])
    stand_in_hub.add_repo(GEMMA_SPLIT, [HubFile.from_disk(part.name, part) for part in parts])
    return stand_in_hub


@pytest.fixture
def hub_settings(hub: StandInHub, tmp_path: Path) -> Settings:
    """Settings as `localchat` builds them from cli_env's environment."""
    return Settings(
        data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", hf_cache_dir=tmp_path / "hf" / "hub",
        hf_endpoint=hub.endpoint, hf_offline=False,
    )


@pytest.fixture
def cli_env(hub: StandInHub, tmp_path: Path) -> dict[str, str]:
    """The environment of a `localchat` process that uses the stand-in hub and this test's caches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    return env | {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.endpoint, "LOCALCHAT_HOME": str(tmp_path)}
