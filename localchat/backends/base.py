"""The one interface every inference backend implements.

A backend owns a loaded model and a context of `n_ctx` token positions shared by up to
`n_seq` independent sequences (a chat, or a server slot). Everything above it speaks token
ids and KV ranges; text only appears in `tokenize` and `token_bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from localchat.errors import InvalidSettingError

if TYPE_CHECKING:  # planning a model imports this module, and no numpy (localchat.cli)
    import numpy as np


# The KV cache's value type, and flash attention: "auto" leaves it to llama.cpp (its default, kept
# for CPU plans); "on" asks for it.
KvType = Literal["f16", "q8_0"]
FlashAttn = Literal["auto", "on"]


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know of a model, read from its file before loading it."""

    format: str
    n_layers: int
    n_ctx_train: int
    layer_bytes: int
    other_bytes: int
    kv_bytes_per_token: int
    n_vocab: int
    # The size of one K and one V head, where the format gives them (GGUF's key/value_length).
    kv_head_sizes: tuple[int, int] | None = None
    # Format-specific lines for `localchat info` (an ONNX graph's fused operators).
    details: tuple[str, ...] = ()
    # Of `layer_bytes`, the routed experts' matrices (a mixture of experts; 0 for a dense model).
    expert_bytes: int = 0
    # The most UTF-8 bytes its chat template (its own, else localchat's fallback) writes around one reply's
    # messages beside their text (localchat.templates.chat_overhead_bytes): what sizes a context for one reply.
    chat_overhead_bytes: int = 0
    # A recurrent state's size for each sequence, whatever its length (Mamba, a hybrid's recurrent layers).
    state_bytes_per_sequence: int = 0

    @property
    def weight_bytes(self) -> int:
        return self.n_layers * self.layer_bytes + self.other_bytes


@dataclass(frozen=True)
class BuildFeatures:
    """What the inference library was compiled with."""

    gpu_offload: bool
    amx: bool
    description: str = ""
    # Flash attention kernels on the GPU (a quantized V cache needs them in llama.cpp).
    flash_attn: bool = False


@dataclass(frozen=True)
class LoadParams:
    """How a backend loads a model: what to offload, the context, the KV cache and threads. The
    planner (localchat.planner) decides them from the hardware and the model."""

    n_ctx: int
    n_seq: int = 1
    n_threads: int = 1
    n_threads_batch: int = 1
    n_gpu_layers: int = 0
    # The main GPU (with a split, the one with most free memory); None on the CPU.
    gpu_index: int | None = None
    # Sample inside the model's graph where a reply allows it (llama.cpp's backend sampling): the
    # logits row stays where the output layer is computed. Worth it with the output layer on a GPU.
    backend_sampling: bool = False
    # The share of the offloaded layers each GPU holds, by GPU index; empty when one GPU (or none) holds them all.
    tensor_split: tuple[float, ...] = ()
    # llama.cpp's repacked CPU weight buffers (off on AMX CPUs: llama.cpp issue 20824).
    use_extra_bufts: bool = True
    kv_type: KvType = "f16"
    flash_attn: FlashAttn = "auto"
    # A mixture of experts whose layers are all on the GPU but for the routed experts of the first
    # `n_cpu_moe` layers, which stay in RAM (llama-server's --n-cpu-moe).
    n_cpu_moe: int = 0

    @property
    def uses_gpu(self) -> bool:
        return self.n_gpu_layers > 0


