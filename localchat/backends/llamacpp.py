"""The llama.cpp backend, over llama-cpp-python's low-level (ctypes) API.

All ctypes details live here and in llamacpp_sampler.py. Each native object (model, context, batch,
sampler) has one owner that frees it once, through the backend's ExitStack. The per-token path is: a
numpy view of the logits row (cached across steps), one numpy argmax for plain greedy decoding or
llama.cpp's sampler chain on a few candidates (LlamaSampler), one cached token piece, one
`llama_decode` on a preallocated batch.
"""

from __future__ import annotations

import ctypes
import os
import threading
import typing
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import llama_cpp
import numpy as np

from localchat.backends.base import (
    DRY_SEQUENCE_BREAKERS,
    ROW_LIMIT,
    BuildFeatures,
    FlashAttn,
    KvType,
    LoadParams,
    LoraScales,
    ModelInfo,
    SamplerSettings,
    TokenGuide,
    TokenScores,
    score_rows,
)
from localchat.backends.llamacpp_embeddings import LlamaEmbedder, open_embedder
from localchat.backends.llamacpp_sampler import DeviceSampler, LlamaSampler, device_chain, device_sampleable
from localchat.errors import ContextOverflowError, InferenceError, ModelError
from localchat.gguf_file import ROUTED_EXPERT_TENSOR

# Tokens per llama_decode call when evaluating a prompt.
PROMPT_BATCH = 512
# Rows of logits read back per decode when scoring (each row is n_vocab floats).
SCORE_CHUNK = 64

# The planner's KV cache types and flash attention settings in llama.cpp's terms.
KV_CACHE_TYPES: dict[KvType, int] = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}
FLASH_ATTN_TYPES: dict[FlashAttn, int] = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
}

GGML_LOG_LEVEL_ERROR = 4  # enum ggml_log_level (NONE, DEBUG, INFO, WARN, ERROR, CONT)
# The metadata a ModelInfo carries: the model's name and family, and its sampling defaults.
METADATA_PREFIX = "general."
# llama_get_logits with its pointer as a plain address, to see cheaply whether the buffer moved.
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", llama_cpp.llama_cpp._lib))
_init_lock = threading.Lock()
_initialized = False
# llama.cpp's logger is process-global; keep its recent errors to explain a failed load.
_recent_errors: deque[str] = deque(maxlen=8)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if text and level == GGML_LOG_LEVEL_ERROR:
        _recent_errors.append(text.decode("utf-8", errors="replace").strip())


class _ComputeThread:
    """The one thread that runs every llama_decode of the process, whichever thread asks.

    llama.cpp's CPU backend (built with OpenMP) keeps a thread team per thread that calls it. Once
    two teams are alive, libgomp counts more threads than cores and stops spinning at barriers, so
    each of a graph's hundreds of barriers sleeps and wakes: a server that warmed its model on one
    thread and decoded on another ran at 31 tok/s against 44 (2 cores, the default model). One
    calling thread keeps one team, as in llama-server, whose main loop does all the decoding.
    """

    def __init__(self) -> None:
        self._ident: int | None = None
        self._executor = ThreadPoolExecutor(1, "llama.cpp-compute", initializer=self._started)

    def _started(self) -> None:
        self._ident = threading.get_ident()

    def adopt_current_thread(self) -> None:
        """Make the calling thread the compute thread, for a command that decodes on no other (`localchat
        run`, `bench`): its decodes then run in place, without two thread switches each (20-40 us a token,
        a few percent of a GPU step). Only before any decode: the executor's thread would be a second team."""
        if self._ident is None:
            self._ident = threading.get_ident()

    def run(self, call: Callable[[], int]) -> int:
        """`call()` on the compute thread. A Ctrl-C while it runs takes effect once it has returned,
        as it would on the caller's own thread, so no decode is left running behind the caller."""
        if threading.get_ident() == self._ident:
            return call()
        future: Future[int] = self._executor.submit(call)
        interrupted = False
        while True:
            try:
                result = future.result()
                break
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt
        return result


_compute = _ComputeThread()


def decode_on_this_thread() -> None:
    """See `_ComputeThread.adopt_current_thread`."""
    _compute.adopt_current_thread()


