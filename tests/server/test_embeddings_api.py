"""Embeddings on the real server and model through the real clients: the openai SDK's
embeddings.create (floats and base64), the `ollama` client's embed and embeddings, langchain-ollama's
OllamaEmbeddings. A text gets the same vector through every API and route; lengths, usage and
refusals are as each API gives them."""

from __future__ import annotations

import numpy as np
import ollama
import openai
import pytest
from langchain_ollama import OllamaEmbeddings
from live_server import LiveServer

from localchat.engine import Engine

MODEL = "gemma-3-270m"
TEXT = "The lighthouse keeper wrote down every ship that passed."
OTHERS = [f"Line {number}: a different sentence about the harbour and its boats." for number in range(63)]
SAME = 0.9999  # cosine


def _unit(vector: object) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float64)
    return array / np.linalg.norm(array)


def test_a_text_gets_the_same_vector_through_every_api_and_route(gemma_server: LiveServer) -> None:
    client = gemma_server.client()
    ollama_client = ollama.Client(host=gemma_server.url, headers=gemma_server.auth, timeout=120)
    langchain = OllamaEmbeddings(model=MODEL, base_url=gemma_server.url, client_kwargs={"headers": gemma_server.auth})
    reference = client.embeddings.create(model=MODEL, input=TEXT, encoding_format="float").data[0].embedding
    assert abs(np.linalg.norm(reference) - 1) < 1e-5
    routes = {
        "openai base64": client.embeddings.create(model=MODEL, input=[TEXT]).data[0].embedding,  # the SDK asks for base64
        "ollama embed": ollama_client.embed(MODEL, TEXT).embeddings[0],
        "ollama embeddings": ollama_client.embeddings(MODEL, TEXT).embedding,
        "langchain query": langchain.embed_query(TEXT),
        "langchain documents": langchain.embed_documents([TEXT])[0],
    }
    for route, vector in routes.items():
        assert float(_unit(vector) @ _unit(reference)) >= SAME, route
    assert abs(np.linalg.norm(routes["ollama embed"]) - 1) < 1e-5
    assert np.linalg.norm(routes["ollama embeddings"]) > 2  # the older route: the model's vector as it is
    # Among 63 other inputs of one request, through both APIs: the same vector through each.
    batch = [TEXT, *OTHERS]
    openai_batch = client.embeddings.create(model=MODEL, input=batch, encoding_format="float").data
    ollama_batch = ollama_client.embed(MODEL, batch).embeddings
    assert [item.index for item in openai_batch] == list(range(64)) and len(ollama_batch) == 64
    assert min(float(_unit(a.embedding) @ _unit(b)) for a, b in zip(openai_batch, ollama_batch, strict=True)) >= SAME


def test_openais_embedding_body(gemma_server: LiveServer, gemma_gguf_engine: Engine) -> None:
    client = gemma_server.client()
    texts = ["one", "two words"]
    reply = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert reply.model == MODEL and reply.object == "list" and len(reply.data) == 2
    assert len(reply.data[0].embedding) == 640 and reply.data[1].object == "embedding"
    counts = [len(gemma_gguf_engine.backend.tokenize(text, add_bos=True, special=False)) for text in texts]  # <bos> each
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(counts)
    ids = gemma_gguf_engine.backend.tokenize("The sky", add_bos=True, special=False)
    as_ids = client.embeddings.create(model=MODEL, input=[ids], encoding_format="float").data[0].embedding
    as_text = client.embeddings.create(model=MODEL, input="The sky", encoding_format="float").data[0].embedding
    assert float(_unit(as_ids) @ _unit(as_text)) >= SAME
    assert client.embeddings.create(model=MODEL, input="x", dimensions=640, encoding_format="float").data[0].embedding
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input="x", dimensions=256)
    assert refused.value.body["param"] == "dimensions"  # type: ignore[index]
    assert "640 dimensions" in refused.value.body["message"]  # type: ignore[index]


def test_an_input_too_long_is_refused_before_any_work(gemma_server: LiveServer) -> None:
    """OpenAI's route refuses it, and Ollama's when told not to cut it (tests/test_embeddings.py cuts one)."""
    long = "word " * 5000  # more than the server's 4096-token context
    refused = gemma_server.post("/v1/embeddings", {"model": MODEL, "input": long})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    kept = gemma_server.post("/api/embed", {"model": MODEL, "input": long, "truncate": False})
    assert kept.status_code == 400 and "at most 4096 can be embedded" in kept.json()["error"]


def test_an_empty_ollama_request_only_loads(gemma_server: LiveServer) -> None:
    assert gemma_server.post("/api/embed", {"model": MODEL}).json()["embeddings"] == []
    assert gemma_server.post("/api/embeddings", {"model": MODEL}).json() == {"embedding": []}
    missing = gemma_server.post("/api/embed", {"model": "no-such-model", "input": "x"})
    assert (missing.status_code, missing.json()) == (404, {"error": "model 'no-such-model' not found"})
