"""The error bodies, OpenAI's, Ollama's and Anthropic's, the exception a handler raises to answer with one, and
the one line a body that failed validation is answered with.

Paths under OLLAMA_PREFIX answer as Ollama does, `{"error": "..."}`; Anthropic's Messages API (ANTHROPIC_PATH and
below) as Anthropic does, `{"type": "error", "error": {"type": ..., "message": ...}}`; every other path as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


# What a refusal of the body as a whole says, by pydantic's error type: no body, or a body that is no object.
BODY_ERRORS = {"missing": "missing request body", "model_attributes_type": "the body must be a JSON object",
               "model_type": "the body must be a JSON object", "dict_type": "the body must be a JSON object"}


# What a refused field must be, by pydantic's error type, in the words of localchat's other refusals (pydantic's own
# say "Input should be ..."): the error's context fills the braces. Other types keep pydantic's message.
FIELD_ERRORS = {
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be an integer",
    "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "string_type": "must be a string", "list_type": "must be a list", "dict_type": "must be an object",
    "literal_error": "must be {expected}", "enum": "must be {expected}",
}
# The units of a too short or too long value, by pydantic's error type and field type (other field types: items).
LENGTH_UNITS = {"String": "characters", "Dictionary": "entries"}
LENGTH_ERRORS = {"too_short": "at least", "string_too_short": "at least", "too_long": "at most", "string_too_long": "at most"}


def _field_error(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    # Bounds as written in the schema: 1, not the 1.0 a float field's bound becomes.
    context = {key: int(value) if isinstance(value, float) and value.is_integer() else value
               for key, value in (error.get("ctx") or {}).items()}
    if (bound := LENGTH_ERRORS.get(kind)) is not None:
        length = context.get("min_length" if bound == "at least" else "max_length")
        if bound == "at least" and length == 1:
            return "must not be empty"
        unit = "characters" if kind.startswith("string") else LENGTH_UNITS.get(context.get("field_type", ""), "items")
        return f"must have {bound} {length} {unit}"
    phrase = FIELD_ERRORS.get(kind)
    try:
        return phrase.format(**context) if phrase is not None else error.get("msg", "invalid")
    except KeyError:  # a context without the field the phrase names
        return error.get("msg", "invalid")


def validation_message(errors: Sequence[Any], renamed: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """A body pydantic refused, in one line from its first error, and the field that names (None: the body as a
    whole). `renamed`: top-level fields as the client named them, where the body validated is a translation."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    location = list(first.get("loc", ()))
    if first.get("type") == "json_invalid":  # its location is the character where the JSON broke, no field
        reason = first.get("ctx", {}).get("error", first.get("msg", "JSON decode error"))
        return f"the request body is not valid JSON: {reason} at character {location[-1] if location else '?'}", None
    path = [str(part) for part in (location[1:] if location[:1] == ["body"] else location)]  # FastAPI's "body" first
    if path and renamed:
        path[0] = renamed.get(path[0], path[0])
    where = ".".join(path)
    if not where:
        return BODY_ERRORS.get(first.get("type", ""), first.get("msg", "invalid request")), None
    if first.get("type") == "missing":
        return f"{where} is required", where
    return f"{where}: {_field_error(first)}", where
