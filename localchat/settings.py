"""One settings object with defaults; LOCALCHAT_HOME moves its folders, command-line flags the rest."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import platformdirs

from localchat.backends.base import ROW_LIMIT
from localchat.hardware import MIB

# The longest prompt-lookup draft the front ends (run, serve, the chat app) use unless told otherwise.
# On by default: a step drafts only when drafting is expected to give tokens faster than a plain step
# (localchat.speculative.LookupDrafting), so a reply that never repeats its prompt, or whose sampler does
# not pick what lookup predicts, pays nothing. As long as one evaluation's rows allow (ROW_LIMIT, with the
# token before the draft), because a copied run pays off more the longer it is drafted once a step's fixed
# cost is paid: with every row's logits (benchmarks/speculative.py --step-cost, AMD EPYC, 2 threads), a row
# cost 5.6 ms in 26 rows and 4.5 in 64 on SmolLM2-135M (a plain step 10.9), 5.4 and 4.4 on Gemma 3 270M
# (15.2). Correcting a text as shipped, SmolLM2 drafted 1.75x against 1.65x with drafts of at most 25
# (medians over 12 seeds), Gemma 2.44x against 2.24x (8 seeds); a story 0.98-1.01x either way. The price
# is memory, once a reply drafts that long: llama.cpp holds the rows' logits in its graph and its output
# buffer (Gemma's peak RSS 557 MB against 473). Odd: with the token before it, a whole draft is an even
# count of rows (see LlamaCppBackend.even_rows).
DEFAULT_LOOKUP_DRAFT = ROW_LIMIT - 1


def _home_from_env() -> tuple[Path, Path]:
    """LOCALCHAT_HOME puts data and cache under one folder (tests, portable installs)."""
    home = os.environ.get("LOCALCHAT_HOME")
    if home:
        return Path(home) / "data", Path(home) / "cache"
    return Path(platformdirs.user_data_dir("localchat")), Path(platformdirs.user_cache_dir("localchat"))


def default_cache_dir() -> Path:
    """Settings().cache_dir, for code that derives what it caches without a Settings at hand."""
    return _home_from_env()[1]


def _hub_constants() -> ModuleType:
    """huggingface_hub's reading of HF_HOME, HF_HUB_CACHE, HF_ENDPOINT and HF_HUB_OFFLINE (done at its import)."""
    from huggingface_hub import constants

    return constants


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default_factory=lambda: _home_from_env()[0])
    cache_dir: Path = field(default_factory=default_cache_dir)
    # Saved KV states kept in RAM for prefix reuse (system prompts, earlier conversations).
    prefix_cache_ram_bytes: int = 1024 * MIB
    # Saved KV states spilled to disk when RAM is full; 0 turns the disk tier off.
    prefix_cache_disk_bytes: int = 4096 * MIB
    # Models pulled from the Hugging Face hub live in its own cache, shared with other tools.
    hf_cache_dir: Path = field(default_factory=lambda: Path(_hub_constants().HF_HUB_CACHE))
    hf_endpoint: str = field(default_factory=lambda: _hub_constants().ENDPOINT)
    hf_offline: bool = field(default_factory=lambda: _hub_constants().is_offline_mode())

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def model_usage_path(self) -> Path:
        """When each model was last loaded (`localchat list`)."""
        return self.data_dir / "model-usage.json"

    @property
    def prefix_cache_dir(self) -> Path:
        return self.cache_dir / "prefix-cache"

