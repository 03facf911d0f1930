"""The ONNX model folder that `localchat convert --to onnx` writes and the onnxruntime backend and
the model list read: its files, the marker `localchat_onnx.json` (checked field by field when
read), the graph's rotary inputs and how each matrix is stored. One definition for all three.

The graph's inputs: input_ids (batch, seq) int64; seqlens_k (batch) int32 = tokens held after this
step minus one; total_sequence_length () int32; logits_count (1) int64, how many last positions get
logits; past_key_values.{i}.key/value (batch, kv_heads, max_length, head_dim); rotary.{kind}.cos/sin
(positions, rotary_dim / 2), GroupQueryAttention's tables, which the runtime computes at load for
its context from the marker's `rope_frequencies` (stored, they took 64 MiB for 32k positions).
Outputs: logits (batch, logits_count, vocab) float32 and present.{i}.key/value, the same buffers
when bound so.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.errors import ModelError

if TYPE_CHECKING:
    import numpy as np

# The file that makes a folder an ONNX model of localchat's.
ONNX_MARKER = "localchat_onnx.json"
# 2: the rotary tables are graph inputs, computed at load.
FORMAT_VERSION = 2
GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
# The KV cache's types (the type the graph computes attention in: float16 for fp16 models), and
# how onnxruntime names each.
KV_DTYPES = {"float32": "tensor(float)", "float16": "tensor(float16)"}
# Folders converted before fp16 compute have no kv_dtype: theirs is float32.
DEFAULT_KV_DTYPE = "float32"
# Kinds of attention layer with rotary tables of their own (sliding-window layers may use another
# base frequency).
ROTARY_KINDS = ("global", "local")


@dataclass(frozen=True, kw_only=True)
class OnnxMetadata:
    """What the marker says, in the order it is written."""

    graph: str
    name: str | None = None  # as general.name in a GGUF file (converters.checkpoint.model_metadata)
    finetune: str | None = None  # as general.finetune
    architecture: str  # the llama.cpp-style name (chat template fallbacks key on it)
    source_architecture: str  # the Hugging Face class, such as Gemma3ForCausalLM
    quant: str
    n_layers: int
    n_heads: int | None = None
    n_kv_heads: int
    head_dim: int
    hidden_size: int | None = None
    n_vocab: int
    n_ctx_train: int | None
    max_positions: int  # the runtime's context is capped here
    rope_frequencies: dict[str, list[float]]  # by kind of layer, the inverse frequency of each rotary pair
    kv_dtype: str = DEFAULT_KV_DTYPE
    kv_bytes_per_token: int
    layer_bytes: int  # a layer's weights, on average
    other_bytes: int
    weight_bytes: int
    operators: dict[str, int]  # the graph's nodes by operator
    weight_formats: dict[str, str] | None = None  # by matrix, a MatrixFormat as text
    bos_id: int | None = None
    eos_id: int | None = None
    eog_ids: list[int] = dataclasses.field(default_factory=list)
    add_bos: bool = False
    chat_template: str | None = None


@dataclass(frozen=True)
class MatrixFormat:
    """How the converter stored one matrix, as the marker's `weight_formats` spells it: 'int4/32'
    (4-bit codes in blocks of 32) or 'float16'; ' smoothed' when its columns carry smoothing
    factors; ' (tied)' for an output head that reads the embedding's stored bytes."""

    storage: str  # int4, int8, float32, float16
    block: int | None = None
    smoothed: bool = False
    tied: bool = False

    def __str__(self) -> str:
        text = self.storage + (f"/{self.block}" if self.block else "")
        return text + (" smoothed" if self.smoothed else "") + (" (tied)" if self.tied else "")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(value: object) -> bool:
    return _count(value) and value > 0  # type: ignore[operator]


def _rope_frequencies(value: object) -> bool:
    return isinstance(value, dict) and bool(value) and all(
        kind in ROTARY_KINDS and isinstance(f, list) and f and all(isinstance(x, float) and x > 0 for x in f) for kind, f in value.items()
    )


def _file_name(value: object) -> bool:
    """A file directly in the model folder (a marker must not point elsewhere)."""
    return isinstance(value, str) and value not in ("", ".", "..") and Path(value).name == value


