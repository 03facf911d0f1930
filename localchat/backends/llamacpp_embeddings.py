"""Embeddings from a loaded GGUF model: a llama.cpp context of its own, with embeddings on, made on
the backend's model (its weights shared, not loaded twice) and freed here, in `close`.

A model whose metadata names a pooling (`{arch}.pooling_type`: an embedding model) is pooled by
llama.cpp as the model says (its first token, the mean, its last token; with the dense layers
some embedding models add after pooling), so each input is evaluated whole within one call. A
generative model names none: its vector is the mean of its final hidden states (after the output
norm) over the input's tokens, summed here from llama.cpp's per-token rows, so an input may run
over several calls and be as long as the chat context. Either way whole inputs are packed into
calls of up to `CALL_TOKENS` tokens, many a call, each in a KV sequence of its own, and the KV
cache is cleared after each call (attention then spans only the call's own cells).

An embeddings context outputs every token, and llama.cpp's graph for a generative model ends in its
output head, which for a small model with a large vocabulary is most of the work (Gemma 3 270M:
168M multiply-adds a token for 262k logits, against ~100M for its 18 layers). Those logits are
never read here, so the mean's context stops the graph once the hidden states it reads are computed:
ggml's evaluation callback cancels the rest of the graph when it returns false.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence

import llama_cpp
import llama_cpp._ggml
import numpy as np

from localchat.backends.base import EmbeddingShape
from localchat.errors import InferenceError, InvalidSettingError, ModelError

# Tokens per llama_decode. A generative model computes its output head for every token of an
# embeddings context (llama.cpp outputs them all), and its logits buffer holds n_vocab floats per
# token of a call: 512 MiB for a 262k vocabulary at 512 tokens, what llama-server's default ubatch costs.
CALL_TOKENS = 512
# Inputs per call: KV sequences of the context.
CALL_INPUTS = 64
# The longest input of a model that llama.cpp pools: one call holds it whole, so its buffers grow with it.
NATIVE_WINDOW = 2048
# The hidden states after the output norm (res->t_embd): with pooling "none", llama.cpp's pooling
# step (build_pooling, the same for every architecture) passes them on renamed so.
HIDDEN_STATES = b"result_embd_pooled"
_tensor_name = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("ggml_get_name", llama_cpp._ggml.libggml))
# llama.cpp's pooling types by the names the API and the docs use.
POOLING_NAMES = {
    llama_cpp.LLAMA_POOLING_TYPE_NONE: "none",
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
    llama_cpp.LLAMA_POOLING_TYPE_RANK: "rank",
}


def embedding_shape(model: llama_cpp.llama_model_p, pooling_type: int | None, max_context: int) -> EmbeddingShape:
    """`pooling_type`: the model's `{arch}.pooling_type`, None when it names none (a generative
    model); `max_context`: the longest input wanted (the chat context's size)."""
    if pooling_type == llama_cpp.LLAMA_POOLING_TYPE_RANK:
        raise InvalidSettingError("this model is a reranker (its pooling is 'rank'): it scores pairs of texts and has no "
                                  "embeddings; serve an embedding or a chat model for them")
    if pooling_type is not None and pooling_type not in POOLING_NAMES:
        raise ModelError(f"the model names pooling type {pooling_type}, which llama.cpp does not know")
    dimensions = llama_cpp.llama_model_n_embd_out(model)
    if pooling_type is None or pooling_type == llama_cpp.LLAMA_POOLING_TYPE_NONE:
        return EmbeddingShape("mean", False, dimensions, max_context)
    # A whole input is one call's ubatch (non-causal attention needs it so, and llama.cpp pools per ubatch).
    window = min(max_context, llama_cpp.llama_model_n_ctx_train(model), NATIVE_WINDOW)
    return EmbeddingShape(POOLING_NAMES[pooling_type], True, dimensions, window)


class LlamaEmbedder:
    """Owns a llama.cpp embeddings context on `model` (which must outlive it) and its batch.

    `decode` runs a llama_decode call where the backend runs its own (its compute thread). One
    `embed` at a time (a lock): its calls may interleave with the chat context's steps.
    """

    def __init__(self, model: llama_cpp.llama_model_p, shape: EmbeddingShape, *, pooling_type: int | None,
                 n_threads: int, n_threads_batch: int, decode: Callable[[Callable[[], int]], int]) -> None:
        self.shape = shape
        self._decode_on = decode
        self._lock = threading.Lock()
        call_tokens = shape.max_tokens if shape.native else CALL_TOKENS
        params = llama_cpp.llama_context_default_params()
        params.embeddings = True
        params.pooling_type = pooling_type if shape.native and pooling_type is not None else llama_cpp.LLAMA_POOLING_TYPE_NONE
        # A long input's KV is kept over its calls (cleared after each group of inputs).
        params.n_ctx = max(call_tokens, shape.max_tokens)
        params.n_batch = params.n_ubatch = call_tokens
        params.n_seq_max = CALL_INPUTS
        params.kv_unified = True
        params.n_threads = n_threads
        params.n_threads_batch = n_threads_batch
        params.no_perf = True
        if not shape.native:
            # Kept here: the C callback must outlive the context.
            self._callback = llama_cpp.ggml_backend_sched_eval_callback(_stop_after_hidden_states)
            params.cb_eval = self._callback
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise ModelError(f"llama.cpp could not create an embeddings context of {params.n_ctx} tokens (out of memory?)")
        self._memory = llama_cpp.llama_get_memory(self._ctx)  # NULL for encoder-only models: nothing kept between calls
        self._call_tokens = call_tokens
        self._batch = llama_cpp.llama_batch_init(call_tokens, 0, 1)
        self.calls = 0  # llama_decode calls made: many inputs share one (the tests count them)

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One vector per input (token ids, each at most `shape.max_tokens`), not normalized: (len(inputs), dimensions)."""
        for tokens in inputs:
            if not 0 < len(tokens) <= self.shape.max_tokens:
                raise InvalidSettingError(f"an input of {len(tokens)} tokens cannot be embedded: 1 to {self.shape.max_tokens} fit")
        with self._lock:
            if self._ctx is None:
                raise InferenceError("the embeddings context was closed")
            return self._pooled(inputs) if self.shape.native else self._mean(inputs)

    def _fill(self, i: int, token: int, position: int, seq: int) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = position
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = True

    def _decode(self, n_tokens: int) -> None:
        self._batch.n_tokens = n_tokens
        status = self._decode_on(lambda: llama_cpp.llama_decode(self._ctx, self._batch))
        if status != 0:
            raise InferenceError(f"llama.cpp failed to compute embeddings (llama_decode status {status})")

    def _groups(self, inputs: Sequence[Sequence[int]]) -> Iterator[range]:
        """Consecutive inputs that one call holds whole (up to its tokens and CALL_INPUTS); an input
        longer than a call alone."""
        first = 0
        while first < len(inputs):
            end, filled = first, 0
            while end < len(inputs) and end - first < CALL_INPUTS and filled + len(inputs[end]) <= self._call_tokens:
                filled += len(inputs[end])
                end += 1
            end = max(end, first + 1)
            yield range(first, end)
            first = end

    def _clear(self) -> None:
        """Forget the last group's KV: the next starts from cell 0, so attention spans only its own cells."""
        if self._memory:
            llama_cpp.llama_memory_clear(self._memory, True)

    def _call(self, group: Sequence[Sequence[int]], start: int = 0) -> None:
        """One llama_decode of `group`'s inputs, each its own sequence from position `start`."""
        filled = 0
        for seq, tokens in enumerate(group):
            for offset, token in enumerate(tokens):
                self._fill(filled + offset, token, start + offset, seq)
            filled += len(tokens)
        self._decode(filled)
        self.calls += 1

    def _rows(self, count: int) -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_embeddings(self._ctx), shape=(count, self.shape.dimensions))

    def _mean(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """The mean of each input's rows; an input longer than a call runs over several, its KV kept between them."""
        vectors = np.empty((len(inputs), self.shape.dimensions), dtype=np.float32)
        for group in self._groups(inputs):
            if len(inputs[group.start]) > self._call_tokens:
                tokens, total = inputs[group.start], np.zeros(self.shape.dimensions, dtype=np.float64)
                for offset in range(0, len(tokens), self._call_tokens):
                    part = tokens[offset : offset + self._call_tokens]
                    self._call([part], offset)
                    total += self._rows(len(part)).sum(axis=0, dtype=np.float64)
                vectors[group.start] = total / len(tokens)
            else:
                lengths = [len(inputs[number]) for number in group]
                self._call([inputs[number] for number in group])
                sums = np.add.reduceat(self._rows(sum(lengths)), np.cumsum([0, *lengths[:-1]]), axis=0, dtype=np.float64)
                vectors[group.start : group.stop] = sums / np.array(lengths, dtype=np.float64)[:, None]
            self._clear()
        return vectors

    def _pooled(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """Pooled by llama.cpp, whole inputs a call."""
        vectors = np.empty((len(inputs), self.shape.dimensions), dtype=np.float32)
        for group in self._groups(inputs):
            self._call([inputs[number] for number in group])
            for seq, number in enumerate(group):
                pointer = llama_cpp.llama_get_embeddings_seq(self._ctx, seq)
                if not pointer:
                    raise InferenceError("llama.cpp computed no pooled embedding for an input")
                vectors[number] = np.ctypeslib.as_array(pointer, shape=(self.shape.dimensions,))
            self._clear()
        return vectors

    def close(self) -> None:
        if self._ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None


def _stop_after_hidden_states(tensor: int, ask: bool, _user_data: int) -> bool:
    """ggml's evaluation callback: asked, it wants to see only the hidden states; shown them, it
    returns false, which cancels the rest of the graph (the output head)."""
    return _tensor_name(tensor) == HIDDEN_STATES if ask else False


def open_embedder(model: llama_cpp.llama_model_p, meta: Callable[[str], str | None], architecture: str, max_context: int,
                  n_threads: int, n_threads_batch: int, decode: Callable[[Callable[[], int]], int]) -> LlamaEmbedder:
    """An embeddings context on `model`, pooled as its metadata (`meta`) says."""
    value = meta(f"{architecture}.pooling_type")
    try:
        pooling_type = None if value is None else int(value)
    except ValueError:
        raise ModelError(f"the model's {architecture}.pooling_type is {value!r}, not a number") from None
    shape = embedding_shape(model, pooling_type, max_context)
    return LlamaEmbedder(model, shape, pooling_type=pooling_type, n_threads=n_threads, n_threads_batch=n_threads_batch,
                         decode=decode)

