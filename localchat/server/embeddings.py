"""The embedding endpoints: OpenAI's /v1/embeddings, Ollama's /api/embed and its older /api/embeddings.

All three take the same path (localchat.embeddings: the model's embedder, many inputs a
llama.cpp call), so a text gets the same vector through each; they differ in their bodies and in
normalization, as the APIs do: /v1/embeddings and /api/embed give vectors of length 1,
/api/embeddings the model's vector as it is. An input longer than the model takes is refused
(OpenAI, /api/embeddings) or cut to fit (/api/embed unless truncate is false, as Ollama does).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from localchat.embeddings import Embeddings, embed_inputs, normalized
from localchat.errors import ContextOverflowError
from localchat.server.errors import APIError
from localchat.server.json_bodies import WellFormedRoute
from localchat.server.ollama import OllamaRoutes, ollama_error_responses
from localchat.server.ollama_schemas import EmbeddingRequest as OllamaEmbeddingRequest
from localchat.server.ollama_schemas import EmbeddingResponse as OllamaEmbeddingResponse
from localchat.server.ollama_schemas import EmbedRequest, EmbedResponse
from localchat.server.schemas import EmbeddingList, EmbeddingRequest, error_responses

if TYPE_CHECKING:
    from localchat.server.routing import ModelRouter
    from localchat.server.served_models import ServedModel

OPENAI_ERRORS = error_responses(
    "Invalid request, an input longer than the model takes, or a backend without embeddings (ONNX)",
    "The model named needs the room of models that are busy",
)


async def _embed(served: ServedModel, inputs: Sequence[str | Sequence[int]], *, truncate: bool) -> Embeddings:
    try:
        return await run_in_threadpool(embed_inputs, served.engine.backend, inputs, truncate=truncate)
    except ContextOverflowError as error:
        raise APIError(400, str(error), code="context_length_exceeded", param="input") from None


def _check_dimensions(requested: int | None, served: ServedModel) -> None:
    size = served.engine.backend.embedder().shape.dimensions
    if requested and requested != size:
        raise APIError(400, f"dimensions: {served.id}'s embeddings have {size} dimensions, and localchat does not "
                            "shorten them; leave dimensions out", code="unsupported_parameter", param="dimensions")


def _openai_inputs(value: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]  # type: ignore[list-item]  (one input as token ids)
    return list(value)  # type: ignore[arg-type]


class EmbeddingRoutes:
    def __init__(self, models: ModelRouter) -> None:
        self.models = models
        self.ollama = OllamaRoutes(models)

    async def openai(self, body: EmbeddingRequest, request: Request) -> Response:
        served = (await self.models.lease(request, body.model)).served
        _check_dimensions(body.dimensions, served)
        result = await _embed(served, _openai_inputs(body.input), truncate=False)
        vectors = normalized(result.vectors)
        if body.encoding_format == "base64":
            encoded: list[Any] = [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in vectors]
        else:
            encoded = vectors.tolist()
        data = [{"object": "embedding", "index": index, "embedding": vector} for index, vector in enumerate(encoded)]
        usage = {"prompt_tokens": result.total_tokens, "total_tokens": result.total_tokens}
        # Built as plain data: a model_dump of 64 vectors of a few thousand floats costs more than the JSON.
        return JSONResponse({"object": "list", "data": data, "model": served.id, "usage": usage})

    async def embed(self, body: EmbedRequest, request: Request) -> Response:
        started = time.perf_counter()
        served = (await self.ollama.lease(request, body.model, body.keep_alive)).served
        leased = time.perf_counter()
        _check_dimensions(body.dimensions, served)
        inputs = [body.input] if isinstance(body.input, str) else list(body.input)
        if inputs == [""]:
            inputs = []  # Ollama: an empty input only loads the model
        result = await _embed(served, inputs, truncate=body.truncate)
        answer = EmbedResponse(model=body.model, embeddings=[], total_duration=round((time.perf_counter() - started) * 1e9),
                               load_duration=round((leased - started) * 1e9), prompt_eval_count=result.total_tokens)
        return JSONResponse({**answer.model_dump(), "embeddings": normalized(result.vectors).tolist()})

    async def embeddings(self, body: OllamaEmbeddingRequest, request: Request) -> Response:
        served = (await self.ollama.lease(request, body.model, body.keep_alive)).served
        if not body.prompt:
            return JSONResponse({"embedding": []})
        result = await _embed(served, [body.prompt], truncate=False)
        return JSONResponse({"embedding": result.vectors[0].astype(np.float64).tolist()})


def embedding_router(models: ModelRouter) -> APIRouter:
    routes = EmbeddingRoutes(models)
    router = APIRouter(route_class=WellFormedRoute)
    router.add_api_route("/v1/embeddings", routes.openai, methods=["POST"], response_model=EmbeddingList,
                         responses=OPENAI_ERRORS, summary="OpenAI's embeddings", tags=["OpenAI"])
    router.add_api_route("/api/embed", routes.embed, methods=["POST"], response_model=EmbedResponse,
                         responses=ollama_error_responses(400, 401, 404, 413, 500, 503), summary="Ollama's embeddings",
                         tags=["Ollama"])
    router.add_api_route("/api/embeddings", routes.embeddings, methods=["POST"], response_model=OllamaEmbeddingResponse,
                         responses=ollama_error_responses(400, 401, 404, 413, 500, 503),
                         summary="Ollama's older embeddings: one text, not normalized", tags=["Ollama"])
    return router