def ensure_initialized() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            # CUDA numbers GPUs fastest first unless told otherwise; the planner's GPU numbers
            # (hardware.nvidia_gpus) follow the PCI bus. Read when CUDA starts, below.
            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
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
        version=llama_cpp.__version__,
    )


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


def _missing_special_token(vocab: llama_cpp.llama_vocab_p) -> str | None:
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
        _recent_errors.clear()
        self.path = path
        self.pointer = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
        if not self.pointer:
            detail = "; ".join(_recent_errors) or "no detail from llama.cpp"
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
        _recent_errors.clear()
        self.pointer = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.pointer:
            detail = "; ".join(_recent_errors) or "no detail from llama.cpp"
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
            detail = "; ".join(_recent_errors) or "out of memory?"
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


class LlamaCppBackend:
    """A GGUF model and its context, loaded with the settings of a `Plan`."""

    name = "llama.cpp"
    # The CPU kernels take longer for an odd count of rows with logits than for one more, whether
    # the rows are one sequence's draft or a batch of sequences (benchmarks/speculative.py
    # --step-cost; default model, AMD EPYC, 2 threads: 3 tokens 60 ms, 4 tokens 51; 9 tokens 108,
    # 10 tokens 103; 25 tokens 241, 26 tokens 222; 3 sequences 59 ms, 4 sequences 52; 5 sequences
    # 78, 6 sequences 67). The same with the extra buffer types off, as on AMX CPUs (3 tokens 63 ms,
    # 4 tokens 54). The 262k-row output head is most of it: with it cut to 32k rows, 3 tokens take
    # 20 ms and 4 tokens 21.
    even_rows = True

    def __init__(self, path: Path, load: LoadParams, *, on_progress: Callable[[float], None] | None = None) -> None:
        ensure_initialized()
        self.load = load
        self._natives = ExitStack()
        try:
            self._open(path, load, on_progress)
        except BaseException:
            self._natives.close()
            raise

    def _open(self, path: Path, load: LoadParams, on_progress: Callable[[float], None] | None) -> None:
        model = self._model = self._owned(LlamaModel(path, load, on_progress))
        # LoRA adapters (load_lora) are freed after the context that applied them, before the model:
        # llama.cpp frees those left with their model, so a later free would be a second.
        self._loras: list[LlamaLoraAdapter] = []
        self._natives.callback(self._close_loras)
        self._vocab = model.vocab
        if missing := _missing_special_token(self._vocab):
            raise ModelError(f"{path}'s tokenizer adds a {missing} token it does not have; download or convert it again")
        self._ctx = self._owned(LlamaContext(model, load, path)).pointer
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        # llama.cpp caps the batch at the context size and aborts on a larger one.
        self._n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_seq = load.n_seq
        self._batch = self._owned(LlamaBatch(max(PROMPT_BATCH, load.n_seq))).batch
        self._output_index: dict[int, int] = {}
        self._first_row: dict[int, int] = {}
        self._n_outputs = 0  # rows of logits the last decode kept
        self._logits_view: tuple[int, int, np.ndarray] | None = None  # (address, rows, view)
        self._piece_cache: dict[int, bytes] = {}
        self._piece_buffer = ctypes.create_string_buffer(256)
        self._dry_samplers: dict[tuple[float, float, int, int], llama_cpp.llama_sampler_p] = {}
        # Sampler chains attached to sequences for backend sampling (load.backend_sampling), with their settings.
        self._attached: dict[int, tuple[SamplerSettings, llama_cpp.llama_sampler_p]] = {}
        self._natives.callback(self._detach_all)
        self._embedder: LlamaEmbedder | None = None
        self._embedder_lock = threading.Lock()
        self._lora_scales: LoraScales = ()
        self.info = self._read_info(path)

    def _owned(self, native: LlamaModel | LlamaContext | LlamaBatch) -> typing.Any:
        """`native`, freed when the backend closes (the last owned first)."""
        self._natives.callback(native.close)
        return native

    # -- model facts ---------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        buffer = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model.pointer, key.encode(), buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace") if n >= 0 else None

    def _general_metadata(self) -> dict[str, str]:
        """The model's general.* keys (arrays such as general.tags read as llama.cpp prints them)."""
        found: dict[str, str] = {}
        buffer = ctypes.create_string_buffer(1024)
        model = self._model.pointer
        for i in range(llama_cpp.llama_model_meta_count(model)):
            if llama_cpp.llama_model_meta_key_by_index(model, i, buffer, len(buffer)) < 0:
                continue
            key = buffer.value.decode("utf-8", errors="replace")
            if key.startswith(METADATA_PREFIX) and llama_cpp.llama_model_meta_val_str_by_index(model, i, buffer, len(buffer)) >= 0:
                found[key] = buffer.value.decode("utf-8", errors="replace")
        return found

    def _read_info(self, path: Path) -> ModelInfo:
        n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        eog = frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)) if n_vocab <= 300_000 else frozenset()
        template = llama_cpp.llama_model_chat_template(self._model.pointer, None)
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        return ModelInfo(
            path=path,
            name=self._meta("general.name") or path.stem,
            architecture=self._meta("general.architecture") or "unknown",
            n_vocab=n_vocab,
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(self._model.pointer),
            n_layers=llama_cpp.llama_model_n_layer(self._model.pointer),
            bos_id=bos if bos >= 0 else None,
            eos_id=eos if eos >= 0 else None,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(self._vocab)),
            eog_ids=eog,
            chat_template=template.decode("utf-8", errors="replace") if template else None,
            size_bytes=llama_cpp.llama_model_size(self._model.pointer),
            metadata=self._general_metadata(),
        )

    # -- text ----------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_bos, special)
        if n < 0:
            capacity = -n
            tokens = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_bos, special)
        return list(tokens[:n])

    def _piece(self, token: int, *, special: bool) -> bytes:
        buffer = self._piece_buffer
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        return buffer.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token, special=False)
        return piece

    def token_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", errors="replace")

    # -- KV cache ------------------------------------------------------------------

    def _decode(self, n_tokens: int, n_outputs: int) -> None:
        self._batch.n_tokens = n_tokens
        self._n_outputs = n_outputs
        status = _compute.run(lambda: llama_cpp.llama_decode(self._ctx, self._batch))
        if status == 1:
            raise ContextOverflowError(f"the context is full ({self.n_ctx} tokens); start a new chat or raise --ctx")
        if status != 0:
            raise InferenceError(f"llama.cpp failed to evaluate tokens (llama_decode status {status})")

    def evaluate(self, seq: int, tokens: Sequence[int], start: int, *, all_logits: bool = False) -> None:
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(tokens)} tokens do not fit in the {self.n_ctx}-token context; "
                "shorten the prompt or raise --ctx"
            )
        batch = self._batch
        chunk = min(SCORE_CHUNK if all_logits else PROMPT_BATCH, self._n_batch)
        for offset in range(0, len(tokens), chunk):
            part = tokens[offset : offset + chunk]
            last = offset + len(part) == len(tokens)
            for i, token in enumerate(part):
                batch.token[i] = token
                batch.pos[i] = start + offset + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = all_logits or (last and i == len(part) - 1)
            self._decode(len(part), len(part) if all_logits else int(last))
        self._output_index = {seq: self._n_outputs - 1}

    def evaluate_batch(self, items: Sequence[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        rows = list(items)
        filler = (spare_cell and len(rows) > 1 and len(rows) % 2 == 1 and len(rows) < self._n_batch
                  and rows[0][2] + 1 < self.n_ctx)
        if filler:  # the first sequence's token once more, one position on; dropped after the step
            seq, token, position = rows[0]
            rows.append((seq, token, position + 1))
        if len(rows) > self._n_batch:
            raise ValueError(f"{len(items)} sequences exceed the batch of {self._n_batch}")
        batch = self._batch
        for i, (seq, token, position) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = True
        self._decode(len(rows), len(rows))
        self._output_index = {seq: i for i, (seq, _, _) in enumerate(items)}
        if filler:
            self.truncate(rows[-1][0], rows[-1][2])

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        """As the interface says; for a sequence sampled on the device the rows are not read back (an
        empty array: the device drew each row's token)."""
        chunk = min(ROW_LIMIT, self._n_batch)
        rows = []
        for offset in range(0, len(tokens), chunk):
            part = tokens[offset : offset + chunk]
            self.evaluate(seq, part, start + offset, all_logits=True)
            if seq in self._attached:
                rows.append(np.empty((len(part), 0), dtype=np.float32))
                continue
            view = self._logits_rows()
            # Earlier chunks' rows are overwritten by the next decode: copied.
            rows.append(view if offset + chunk >= len(tokens) else view.copy())
        # Row r of the call is output r - first of llama.cpp's last decode.
        self._first_row = {seq: len(tokens) - len(rows[-1])}
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def truncate(self, seq: int, start: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, start, -1):
            # Cannot happen with swa_full; clearing the whole sequence always works.
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            raise InferenceError(f"llama.cpp could not drop positions {start}.. of sequence {seq}")

    # -- sampling ------------------------------------------------------------------

    def make_sampler(self, settings: SamplerSettings, guide: TokenGuide | None = None, *, seq: int | None = None,
                     raw_logits: bool = False) -> LlamaSampler | DeviceSampler:
        """A sampler for a reply on `seq`. Where the plan samples on the device (the output layer on a
        GPU) and the reply allows it (device_sampleable), llama.cpp samples inside its graph."""
        if self.load.backend_sampling and seq is not None and device_sampleable(settings, guide, raw_logits):
            chain = self._attach(seq, settings)
            if chain is not None:
                return DeviceSampler(settings, chain, self._ctx)
        if seq is not None:
            self._detach(seq)  # sampling on the host needs the raw logits
        return LlamaSampler(settings, self.info.n_vocab, self._dry_sampler(settings) if settings.dry else None, guide)

    def _attach(self, seq: int, settings: SamplerSettings) -> llama_cpp.llama_sampler_p | None:
        """The device chain for `settings` attached to `seq`: the one attached if its settings are the same
        (reset: attaching another makes llama.cpp reserve its graph again), else a new one; None if llama.cpp
        cannot run it on the device."""
        attached = self._attached.get(seq)
        if attached is not None and attached[0] == settings:
            llama_cpp.llama_sampler_reset(attached[1])
            return attached[1]
        self._detach(seq)
        chain = device_chain(settings)
        if not llama_cpp.llama_set_sampler(self._ctx, seq, chain):
            llama_cpp.llama_sampler_free(chain)
            return None
        self._attached[seq] = (settings, chain)
        return chain

    def _detach(self, seq: int) -> None:
        attached = self._attached.pop(seq, None)
        if attached is not None:
            llama_cpp.llama_set_sampler(self._ctx, seq, None)
            llama_cpp.llama_sampler_free(attached[1])

    def _detach_all(self) -> None:
        for seq in list(self._attached):
            self._detach(seq)

    def _dry_sampler(self, settings: SamplerSettings) -> llama_cpp.llama_sampler_p:
        """A DRY sampler for these parameters, made once: llama.cpp finds the tokens holding a
        sequence breaker by reading the whole vocabulary (0.2 s for 262k tokens), a copy takes 0.2 ms."""
        # This build's DRY takes no context size to stand for -1: the window is given whole.
        window = self.n_ctx if settings.dry_penalty_last_n < 0 else settings.dry_penalty_last_n
        key = (settings.dry_multiplier, settings.dry_base, settings.dry_allowed_length, window)
        sampler = self._dry_samplers.get(key)
        if sampler is None:
            breakers = (ctypes.c_char_p * len(DRY_SEQUENCE_BREAKERS))(*(b.encode() for b in DRY_SEQUENCE_BREAKERS))
            sampler = self._dry_samplers[key] = llama_cpp.llama_sampler_init_dry(
                self._vocab, settings.dry_multiplier, settings.dry_base, settings.dry_allowed_length, window,
                breakers, len(breakers),
            )
            self._natives.callback(llama_cpp.llama_sampler_free, sampler)
        return sampler

    def _index(self, seq: int, row: int) -> int:
        """The output row of `seq`'s last token, or of row `row` of `evaluate_all`."""
        if row < 0:
            return self._output_index[seq]
        index = row - self._first_row[seq]
        if index < 0:
            raise ValueError(f"row {row} of the last evaluation is no longer held (only the last {ROW_LIMIT} are)")
        return index

    def _logits_rows(self) -> np.ndarray:
        """The last decode's rows of logits, `(n_outputs, n_vocab)`: a view kept while llama.cpp keeps
        its buffer where it was (making one costs 12 us, a sixth of sampling a token)."""
        address = _logits_address(self._ctx)  # waits for the decode, as llama_get_logits does
        cached = self._logits_view
        if cached is None or cached[0] != address or cached[1] < self._n_outputs:
            pointer = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = np.ctypeslib.as_array(pointer, shape=(self._n_outputs, self.info.n_vocab))
            cached = self._logits_view = (address, self._n_outputs, view)
        return cached[2][: self._n_outputs]

    def sample(self, seq: int, sampler: LlamaSampler | DeviceSampler, row: int = -1) -> int:  # type: ignore[override]
        if isinstance(sampler, DeviceSampler):
            # Counted back from the last output row: llama.cpp reads a positive index as a batch position.
            return sampler.pick_output(self._index(seq, row) - self._n_outputs)
        return sampler.pick(self.logits(seq, row))

    def logits(self, seq: int, row: int = -1) -> np.ndarray:
        if seq in self._attached:
            raise ValueError(f"sequence {seq} is sampled on the device: its raw logits were not read back")
        return self._logits_rows()[self._index(seq, row)]

    def score(self, seq: int, tokens: Sequence[int]) -> TokenScores:
        self._detach(seq)
        self.truncate(seq, 0)
        logprobs = np.empty(len(tokens) - 1, dtype=np.float64)
        top1 = np.empty(len(tokens) - 1, dtype=np.int64)
        chunk = min(SCORE_CHUNK, self._n_batch)
        for offset in range(0, len(tokens), chunk):
            part = tokens[offset : offset + chunk]
            self.evaluate(seq, part, offset, all_logits=True)
            logits = self._logits_rows()
            # Row i predicts token offset + i + 1.
            rows = min(len(part), len(tokens) - 1 - offset)
            if rows <= 0:
                break
            targets = np.asarray(tokens[offset + 1 : offset + 1 + rows])
            logprobs[offset : offset + rows], top1[offset : offset + rows] = score_rows(logits[:rows], targets)
        return TokenScores(logprobs=logprobs, top1=top1)

    # -- state ---------------------------------------------------------------------

    def save_state(self, seq: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        return bytes(memoryview(buffer)[:written])

    def restore_state(self, seq: int, state: bytes) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
        source = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if llama_cpp.llama_state_seq_set_data(self._ctx, source, len(state), seq) == 0:
            raise InferenceError("llama.cpp refused a saved KV state (different model or context?)")

    # -- LoRA adapters -------------------------------------------------------------

    def load_lora(self, path: Path) -> int:
        self._loras.append(LlamaLoraAdapter(self._model.pointer, path, self.info.architecture))
        return len(self._loras) - 1

    def use_loras(self, scales: LoraScales) -> None:
        # llama.cpp re-plans its compute graph after a change: only a change is passed on.
        if scales == self._lora_scales:
            return
        n = len(scales)
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(self._loras[i].pointer for i, _ in scales)) if n else None
        values = (ctypes.c_float * n)(*(scale for _, scale in scales)) if n else None
        llama_cpp.llama_set_adapters_lora(self._ctx, adapters, n, values)
        self._lora_scales = scales

    def _close_loras(self) -> None:
        for adapter in self._loras:
            adapter.close()

    # -- embeddings and closing ----------------------------------------------------

    def embedder(self) -> LlamaEmbedder:
        """The model's embeddings context, made on first use (localchat/backends/llamacpp_embeddings.py)
        and owned as the other natives are: freed before the model it was made on."""
        with self._embedder_lock:
            if self._embedder is None:
                self._embedder = open_embedder(self._model.pointer, self._meta, self.info.architecture, self.n_ctx,
                                               self.load.n_threads, self.load.n_threads_batch, _compute.run)
                self._natives.callback(self._embedder.close)
            return self._embedder

    def close(self) -> None:
        """Free the batch, the context, the model and the DRY samplers, each once."""
        natives = getattr(self, "_natives", None)
        if natives is not None:
            natives.close()
            self._logits_view = None

    def __del__(self) -> None:
        self.close()
