"""The error bodies, OpenAI's and Ollama's, and the exception a handler raises to answer with one.

Paths under OLLAMA_PREFIX answer as Ollama does, `{"error": "..."}`; every other path as OpenAI does.
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


def error_body(path: str, status: int, message: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The error body for a request to `path`."""
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(path: str, status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(path, status, message, code=code, param=param), status_code=status, headers=headers)