@dataclass(frozen=True)
class FillInMiddleTokens:
    """A vocabulary's fill-in-the-middle tokens (localchat.infill lays out a prompt with them); the repository
    and file separator tokens of repository-level FIM where it has them."""

    prefix: int
    suffix: int
    middle: int
    repository: int | None = None
    file_separator: int | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a loaded model."""

    path: Path
    name: str
    architecture: str
    n_vocab: int
    n_ctx_train: int
    n_layers: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    eog_ids: frozenset[int]
    chat_template: str | None
    size_bytes: int
    extra: dict[str, str] = field(default_factory=dict)
    # The model file's general.* metadata (name, basename, size label, finetune, sampling defaults).
    metadata: dict[str, str] = field(default_factory=dict)
    # The vocabulary's fill-in-the-middle tokens, if it has them (code models).
    fim: FillInMiddleTokens | None = None


# LoRA adapters a backend computes with: (adapter id, scale) pairs, by id, no zero scale (a zero
# scale is no adapter, as in llama.cpp). () is the model alone.
LoraScales = tuple[tuple[int, float], ...]


def lora_scales(scales: dict[int, float]) -> LoraScales:
    """The canonical LoraScales of an id -> scale mapping: equal sets of adapters compare equal."""
    return tuple(sorted((i, float(s)) for i, s in scales.items() if s != 0.0))


# DRY's sequence breakers (llama.cpp's defaults): a repeat is never matched across a token that
# holds one of them, so lines, key/value pairs and quotes may start alike.
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
# A token this many logits under the best, at a temperature of 1 or less, weighs below e^-30 (1e-13) beside it
# in the draw, which top-p's sums and the draw do not see in float32: both samplers look no further
# (SamplerSettings.far_span).
FAR_SPAN = 30.0


@dataclass(frozen=True)
class SamplerSettings:
    """Sampling parameters; `temperature == 0` means greedy (penalties still apply: see ARGMAX).

    The defaults are llama.cpp's (its server's and CLI's): top-k 40, top-p 0.95, min-p 0.05 and
    temperature 0.8, no penalties. A model's own defaults (its GGUF's `general.sampling.*`) or its
    family's come first: localchat.sampling_defaults. The repeat penalty (over the last
    `penalty_last_n` tokens, prompt included) and DRY ("don't repeat yourself": a token that would
    extend a sequence already seen in the reply is penalised, the more the longer) are there for
    models that loop. DRY sees the reply alone: quoting the prompt is what a grounded reply does
    (fixing a text, editing code) and what prompt lookup drafts, and a loop is the reply repeating itself.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    seed: int | None = None
    # OpenAI's logit_bias: (token, bias) pairs, each token once, the bias added to the token's logit before
    # anything else sees the row (a grammar's mask, the penalties, the truncations: llama.cpp's order).
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        checks = [
            (self.temperature >= 0, "temperature must be >= 0 (0 means greedy)"),
            (self.top_k >= 0, "top_k must be >= 0 (0 disables it)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p < 1, "min_p must be in [0, 1)"),
            (self.repeat_penalty > 0, "repeat_penalty must be > 0 (1 disables it)"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (self.penalty_last_n >= -1, "penalty_last_n must be >= -1 (-1 means the whole context)"),
            (self.dry_multiplier >= 0, "dry_multiplier must be >= 0 (0 disables DRY)"),
            (self.dry_base >= 1, "dry_base must be >= 1"),
            (self.dry_allowed_length >= 1, "dry_allowed_length must be >= 1"),
            (self.dry_penalty_last_n >= -1, "dry_penalty_last_n must be >= -1 (-1 means the whole context)"),
            (self.seed is None or 0 <= self.seed < 2**32, "seed must be in [0, 2**32)"),
            (all(token >= 0 and math.isfinite(bias) for token, bias in self.logit_bias),
             "logit_bias must pair token ids (>= 0) with finite biases"),
            (len({token for token, _ in self.logit_bias}) == len(self.logit_bias), "logit_bias must name each token once"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidSettingError(f"invalid sampler setting: {message}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def far_span(self) -> float:
        """How far under the best logit a token can still be drawn: FAR_SPAN, times the temperature above 1
        (it divides the logits before the draw)."""
        return FAR_SPAN * max(self.temperature, 1.0)

    def describe(self) -> str:
        """The settings in a few words, in the chain's order (greedy: the penalties and the pick)."""
        parts = [] if self.greedy else [f"top_k={self.top_k}", f"top_p={self.top_p:g}", f"min_p={self.min_p:g}"]
        if self.repeat_penalized:
            parts.insert(0, f"repeat_penalty={self.repeat_penalty:g}/{self.penalty_last_n}")
        if self.dry:
            parts.insert(int(self.repeat_penalized), f"dry={self.dry_multiplier:g}")
        parts.append("greedy" if self.greedy else f"temp={self.temperature:g}")
        return " ".join(parts)

    @property
    def repeat_penalized(self) -> bool:
        """Whether the repeat, frequency or presence penalty is on."""
        return self.penalty_last_n != 0 and (self.repeat_penalty, self.frequency_penalty, self.presence_penalty) != (1.0, 0.0, 0.0)

    @property
    def dry(self) -> bool:
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0

    @property
    def penalized(self) -> bool:
        """Whether a penalty is on: the sampler must then remember the tokens it has seen."""
        return self.repeat_penalized or self.dry

    def check_vocabulary(self, n_vocab: int) -> None:
        """Raises InvalidSettingError where logit_bias names a token past a vocabulary of `n_vocab`."""
        outside = next((token for token, _ in self.logit_bias if token >= n_vocab), None)
        if outside is not None:
            raise InvalidSettingError(f"logit_bias: token {outside} is not in the model's vocabulary (ids 0 to {n_vocab - 1})")

    @property
    def history_window(self) -> int:
        """How many of the latest tokens the penalties look at (-1: all of them)."""
        windows = [n for n, on in ((self.penalty_last_n, self.repeat_penalized), (self.dry_penalty_last_n, self.dry)) if on]
        return -1 if -1 in windows else max(windows, default=0)


# The model's own top token at every step, no penalty: for exactness checks and speed figures.
ARGMAX = SamplerSettings(temperature=0, repeat_penalty=1.0, dry_multiplier=0.0)


@dataclass(frozen=True)
class TokenScores:
    """Per position i of a scored text: log p(tokens[i+1] | tokens[:i+1]) and the top-1 token."""

    logprobs: np.ndarray
    top1: np.ndarray

    @property
    def perplexity(self) -> float:
        return math.exp(-float(self.logprobs.mean()))


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model's raw logits (before the logit bias, penalties and
    temperature, as vLLM and llama-server report them by default), and the `top` most likely tokens' (best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


# Rows of one `evaluate_all` that `sample(row=...)` can read: every row of a call this long or shorter.
ROW_LIMIT = 64


class TokenGuide(Protocol):
    """A reply's grammar as a sampler consults it (localchat.constraints makes one from a
    Constraint): the tokens it allows next, and the token taken."""

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of the tokens the grammar forbids next to -inf, in place."""
        ...

    def consume(self, token: int) -> None:
        """The token chosen."""
        ...


class Sampler(Protocol):
    """A stateful sampler (penalties remember what it produced); made by a backend."""

    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None:
        """Show it tokens it did not pick, for its penalties: the prompt, or (`reply`) tokens of the reply
        (DRY sees those alone)."""
        ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EmbeddingShape:
    """How a model embeds: its pooling, whether the inference library pools (an embedding model
    names its own) or the mean is taken over the tokens' rows, the vector's size, the longest input."""

    pooling: str
    native: bool
    dimensions: int
    max_tokens: int


class Embedder(Protocol):
    """A model's text embeddings, made by its backend."""

    shape: EmbeddingShape

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One vector per input (token ids, each 1 to `shape.max_tokens`), not normalized:
        float32, (len(inputs), shape.dimensions)."""
        ...


class Backend(Protocol):
    """A loaded model plus its KV cache: the engine's only view of an inference library."""

    info: ModelInfo
    n_ctx: int
    n_seq: int
    name: str
    # Whether an even count of rows with logits (a draft's in `evaluate_all`, a batch's) costs less
    # than one fewer (its kernels' quirk): drafts are then verified in even counts of rows, and an
    # odd batch may take a throwaway row.
    even_rows: bool
    # What the context's first step of a count of rows, each with logits, costs over its later steps of
    # that count, in plain steps: a GPU loads the kernels of a shape it has not run yet and builds its
    # graphs (see `new_shapes`); a CPU pays next to nothing.
    first_shape_steps: float
    # Whether `truncate` can drop a sequence's last positions. A cache of K and V rows can; a recurrent
    # state (Mamba, RWKV, a hybrid's recurrent layers: Qwen 3.5, LFM2, Granite 4) holds no earlier
    # position to go back to, and can only be cleared: such a model drafts nothing, and a prompt that
    # does not continue what its sequence holds is evaluated again whole (or from a saved state).
    rewinds: bool
    # Whether a state restored from `save_state` can be cut back like a live sequence: llama.cpp saves
    # a sliding-window layer's last window of positions alone (Gemma 2 and 3, gpt-oss), which cut back
    # lacks the positions before it. Such a state is restored whole, or not at all.
    saved_states_rewind: bool

    def new_shapes(self, rows: np.ndarray) -> np.ndarray:
        """For each count in `rows`: whether the context has yet to evaluate a step of that many rows,
        each with logits (a plain step has 1; a draft's, or a batch's, more)."""
        ...

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        """Text to token ids; `special` parses control tokens such as `<start_of_turn>`."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (may be part of one UTF-8 character)."""
        ...

    def token_text(self, token: int) -> str:
        """The token as the vocabulary spells it, control tokens such as `<bos>` included."""
        ...

    def evaluate(self, seq: int, tokens: Sequence[int], start: int) -> None:
        """Write `tokens` into `seq`'s KV cache at positions `start...`; keeps logits of the last."""
        ...

    def evaluate_batch(self, items: Sequence[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        """One decode step for several sequences: `(seq, token, position)` each, logits kept for all.
        `spare_cell`: the KV cache has a cell free beyond those the items take, which a backend
        with `even_rows` may use for a throwaway row that makes an odd batch even."""
        ...

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        """Write `tokens` into `seq`'s KV cache at positions `start...` and return every position's
        logits, `(len(tokens), n_vocab)`: row i follows `tokens[i]` (one call verifies a draft).
        `sample` and `logits` then read row `row` of it; for more than `ROW_LIMIT` tokens only the
        last rows remain readable that way. The rows may be a view, valid until the next evaluation."""
        ...

    def truncate(self, seq: int, start: int) -> None:
        """Drop `seq`'s KV cache from position `start` on (`start == 0` clears it; any other `start` short
        of what the sequence holds needs `rewinds`)."""
        ...

    def make_sampler(self, settings: SamplerSettings, guide: TokenGuide | None = None, *, seq: int | None = None,
                     raw_logits: bool = False) -> Sampler:
        """A sampler with `settings`; with a `guide`, only tokens its grammar allows are picked. `seq`: the
        sequence whose replies it samples (a backend may then sample on the device); `raw_logits`: the
        caller reads `logits` too (logprobs)."""
        ...

    def sample(self, seq: int, sampler: Sampler, row: int = -1) -> int:
        """Pick the next token for `seq` from the logits of its last evaluated token (or of row
        `row` of the last `evaluate_all`)."""
        ...

    def logits(self, seq: int, row: int = -1) -> np.ndarray:
        """The raw logits `sample` reads (a view, valid until the next evaluation; sampling may
        rewrite it in place)."""
        ...

    def score(self, seq: int, tokens: Sequence[int]) -> TokenScores:
        """Evaluate `tokens` from position 0 of `seq` keeping every position's logits (perplexity,
        agreement checks); leaves `seq` holding `tokens`."""
        ...

    def save_state(self, seq: int) -> bytes:
        """A copy of `seq`'s KV cache, to give back to `restore_state` later."""
        ...

    def restore_state(self, seq: int, state: bytes) -> None: ...

    def embedder(self) -> Embedder:
        """The model's embeddings (made on first use, freed by `close`); raises UnsupportedError
        naming what is missing when the backend cannot make them."""
        ...

    def load_lora(self, path: Path) -> int:
        """Load the LoRA adapter file `path` for this model; returns its id for `use_loras`. A file
        that is no adapter of this model is a ModelError; a backend without adapters refuses them."""
        ...

    def use_loras(self, scales: LoraScales) -> None:
        """Compute with these loaded adapters from the next evaluation on, for every sequence (the
        KV cache written under other adapters is not theirs to reuse); () for the model alone."""
        ...

    def hold_compute(self, step: Callable[[], bool]) -> None:
        """`step()` again and again while it returns True, where the backend evaluates (llama.cpp: the
        process's one compute thread), for a loop of evaluations that should make no hop between threads
        each. Evaluations asked for by other threads meanwhile run between two steps."""
        ...

    def close(self, *, process_ends: bool = False) -> None:
        """Free the model and its caches, once. `process_ends`: the process exits next, whose end takes
        the memory back sooner than freeing it piece by piece; a backend may leave it to the end."""
        ...
