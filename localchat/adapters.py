"""LoRA adapters on a loaded model: `--lora FILE[:SCALE]`, the adapters an engine loaded, and the
scales a request asks for, by llama-server's rule (its `lora` field lists {id, scale}; a loaded
adapter it leaves out is off for that request)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from localchat.backends.base import LoraScales, lora_scales
from localchat.errors import InvalidSettingError


@dataclass(frozen=True)
class LoraSpec:
    """An adapter to load and the scale it is applied with unless a request says otherwise."""

    path: Path
    scale: float = 1.0

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """`FILE` or `FILE:SCALE`."""
        path, _, scale = text.rpartition(":")
        if path and _is_number(scale):
            return cls(Path(path).expanduser(), float(scale))
        if path and Path(path).expanduser().is_file() and not Path(text).expanduser().exists():
            raise InvalidSettingError(f"--lora {text}: the scale '{scale}' is not a number; write FILE:SCALE, as {path}:0.5")
        return cls(Path(text).expanduser())


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


@dataclass(frozen=True)
class LoadedLora:
    """An adapter loaded on an engine's backend: its id there, its file and its default scale."""

    id: int
    path: Path
    scale: float


def default_scales(loaded: Iterable[LoadedLora]) -> LoraScales:
    return lora_scales({lora.id: lora.scale for lora in loaded})


def requested_scales(loaded: Sequence[LoadedLora], request: Iterable[tuple[int, float]]) -> LoraScales:
    """The scales of a request's adapter list: those it names at its scales, the others off."""
    known = {lora.id for lora in loaded}
    scales: dict[int, float] = {}
    for adapter_id, scale in request:
        if adapter_id not in known:
            listed = ", ".join(f"{lora.id} ({lora.path.name})" for lora in loaded) or "none"
            raise InvalidSettingError(f"no LoRA adapter has id {adapter_id}; loaded: {listed}")
        if not math.isfinite(scale):
            raise InvalidSettingError(f"LoRA adapter {adapter_id}'s scale must be a finite number, got {scale}")
        scales[adapter_id] = scale
    return lora_scales(scales)
