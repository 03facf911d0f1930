"""Where a remote OpenAI-compatible server is: `-m http://HOST:PORT/v1#MODEL` read into an endpoint.
Apart from the client (localchat.remote) so that a command can tell a remote model from a local one
without importing openai's (0.6 s)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from localchat.errors import LocalchatError

API_KEY_VARIABLE = "LOCALCHAT_REMOTE_API_KEY"


class RemoteError(LocalchatError):
    """A remote server that cannot be reached, refuses the request or fails mid-reply."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where the remote is: `base_url` ends at its API root (`.../v1`); `model` None picks the
    server's only model."""

    base_url: str
    model: str | None = None
    api_key: str | None = None


def remote_endpoint(model: str | None, *, remote_model: str | None = None, api_key: str | None = None) -> RemoteEndpoint | None:
    """The endpoint `model` names when it is an http(s) URL (`http://host:8000/v1#MODEL`), else None.
    The API key comes from `api_key`, else LOCALCHAT_REMOTE_API_KEY."""
    if model is None or not model.startswith(("http://", "https://")):
        return None
    url, _, fragment = model.partition("#")
    try:
        parts = urlsplit(url)
        hostname, _ = parts.hostname, parts.port  # each raises ValueError for what it cannot read
    except ValueError:  # an unclosed IPv6 bracket, a port that is not a number in [0, 65535]
        hostname = None
    if not hostname:
        raise RemoteError(f"'{model}' is not a server's address: write it as http://HOST:PORT/v1")
    return RemoteEndpoint(url.rstrip("/"), remote_model or fragment or None, api_key or os.environ.get(API_KEY_VARIABLE))
