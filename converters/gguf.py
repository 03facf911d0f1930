"""Hugging Face checkpoint -> GGUF file, with gguf's writer and llama.cpp's own quantizer.

Float outputs (f32, f16, bf16) are written tensor by tensor from the memory-mapped checkpoint.
Quantized outputs are written as a float GGUF first (bf16 for bf16 checkpoints, so nothing is
rounded twice) and then quantized by `llama_model_quantize`, which is multithreaded C and picks
the per-tensor mix (Q4_K_M keeps some tensors in Q6_K) exactly as llama-quantize does. Output is
atomic: everything is written to `.incomplete` files that are renamed at the end or removed.
An MXFP4 checkpoint's experts (gpt-oss's release) stay MXFP4 at every output type, repacked, never requantized.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize as gguf_quantize

from localchat.converters.architectures import PlannedTensor, add_hparams, architecture_for, plan_tensors, transform
from localchat.converters.checkpoint import FLOAT_DTYPES, Checkpoint, TensorRef, model_metadata, wrapper_notice
from localchat.converters.gguf_choices import DEFAULT_QUANT, QUANT_TYPES, QuantType, default_output_path
from localchat.converters.tokenizer import add_tokenizer
from localchat.errors import InvalidSettingError, LocalchatError, ModelError, UnwritableFolderError
from localchat.gguf_file import generation_config_sampling

INCOMPLETE_SUFFIX = ".incomplete"
# Room left on the disk beyond the estimated output, for the filesystem and other programs.
DISK_MARGIN_BYTES = 256 * 1024 * 1024
# Names llama.cpp's vocabulary loader takes for Phi-3's, and the tokens it then looks up by text.
PHI3_NAME = re.compile("phi-?3", re.IGNORECASE)
PHI3_NAMED_TOKENS = ("<unk>", "<s>", "<|endoftext|>", "</s>")
# Elements widened to float32 at once when re-encoding a large tensor (64 MiB of float32).
ENCODE_CHUNK_ELEMENTS = 16 * 1024 * 1024


def quant_type(name: str) -> QuantType:
    try:
        return QUANT_TYPES[name.lower()]
    except KeyError:
        raise InvalidSettingError(f"unknown quantization '{name}'; choose one of: {', '.join(QUANT_TYPES)}") from None


def ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """An MXFP4 matrix as stored in a checkpoint (rows x blocks x 16 bytes, value 2k in byte k's low nibble and 2k + 1 in its
    high one; rows x blocks of E8M0 scales) as GGML's MXFP4 rows: per block its scale byte, then value j in byte j's low nibble
    and value j + 16 in its high one. The scale carries over: GGML doubles the E2M1 values and halves the scale."""
    values = np.empty((*blocks.shape[:-1], 2 * blocks.shape[-1]), dtype=np.uint8)
    values[..., 0::2], values[..., 1::2] = blocks & 0x0F, blocks >> 4
    half = blocks.shape[-1]
    packed = np.concatenate((scales[..., None], values[..., :half] | (values[..., half:] << 4)), axis=-1)
    return packed.reshape(*blocks.shape[:-2], -1)


def _to_bf16_bytes(weights: np.ndarray) -> np.ndarray:
    return gguf_quantize(np.ascontiguousarray(weights, dtype=np.float32), GGMLQuantizationType.BF16)


FLOAT_ENCODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLQuantizationType.F32: lambda w: np.ascontiguousarray(w, dtype=np.float32),
    GGMLQuantizationType.F16: lambda w: np.ascontiguousarray(w, dtype=np.float16),
    GGMLQuantizationType.BF16: _to_bf16_bytes,
}
# llama.cpp's names of the experts' stacks, which an MXFP4 checkpoint's quantized GGUF keeps in MXFP4 (llama.cpp's quantizer
# would refuse to requantize them, and its MXFP4_MOE type keeps them so).
EXPERT_STACKS = rb"_exps\.weight$"
# Checkpoint dtypes that are already in a GGML float encoding, byte for byte.
STORED_AS = {"F32": GGMLQuantizationType.F32, "F16": GGMLQuantizationType.F16, "BF16": GGMLQuantizationType.BF16}


@dataclass(frozen=True)
class ConversionResult:
    output: Path
    quant: str
    n_tensors: int
    n_bytes: int
    seconds: float
    notice: str | None = None  # what was not converted (an image-reading model's vision part)


Progress = Callable[[int, int, str], None]  # (bytes done, total bytes, what is happening)


class TensorWriter:
    """Turns planned tensors into the bytes of one float GGUF encoding, in parallel, in order."""

    def __init__(self, checkpoint: Checkpoint, float_type: GGMLQuantizationType, tensors: list[PlannedTensor]) -> None:
        self.checkpoint = checkpoint
        self.float_type = float_type
        # A fused matrix whose blocks are rewritten into tensors of their own (Granite 4's gate and up) is read once:
        # its float32 copy is kept until the last of them has taken it.
        readers = Counter(ref.name for planned in tensors if planned.rewrite is not None for ref in planned.sources)
        self._readers_left = {name: count for name, count in readers.items() if count > 1}
        self._shared: dict[str, np.ndarray] = {}
        self._shared_lock = threading.Lock()

    def ggml_type(self, planned: PlannedTensor) -> GGMLQuantizationType:
        # MXFP4 matrices stay so; llama.cpp keeps vectors (norms, biases, RoPE factors) in F32 at every quantization.
        if planned.scales:
            return GGMLQuantizationType.MXFP4
        return GGMLQuantizationType.F32 if planned.keeps_f32 else self.float_type

    def add_info(self, writer: GGUFWriter, planned: PlannedTensor) -> int:
        ggml_type = self.ggml_type(planned)
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        n_bytes = int(np.prod(planned.shape, dtype=np.int64)) // block * type_size
        if ggml_type in (GGMLQuantizationType.BF16, GGMLQuantizationType.MXFP4):
            byte_shape = (*planned.shape[:-1], planned.shape[-1] // block * type_size)
            writer.add_tensor_info(planned.gguf_name, byte_shape, np.dtype(np.uint8), n_bytes, raw_dtype=ggml_type)
        else:
            dtype = np.dtype(np.float32 if ggml_type == GGMLQuantizationType.F32 else np.float16)
            writer.add_tensor_info(planned.gguf_name, planned.shape, dtype, n_bytes)
        return n_bytes

    def encode(self, planned: PlannedTensor) -> np.ndarray:
        ggml_type = self.ggml_type(planned)
        if planned.data is not None:
            return FLOAT_ENCODERS[ggml_type](planned.data)
        if not planned.stacked:
            return self._encode_source(planned, planned.sources[0], ggml_type)
        # An expert's matrices, one after another along a new first axis.
        stacked: np.ndarray | None = None
        for i, ref in enumerate(planned.sources):
            piece = self._encode_source(planned, ref, ggml_type)
            if stacked is None:
                stacked = np.empty((len(planned.sources), *piece.shape), dtype=piece.dtype)
            stacked[i] = piece
        assert stacked is not None
        return stacked

    def _encode_source(self, planned: PlannedTensor, ref: TensorRef, ggml_type: GGMLQuantizationType) -> np.ndarray:
        if planned.scales:
            rows = planned.rewrite or (lambda stored: stored)
            scales = planned.scales[planned.sources.index(ref)]
            return ggml_mxfp4(rows(self.checkpoint.read_stored(ref)), rows(self.checkpoint.read_stored(scales)))
        untouched = not planned.permute_heads and not planned.add and planned.rewrite is None
        if untouched and STORED_AS.get(ref.dtype) == ggml_type:
            stored = self.checkpoint.read_stored(ref)
            return stored.view(np.uint8) if ggml_type == GGMLQuantizationType.BF16 else stored
        # Reordered rows (heads) cannot be encoded a slice of rows at a time, nor FP8 ones without their scales.
        if planned.permute_heads or planned.rewrite is not None or ref.name in self.checkpoint.scales or ref.n_elements <= ENCODE_CHUNK_ELEMENTS:
            return FLOAT_ENCODERS[ggml_type](transform(planned, self._read_float32(ref)))
        # Large matrices (a 262k-token embedding) go through float32 a slice of rows at a time.
        stored = self.checkpoint.read_stored(ref)
        rows = max(1, ENCODE_CHUNK_ELEMENTS * ref.shape[0] // ref.n_elements)
        encoded: np.ndarray | None = None
        for start in range(0, ref.shape[0], rows):
            piece = FLOAT_ENCODERS[ggml_type](transform(planned, self.checkpoint.float32(ref, stored[start : start + rows])))
            if encoded is None:
                encoded = np.empty((ref.shape[0], *piece.shape[1:]), dtype=piece.dtype)
            encoded[start : start + rows] = piece
        return encoded

    def _read_float32(self, ref: TensorRef) -> np.ndarray:
        if ref.name not in self._readers_left:
            return self.checkpoint.read_float32(ref)
        with self._shared_lock:
            if ref.name not in self._shared:
                self._shared[ref.name] = self.checkpoint.read_float32(ref)
            self._readers_left[ref.name] -= 1
            return self._shared[ref.name] if self._readers_left[ref.name] else self._shared.pop(ref.name)

    def encoded(self, tensors: list[PlannedTensor], threads: int) -> Iterator[tuple[PlannedTensor, np.ndarray]]:
        """Encoded tensors in order; at most `threads + 1` in flight, so memory stays bounded."""
        with ThreadPoolExecutor(max_workers=threads) as pool:
            pending: deque[tuple[PlannedTensor, Future[np.ndarray]]] = deque()
            upcoming = iter(tensors)
            for planned in upcoming:
                pending.append((planned, pool.submit(self.encode, planned)))
                if len(pending) > threads:
                    yield pending[0][0], pending.popleft()[1].result()
            while pending:
                planned, future = pending.popleft()
                yield planned, future.result()


def add_sampling_defaults(writer: GGUFWriter, checkpoint: Checkpoint) -> None:
    """The maker's sampling defaults from generation_config.json as `general.sampling.*`, as llama.cpp's
    converter writes them (localchat and llama.cpp read them as the model's defaults)."""
    path = checkpoint.folder / "generation_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # as llama.cpp's converter: not every checkpoint's generation config is valid
    for key, value in generation_config_sampling(config if isinstance(config, dict) else {}).items():
        (writer.add_int32 if isinstance(value, int) else writer.add_float32)(key, value)


def model_name(name: str, tokens: list[str]) -> str:
    """general.name, unless llama.cpp would take it for Phi-3's and fail to load the vocabulary:
    it gives Phi-3's tokens their attributes in any model whose name contains "phi3" or "phi-3",
    looking each up by text. A vocabulary without them is not Phi-3's: the name loses the match."""
    if PHI3_NAME.search(name) and not set(PHI3_NAMED_TOKENS) <= set(tokens):
        return PHI3_NAME.sub(lambda found: found[0][:-1] + " " + found[0][-1], name)
    return name


def _write_float_gguf(
    checkpoint: Checkpoint,
    path: Path,
    float_type: GGMLQuantizationType,
    file_type: LlamaFileType,
    threads: int,
    progress: Progress,
) -> int:
    """Write the checkpoint as one float GGUF at `path`; returns the number of tensors."""
    config = checkpoint.config
    arch = architecture_for(config)
    tensors = plan_tensors(checkpoint, arch)
    n_vocab = next(p.shape[0] for p in tensors if p.gguf_name == "token_embd.weight")
    writer = GGUFWriter(None, arch.gguf_name)
    writer.add_type("model")
    tensors += add_hparams(config, arch, writer)
    writer.add_file_type(int(file_type))
    add_sampling_defaults(writer, checkpoint)
    vocabulary = add_tokenizer(writer, checkpoint, n_vocab, arch.tokenizer_model, arch.space_prefix_from_tokenizer_config)
    metadata = model_metadata(checkpoint, sum(math.prod(planned.shape) for planned in tensors if planned.data is None))
    metadata.name = model_name(metadata.name or "", vocabulary.tokens)
    metadata.set_gguf_meta_model(writer)
    tensor_writer = TensorWriter(checkpoint, float_type, tensors)
    total = sum(tensor_writer.add_info(writer, planned) for planned in tensors)
    done = 0
    writer.write_header_to_file(path)
    try:
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (planned, data) in enumerate(tensor_writer.encoded(tensors, threads)):
            writer.write_tensor_data(data)
            for ref in (*planned.sources, *planned.scales):
                checkpoint.release(ref)
            done += data.nbytes
            progress(done, total, f"tensor {i + 1}/{len(tensors)}")
        writer.flush()
    finally:
        writer.close()
    return len(tensors)


def quantize_gguf(source: Path, output: Path, quant: str, threads: int, progress: Progress | None = None,
                  keep_mxfp4: bool = False) -> None:
    """llama.cpp's quantizer (llama-quantize) on a float GGUF; `progress` watches the output grow. `keep_mxfp4`: the experts'
    stacks are MXFP4 (an MXFP4 checkpoint's) and stay so."""
    import llama_cpp

    from localchat.backends.llamacpp_natives import ensure_initialized

    ensure_initialized()  # routes llama.cpp's log to localchat's quiet logger
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(quant_type(quant).file_type)
    params.nthread = threads
    if keep_mxfp4:  # the quantizer reads the list (ended by a null pattern) while `kept` lives, to the end of this call
        kept = (llama_cpp.llama_model_tensor_override * 2)((EXPERT_STACKS, int(GGMLQuantizationType.MXFP4)), (None, 0))
        params.tt_overrides = kept
    status: list[int] = []
    worker = threading.Thread(
        target=lambda: status.append(llama_cpp.llama_model_quantize(str(source).encode(), str(output).encode(), ctypes.byref(params)))
    )
    worker.start()
    estimate = _estimated_bytes(source.stat().st_size, 16, quant_type(quant).bits_per_weight)
    while worker.is_alive():
        worker.join(0.2)
        if progress is not None and output.exists():
            progress(min(output.stat().st_size, estimate), estimate, f"quantizing to {quant.upper()}")
    if status != [0]:
        raise ModelError(f"llama.cpp could not quantize {source} to {quant} (status {status[0] if status else '?'})")
    if progress is not None:  # once at the end too: a small model is quantized before the first look
        size = output.stat().st_size
        progress(size, size, f"quantizing to {quant.upper()}")


def _estimated_bytes(float_bytes: int, float_bits: float, bits_per_weight: float) -> int:
    return int(float_bytes * bits_per_weight / float_bits)


def check_writable(folder: Path) -> None:
    """Before the disk-space check: a folder that takes no files (/proc, a read-only one) may show 0 bytes free."""
    try:
        with tempfile.TemporaryFile(dir=folder):  # unnamed where the filesystem allows, else removed at once
            pass
    except OSError as error:
        raise UnwritableFolderError(folder, error) from None


def _check_free_disk(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed + DISK_MARGIN_BYTES:
        raise LocalchatError(
            f"not enough disk space in {folder}: the conversion needs about {needed / 2**30:.2f} GiB "
            f"and {free / 2**30:.2f} GiB is free; free some space or choose another output with -o"
        )


def _intermediate_float_type(checkpoint: Checkpoint) -> GGMLQuantizationType:
    """bf16 checkpoints stay bf16 (exact); others go through f16, as llama.cpp's converter does."""
    matrices = [ref for ref in checkpoint if len(ref.shape) > 1 and ref.dtype in FLOAT_DTYPES]
    if matrices and all(ref.dtype == "BF16" for ref in matrices):
        return GGMLQuantizationType.BF16
    return GGMLQuantizationType.F16


def _silent(done: int, total: int, what: str) -> None:
    pass


def _make_folder(folder: Path) -> list[Path]:
    """Create `folder` and any missing parents; returns those created, deepest first."""
    missing = [parent for parent in (folder, *folder.parents) if not parent.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LocalchatError(f"cannot create the output folder {folder} ({error.strerror}); choose another path with -o") from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # something else was put there meanwhile: keep it
            return


def convert_checkpoint(
    source: Path,
    output: Path | None = None,
    quant: str = DEFAULT_QUANT,
    *,
    force: bool = False,
    threads: int | None = None,
    progress: Progress = _silent,
) -> ConversionResult:
    """Convert the checkpoint folder `source` to a GGUF file; returns where it went.

    The output's folder is created if missing (and removed again if the conversion fails).
    """
    started = time.perf_counter()
    choice = quant_type(quant)
    output = output or default_output_path(source.name, quant, source.parent)
    if output.exists() and not force:
        raise LocalchatError(f"{output} already exists; pass --force to overwrite it or choose another path with -o")
    if output.is_dir():
        raise LocalchatError(f"{output} is a folder; give the path of the GGUF file to write with -o")
    threads = threads or os.cpu_count() or 1
    checkpoint = Checkpoint(source, accept=architecture_for)
    created: list[Path] = []
    try:
        float_type = choice.float_type if choice.float_type is not None else _intermediate_float_type(checkpoint)
        float_bits = 8 * GGML_QUANT_SIZES[float_type][1]
        n_params = sum(ref.n_elements for ref in checkpoint)
        float_bytes = n_params * float_bits // 8
        final_bytes = _estimated_bytes(float_bytes, float_bits, choice.bits_per_weight)
        created = _make_folder(output.parent)
        check_writable(output.parent)
        _check_free_disk(output.parent, final_bytes + (float_bytes if choice.float_type is None else 0))

        partial = output.with_name(output.name + INCOMPLETE_SUFFIX)
        direct = choice.float_type is not None
        floats = partial if direct else output.with_name(f"{output.name}.{float_type.name.lower()}{INCOMPLETE_SUFFIX}")
        try:
            n_tensors = _write_float_gguf(checkpoint, floats, float_type, choice.file_type, threads, progress)
            checkpoint.close()
            if not direct:
                quantize_gguf(floats, partial, quant, threads, progress, keep_mxfp4=checkpoint.config.mxfp4)
            os.replace(partial, output)
        finally:
            # Reached on success too: by then both names are gone or the float file is spare.
            floats.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)
    except BaseException:
        _remove_empty(created)
        raise
    finally:
        checkpoint.close()
    return ConversionResult(output, quant, n_tensors, output.stat().st_size, time.perf_counter() - started,
                            wrapper_notice(checkpoint.config))
