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
from collections import Counter, deque
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from localchat.backends.base import DRY_SEQUENCE_BREAKERS, LoraScales, ModelInfo, SamplerSettings, TokenScores, score_rows
from localchat.constraints import TokenGuide
from localchat.errors import ContextOverflowError, InferenceError, InvalidSettingError, ModelError
from localchat.models import ONNX_MARKER
from localchat.planner import BuildFeatures, ModelFacts, Plan

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Tokens per run when evaluating a prompt (bounds the activations, not the cache).
PROMPT_CHUNK = 512
# Positions whose logits are read back per run when scoring (each row is n_vocab floats). Loading
# Gemma 3 270M int4 and scoring the benchmark text: 64 peaked at 1164 MiB in 22.3 s, 32 at 867 MiB
# in 17.3 s.
SCORE_CHUNK = 32
# Candidates for sampling: logits this far below the best have a relative weight under e^-30.
CANDIDATE_MARGIN = 30.0
# About ln(FLT_MAX): DRY's exponent is capped so that base^exponent stays a finite float32.
FLOAT_MAX_LOG = 88.7228391
SUPPORTED_FORMAT = 2
_STATE_MAGIC = b"LCOX1"
CUDA = "CUDAExecutionProvider"


def build_features() -> BuildFeatures:
    providers = ort.get_available_providers()
    return BuildFeatures(
        gpu_offload=CUDA in providers,
        amx=False,
        description=f"onnxruntime {ort.__version__}, providers {', '.join(providers)}",
    )


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


# The KV cache's types (the type the graph computes attention in: float16 for fp16 models), and
# how onnxruntime names each.
KV_DTYPES = {"float32": "tensor(float)", "float16": "tensor(float16)"}
# Folders converted before fp16 compute have no kv_dtype: theirs is float32.
DEFAULT_KV_DTYPE = "float32"
# Kinds of attention layer with rotary tables of their own (sliding-window layers may use another
# base frequency).
ROTARY_KINDS = ("global", "local")
# The marker's fields the runtime reads: (check, what the value must be, required).
MARKER_FIELDS: dict[str, tuple[Callable[[object], bool], str, bool]] = {
    "graph": (_file_name, "a file name in the folder", True),
    "architecture": (lambda v: isinstance(v, str), "a string", True),
    "source_architecture": (lambda v: isinstance(v, str), "a string", True),
    "quant": (lambda v: isinstance(v, str), "a string", True),
    "n_layers": (_positive, "a positive integer", True),
    "n_kv_heads": (_positive, "a positive integer", True),
    "head_dim": (_positive, "a positive integer", True),
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
    "bos_id": (lambda v: v is None or _count(v), "a token id or null", False),
    "eos_id": (lambda v: v is None or _count(v), "a token id or null", False),
    "add_bos": (lambda v: isinstance(v, bool), "true or false", False),
    "eog_ids": (lambda v: isinstance(v, list) and all(_count(t) for t in v), "a list of token ids", False),
    "chat_template": (lambda v: v is None or isinstance(v, str), "a string or null", False),
    "weight_formats": (
        lambda v: isinstance(v, dict) and all(isinstance(f, str) for f in v.values()), "a table of weight formats", False,
    ),
}
TOKENIZER_FILE = "tokenizer.json"


def read_metadata(folder: Path) -> dict[str, object]:
    """The folder's marker, checked field by field; raises ModelError naming what is wrong."""
    path = folder / ONNX_MARKER
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"{path} cannot be read ({error}); convert the model again") from None
    if not isinstance(meta, dict):
        raise ModelError(f"{path} is not a localchat ONNX marker (not a JSON object); convert the model again")
    if meta.get("format_version") != SUPPORTED_FORMAT:
        version = str(meta.get("format_version"))[:40]
        raise ModelError(f"{folder} was made by another localchat version (format {version}); convert it again")
    for key, (valid, expected, required) in MARKER_FIELDS.items():
        if key not in meta:
            if required:
                raise ModelError(f"{path} has no '{key}'; convert the model again")
        elif not valid(meta[key]):
            raise ModelError(f"{path}: '{key}' must be {expected}, not {str(meta[key])[:60]!r}; convert the model again")
    n_vocab = int(meta["n_vocab"])  # type: ignore[call-overload]
    for key in ("bos_id", "eos_id"):
        if isinstance(meta.get(key), int) and meta[key] >= n_vocab:
            raise ModelError(f"{path}: '{key}' {meta[key]} is beyond the {n_vocab}-token vocabulary; convert the model again")
    return meta


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


