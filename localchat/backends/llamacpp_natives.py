"""The llama.cpp backend's native objects, each with one owner that frees it once (model, context,
batch, LoRA adapter), how a load's parameters reach them (layers, splits, experts left in RAM), the
library (initialized once, what its build can do), and llama.cpp's log, whose recent errors explain a
failed load.

`open_model` loads a model and makes its context: the long part of opening a backend. Neither it nor
planning imports numpy, so a load starts before the rest of the backend is imported, which goes on
beside it (localchat.model_loading).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from localchat.backends import _llama_log
from localchat.backends.base import (
    DRY_SEQUENCE_BREAKERS,
    ROW_LIMIT,
    BuildFeatures,
    FlashAttn,
    KvType,
    LoadParams,
    SamplerSettings,
)
from localchat.background import started
from localchat.errors import ModelError
from localchat.file_facts import FileVersion, remembered
from localchat.gguf_file import ROUTED_EXPERT_TENSOR

# Tokens per llama_decode call when evaluating a prompt.
PROMPT_BATCH = 512

# The planner's KV cache types and flash attention settings in llama.cpp's terms.
KV_CACHE_TYPES: dict[KvType, int] = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}
FLASH_ATTN_TYPES: dict[FlashAttn, int] = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
}

# llama.cpp's logger is process-global; it keeps the recent errors that explain a failed load (in C: see
# _llama_log.c) and drops the rest.
log_callback = llama_cpp.llama_log_callback(_llama_log.callback_address())


def llama_errors() -> str | None:
    """What llama.cpp logged as errors since the errors were last cleared, in one line; None if nothing."""
    return "; ".join(_llama_log.recent_errors()) or None


# The llama.cpp library loaded: a rebuild or another release is another file. (llama-cpp-python's own
# `__version__` is not read: asking the package for it imports all of it, Llama and jinja2.)
_LIBRARY_VERSION = FileVersion.of(Path(llama_cpp.llama_cpp._lib._name))
_init_lock = threading.Lock()
_initialized = False


def ensure_initialized() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            # CUDA numbers GPUs fastest first unless told otherwise; the planner's GPU numbers
            # (hardware.nvidia_gpus) follow the PCI bus. Read when CUDA starts, below.
            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            llama_cpp.llama_log_set(log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialized = True


def build_features() -> BuildFeatures:
    ensure_initialized()
    info = llama_cpp.llama_print_system_info().decode()
    gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
    return BuildFeatures(
        gpu_offload=gpu_offload,
        amx="AMX_INT8 = 1" in info,
        description=info.strip().rstrip("|").strip(),
        # llama.cpp's GPU backends (CUDA, Metal, Vulkan, HIP) all implement flash attention.
        flash_attn=gpu_offload,
    )


def end_of_generation_ids(vocab: llama_cpp.llama_vocab_p) -> frozenset[int]:
    """The tokens llama.cpp ends a reply at (none asked past 300k tokens: a vocabulary that large is not a
    chat model's)."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    if n_vocab > 300_000:
        return frozenset()
    return frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))


def remembered_end_of_generation_ids(path: Path, version: FileVersion | None, vocab: llama_cpp.llama_vocab_p) -> frozenset[int]:
    """end_of_generation_ids of `vocab`, loaded from `version` of the file at `path`, kept for the next start
    with this file and this llama.cpp (localchat.file_facts)."""
    kind = f"end-of-generation ids, {_LIBRARY_VERSION}"
    return frozenset(remembered(path, kind, lambda: sorted(end_of_generation_ids(vocab)), version=version))


