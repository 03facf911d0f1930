"""Sampling defaults as data: the model's own, else its family's recommendation, else llama.cpp's.

A GGUF file may carry its maker's defaults as `general.sampling.*` (llama.cpp's converter writes them
from the checkpoint's `generation_config.json`, and so does `localchat convert`); llama.cpp's own tools
read them the same way. A model without them gets its family's row below, and a model of no known
family llama.cpp's defaults, which are `SamplerSettings()`'s. What a user or a request sets goes over all.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from localchat.backends.base import SamplerSettings
from localchat.gguf_file import GGUF_SAMPLING_KEYS

@dataclass(frozen=True)
class FamilyDefaults:
    """A family's recommended settings, for models whose file carries none."""

    family: str
    # GGUF metadata key -> a regular expression its value must match whole (case aside); a
    # missing key reads as "".
    match: Mapping[str, str]
    settings: Mapping[str, float | int]
    why: str

    def matches(self, metadata: Mapping[str, str]) -> bool:
        return all(re.fullmatch(pattern, metadata.get(key, ""), re.IGNORECASE) for key, pattern in self.match.items())


FAMILY_DEFAULTS: tuple[FamilyDefaults, ...] = (
    FamilyDefaults(
        "SmolLM2", {"general.name": r"smollm2\b.*"}, {"temperature": 0.2, "top_p": 0.9, "dry_multiplier": 1.2},
        "the model card's temperature and top-p, and DRY: over seeds 0-4 of benchmarks/first_chat.py, 8 of 50 "
        "everyday replies looped without it (a haiku's 'aye, aye, aye', 'Boil an egg:' again and again), 1 with "
        "DRY 0.8 and none with 1.2, factual questions answered in the first sentence 30 of 50 either way; a "
        "repeat penalty of 1.1 over 64 tokens stopped the loops too, but it sees the question, and answers "
        "fell to 22 of 50. DRY sees the reply alone, so a reply quoting its prompt is not penalised",
    ),
    FamilyDefaults(
        "Gemma 3 270M base", {"general.name": r"gemma[- ]3[- ]270m", "general.finetune": ""},
        {"repeat_penalty": 1.1, "penalty_last_n": 64, "dry_multiplier": 0.8},
        "a base model that loops without repetition control: 18 of 20 first replies looped with no penalty, "
        "none with the repeat penalty and DRY (benchmarks/repetition.py, seed 0). Neither alone did as well: "
        "DRY 0.8 alone left 7 of 20 looping (256 tokens, seed 0), the repeat penalty alone 2 of 40 over seeds "
        "0-1 against 1 for both (1024 tokens); DRY costs 0.01-0.03 ms a token here. DRY sees the reply alone, "
        "so a reply quoting its prompt is not penalised and prompt-lookup drafts are taken",
    ),
)


@dataclass(frozen=True)
class SamplerDefaults:
    """A model's default sampler and where it came from: "model", "family: NAME" or "llama.cpp"."""

    settings: SamplerSettings
    source: str


def sampling_from_metadata(metadata: Mapping[str, str]) -> dict[str, float | int]:
    """The SamplerSettings fields a GGUF file's `general.sampling.*` keys set (unreadable values left out)."""
    found: dict[str, float | int] = {}
    for key, (field, kind) in GGUF_SAMPLING_KEYS.items():
        if key in metadata:
            try:
                found[field] = kind(metadata[key])
            except ValueError:
                continue
    return found


def sampler_defaults(metadata: Mapping[str, str]) -> SamplerDefaults:
    """The default sampler for a model with this GGUF metadata."""
    own = sampling_from_metadata(metadata)
    if own:
        return SamplerDefaults(_settings(own), "model")
    family = next((row for row in FAMILY_DEFAULTS if row.matches(metadata)), None)
    if family is not None:
        return SamplerDefaults(_settings(family.settings), f"family: {family.family}")
    return SamplerDefaults(SamplerSettings(), "llama.cpp")


def _settings(fields: Mapping[str, float | int]) -> SamplerSettings:
    try:
        return dataclasses.replace(SamplerSettings(), **fields)
    except ValueError:  # values out of range in a file: llama.cpp's defaults instead
        return SamplerSettings()