def _check_graph(session: ort.InferenceSession, meta: dict[str, object], path: Path) -> None:
    """The graph's inputs and outputs are the ones the marker describes (the KV buffers and the
    logits row are bound by these names and shapes)."""
    n_layers, kv_heads, head_dim, n_vocab = (int(meta[k]) for k in ("n_layers", "n_kv_heads", "head_dim", "n_vocab"))  # type: ignore[call-overload]
    kv = [f"{kind}.{i}.{part}" for kind in ("past_key_values", "present") for i in range(n_layers) for part in ("key", "value")]
    shapes = {arg.name: arg.shape for arg in (*session.get_inputs(), *session.get_outputs())}
    rotary = [name for kind in meta["rope_frequencies"] for name in rotary_input_names(kind)]  # type: ignore[attr-defined]
    wanted = {"input_ids", "seqlens_k", "total_sequence_length", "logits_count", "logits", *kv, *rotary}
    if missing := sorted(wanted - shapes.keys()) or sorted({arg.name for arg in session.get_inputs()} - wanted):
        raise ModelError(
            f"{path}: the graph does not match {ONNX_MARKER} ({n_layers} layers; the graph lacks or adds {missing[0]}); "
            "convert the model again"
        )
    kv_type = KV_DTYPES[str(meta.get("kv_dtype", DEFAULT_KV_DTYPE))]
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
    """The converter's per-matrix formats in one line, by role: each role's most common format,
    then the layers that differ ('mlp.down_proj int4/32 (int8/32 in layers 0-1, 16-17)')."""
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


def onnx_facts(folder: Path) -> ModelFacts:
    """Planner facts from the converter's JSON; `details` lists the fused operators."""
    meta = read_metadata(folder)
    operators = meta.get("operators", {})
    fused = ("GroupQueryAttention", "MatMulNBits", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
             "GatherBlockQuantized", "FastGelu")
    counts = ", ".join(f"{name} {operators[name]}" for name in fused if operators.get(name))
    others = sum(n for name, n in operators.items() if name not in fused)
    return ModelFacts(
        format="onnx",
        n_layers=int(meta["n_layers"]),
        n_ctx_train=int(min(meta["n_ctx_train"] or meta["max_positions"], meta["max_positions"])),
        layer_bytes=int(meta["layer_bytes"]),
        other_bytes=int(meta["other_bytes"]),
        kv_bytes_per_token=int(meta["kv_bytes_per_token"]),
        n_vocab=int(meta["n_vocab"]),
        details=(
            f"onnx {meta['quant']}, {meta['source_architecture']}",
            *([f"weights: {describe_weight_formats(formats)}"] if isinstance(formats := meta.get("weight_formats"), dict) else []),
            f"fused operators: {counts}; {others} other nodes",
        ),
    )


def rotary_input_names(kind: str) -> tuple[str, str]:
    """The graph inputs of GroupQueryAttention's cos and sin tables for one kind of layer."""
    return f"rotary.{kind}.cos", f"rotary.{kind}.sin"


def rotary_tables(rope_frequencies: dict[str, list[float]], n_positions: int, dtype: type) -> dict[str, np.ndarray]:
    """The marker's `rope_frequencies` as GroupQueryAttention's cos and sin tables, (n_positions,
    rotary pairs) by graph input, computed in float32 as transformers computes them."""
    tables = {}
    for kind, inverse_frequencies in rope_frequencies.items():
        angles = np.arange(n_positions, dtype=np.float32)[:, None] * np.asarray(inverse_frequencies, dtype=np.float32)[None, :]
        cos, sin = rotary_input_names(kind)
        tables[cos], tables[sin] = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    return tables


