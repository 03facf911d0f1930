"""The onnxruntime backend, for model folders made by `localchat convert --to onnx`.

The KV cache is one buffer per layer and kind, (n_seq, kv_heads, n_ctx + 1, head_dim), allocated
once. GroupQueryAttention reads and writes it in place: every run binds the same memory as past
and present, so a token costs no cache copy. A sequence's length is just a number here:
truncating to a common prefix is setting it. Logits land in a preallocated (n_seq, vocab) array.
"""

from __future__ import annotations

import ctypes
import json
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np
import onnxruntime as ort

from localchat.backends.base import (
    DRY_SEQUENCE_BREAKERS,
    BuildFeatures,
    LoadParams,
    LoraScales,
    ModelFacts,
    ModelInfo,
    SamplerSettings,
    TokenGuide,
    TokenScores,
)
from localchat.backends.logprobs import score_rows
from localchat.backends.numpy_sampler import NumpySampler
from localchat.errors import ContextOverflowError, InferenceError, InvalidSettingError, ModelError, UnsupportedError
from localchat.onnx_format import (
    KV_DTYPES,
    ONNX_MARKER,
    TOKENIZER_FILE,
    OnnxMetadata,
    describe_weight_formats,
    read_metadata,
    rotary_input_names,
    rotary_tables,
)
from localchat.gguf_file import generation_config_sampling

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Tokens per run when evaluating a prompt (bounds the activations, not the cache).
PROMPT_CHUNK = 512
# Positions whose logits are read back per run when scoring (each row is n_vocab floats). Loading
# Gemma 3 270M int4 and scoring the benchmark text: 64 peaked at 1164 MiB in 22.3 s, 32 at 867 MiB
# in 17.3 s.
SCORE_CHUNK = 32
_STATE_MAGIC = b"LCOX1"
CUDA = "CUDAExecutionProvider"


def build_features() -> BuildFeatures:
    providers = ort.get_available_providers()
    return BuildFeatures(
        gpu_offload=CUDA in providers,
        amx=False,
        description=f"onnxruntime {ort.__version__}, providers {', '.join(providers)}",
    )


def _release_freed_heap() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim; a no-op elsewhere), so a
    parser's temporaries do not stay in the process's resident memory."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl)
        pass


def _load_error(path: Path, error: Exception) -> ModelError:
    # onnxruntime's and tokenizers' messages may span lines: one line for the user.
    detail = " ".join(str(error).split())[:400]
    return ModelError(f"onnxruntime could not load {path}: {detail}; convert the model again")


def _check_graph(session: ort.InferenceSession, meta: OnnxMetadata, path: Path) -> None:
    """The graph's inputs and outputs are the ones the marker describes (the KV buffers and the
    logits row are bound by these names and shapes)."""
    n_layers, kv_heads, head_dim, n_vocab = meta.n_layers, meta.n_kv_heads, meta.head_dim, meta.n_vocab
    kv = [f"{kind}.{i}.{part}" for kind in ("past_key_values", "present") for i in range(n_layers) for part in ("key", "value")]
    shapes = {arg.name: arg.shape for arg in (*session.get_inputs(), *session.get_outputs())}
    rotary = [name for kind in meta.rope_frequencies for name in rotary_input_names(kind)]
    wanted = {"input_ids", "seqlens_k", "total_sequence_length", "logits_count", "logits", *kv, *rotary}
    if missing := sorted(wanted - shapes.keys()) or sorted({arg.name for arg in session.get_inputs()} - wanted):
        raise ModelError(
            f"{path}: the graph does not match {ONNX_MARKER} ({n_layers} layers; the graph lacks or adds {missing[0]}); "
            "convert the model again"
        )
    kv_type = KV_DTYPES[meta.kv_dtype]
    if wrong := next((arg for arg in session.get_inputs() if arg.name in kv and arg.type != kv_type), None):
        raise ModelError(
            f"{path}: the graph's {wrong.name} is a {wrong.type} where {ONNX_MARKER} says {kv_type}; convert the model again"
        )
    expected = {**{name: (None, kv_heads, None, head_dim) for name in kv}, "logits": (None, None, n_vocab)}
    for name, dims in expected.items():
        shape = shapes[name]
        if len(shape) != len(dims) or any(isinstance(s, int) and d is not None and s != d for s, d in zip(shape, dims)):
            raise ModelError(
                f"{path}: the graph's {name} has shape {shape}, which does not match {ONNX_MARKER}; convert the model again"
            )


