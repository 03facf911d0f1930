"""OpenAI's error body, and the exception a handler raises to answer with it."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def error_response(status: int, message: str, *, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    error_type = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)