# The marker's fields: (check, what the value must be, required).
MARKER_FIELDS: dict[str, tuple[Callable[[object], bool], str, bool]] = {
    "graph": (_file_name, "a file name in the folder", True),
    "architecture": (lambda v: isinstance(v, str), "a string", True),
    "source_architecture": (lambda v: isinstance(v, str), "a string", True),
    "quant": (lambda v: isinstance(v, str), "a string", True),
    "n_layers": (_positive, "a positive integer", True),
    "n_heads": (_positive, "a positive integer", False),
    "n_kv_heads": (_positive, "a positive integer", True),
    "head_dim": (_positive, "a positive integer", True),
    "hidden_size": (_positive, "a positive integer", False),
    "n_vocab": (_positive, "a positive integer", True),
    "max_positions": (_positive, "a positive integer", True),
    "rope_frequencies": (_rope_frequencies, "lists of positive inverse frequencies by kind (global, local)", True),
    "n_ctx_train": (lambda v: v is None or _count(v), "an integer or null", True),
    "kv_bytes_per_token": (_count, "an integer >= 0", True),
    "kv_dtype": (lambda v: v in KV_DTYPES, " or ".join(KV_DTYPES), False),
    "layer_bytes": (_count, "an integer >= 0", True),
    "other_bytes": (_count, "an integer >= 0", True),
    "weight_bytes": (_count, "an integer >= 0", True),
    "operators": (lambda v: isinstance(v, dict) and all(_count(n) for n in v.values()), "operator counts", True),
    "name": (lambda v: v is None or isinstance(v, str), "a string", False),
    "finetune": (lambda v: v is None or isinstance(v, str), "a string", False),
    "bos_id": (lambda v: v is None or _count(v), "a token id or null", False),
    "eos_id": (lambda v: v is None or _count(v), "a token id or null", False),
    "add_bos": (lambda v: isinstance(v, bool), "true or false", False),
    "eog_ids": (lambda v: isinstance(v, list) and all(_count(t) for t in v), "a list of token ids", False),
    "chat_template": (lambda v: v is None or isinstance(v, str), "a string or null", False),
    "weight_formats": (
        lambda v: isinstance(v, dict) and all(isinstance(f, str) for f in v.values()), "a table of weight formats", False,
    ),
}


def read_metadata(folder: Path) -> OnnxMetadata:
    """The folder's marker, checked field by field; raises ModelError naming what is wrong."""
    path = folder / ONNX_MARKER
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"{path} cannot be read ({error}); convert the model again") from None
    if not isinstance(meta, dict):
        raise ModelError(f"{path} is not a localchat ONNX marker (not a JSON object); convert the model again")
    if meta.get("format_version") != FORMAT_VERSION:
        version = str(meta.get("format_version"))[:40]
        raise ModelError(f"{folder} was made by another localchat version (format {version}); convert it again")
    for key, (valid, expected, required) in MARKER_FIELDS.items():
        if key not in meta:
            if required:
                raise ModelError(f"{path} has no '{key}'; convert the model again")
        elif not valid(meta[key]):
            raise ModelError(f"{path}: '{key}' must be {expected}, not {str(meta[key])[:60]!r}; convert the model again")
    for key in ("bos_id", "eos_id"):
        if isinstance(meta.get(key), int) and meta[key] >= meta["n_vocab"]:
            raise ModelError(f"{path}: '{key}' {meta[key]} is beyond the {meta['n_vocab']}-token vocabulary; convert the model again")
    return OnnxMetadata(**{key: meta[key] for key in MARKER_FIELDS if key in meta})


def write_metadata(folder: Path, meta: OnnxMetadata) -> None:
    marker = {"format_version": FORMAT_VERSION, **dataclasses.asdict(meta)}
    (folder / ONNX_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def rotary_input_names(kind: str) -> tuple[str, str]:
    """The graph inputs of GroupQueryAttention's cos and sin tables for one kind of layer."""
    return f"rotary.{kind}.cos", f"rotary.{kind}.sin"


def rotary_tables(rope_frequencies: dict[str, list[float]], n_positions: int, dtype: type) -> dict[str, np.ndarray]:
    """The marker's `rope_frequencies` as GroupQueryAttention's cos and sin tables, (n_positions,
    rotary pairs) by graph input, computed in float32 as transformers computes them."""
    import numpy as np  # here alone: the model list reads this module, and needs no numpy

    tables = {}
    for kind, inverse_frequencies in rope_frequencies.items():
        angles = np.arange(n_positions, dtype=np.float32)[:, None] * np.asarray(inverse_frequencies, dtype=np.float32)[None, :]
        cos, sin = rotary_input_names(kind)
        tables[cos], tables[sin] = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    return tables


def _layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def describe_weight_formats(formats: dict[str, str]) -> str:
    """The marker's per-matrix formats in one line, by role: each role's most common format, then
    the layers that differ ('mlp.down_proj int4/32 (int8/32 in layers 0-1, 16-17)')."""
    by_role: dict[str, dict[str, list[int]]] = {}
    for name, fmt in formats.items():
        layer, _, role = name.removeprefix("layers.").partition(".") if name.startswith("layers.") else ("-1", "", name)
        by_role.setdefault(role, {}).setdefault(fmt, []).append(int(layer))
    parts = []
    for role, kinds in by_role.items():
        common, *others = sorted(kinds, key=lambda f: -len(kinds[f]))
        exceptions = "; ".join(f"{fmt} in layers {_layer_ranges(kinds[fmt])}" for fmt in others)
        parts.append(f"{role} {common}" + (f" ({exceptions})" if exceptions else ""))
    return ", ".join(parts)