def sampling_metadata(folder: Path) -> dict[str, str]:
    """What localchat.sampling_defaults reads, as a converted GGUF carries it: the maker's sampling defaults
    from the generation_config.json the converter copies (`general.sampling.*`), and the model's name and
    finetune from the marker (its family's defaults match on them). Both formats of a model start from one
    sampler."""
    meta = read_metadata(folder)
    named = {"general.name": meta.name or "", "general.finetune": meta.finetune or ""}
    try:
        config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return named  # none, or unreadable: the defaults go on without the maker's
    sampling = generation_config_sampling(config if isinstance(config, dict) else {})
    return named | {key: str(value) for key, value in sampling.items()}


def onnx_facts(folder: Path) -> ModelFacts:
    """Planner facts from the converter's JSON; `details` lists the fused operators."""
    meta = read_metadata(folder)
    operators = meta.operators
    fused = ("GroupQueryAttention", "MatMulNBits", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
             "GatherBlockQuantized", "FastGelu")
    counts = ", ".join(f"{name} {operators[name]}" for name in fused if operators.get(name))
    others = sum(n for name, n in operators.items() if name not in fused)
    return ModelFacts(
        format="onnx",
        n_layers=meta.n_layers,
        n_ctx_train=min(meta.n_ctx_train or meta.max_positions, meta.max_positions),
        layer_bytes=meta.layer_bytes,
        other_bytes=meta.other_bytes,
        kv_bytes_per_token=meta.kv_bytes_per_token,
        n_vocab=meta.n_vocab,
        details=(
            f"onnx {meta.quant}, {meta.source_architecture}",
            *([f"weights: {describe_weight_formats(meta.weight_formats)}"] if meta.weight_formats is not None else []),
            f"fused operators: {counts}; {others} other nodes",
        ),
    )


