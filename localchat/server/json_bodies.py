"""How request bodies are read: as JSON whatever their Content-Type, with text made well-formed.

Ollama and llama-server read a body as JSON whatever its Content-Type, and `curl -d`, in every example
of Ollama's API, sends a form's type; FastAPI reads such a body as bytes and refuses it. Browsers'
forms send such bodies too: localchat.server.security.OriginGuard keeps other sites' pages out.

JSON may carry half of a surrogate pair ("\\ud83d", a JavaScript string cut through an emoji), which
no UTF-8 encoder takes: Go's decoder reads it as U+FFFD, and so do these requests (localchat.unicode_text).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from localchat.unicode_text import well_formed

JSON_TYPE = b"application/json"
# What a surrogate looks like in a body's bytes: a JSON escape, or UTF-8's lead byte of U+D000-U+DFFF
# (json.loads lets encoded surrogates through). Bodies with none (nearly all) are not walked.
SURROGATE_MARKS = (b"\\ud", b"\\uD", b"\xed")


class BodiesAsJson:
    """A request body whose Content-Type is not JSON is read as JSON (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
            given = dict(scope["headers"]).get(b"content-type", b"")
            if not given.split(b";")[0].strip().lower().endswith((b"/json", b"+json")):
                headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", JSON_TYPE)]}
        await self.app(scope, receive, send)


def _well_formed_json(value: Any) -> Any:
    """`value` (parsed JSON) with every string, keys too, made well-formed."""
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, list):
        return [_well_formed_json(item) for item in value]
    if isinstance(value, dict):
        return {well_formed(key): _well_formed_json(item) for key, item in value.items()}
    return value


class WellFormedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            parsed = json.loads(body)
            self._json = _well_formed_json(parsed) if any(mark in body for mark in SURROGATE_MARKS) else parsed
        return self._json


class WellFormedRoute(APIRoute):
    """A route whose handler reads its body through WellFormedRequest."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(WellFormedRequest(request.scope, request.receive))

        return route
