"""The server's settings: where it listens, who may call it, and the bounds it puts on requests."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.backends.base import ROW_LIMIT
from localchat.errors import InvalidSettingError
from localchat.hardware import MIB
from localchat.settings import DEFAULT_LOOKUP_DRAFT


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"  # loopback only unless the user says otherwise
    port: int = 8080
    # None: no key needed. Otherwise every endpoint but /health wants `Authorization: Bearer KEY`.
    api_key: str | None = None
    # Origins a browser page may call the API from beyond this machine's own pages and local apps'
    # (localchat.server.security.LOCAL_ORIGINS); pages of other origins get 403.
    cors_origins: tuple[str, ...] = ()
    # Requests waiting for a slot beyond the busy ones; past that, 503 with Retry-After.
    queue_size: int = 16
    # A batch of documents to embed is the largest body apps send (LangChain sends them all at once).
    max_body_bytes: int = 64 * MIB
    # The most tokens one reply may ask for, and what a request that names no limit gets; None: a reply
    # ends at the end of the context, as llama-server's n_predict -1 and Ollama's num_predict -1 (their defaults).
    max_reply_tokens: int | None = None
    retry_after_s: int = 1
    # The template's enable_thinking when a request does not set it (None: the template's default).
    enable_thinking: bool | None = None
    # The most models loaded at once; None: as many as fit in memory (at least one).
    max_models: int | None = None
    # How long a request for a model waits for busy models (replies in flight) to make room for it
    # before a 503; idle models are unloaded at once.
    model_wait_s: float = 30.0
    # Whether a request may name a hub model not yet in the Hugging Face cache and have it pulled
    # (a chat naming it, Ollama's /api/pull).
    allow_pull: bool = False
    # Whether requests may delete models and give them second names (Ollama's /api/delete, /api/copy).
    allow_model_changes: bool = False
    # Prompt-lookup speculative decoding for a reply decoding alone: at most this many tokens drafted (0: off).
    lookup_draft: int = DEFAULT_LOOKUP_DRAFT

    def __post_init__(self) -> None:
        checks = [
            (0 <= self.port < 65536, f"port must be in [0, 65535], got {self.port}"),
            (self.api_key is None or len(self.api_key) > 0, "the API key must not be empty"),
            (self.queue_size >= 0, f"the queue size must be >= 0, got {self.queue_size}"),
            (self.max_body_bytes > 0, "the request size limit must be > 0"),
            (self.max_reply_tokens is None or self.max_reply_tokens >= 1,
             f"--max-reply-tokens must be >= 1, got {self.max_reply_tokens}"),
            (self.max_models is None or self.max_models >= 1, f"--max-models must be >= 1, got {self.max_models}"),
            (0 <= self.lookup_draft < ROW_LIMIT, f"--lookup-draft must be in [0, {ROW_LIMIT - 1}], got {self.lookup_draft}"),
            (self.model_wait_s >= 0, f"the wait for a model must be >= 0 s, got {self.model_wait_s}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidSettingError(message)
