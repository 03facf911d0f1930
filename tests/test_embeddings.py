"""Embeddings from the real model in llama.cpp (localchat/backends/llamacpp_embeddings.py): many
inputs a llama_decode call, each input's vector its own whatever shares its call, a long input
over several calls, and an embedding model's own pooling (the default model with the metadata key
of one) equal to the mean taken here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

import localchat.backends.llamacpp_embeddings as llamacpp_embeddings
from localchat.backends.base import Backend
from localchat.embeddings import embed_inputs, normalized
from localchat.engine import Engine
from localchat.errors import ContextOverflowError
from localchat.gguf_file import read_gguf_header
from localchat.planner import PlanRequest
from localchat.settings import Settings

SAME = 0.9999  # cosine: the same vector, computed along the same path or rounded apart by a few ulps
# A lone short input and the same input in a call of hundreds of tokens go through different CPU
# matmul kernels (llama.cpp switches with the batch size), which round its hidden states apart:
# 0.99947 measured for 19-token inputs on an AVX-512 CPU; different texts of one pattern stay below 0.99.
BATCHED = 0.999
TEXTS = [f"Note {number}: the {word} stood by the water, and nobody came that morning." for number, word in
         enumerate(["river", "mill", "tower", "bridge", "harbour", "garden", "lantern", "market"] * 8)]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def tokens(backend: Backend, texts: Sequence[str]) -> list[list[int]]:
    return [backend.tokenize(text, add_bos=True, special=False) for text in texts]


def test_64_inputs_take_a_few_calls_and_each_keeps_its_own_vector(engine: Engine) -> None:
    embedder = engine.backend.embedder()
    assert embedder.shape.pooling == "mean" and not embedder.shape.native
    inputs = tokens(engine.backend, TEXTS)
    before = embedder.calls
    together = embedder.embed(inputs)
    assert together.shape == (64, embedder.shape.dimensions) and together.dtype == np.float32
    total = sum(map(len, inputs))
    # Whole inputs a call: ~26 of these a call, 3 calls for 64 (a call's last few cells may go spare).
    assert embedder.calls - before <= -(-total // llamacpp_embeddings.CALL_TOKENS) + 1 <= 4
    alone = np.stack([embedder.embed([inputs[number]])[0] for number in (0, 21, 63)])
    assert cosines(alone, together[[0, 21, 63]]).min() >= BATCHED
    assert cosines(together[:8], together[1:9]).max() < 0.99  # different texts, different vectors
    assert cosines(embedder.embed(inputs[:1]), alone[:1])[0] >= SAME  # alone again: the same path


def test_a_long_input_runs_over_several_calls_with_its_kv_kept(engine: Engine, settings: Settings, default_model: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 512 tokens: two calls of 512, or three of 256 (another engine), the same mean."""
    count = next(n for n in range(len(TEXTS)) if len(tokens(engine.backend, [" ".join(TEXTS[:n])])[0]) > 520)
    long = tokens(engine.backend, [" ".join(TEXTS[:count])])
    assert 512 < len(long[0]) <= 3 * 256
    embedder = engine.backend.embedder()
    before = embedder.calls
    vector = embedder.embed(long)
    assert embedder.calls - before == 2
    monkeypatch.setattr(llamacpp_embeddings, "CALL_TOKENS", 256)
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048, n_seq=1)) as other:
        smaller = other.backend.embedder()
        assert cosines(smaller.embed(long), vector)[0] >= SAME and smaller.calls == 3


def test_an_input_over_the_limit_is_cut_or_refused(engine: Engine) -> None:
    limit = engine.backend.embedder().shape.max_tokens
    text = "word " * (limit + 10)
    count = len(engine.backend.tokenize(text, add_bos=True, special=False))
    with pytest.raises(ContextOverflowError, match=f"input 0 is {count} tokens but at most {limit} can be embedded"):
        embed_inputs(engine.backend, [text], truncate=False)
    cut = embed_inputs(engine.backend, [text], truncate=True)
    assert cut.token_counts == (limit,)
    assert np.allclose(np.linalg.norm(normalized(cut.vectors), axis=1), 1.0, atol=1e-6)


@pytest.fixture(scope="module")
def embedding_model(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with an embedding model's metadata key, `{arch}.pooling_type = mean`."""
    architecture = read_gguf_header(default_model).architecture
    target = tmp_path_factory.mktemp("embedding-model") / f"{default_model.stem}-mean.gguf"
    reader = gguf.GGUFReader(default_model)
    writer = gguf.GGUFWriter(target, arch=architecture, endianess=reader.endianess)
    pooling = MetadataDetails(gguf.GGUFValueType.UINT32, gguf.PoolingType.MEAN)
    copy_with_new_metadata(reader, writer, {f"{architecture}.pooling_type": pooling}, [])
    return target


@pytest.fixture(scope="module")
def pooled(embedding_model: Path, settings: Settings) -> Iterator[Engine]:
    with Engine.load(str(embedding_model), settings, PlanRequest(n_ctx=1024, n_seq=1)) as loaded:
        yield loaded


def test_an_embedding_models_own_pooling_is_llama_cpps(engine: Engine, pooled: Engine) -> None:
    """llama.cpp pools it (whole inputs a call), to the mean this module takes over the same rows."""
    shape = pooled.backend.embedder().shape
    assert shape.native and shape.pooling == "mean" and shape.max_tokens == 1024
    inputs = tokens(engine.backend, TEXTS[:10])
    assert cosines(pooled.backend.embedder().embed(inputs), engine.backend.embedder().embed(inputs)).min() >= SAME
