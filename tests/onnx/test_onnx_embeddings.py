"""The ONNX backend has no embeddings: both APIs' embedding routes say so in one line, naming what it lacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.server.app import create_app
from localchat.server.settings import ServerSettings
from localchat.settings import Settings

LACKS = ("the ONNX backend has no embeddings: its fused model graph outputs logits only, not the hidden states a vector "
         "is pooled from; serve the model as GGUF (llama.cpp) for embeddings")


def test_embedding_requests_to_an_onnx_model_are_refused(onnx_model: Callable[[str, str], Path], settings: Settings) -> None:
    engine = Engine.load(str(onnx_model("llama", "fp32")), settings, PlanRequest(n_ctx=256, n_seq=1))
    with TestClient(create_app(engine, ServerSettings())) as http:
        openai = http.post("/v1/embeddings", json={"input": "hello"})
        assert openai.status_code == 400 and openai.json()["error"]["message"] == LACKS
        name = engine.model_name
        for path, body in [("/api/embed", {"model": name, "input": "hello"}), ("/api/embeddings", {"model": name, "prompt": "x"})]:
            refused = http.post(path, json=body)
            assert (refused.status_code, refused.json()) == (400, {"error": LACKS})
