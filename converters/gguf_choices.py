"""What `localchat convert --to gguf` offers: the quantization types and the output's default name.

Kept apart from the converter so that the command line knows them without importing the gguf library
(50 ms of every start of `localchat`, whatever the command); the gguf types are looked up by name when
a conversion needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType, LlamaFileType


@dataclass(frozen=True)
class QuantType:
    """A `--quant` choice: the file type it makes and how its tensors are encoded."""

    # The name of its gguf.LlamaFileType.
    file_type_name: str
    # Bits per weight of the bulk of the tensors, for the disk-space estimate.
    bits_per_weight: float
    # The name of the float encoding written directly (a gguf.GGMLQuantizationType); None means quantize
    # with llama.cpp after writing floats.
    float_type_name: str | None = None

    @property
    def file_type(self) -> LlamaFileType:
        from gguf import LlamaFileType

        return LlamaFileType[self.file_type_name]

    @property
    def float_type(self) -> GGMLQuantizationType | None:
        """GGMLQuantizationType.F32 is 0, so test this against None, never for truth."""
        from gguf import GGMLQuantizationType

        return None if self.float_type_name is None else GGMLQuantizationType[self.float_type_name]


QUANT_TYPES: dict[str, QuantType] = {
    "f32": QuantType("ALL_F32", 32, "F32"),
    "f16": QuantType("MOSTLY_F16", 16, "F16"),
    "bf16": QuantType("MOSTLY_BF16", 16, "BF16"),
    "q8_0": QuantType("MOSTLY_Q8_0", 8.5),
    "q4_0": QuantType("MOSTLY_Q4_0", 4.5),
    "q4_k_m": QuantType("MOSTLY_Q4_K_M", 5.5),
    "q5_k_m": QuantType("MOSTLY_Q5_K_M", 6.5),
    "q6_k": QuantType("MOSTLY_Q6_K", 6.6),
}
DEFAULT_QUANT = "q4_k_m"


def default_output_path(name: str, quant: str, directory: Path) -> Path:
    """`<name>-<QUANT>.gguf` in `directory` (e.g. gemma-3-270m-Q4_K_M.gguf)."""
    return directory / f"{name}-{quant.upper()}.gguf"