class OnnxBackend:
    """An ONNX model folder in an onnxruntime session, with its KV buffers and tokenizer."""

    name = "onnxruntime"
    even_rows = False
    rewinds = True  # its KV cache is arrays of K and V rows, cut at any position
    saved_states_rewind = True
    # Not measured on onnxruntime's GPU providers; on a CPU a new count of rows costs nothing more.
    first_shape_steps = 0.0

    def __init__(self, path: Path, params: LoadParams, *, on_progress: Callable[[float], None] | None = None) -> None:
        from tokenizers import Tokenizer

        self.params = params
        meta = read_metadata(path)
        self.meta = meta
        self.n_layers = meta.n_layers
        self.n_seq = params.n_seq
        self.n_ctx = min(params.n_ctx, meta.max_positions)
        n_vocab = meta.n_vocab

        options = ort.SessionOptions()
        options.intra_op_num_threads = params.n_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        use_cuda = params.uses_gpu and CUDA in ort.get_available_providers()
        # No memory pattern on the CPU: with one, a run's intermediate tensors get one block sized
        # for the whole run. Without, Gemma 3 270M int4 peaked 36 MiB lower evaluating a 512-token
        # prompt (580 MiB), at the same prefill and decode speed. Not measured on a GPU.
        options.enable_mem_pattern = use_cuda
        providers: list[object] = ["CPUExecutionProvider"]
        if use_cuda:
            providers.insert(0, (CUDA, {"device_id": params.gpu_index or 0}))
        if on_progress is not None:
            on_progress(0.0)
        for name in (meta.graph, TOKENIZER_FILE):
            if not (path / name).is_file():
                raise ModelError(f"{path} has no {name}; convert the model again")
        # The tokenizer first: parsing a large tokenizer.json (Gemma's is 33 MB) peaks ~250 MiB
        # over what it keeps, and that must be handed back before the weights arrive.
        try:
            self._tokenizer = Tokenizer.from_file(str(path / TOKENIZER_FILE))
            self._decoder_kind = self._detect_decoder(self._tokenizer)
        except Exception as error:  # the tokenizers library raises plain Exception
            detail = " ".join(str(error).split())[:200]
            raise ModelError(f"{path / TOKENIZER_FILE} is not a tokenizer the model can use ({detail}); convert it again") from None
        _release_freed_heap()
        try:
            self._session = ort.InferenceSession(str(path / meta.graph), options, providers=providers)
        except Exception as error:  # onnxruntime raises its own exception types with the detail
            raise _load_error(path, error) from None
        _check_graph(self._session, meta, path)
        # A token id past the embedding would fail in the middle of a reply.
        if (n_tokens := self._tokenizer.get_vocab_size(with_added_tokens=True)) > n_vocab:
            raise ModelError(f"{path / TOKENIZER_FILE} has {n_tokens} tokens but the model only {n_vocab}; convert it again")
        if on_progress is not None:
            on_progress(1.0)
        self.device = "cuda" if use_cuda else "cpu"

        kv_heads, head_dim = meta.n_kv_heads, meta.head_dim
        # One spare position: a batched decode step writes a placeholder token for every idle
        # sequence at its length, which may be n_ctx.
        self._kv_shape = (self.n_seq, kv_heads, self.n_ctx + 1, head_dim)
        self._kv_dtype = np.dtype(meta.kv_dtype)
        if self.device == "cpu":
            self._kv_arrays = [np.zeros(self._kv_shape, dtype=self._kv_dtype) for _ in range(2 * self.n_layers)]
            self._kv_pointers = [array.ctypes.data for array in self._kv_arrays]
        else:
            self._kv_values = [
                ort.OrtValue.ortvalue_from_shape_and_type(self._kv_shape, self._kv_dtype, self.device, params.gpu_index or 0)
                for _ in range(2 * self.n_layers)
            ]
            self._kv_pointers = [value.data_ptr() for value in self._kv_values]
        # The rotary tables cover every position the KV buffers hold.
        self._rotary = {
            name: ort.OrtValue.ortvalue_from_numpy(table, self.device, params.gpu_index or 0)
            for name, table in rotary_tables(meta.rope_frequencies, self._kv_shape[2], self._kv_dtype.type).items()
        }
        self._seq_stride = int(np.prod(self._kv_shape[1:])) * self._kv_dtype.itemsize
        self.lengths = [0] * self.n_seq
        self._logits = np.zeros((self.n_seq, n_vocab), dtype=np.float32)
        # Each sequence's rows of its last `evaluate_all`, for `sample(row=...)`.
        self._rows: dict[int, np.ndarray] = {}
        self._bindings = [self._make_binding(seq) for seq in range(self.n_seq)]
        self._batch_binding = self._make_binding(None) if self.n_seq > 1 else None
        self._lock = threading.Lock()

        self._special = {i for i, t in self._tokenizer.get_added_tokens_decoder().items() if t.special}
        self._piece_cache: dict[int, bytes] = {}
        self._breaker_mask: np.ndarray | None = None
        self.info = ModelInfo(
            path=path,
            name=meta.name or path.name,
            architecture=meta.architecture,
            n_vocab=n_vocab,
            n_ctx_train=meta.n_ctx_train or meta.max_positions,
            n_layers=self.n_layers,
            bos_id=meta.bos_id,
            eos_id=meta.eos_id,
            add_bos=meta.add_bos,
            eog_ids=frozenset(meta.eog_ids),
            chat_template=meta.chat_template,
            size_bytes=meta.weight_bytes,
            extra={"quant": meta.quant, "device": self.device},
            metadata=sampling_metadata(path),
        )

    # -- bindings ------------------------------------------------------------------

    def _make_binding(self, seq: int | None) -> ort.IOBinding:
        """A binding with the KV buffers of `seq` (or all sequences) bound once, as past and present,
        and the rotary tables."""
        binding = self._session.io_binding()
        shape = self._kv_shape if seq is None else (1, *self._kv_shape[1:])
        offset = 0 if seq is None else seq * self._seq_stride
        for i in range(self.n_layers):
            for j, kind in enumerate(("key", "value")):
                pointer = self._kv_pointers[2 * i + j] + offset
                binding.bind_input(f"past_key_values.{i}.{kind}", self.device, 0, self._kv_dtype, shape, pointer)
                binding.bind_output(f"present.{i}.{kind}", self.device, 0, self._kv_dtype, shape, pointer)
        for name, table in self._rotary.items():
            binding.bind_ortvalue_input(name, table)
        return binding

    def _run(self, binding: ort.IOBinding, tokens: np.ndarray, seqlens: np.ndarray, total: int, n_logits: int,
             logits_into: np.ndarray) -> None:
        binding.bind_cpu_input("input_ids", tokens)
        binding.bind_cpu_input("seqlens_k", seqlens)
        binding.bind_cpu_input("total_sequence_length", np.array(total, dtype=np.int32))
        binding.bind_cpu_input("logits_count", np.array([n_logits], dtype=np.int64))
        binding.bind_output("logits", "cpu", 0, np.float32, logits_into.shape, logits_into.ctypes.data)
        try:
            self._session.run_with_iobinding(binding)
        except RuntimeError as error:  # onnxruntime's Fail and RuntimeException: a graph this runtime cannot run
            detail = " ".join(str(error).split())[:300]
            raise InferenceError(f"onnxruntime could not run {self.info.path}: {detail}; convert the model again "
                                 "(`localchat convert`) with this localchat") from None

    # -- text ----------------------------------------------------------------------

    @staticmethod
    def _detect_decoder(tokenizer: Tokenizer) -> str:
        """'bytelevel' (GPT-2 style byte alphabet) or 'sentencepiece' ('▁' spaces, <0xNN> bytes)."""
        # The decoder's own JSON: parsing the whole file in Python (and the tokenizer after the
        # weights) made the load peak ~450 MiB higher with Gemma 3.
        decoder = json.loads(tokenizer.decoder.__getstate__()) if tokenizer.decoder is not None else {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
        return "bytelevel" if "ByteLevel" in kinds else "sentencepiece"

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        with self._lock:
            self._tokenizer.encode_special_tokens = not special
            ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if add_bos and self.info.bos_id is not None:
            ids = [self.info.bos_id, *ids]
        return ids

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece(token)
            self._piece_cache[token] = piece
        return piece

    def _piece(self, token: int) -> bytes:
        if token in self._special:
            return b""  # control tokens print nothing, as with llama.cpp
        spelled = self._tokenizer.id_to_token(token)
        if spelled is None:
            return b""
        if self._decoder_kind == "bytelevel":
            return bytes(_BYTE_DECODER.get(ch, 0) for ch in spelled)
        if len(spelled) == 6 and spelled.startswith("<0x") and spelled.endswith(">"):
            return bytes([int(spelled[3:5], 16)])
        return spelled.replace("\u2581", " ").encode("utf-8")

    def token_text(self, token: int) -> str:
        if token in self._special:
            return self._tokenizer.id_to_token(token) or ""
        return self.token_bytes(token).decode("utf-8", errors="replace")

    # -- KV cache ------------------------------------------------------------------

    def _check_room(self, end: int) -> None:
        if end > self.n_ctx:
            raise ContextOverflowError(
                f"{end} tokens do not fit in the {self.n_ctx}-token context; shorten the prompt or raise --ctx"
            )

    def evaluate(self, seq: int, tokens: Sequence[int], start: int, *, all_logits: bool = False) -> np.ndarray | None:
        """Run `tokens` at positions `start...` of `seq`; the last position's logits are kept for
        `sample`. With `all_logits`, returns every position's logits (n, vocab) instead."""
        self._check_room(start + len(tokens))
        self.lengths[seq] = min(self.lengths[seq], start)
        chunk = SCORE_CHUNK if all_logits else PROMPT_CHUNK
        # A prompt's earlier chunks write their last row here too; the last chunk's stays.
        last_row = self._logits[seq : seq + 1, None, :]
        rows = []
        for offset in range(0, len(tokens), chunk):
            part = np.asarray(tokens[offset : offset + chunk], dtype=np.int64)[None, :]
            end = start + offset + part.shape[1]
            target = np.empty((1, part.shape[1], self._logits.shape[1]), dtype=np.float32) if all_logits else last_row
            self._run(self._bindings[seq], part, np.array([end - 1], dtype=np.int32), end, target.shape[1], target)
            self.lengths[seq] = end
            rows.append(target[0])
        if all_logits:
            self._logits[seq] = rows[-1][-1]
            return np.concatenate(rows)
        return None

    def new_shapes(self, rows: np.ndarray) -> np.ndarray:
        return np.zeros(np.shape(rows), dtype=bool)

    def evaluate_batch(self, items: Sequence[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        if len(items) == 1 or self._batch_binding is None:
            for seq, token, position in items:
                self.evaluate(seq, [token], position)
            return
        tokens = np.zeros((self.n_seq, 1), dtype=np.int64)
        for seq, token, position in items:
            self._check_room(position + 1)
            self.lengths[seq] = position
            tokens[seq, 0] = token
        # Idle sequences get a placeholder token written just past their end: harmless, since a
        # position at or beyond a sequence's length is never attended to and is overwritten later.
        positions = np.array(self.lengths, dtype=np.int32)
        self._run(self._batch_binding, tokens, positions, int(positions.max()) + 1, 1, self._logits[:, None, :])
        for seq, _, position in items:
            self.lengths[seq] = position + 1

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        rows = self.evaluate(seq, tokens, start, all_logits=True)
        assert rows is not None
        self._rows[seq] = rows
        return rows

    def truncate(self, seq: int, start: int) -> None:
        self.lengths[seq] = min(self.lengths[seq], start)

    # -- sampling ------------------------------------------------------------------

    def make_sampler(self, settings: SamplerSettings, guide: TokenGuide | None = None, *, seq: int | None = None,
                     raw_logits: bool = False) -> NumpySampler:
        return NumpySampler(settings, self._dry_breakers() if settings.dry else None, guide)

    def _dry_breakers(self) -> np.ndarray:
        """Which tokens hold a DRY sequence breaker (computed once: one pass over the vocabulary)."""
        if self._breaker_mask is None:
            marks = [b.encode() for b in DRY_SEQUENCE_BREAKERS]
            self._breaker_mask = np.fromiter(
                (any(m in self._piece(t) for m in marks) for t in range(self.info.n_vocab)), dtype=bool, count=self.info.n_vocab
            )
        return self._breaker_mask

    def sample(self, seq: int, sampler: NumpySampler, row: int = -1) -> int:  # type: ignore[override]
        return sampler.pick(self.logits(seq, row))

    def logits(self, seq: int, row: int = -1) -> np.ndarray:
        return self._logits[seq] if row < 0 else self._rows[seq][row]

    def score(self, seq: int, tokens: Sequence[int]) -> TokenScores:
        self.truncate(seq, 0)
        n = len(tokens) - 1
        logprobs = np.empty(n, dtype=np.float64)
        top1 = np.empty(n, dtype=np.int64)
        for offset in range(0, len(tokens), SCORE_CHUNK):
            part = tokens[offset : offset + SCORE_CHUNK]
            logits = self.evaluate(seq, part, offset, all_logits=True)
            assert logits is not None
            rows = min(len(part), n - offset)
            if rows <= 0:
                break
            targets = np.asarray(tokens[offset + 1 : offset + 1 + rows])
            logprobs[offset : offset + rows], top1[offset : offset + rows] = score_rows(logits[:rows], targets)
        return TokenScores(logprobs=logprobs, top1=top1)

    # -- state ---------------------------------------------------------------------

    def _seq_views(self, seq: int, length: int) -> list[np.ndarray]:
        if self.device != "cpu":
            raise ModelError("saving KV states is only supported on the CPU provider")
        return [array[seq, :, :length, :] for array in self._kv_arrays]

    def save_state(self, seq: int) -> bytes:
        length = self.lengths[seq]
        header = _STATE_MAGIC + struct.pack("<II", length, self.n_layers)
        return header + b"".join(view.tobytes() for view in self._seq_views(seq, length))

    def restore_state(self, seq: int, state: bytes) -> None:
        magic = state[: len(_STATE_MAGIC)]
        length, n_layers = struct.unpack_from("<II", state, len(_STATE_MAGIC))
        if magic != _STATE_MAGIC or n_layers != self.n_layers or length > self.n_ctx:
            raise InferenceError("onnxruntime backend refused a saved KV state (different model or context?)")
        offset = len(_STATE_MAGIC) + 8
        for view in self._seq_views(seq, length):
            size = view.nbytes
            view[...] = np.frombuffer(state, dtype=self._kv_dtype, count=view.size, offset=offset).reshape(view.shape)
            offset += size
        self.lengths[seq] = length

    def embedder(self) -> NoReturn:
        raise UnsupportedError("the ONNX backend has no embeddings: its fused model graph outputs logits only, not the "
                               "hidden states a vector is pooled from; serve the model as GGUF (llama.cpp) for embeddings")

    def load_lora(self, path: Path) -> int:
        raise InvalidSettingError(
            f"the ONNX backend (onnxruntime) cannot apply LoRA adapters ({path}); run the model as GGUF for --lora "
            "(localchat convert CHECKPOINT --to gguf)"
        )

    def use_loras(self, scales: LoraScales) -> None:
        if scales:
            raise InvalidSettingError("the ONNX backend (onnxruntime) cannot apply LoRA adapters; run the model as GGUF for them")

    def hold_compute(self, step: Callable[[], bool]) -> None:
        while step():  # onnxruntime evaluates on the calling thread
            pass

    def close(self, *, process_ends: bool = False) -> None:
        self._bindings = []
        self._batch_binding = None
        self._session = None  # type: ignore[assignment]


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_DECODER = _byte_decoder()
