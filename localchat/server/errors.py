"""The error bodies, OpenAI's, Ollama's and Anthropic's, and the exception a handler raises to answer with one.

Paths under OLLAMA_PREFIX answer as Ollama does, `{"error": "..."}`; Anthropic's Messages API (ANTHROPIC_PATH and
below) as Anthropic does, `{"type": "error", "error": {"type": ..., "message": ...}}`; every other path as OpenAI does.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


OLLAMA_PREFIX = "/api/"
ANTHROPIC_PATH = "/v1/messages"
# Anthropic's error type for each status (any other: invalid_request_error below 500, api_error from it).
ANTHROPIC_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                         413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(path: str, status: int, message: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The error body for a request to `path`."""
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        fallback = "invalid_request_error" if status < 500 else "api_error"
        return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, fallback), "message": message}}
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(path: str, status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(path, status, message, code=code, param=param), status_code=status, headers=headers)
