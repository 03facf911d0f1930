"""Reads a Hugging Face checkpoint folder: its config, normalised, and its tensors, lazily.

Shared by every target format. Tensors come straight out of memory-mapped safetensors files
(sharded or not), one at a time; nothing here needs torch. bf16, which numpy lacks, is read as
uint16 and widened with a bit shift.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localchat.errors import ModelError

SAFETENSORS_INDEX = "model.safetensors.index.json"
# safetensors dtype -> numpy dtype of the stored bytes (bf16 stays raw uint16 until widened).
STORED_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# A safetensors header larger than this is corrupt, not a real checkpoint.
MAX_HEADER_BYTES = 100 * 1024 * 1024


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32: bf16 is the top half of a float32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class RopeSettings:
    """One RoPE configuration: base frequency and optional scaling (`type` "linear", "llama3", ...)."""

    theta: float
    scaling_type: str = "default"
    scaling: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any], default_theta: float) -> RopeSettings:
        scaling_type = values.get("rope_type") or values.get("type") or "default"
        extra = {k: v for k, v in values.items() if k not in ("rope_theta", "rope_type", "type")}
        return cls(float(values.get("rope_theta", default_theta)), str(scaling_type), extra)


def _rope_layouts(config: dict[str, Any]) -> tuple[RopeSettings, RopeSettings | None]:
    """Global and sliding-window RoPE from either layout.

    transformers 5 writes `rope_parameters`, flat or nested per layer type (`full_attention`,
    `sliding_attention`); older checkpoints have flat `rope_theta`, `rope_scaling` and, for
    Gemma 3, `rope_local_base_freq`.
    """
    default_theta = float(config.get("rope_theta", 10000.0))
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict) and "full_attention" in parameters:
        full = RopeSettings.from_dict(parameters["full_attention"], default_theta)
        sliding = parameters.get("sliding_attention")
        return full, RopeSettings.from_dict(sliding, default_theta) if sliding else None
    if isinstance(parameters, dict):
        return RopeSettings.from_dict(parameters, default_theta), None
    full = RopeSettings.from_dict({"rope_theta": default_theta, **(config.get("rope_scaling") or {})}, default_theta)
    local = config.get("rope_local_base_freq")
    return full, RopeSettings(float(local)) if local is not None else None


@dataclass(frozen=True)
class ModelConfig:
    """config.json with the names and layouts of different transformers versions made uniform."""

    architecture: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    context_length: int
    rope: RopeSettings
    rope_local: RopeSettings | None
    tie_word_embeddings: bool
    sliding_window: int | None
    layer_types: tuple[str, ...]
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, config: dict[str, Any], source: Path) -> ModelConfig:
        architectures = config.get("architectures") or []
        if not architectures:
            raise ModelError(f"{source} has no 'architectures' entry; is it a transformers model config?")
        try:
            hidden = int(config["hidden_size"])
            n_heads = int(config["num_attention_heads"])
            n_layers = int(config["num_hidden_layers"])
            values = dict(
                vocab_size=int(config["vocab_size"]),
                intermediate_size=int(config["intermediate_size"]),
            )
        except KeyError as missing:
            raise ModelError(f"{source} lacks {missing}; the checkpoint's config.json is incomplete") from None
        rope, rope_local = _rope_layouts(config)
        layer_types = config.get("layer_types") or ["full_attention"] * n_layers
        return cls(
            architecture=str(architectures[0]),
            hidden_size=hidden,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
            head_dim=int(config.get("head_dim") or hidden // n_heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            context_length=int(config.get("max_position_embeddings", 0)),
            rope=rope,
            rope_local=rope_local,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            sliding_window=config.get("sliding_window"),
            layer_types=tuple(layer_types),
            raw=config,
            **values,
        )


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lies in a safetensors file; nothing is read until `read`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset in `file`
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _MappedFile:
    """One safetensors file mapped read-only; pages are dropped after each tensor is used."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as stream:
            self.map = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)

    def view(self, ref: TensorRef) -> np.ndarray:
        stored = STORED_DTYPES[ref.dtype]
        return np.frombuffer(self.map, dtype=stored, count=ref.n_elements, offset=ref.start).reshape(ref.shape)

    def release(self, ref: TensorRef) -> None:
        # The kernel keeps the pages in its cache; this only stops them counting as our RSS.
        start = ref.start // mmap.PAGESIZE * mmap.PAGESIZE
        self.map.madvise(mmap.MADV_DONTNEED, start, ref.start + ref.n_bytes - start)