class NumpySampler:
    """Penalties, DRY, temperature, top-k, top-p and min-p over one logits row, as llama.cpp's
    chain does them, on a few candidates.

    Only tokens within CANDIDATE_MARGIN of the best logit are looked at, so after one pass over
    the vocabulary the work scales with the candidates, not the vocabulary."""

    def __init__(self, settings: SamplerSettings, dry_breakers: np.ndarray | None = None, guide: TokenGuide | None = None) -> None:
        """`dry_breakers`: a mask over the vocabulary of the tokens that hold a DRY sequence breaker;
        `guide`: the grammar the reply must follow."""
        self.settings = settings
        self.guide = guide
        self.rng = np.random.default_rng(settings.seed)
        window = settings.history_window
        self.history: deque[int] = deque(maxlen=None if window < 0 else window)
        self.dry_breakers = dry_breakers
        if settings.dry and dry_breakers is None:
            raise ValueError("DRY needs the mask of the tokens that break a sequence")

    def accept(self, tokens: Sequence[int]) -> None:
        if self.settings.penalized:
            self.history.extend(int(t) for t in tokens)

    def reset(self) -> None:
        self.history.clear()

    def close(self) -> None:
        pass

    def _recent(self, n: int) -> list[int]:
        """The last `n` tokens seen (-1: all)."""
        start = 0 if n < 0 else max(len(self.history) - n, 0)
        return list(islice(self.history, start, None))

    def penalise(self, logits: np.ndarray) -> None:
        """The penalties and DRY, in place (the row is rewritten by the next run)."""
        if self.settings.repeat_penalized and self.history:
            self._repeat_penalties(logits)
        if self.settings.dry:
            self._dry(logits)

    def _repeat_penalties(self, logits: np.ndarray) -> None:
        counts = Counter(self._recent(self.settings.penalty_last_n))
        ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
        n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        values = logits[ids]
        s = self.settings
        values = np.where(values > 0, values / s.repeat_penalty, values * s.repeat_penalty)
        values -= n * s.frequency_penalty + s.presence_penalty
        logits[ids] = values

    def _dry(self, logits: np.ndarray) -> None:
        """DRY, as llama.cpp's `llama_sampler_dry_apply` does it, in place: a token that would
        extend a repeat of the text's end (since its last sequence breaker) by at least
        `dry_allowed_length` tokens loses multiplier * base^(length - allowed_length)."""
        s, breakers = self.settings, self.dry_breakers
        assert breakers is not None
        tail = np.asarray(self._recent(s.dry_penalty_last_n), dtype=np.int64)
        n = len(tail)
        if n <= s.dry_allowed_length:
            return
        stops = np.flatnonzero(breakers[tail])
        limit = n - 1 - int(stops[-1]) if len(stops) else n
        if limit < s.dry_allowed_length:
            return
        if s.dry_base > 1.000001:
            # llama.cpp caps the exponent so that the penalty stays a finite float: longer
            # repeats than this are penalised alike and need not be measured.
            limit = min(limit, s.dry_allowed_length + int(FLOAT_MAX_LOG / np.log(s.dry_base)))
        # length[e]: how many tokens ending at e equal the tokens at the end (at most `limit`).
        # Ends still matching are compared a block of tokens at a time, the block doubling, so a
        # long periodic text costs a few numpy steps, not one per token.
        length = np.zeros(n - 1, dtype=np.int64)
        alive = np.flatnonzero(tail[:-1] == tail[-1])
        length[alive] = 1
        done, width = 1, 1
        while len(alive) and done < limit:
            width = min(width * 2, limit - done)
            back = done + np.arange(width)
            theirs = alive[:, None] - back
            same = (theirs >= 0) & (tail[np.maximum(theirs, 0)] == tail[n - 1 - back])
            run = np.where(same.all(axis=1), width, same.argmin(axis=1))
            length[alive] += run
            alive = alive[run == width]
            done += width
        ends = np.flatnonzero(length >= s.dry_allowed_length)
        if not len(ends):
            return
        ids, where = np.unique(tail[ends + 1], return_inverse=True)
        longest = np.zeros(len(ids), dtype=np.int64)
        np.maximum.at(longest, where, length[ends])
        keep = ~breakers[ids]
        exponent = longest[keep] - s.dry_allowed_length
        logits[ids[keep]] -= (s.dry_multiplier * s.dry_base ** exponent.astype(np.float64)).astype(np.float32)

    def pick(self, logits: np.ndarray) -> int:
        s = self.settings
        if self.guide is not None:
            self.guide.mask(logits)
        if s.penalized:
            self.penalise(logits)
        if s.greedy:
            token = int(logits.argmax())
        else:
            token = self._sample(logits)
        if s.penalized:
            self.history.append(token)
        if self.guide is not None:
            self.guide.consume(token)
        return token

    def _sample(self, logits: np.ndarray) -> int:
        s = self.settings
        best = float(logits.max())
        margin = CANDIDATE_MARGIN if s.min_p <= 0 else min(CANDIDATE_MARGIN, -float(np.log(s.min_p)))
        ids = np.flatnonzero(logits >= best - margin)
        values = logits[ids].astype(np.float64)
        if 0 < s.top_k < len(ids):
            keep = np.argpartition(-values, s.top_k - 1)[: s.top_k]
            ids, values = ids[keep], values[keep]
        order = np.argsort(-values, kind="stable")
        ids, values = ids[order], values[order]
        if s.top_p < 1.0:
            probs = np.exp(values - values[0])
            probs /= probs.sum()
            cut = int(np.searchsorted(np.cumsum(probs), s.top_p)) + 1
            ids, values = ids[:cut], values[:cut]
        weights = np.exp((values - values[0]) / s.temperature)
        cumulative = np.cumsum(weights)
        return int(ids[min(int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")), len(ids) - 1)])


class OnnxBackend:
    """An ONNX model folder in an onnxruntime session, with its KV buffers and tokenizer."""

    name = "onnxruntime"
    even_rows = False

    def __init__(self, path: Path, plan: Plan, *, on_progress: Callable[[float], None] | None = None) -> None:
        from tokenizers import Tokenizer

        self.plan = plan
        meta = read_metadata(path)
        self.meta = meta
        self.n_layers = int(meta["n_layers"])
        self.n_seq = plan.n_seq
        self.n_ctx = min(plan.n_ctx, int(meta["max_positions"]))
        n_vocab = int(meta["n_vocab"])

        options = ort.SessionOptions()
        options.intra_op_num_threads = plan.n_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        use_cuda = plan.uses_gpu and CUDA in ort.get_available_providers()
        # No memory pattern on the CPU: with one, a run's intermediate tensors get one block sized
        # for the whole run. Without, Gemma 3 270M int4 peaked 36 MiB lower evaluating a 512-token
        # prompt (580 MiB), at the same prefill and decode speed. Not measured on a GPU.
        options.enable_mem_pattern = use_cuda
        providers: list[object] = ["CPUExecutionProvider"]
        if use_cuda:
            providers.insert(0, (CUDA, {"device_id": plan.gpu_index or 0}))
        if on_progress is not None:
            on_progress(0.0)
        for name in (str(meta["graph"]), TOKENIZER_FILE):
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
            self._session = ort.InferenceSession(str(path / str(meta["graph"])), options, providers=providers)
        except Exception as error:  # onnxruntime raises its own exception types with the detail
            raise _load_error(path, error) from None
        _check_graph(self._session, meta, path)
        # A token id past the embedding would fail in the middle of a reply.
        if (n_tokens := self._tokenizer.get_vocab_size(with_added_tokens=True)) > n_vocab:
            raise ModelError(f"{path / TOKENIZER_FILE} has {n_tokens} tokens but the model only {n_vocab}; convert it again")
        if on_progress is not None:
            on_progress(1.0)
        self.device = "cuda" if use_cuda else "cpu"

        kv_heads, head_dim = int(meta["n_kv_heads"]), int(meta["head_dim"])
        # One spare position: a batched decode step writes a placeholder token for every idle
        # sequence at its length, which may be n_ctx.
        self._kv_shape = (self.n_seq, kv_heads, self.n_ctx + 1, head_dim)
        self._kv_dtype = np.dtype(str(meta.get("kv_dtype", DEFAULT_KV_DTYPE)))
        if self.device == "cpu":
            self._kv_arrays = [np.zeros(self._kv_shape, dtype=self._kv_dtype) for _ in range(2 * self.n_layers)]
            self._kv_pointers = [array.ctypes.data for array in self._kv_arrays]
        else:
            self._kv_values = [
                ort.OrtValue.ortvalue_from_shape_and_type(self._kv_shape, self._kv_dtype, self.device, plan.gpu_index or 0)
                for _ in range(2 * self.n_layers)
            ]
            self._kv_pointers = [value.data_ptr() for value in self._kv_values]
        # The rotary tables cover every position the KV buffers hold.
        self._rotary = {
            name: ort.OrtValue.ortvalue_from_numpy(table, self.device, plan.gpu_index or 0)
            for name, table in rotary_tables(meta["rope_frequencies"], self._kv_shape[2], self._kv_dtype.type).items()  # type: ignore[arg-type]
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
            name=str(meta.get("name") or path.name),
            architecture=str(meta["architecture"]),
            n_vocab=n_vocab,
            n_ctx_train=int(meta["n_ctx_train"] or meta["max_positions"]),
            n_layers=self.n_layers,
            bos_id=meta.get("bos_id"),  # type: ignore[arg-type]
            eos_id=meta.get("eos_id"),  # type: ignore[arg-type]
            add_bos=bool(meta.get("add_bos")),
            eog_ids=frozenset(int(t) for t in meta.get("eog_ids", [])),  # type: ignore[union-attr]
            chat_template=meta.get("chat_template"),  # type: ignore[arg-type]
            size_bytes=int(meta["weight_bytes"]),
            extra={"quant": str(meta["quant"]), "device": self.device},
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
        self._session.run_with_iobinding(binding)

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

    def make_sampler(self, settings: SamplerSettings, guide: TokenGuide | None = None) -> NumpySampler:
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

    def load_lora(self, path: Path) -> int:
        raise InvalidSettingError(
            f"the ONNX backend (onnxruntime) cannot apply LoRA adapters ({path}); run the model as GGUF for --lora "
            "(localchat convert CHECKPOINT --to gguf)"
        )

    def use_loras(self, scales: LoraScales) -> None:
        if scales:
            raise InvalidSettingError("the ONNX backend (onnxruntime) cannot apply LoRA adapters; run the model as GGUF for them")

    def close(self) -> None:
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