def place_layers(params: llama_cpp.llama_model_params, load: LoadParams) -> ctypes.Array[ctypes.c_float] | None:
    """Set where `load` puts the layers: on one GPU alone, or split across GPUs by
    `load.tensor_split`. Returns the split's C array, which must outlive the load."""
    params.n_gpu_layers = load.n_gpu_layers
    if load.gpu_index is None:
        return None
    params.main_gpu = load.gpu_index
    if not load.tensor_split:
        # Layer mode (the default) would spread the layers over every GPU by free memory.
        params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
        return None
    params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
    split = (ctypes.c_float * llama_cpp.llama_max_devices())(*load.tensor_split)
    params.tensor_split = split
    return split


class _TensorBufferOverride(ctypes.Structure):
    """llama.cpp's llama_model_tensor_buft_override: tensors matching `pattern` go to `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def experts_in_ram_pattern(n_layers: int) -> str:
    """The regex llama.cpp matches against tensor names: the routed experts of the first `n_layers`."""
    return rf"^blk\.({'|'.join(map(str, range(n_layers)))}){ROUTED_EXPERT_TENSOR.pattern}"


def keep_experts_in_ram(params: llama_cpp.llama_model_params, load: LoadParams) -> ctypes.Array[_TensorBufferOverride] | None:
    """Point llama.cpp's tensor buffer overrides at the CPU for the experts `load` leaves in RAM
    (llama-server's --n-cpu-moe). Returns the NULL-terminated C array, which must outlive the load."""
    if not load.n_cpu_moe:
        return None
    from llama_cpp._ggml import libggml  # ggml's own library: llama_cpp binds none of its buffer types

    cpu_buffer_type = libggml.ggml_backend_cpu_buffer_type
    cpu_buffer_type.restype = ctypes.c_void_p
    overrides = (_TensorBufferOverride * 2)()
    overrides[0].pattern = experts_in_ram_pattern(load.n_cpu_moe).encode()
    overrides[0].buft = cpu_buffer_type()
    params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    return overrides


def missing_special_token(vocab: llama_cpp.llama_vocab_p) -> str | None:
    """The special token llama.cpp would add while tokenizing but the vocabulary lacks: it asserts
    on that, aborting the process (WPM vocabularies always add BOS and SEP)."""
    wpm = llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_WPM
    needed = {
        "BOS": (wpm or llama_cpp.llama_vocab_get_add_bos(vocab), llama_cpp.llama_vocab_bos(vocab)),
        "EOS": (not wpm and llama_cpp.llama_vocab_get_add_eos(vocab), llama_cpp.llama_vocab_eos(vocab)),
        "SEP": (wpm, llama_cpp.llama_vocab_sep(vocab)),
    }
    return next((name for name, (added, token) in needed.items() if added and token < 0), None)


class LlamaLoraAdapter:
    """A LoRA adapter loaded for a model; owns its llama_adapter_lora, freed once by `close` (before
    the model: llama.cpp frees adapters left with their model, so a later free would be a second)."""

    def __init__(self, model: llama_cpp.llama_model_p, path: Path, model_architecture: str) -> None:
        from localchat.gguf_file import read_gguf_header

        header = read_gguf_header(path)
        if header.get("general.type") != "adapter" or header.get("adapter.type") != "lora":
            raise ModelError(f"{path} is not a LoRA adapter (general.type {header.get('general.type')!r}); "
                             "give the model with -m and its adapters with --lora")
        if header.architecture != model_architecture:
            raise ModelError(f"{path} is a LoRA adapter for {header.architecture} models and the model is {model_architecture}; "
                             "an adapter works only with the base model it was made for")
        _llama_log.clear_errors()
        self.path = path
        self.pointer = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
        if not self.pointer:
            detail = llama_errors() or "no detail from llama.cpp"
            raise ModelError(f"llama.cpp cannot apply the LoRA adapter {path} to this model ({detail}); "
                             "an adapter works only with the base model it was made for")

    def close(self) -> None:
        if self.pointer:
            llama_cpp.llama_adapter_lora_free(self.pointer)
            self.pointer = None


class LlamaModel:
    """A loaded llama_model; frees it once."""

    def __init__(self, path: Path, load: LoadParams, on_progress: Callable[[float], None] | None) -> None:
        params = llama_cpp.llama_model_default_params()
        # The split's and the overrides' C arrays and the progress callback must outlive the load call.
        self._split = place_layers(params, load)
        self._buffer_overrides = keep_experts_in_ram(params, load)
        params.use_extra_bufts = load.use_extra_bufts
        if on_progress is not None:
            self._progress = llama_cpp.llama_progress_callback(lambda value, _data: (on_progress(value), True)[1])
            params.progress_callback = self._progress
        _llama_log.clear_errors()
        self.pointer = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.pointer:
            detail = llama_errors() or "no detail from llama.cpp"
            raise ModelError(f"llama.cpp could not load {path}: {detail}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.pointer)

    def close(self) -> None:
        if self.pointer:
            llama_cpp.llama_model_free(self.pointer)
            self.pointer = None


class LlamaContext:
    """A llama_context on a model (its KV cache and compute buffers); frees it once."""

    def __init__(self, model: LlamaModel, load: LoadParams, path: Path) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = load.n_ctx
        params.n_batch = PROMPT_BATCH
        params.n_ubatch = PROMPT_BATCH
        params.n_seq_max = load.n_seq
        params.n_threads = load.n_threads
        params.n_threads_batch = load.n_threads_batch
        params.no_perf = True
        params.type_k = params.type_v = KV_CACHE_TYPES[load.kv_type]
        params.flash_attn_type = FLASH_ATTN_TYPES[load.flash_attn]
        # A full-size sliding-window cache lets any KV range be dropped, so a turn can always
        # keep its common prefix (a windowed one forgets old positions and cannot roll back).
        params.swa_full = True
        # Sequences share all n_ctx cells instead of n_ctx / n_seq each.
        params.kv_unified = True
        if load.backend_sampling:
            # A draft's rows are sampled on the device too (llama.cpp's default: one output a sequence).
            params.n_outputs_max_per_seq = ROW_LIMIT
        self.pointer = llama_cpp.llama_init_from_model(model.pointer, params)
        if not self.pointer:
            detail = llama_errors() or "out of memory?"
            raise ModelError(f"llama.cpp could not create a {load.n_ctx}-token context for {path}: {detail}")

    def close(self) -> None:
        if self.pointer:
            llama_cpp.llama_free(self.pointer)
            self.pointer = None


class LlamaBatch:
    """A preallocated llama_batch of `capacity` tokens; frees it once."""

    def __init__(self, capacity: int) -> None:
        self.batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        self._freed = False

    def close(self) -> None:
        if not self._freed:
            llama_cpp.llama_batch_free(self.batch)
            self._freed = True


# The metadata a ModelInfo carries: the model's name and family, and its sampling defaults.
METADATA_PREFIX = "general."

# A DRY sampler's parameters: multiplier, base, allowed length and the window it looks back on.
DryKey = tuple[float, float, int, int]


def general_metadata(model: llama_cpp.llama_model_p) -> dict[str, str]:
    """The model's general.* keys (arrays such as general.tags read as llama.cpp prints them)."""
    found: dict[str, str] = {}
    buffer = ctypes.create_string_buffer(1024)
    for i in range(llama_cpp.llama_model_meta_count(model)):
        if llama_cpp.llama_model_meta_key_by_index(model, i, buffer, len(buffer)) < 0:
            continue
        key = buffer.value.decode("utf-8", errors="replace")
        if key.startswith(METADATA_PREFIX) and llama_cpp.llama_model_meta_val_str_by_index(model, i, buffer, len(buffer)) >= 0:
            found[key] = buffer.value.decode("utf-8", errors="replace")
    return found


def dry_key(settings: SamplerSettings, n_ctx: int) -> DryKey:
    # This build's DRY takes no context size to stand for -1: the window is given whole.
    window = n_ctx if settings.dry_penalty_last_n < 0 else settings.dry_penalty_last_n
    return settings.dry_multiplier, settings.dry_base, settings.dry_allowed_length, window


def start_dry(vocab: llama_cpp.llama_vocab_p, key: DryKey) -> Future[llama_cpp.llama_sampler_p]:
    """A DRY sampler with these parameters, made on a thread of its own: llama.cpp finds the tokens
    holding a sequence breaker by reading the whole vocabulary (50 ms for 262k tokens); a copy of
    it takes 0.2 ms. Free it with `free_when_made`, before the model."""
    multiplier, base, allowed_length, window = key
    breakers = (ctypes.c_char_p * len(DRY_SEQUENCE_BREAKERS))(*(b.encode() for b in DRY_SEQUENCE_BREAKERS))
    return started(lambda: llama_cpp.llama_sampler_init_dry(vocab, multiplier, base, allowed_length, window,
                                                            breakers, len(breakers)), "llama.cpp-dry")


def free_when_made(making: Future[llama_cpp.llama_sampler_p]) -> None:
    llama_cpp.llama_sampler_free(making.result())


@dataclass
class OpenedModel:
    """A model loaded and its context made (`open_model`), for a backend to own: `natives` frees them,
    the LoRA adapters loaded on the model and the DRY samplers made for it, in order; `close` frees
    them unused. `dry_samplers`: the model's default sampler's DRY, begun while the context was made."""

    path: Path
    load: LoadParams
    natives: ExitStack
    model: LlamaModel
    context: LlamaContext
    loras: list[LlamaLoraAdapter]
    eog_ids: frozenset[int]
    metadata: dict[str, str]
    dry_samplers: dict[DryKey, Future[llama_cpp.llama_sampler_p]]

    def close(self) -> None:
        self.natives.close()


def _close_each(adapters: list[LlamaLoraAdapter]) -> None:
    for adapter in adapters:
        adapter.close()


def open_model(path: Path, load: LoadParams, on_progress: Callable[[float], None] | None = None,
               first_sampler: Callable[[Mapping[str, str]], SamplerSettings] | None = None) -> OpenedModel:
    """The model at `path` loaded with `load`, and its context. `first_sampler`: the sampler the first replies
    will use, from the model's general.* metadata; its DRY (50 ms of Gemma 3 270M's first reply, were it made
    by that reply) is begun beside the context."""
    ensure_initialized()
    natives = ExitStack()
    try:
        version = FileVersion.of(path)  # what the model is loaded from (a file replaced meanwhile is another)
        model = LlamaModel(path, load, on_progress)
        natives.callback(model.close)
        # LoRA adapters are freed after the context that applied them, before the model: llama.cpp
        # frees those left with their model, so a later free would be a second.
        loras: list[LlamaLoraAdapter] = []
        natives.callback(_close_each, loras)
        if missing := missing_special_token(model.vocab):
            raise ModelError(f"{path}'s tokenizer adds a {missing} token it does not have; download or convert it again")
        metadata = general_metadata(model.pointer)
        dry_samplers: dict[DryKey, Future[llama_cpp.llama_sampler_p]] = {}
        if first_sampler is not None and (first := first_sampler(metadata)).dry:
            key = dry_key(first, load.n_ctx)
            dry_samplers[key] = making = start_dry(model.vocab, key)
            natives.callback(free_when_made, making)
        # llama.cpp lists its end-of-generation tokens to no one: they are asked one by one (0.1 s on a 262k
        # vocabulary), on a thread of their own while the context is made, which holds no GIL.
        eog = started(lambda: remembered_end_of_generation_ids(path, version, model.vocab), "llama.cpp-vocabulary")
        try:
            context = LlamaContext(model, load, path)
            natives.callback(context.close)
        finally:
            eog_ids = eog.result()  # either way: the scan reads the vocabulary a failure would free
        return OpenedModel(path, load, natives, model, context, loras, eog_ids, metadata, dry_samplers)
    except BaseException:
        natives.close()
        raise