def _read_safetensors_header(path: Path) -> list[TensorRef]:
    size = path.stat().st_size
    with path.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            raise ModelError(f"{path} is truncated (no safetensors header); download it again")
        header_len = struct.unpack("<Q", prefix)[0]
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise ModelError(f"{path} is truncated or not a safetensors file (header of {header_len:,} bytes); download it again")
        try:
            header = json.loads(stream.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelError(f"{path} has a corrupt safetensors header; download it again") from None
    data_start = 8 + header_len
    refs = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry["dtype"]
        if dtype not in STORED_DTYPES:
            raise ModelError(f"{path}: tensor '{name}' has dtype {dtype}, which localchat cannot convert")
        begin, end = entry["data_offsets"]
        ref = TensorRef(name, dtype, tuple(entry["shape"]), path, data_start + begin, end - begin)
        if ref.n_elements * STORED_DTYPES[dtype].itemsize != ref.n_bytes:
            raise ModelError(f"{path}: tensor '{name}' has {ref.n_bytes} bytes for shape {list(ref.shape)}; the file is corrupt")
        if data_start + end > size:
            raise ModelError(
                f"{path} is truncated: tensor '{name}' ends at byte {data_start + end:,} but the file has {size:,}; "
                "download it again"
            )
        refs.append(ref)
    return refs


def _weight_files(folder: Path) -> list[Path]:
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({folder / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelError(f"{folder} lacks {', '.join(missing)} listed in {SAFETENSORS_INDEX}; download every shard")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    others = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    hint = f" (found {', '.join(others)}: only safetensors weights are read)" if others else ""
    raise ModelError(f"{folder} has no *.safetensors weights{hint}; download the model's safetensors files")


class Checkpoint:
    """A Hugging Face checkpoint folder: `config`, tensor table, and tensors read one at a time."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        config_path = folder / "config.json"
        if not folder.is_dir():
            raise ModelError(f"{folder} is not a folder; give a Hugging Face checkpoint folder or a hub repo id")
        if not config_path.is_file():
            raise ModelError(f"{folder} has no config.json; is it a Hugging Face checkpoint folder?")
        try:
            raw = json.loads(config_path.read_text())
        except json.JSONDecodeError as error:
            raise ModelError(f"{config_path} is not valid JSON ({error}); download it again") from None
        self.config = ModelConfig.from_dict(raw, config_path)
        self.tensors: dict[str, TensorRef] = {}
        for path in _weight_files(folder):
            for ref in _read_safetensors_header(path):
                self.tensors[ref.name] = ref
        self._files: dict[Path, _MappedFile] = {}

    @property
    def n_bytes(self) -> int:
        return sum(ref.n_bytes for ref in self.tensors.values())

    def json_file(self, name: str) -> dict[str, Any] | None:
        path = self.folder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def _mapped(self, ref: TensorRef) -> _MappedFile:
        if ref.file not in self._files:
            self._files[ref.file] = _MappedFile(ref.file)
        return self._files[ref.file]

    def read_stored(self, ref: TensorRef) -> np.ndarray:
        """The tensor as stored, without a copy (bf16 as uint16); valid until `release`."""
        return self._mapped(ref).view(ref)

    def read_float32(self, ref: TensorRef) -> np.ndarray:
        """A float32 copy of the tensor."""
        return self.float32(ref, self.read_stored(ref))

    @staticmethod
    def float32(ref: TensorRef, stored: np.ndarray) -> np.ndarray:
        """A float32 copy of `stored`, all or part of `ref` as read by `read_stored`."""
        return bf16_to_float32(stored) if ref.dtype == "BF16" else stored.astype(np.float32)

    def release(self, ref: TensorRef) -> None:
        self._mapped(ref).release(ref)

    def __iter__(self) -> Iterator[TensorRef]:
        return iter(self.tensors.values())

    def close(self) -> None:
        # Views handed out keep a map alive through its buffer; drop ours and let them go.
        self._files.clear()


# What a conversion needs from a hub repository: no other weights formats, no extras.
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    SAFETENSORS_INDEX,
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
    "chat_template.jinja",
]


@dataclass(frozen=True)
class CheckpointSource:
    """Where a checkpoint is, and a name and folder for the output made from it."""

    folder: Path
    name: str
    directory: Path


def locate_checkpoint(spec: str) -> CheckpointSource:
    """A local folder as is; otherwise a hub repo id, fetched into huggingface_hub's cache."""
    path = Path(spec).expanduser()
    if path.exists():
        return CheckpointSource(path, path.resolve().name, path.resolve().parent)
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise ModelError(f"{spec} is neither a folder nor a Hugging Face repo id (owner/name); check the path")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(spec, allow_patterns=HUB_PATTERNS))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:
        files = ", ".join(HUB_PATTERNS[:6])
        raise ModelError(
            f"cannot fetch {spec} from the Hugging Face hub ({type(error).__name__}); download {files} "
            f"from https://huggingface.co/{spec} into a folder and pass that folder instead"
        ) from None
    return CheckpointSource(folder, spec.split("/")[1], Path.cwd())
