"""A chat on a remote OpenAI-compatible server (vLLM, llama.cpp's server, Ollama's /v1, another
`localchat serve`), through the `openai` client: `-m http://HOST:PORT/v1#MODEL`.

It offers what a local `Chat` offers a front end (messages, `send`, `reply`, `commit`, and a
generation to iterate for text, cancel and read stats from), measured from the stream: the time
to first token and tokens/s as the chunks arrive, token counts from the server's usage. The
reasoning a server streams apart from the answer (`reasoning_content`) comes back inside `<think>`
markers, as a local reasoning model writes it, so that the same reply parser folds it. Every
failure is a `RemoteError` of one line saying what to do; the client never retries on its own,
since retrying is the person's call (a 429's Retry-After is passed on).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai
from openai import OpenAI

from localchat.chat_engine import ContextUse
from localchat.chat_formats import GENERIC, REASONING, ChatFormat
from localchat.remote_endpoint import API_KEY_VARIABLE, RemoteEndpoint, RemoteError
from localchat.reply_parser import ReplyParser
from localchat.session import GenerationSettings, GenerationStats
from localchat.templates import THINKING_SWITCH, Message

# Connecting and each read; a remote's first token may wait behind a long prompt or a model load.
TIMEOUT_S = 600.0
# A reply's text here: the server's reasoning between the markers a reasoning model writes, then its
# answer. The parser of REPLY_FORMAT splits them again (it also folds a server's own raw markers).
REASONING_START, REASONING_END = "<think>\n", "\n</think>\n\n"
REPLY_FORMAT = ChatFormat("remote", (), REASONING, GENERIC.call)
# Where servers put the reasoning they split out: vLLM, llama.cpp and localchat's reasoning_content;
# newer vLLM and OpenRouter's reasoning.
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _status_error(error: openai.APIStatusError, endpoint: RemoteEndpoint) -> RemoteError:
    detail = _detail(error)
    if isinstance(error, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return RemoteError(f"{endpoint.base_url} refused the API key ({detail}): give the right one with --api-key "
                           f"or {API_KEY_VARIABLE}")
    if isinstance(error, openai.RateLimitError):
        retry_after = _retry_after(error.response.headers.get("retry-after"))
        when = f"in {retry_after:g} s" if retry_after is not None else "in a moment"
        return RemoteError(f"{endpoint.base_url} is busy (429: {detail}): try again {when}", retry_after_s=retry_after)
    if isinstance(error, openai.NotFoundError):
        return RemoteError(f"{endpoint.base_url} answered 404 ({detail}): check the address (it ends at /v1) and the model name")
    if error.status_code == 503:
        retry_after = _retry_after(error.response.headers.get("retry-after"))
        return RemoteError(f"{endpoint.base_url} is not ready (503: {detail}): try again shortly", retry_after_s=retry_after)
    return RemoteError(f"{endpoint.base_url} refused the request ({error.status_code}: {detail})")


def _detail(error: openai.APIStatusError) -> str:
    """The server's own message: OpenAI's `{"error": {"message"}}`, or a plain `{"error": "..."}`."""
    body = error.body.get("error", error.body) if isinstance(error.body, dict) else error.body
    message = body.get("message") if isinstance(body, dict) else body
    return str(message) if message else error.message


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from inference servers


def _translate(error: Exception, endpoint: RemoteEndpoint) -> RemoteError:
    if isinstance(error, openai.APIStatusError):
        return _status_error(error, endpoint)
    if isinstance(error, openai.APITimeoutError):
        return RemoteError(f"{endpoint.base_url} did not answer within {TIMEOUT_S:g} s: check that the server is running")
    if isinstance(error, openai.APIConnectionError):
        return RemoteError(f"cannot reach {endpoint.base_url}: is the server running, and is the address right?")
    if isinstance(error, httpx2.HTTPError):
        return _broken_off(error, endpoint)
    return RemoteError(f"{endpoint.base_url} failed: {error}")


def _broken_off(error: Exception, endpoint: RemoteEndpoint) -> RemoteError:
    return RemoteError(f"{endpoint.base_url} broke off the reply ({type(error).__name__}): the server may have stopped; "
                       "try again")


class RemoteServer:
    """A connection to one remote server and the model it serves."""

    backend_name = "remote"
    context_size: int | None  # when the server says it (vLLM's max_model_len)

    def __init__(self, endpoint: RemoteEndpoint) -> None:
        self.endpoint = endpoint
        # The SDK needs some key; servers without auth ignore it.
        self.client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key or "none", max_retries=0, timeout=TIMEOUT_S)
        self.model, self.context_size = self._pick_model()

    def _pick_model(self) -> tuple[str, int | None]:
        """The model to ask for, checked against the server's list, and its context size when
        the server says it (vLLM's `max_model_len`)."""
        try:
            models = list(self.client.models.list())
        except (openai.OpenAIError, OSError) as error:
            raise _translate(error, self.endpoint) from None
        names = [m.id for m in models]
        wanted = self.endpoint.model
        if wanted is None:
            # A server of several models that says which one it has loaded (localchat serve) offers that one.
            loaded = [m.id for m in models if getattr(m, "status", None) == "loaded"]
            candidates = names if len(names) == 1 else loaded
            if len(candidates) != 1:
                listed = ", ".join(names) or "none"
                raise RemoteError(f"{self.endpoint.base_url} serves {len(names)} models ({listed}): pick one with "
                                  f"{self.endpoint.base_url}#MODEL or --remote-model")
            wanted = candidates[0]
        elif wanted not in names:
            raise RemoteError(f"{self.endpoint.base_url} has no model '{wanted}'; it serves: {', '.join(names) or 'none'}")
        chosen = next(m for m in models if m.id == wanted)
        context = getattr(chosen, "max_model_len", None)
        return wanted, context if isinstance(context, int) else None

    @property
    def name(self) -> str:
        return self.model

    # The chat interface (localchat.chat_engine.ChatEngine) that front ends use.

    @property
    def model_name(self) -> str:
        return self.model

    @property
    def backend_label(self) -> str:
        return f"remote {urlsplit(self.endpoint.base_url).netloc}"

    uses_gpu = False  # not this machine's
    # Thinking off is asked of the server's template (chat_template_kwargs); one that does not read
    # the switch, or a server that does not render templates, ignores it.
    can_switch_thinking = True
    thinking_switch_checked = False

    def open_chat(self, messages: list[Message], *, thinking: bool = True) -> RemoteChat:
        return RemoteChat(self, messages, {} if thinking else {THINKING_SWITCH: False})

    def token_count(self, text: str) -> None:
        return None  # only the server's usage counts tokens

    def new_chat(self, system_prompt: str | None = None) -> RemoteChat:
        return RemoteChat(self, [Message("system", system_prompt)] if system_prompt else [])

    def generate(self, messages: list[Message], settings: GenerationSettings,
                 template_kwargs: dict[str, object] | None = None) -> RemoteGeneration:
        return RemoteGeneration(self, messages, settings, dict(template_kwargs or {}))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _request(messages: list[Message], settings: GenerationSettings, template_kwargs: dict[str, object]) -> dict[str, Any]:
    """The request body: OpenAI's own fields, and the chat template's variables only when there
    are some (vLLM's, llama.cpp's and localchat's `chat_template_kwargs`). localchat's local
    sampling extras (repeat penalty, DRY, top_k, min_p) are left to the remote engine's defaults,
    which any server accepts; without a sampler in `settings`, the server's own defaults for the
    model (its generation config) are left to it. `ignore_eos` goes as the extension of the same name that
    llama.cpp's, vLLM's and localchat's servers read. A message's reasoning stays here: servers do not take it back."""
    body: dict[str, Any] = {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sampler = settings.sampler
    if sampler is not None:
        body["temperature"] = sampler.temperature
        body["top_p"] = sampler.top_p
    if settings.max_tokens is not None:
        body["max_tokens"] = settings.max_tokens
    if settings.stop:
        body["stop"] = list(settings.stop)
    if sampler is not None and sampler.seed is not None:
        body["seed"] = sampler.seed
    if sampler is not None and sampler.presence_penalty:
        body["presence_penalty"] = sampler.presence_penalty
    if sampler is not None and sampler.frequency_penalty:
        body["frequency_penalty"] = sampler.frequency_penalty
    constraint = settings.constraint
    if constraint is not None:
        if constraint.kind != "json_schema":
            raise RemoteError(f"a remote server takes a JSON schema as the reply's constraint, not a {constraint.kind} grammar")
        schema = {"name": "reply", "schema": json.loads(constraint.source), "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    extra: dict[str, Any] = {}
    if template_kwargs:
        extra["chat_template_kwargs"] = template_kwargs
    if settings.ignore_eos:
        extra["ignore_eos"] = True
    if extra:
        body["extra_body"] = extra
    return body


@dataclass
class RemoteGeneration:
    """A reply streaming from the server: iterate for text pieces (its reasoning, if the server
    sends some, inside REASONING_START and REASONING_END); `stats` is set when it ends. `cancel()`
    (from any thread) closes the stream, so the server stops generating too."""

    server: RemoteServer
    messages: list[Message]
    settings: GenerationSettings
    template_kwargs: dict[str, object] = field(default_factory=dict)
    stats: GenerationStats | None = None
    started_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    chunks: int = 0  # reasoning and content chunks received: a token each from llama.cpp, vLLM and localchat
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _stream: Any = None
    _reasoning: bool = False  # inside the reasoning markers

    @property
    def tokens_per_second(self) -> float:
        if self.first_token_at is None or self.chunks < 2:
            return 0.0
        return (self.chunks - 1) / max(time.perf_counter() - self.first_token_at, 1e-9)

    def cancel(self) -> None:
        self._cancelled.set()
        stream = self._stream
        if stream is not None:
            stream.close()  # the read in progress ends; the server sees the disconnect

    def __iter__(self) -> Iterator[str]:
        return self._run()

    def stream(self, emit: Callable[[str], None]) -> None:
        """Run to the end, passing each text piece to `emit` on the calling thread (the server computes)."""
        for piece in self:
            emit(piece)

    def _run(self) -> Iterator[str]:
        endpoint = self.server.endpoint
        usage = None
        finish = None
        try:
            request = _request(self.messages, self.settings, self.template_kwargs)
            self._stream = self.server.client.chat.completions.create(model=self.server.model, **request)
            for chunk in self._stream:
                if self._cancelled.is_set():
                    break
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    text = self._text(choice.delta)
                    if text:
                        if self.first_token_at is None:
                            self.first_token_at = time.perf_counter()
                        self.chunks += 1
                        yield text
            if self._reasoning and not self._cancelled.is_set():
                self._reasoning = False
                yield REASONING_END  # the reply ended while thinking (at its length limit, say)
        except (openai.OpenAIError, httpx2.HTTPError, OSError) as error:  # a broken stream raises httpx2's own
            if self._cancelled.is_set():
                pass
            elif (self._stream is not None and isinstance(error, (openai.APIConnectionError, httpx2.HTTPError))
                  and not isinstance(error, openai.APITimeoutError)):
                # The server had taken the request: the connection broke during the reply.
                raise _broken_off(error, endpoint) from None
            else:
                raise _translate(error, endpoint) from None
        finally:
            if self._stream is not None:
                self._stream.close()
            self.stats = self._stats(usage, finish)
        if finish is None and not self._cancelled.is_set():
            raise RemoteError(f"{endpoint.base_url} ended the reply without finishing it: the server may have "
                              "stopped; try again")

    def _text(self, delta: Any) -> str:
        """A chunk's delta as reply text: its reasoning inside the markers, its content after them."""
        if delta is None:
            return ""
        values = [getattr(delta, name, None) for name in REASONING_FIELDS]
        reasoning = next((value for value in values if isinstance(value, str) and value), "")
        text = ""
        if reasoning:
            text = reasoning if self._reasoning else REASONING_START + reasoning
            self._reasoning = True
        if delta.content:
            text += (REASONING_END if self._reasoning else "") + delta.content
            self._reasoning = False
        return text

    def _stats(self, usage: Any, finish: str | None) -> GenerationStats:
        end = time.perf_counter()
        first = self.first_token_at or end
        cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None) or 0
        reason = "cancelled" if self._cancelled.is_set() or finish is None else ("length" if finish == "length" else "stop")
        return GenerationStats(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            cached_tokens=cached,
            prefix_cache_tokens=0,
            completion_tokens=usage.completion_tokens if usage else self.chunks,
            completion_ids=(),
            ttft_s=first - self.started_at,
            prefill_s=first - self.started_at,
            decode_s=end - first,
            finish_reason=reason,
        )

    def text(self) -> str:
        return "".join(self)


@dataclass
class RemoteChat:
    """A conversation kept here and sent whole with each turn (the server's prefix cache, if
    it has one, reuses what it saw)."""

    server: RemoteServer
    messages: list[Message]
    template_kwargs: dict[str, object] = field(default_factory=dict)  # sent with each reply: {"enable_thinking": False}
    last: RemoteGeneration | None = None  # the last reply started

    def send(self, content: str, settings: GenerationSettings = GenerationSettings()) -> RemoteGeneration:
        self.messages.append(Message("user", content))
        return self.reply(settings)

    def reply(self, settings: GenerationSettings = GenerationSettings()) -> RemoteGeneration:
        self.last = self.server.generate(list(self.messages), settings, self.template_kwargs)
        return self.last

    def commit(self, text: str, reasoning: str | None = None) -> None:
        self.messages.append(Message("assistant", text, reasoning=reasoning or None))

    def reply_parser(self) -> ReplyParser:
        """Reads the reasoning the generation put inside the markers apart from the answer."""
        return ReplyParser(REPLY_FORMAT, calls=False)

    def reply_settings(self, settings: GenerationSettings) -> GenerationSettings:
        return settings

    def next_context(self, settings: GenerationSettings) -> ContextUse:
        return ContextUse(None)  # tokens are counted by the server, once it has the prompt

    def context_used(self) -> int | None:
        """The last reply's prompt and completion, from the server's usage once it ended."""
        stats = self.last.stats if self.last is not None else None
        return stats.prompt_tokens + stats.completion_tokens if stats is not None and stats.prompt_tokens else None

    def left_out(self) -> int:
        return 0  # sent whole; a server whose context it overflows refuses it
