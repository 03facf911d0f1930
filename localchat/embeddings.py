"""Text embeddings from a loaded model, for the servers' embedding endpoints: texts in, vectors out.

Each text is tokenized as llama.cpp's server does for embeddings (the model's special tokens
added: BOS, and EOS or SEP where the vocabulary adds them) and embedded by the backend's embedder
(localchat/backends: pooled as the model names, else the mean of its hidden states). A text longer
than the embedder takes is cut to fit or refused, as the caller asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localchat.backends.base import Backend
from localchat.errors import ContextOverflowError, InvalidSettingError


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # float32, (len(texts), dimensions), as the model gives them (not normalized)
    token_counts: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


def embed_inputs(backend: Backend, inputs: Sequence[str | Sequence[int]], *, truncate: bool) -> Embeddings:
    """One vector per input, a text or token ids; `truncate`: cut an input longer than the model
    takes to its first tokens, else raise ContextOverflowError naming it."""
    embedder = backend.embedder()
    limit = embedder.shape.max_tokens
    token_lists = []
    for number, item in enumerate(inputs):
        tokens = backend.tokenize(item, add_bos=True, special=False) if isinstance(item, str) else list(item)
        if not tokens:
            raise InvalidSettingError(f"input {number} is empty: it has no tokens to embed")
        if not all(0 <= token < backend.info.n_vocab for token in tokens):
            raise InvalidSettingError(f"input {number}: token ids must be in [0, {backend.info.n_vocab})")
        if len(tokens) > limit:
            if not truncate:
                raise ContextOverflowError(f"input {number} is {len(tokens)} tokens but at most {limit} can be embedded; "
                                           "shorten it")
            tokens = tokens[:limit]
        token_lists.append(tokens)
    vectors = embedder.embed(token_lists) if token_lists else np.empty((0, embedder.shape.dimensions), np.float32)
    return Embeddings(vectors, tuple(len(tokens) for tokens in token_lists))


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero), as OpenAI's and Ollama's embeddings come."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
