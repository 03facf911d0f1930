"""ASGI guards in front of the app: the API key, the request size bound, and which web pages may call it.

Request bodies are read as JSON whatever their Content-Type (localchat.server.json_bodies). A browser
sends a form's body from any page without asking first (no CORS preflight), so OriginGuard refuses a
request that a page of an origin not allowed makes: what stops a site from making this server work, or
changing its models, through a form.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localchat.server.errors import error_body

# Paths anyone may call without the key: load balancers, supervisors and Ollama's clients poll them.
OPEN_PATHS = frozenset({"/health", "/"})
# Origins whose pages may call the API without `--cors-origin`, as Ollama allows them by default: pages
# served from this machine, and the shells of desktop apps and editor extensions.
LOCAL_ORIGINS = (r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])(:\d+)?"
                 r"|(app|file|tauri|vscode-webview|vscode-file)://.*")


def allowed_origins(extra: Sequence[str]) -> re.Pattern[str]:
    """The origins a web page may call the API from: LOCAL_ORIGINS and `extra` (`--cors-origin`; `*`: any)."""
    given = (".*" if origin == "*" else re.escape(origin.rstrip("/")) for origin in extra)
    return re.compile("|".join([LOCAL_ORIGINS, *given]))


async def send_error(
    scope: Scope, send: Send, status: int, message: str, code: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """An error response in the shape of the API the path belongs to, sent from outside the FastAPI app."""
    body = json.dumps(error_body(scope["path"], status, message, code=code)).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    })
    await send({"type": "http.response.body", "body": body})


class ApiKeyGuard:
    """Every path but OPEN_PATHS needs `Authorization: Bearer <key>`, or `x-api-key: <key>` as Anthropic's clients
    send it (Claude Code, older anthropic packages)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()
        self._bearer = b"Bearer " + self._key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        bearer, key = headers.get(b"authorization"), headers.get(b"x-api-key")
        if not ((bearer is not None and secrets.compare_digest(bearer, self._bearer))
                or (key is not None and secrets.compare_digest(key, self._key))):
            await send_error(
                scope, send, 401, "a valid API key is needed: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
                "invalid_api_key", ((b"www-authenticate", b"Bearer"),),
            )
            return
        await self.app(scope, receive, send)


class BodySizeLimit:
    """Refuse request bodies over `max_bytes` with 413, by Content-Length or as they stream in; but those sent
    to a path under `unbounded` (model files uploaded, which the route writes to disk as they come)."""

    def __init__(self, app: ASGIApp, max_bytes: int, unbounded: str | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.unbounded = unbounded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.unbounded is not None and scope["path"].startswith(self.unbounded)):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await send_error(scope, send, 413, self._message, "request_too_large")
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the app's body read, so the app's error handler answers it.
                    raise HTTPException(413, self._message)
            return message

        await self.app(scope, counted_receive, send)

    @property
    def _message(self) -> str:
        return f"the request body is over the {self.max_bytes}-byte limit"


class OriginGuard:
    """A request from a web page (it carries an Origin header) whose origin is neither allowed nor the
    server's own gets 403, as Ollama answers it."""

    def __init__(self, app: ASGIApp, origins: re.Pattern[str]) -> None:
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode("latin-1")
            own = urlsplit(origin).netloc.encode("latin-1") == headers.get(b"host")
            if origin and not own and not self.origins.fullmatch(origin):
                await send_error(scope, send, 403, f"web pages from {origin} may not call this server: start "
                                 f"`localchat serve --cors-origin {origin}` to let them", "origin_not_allowed")
                return
        await self.app(scope, receive, send)

