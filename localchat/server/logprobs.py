"""Tokens' log-probabilities in the API's two shapes: chat's `logprobs.content` entries and the
legacy completions' parallel lists."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from localchat.backends.base import Backend, TokenLogprob
from localchat.server.schemas import ChoiceLogprobs, CompletionLogprobs, TopLogprob
from localchat.server.schemas import TokenLogprob as TokenLogprobEntry

# JSON has no -inf: a token the model rules out reports this, as vLLM does.
LOWEST_LOGPROB = -9999.0

TokenPiece = Callable[[int], bytes]


def token_piece(backend: Backend, shown_tokens: frozenset[int]) -> TokenPiece:
    """A token's bytes as the reply's text has them (the control tokens it shows, spelled out)."""
    return lambda token: backend.token_text(token).encode() if token in shown_tokens else backend.token_bytes(token)


def _finite(logprob: float) -> float:
    return max(logprob, LOWEST_LOGPROB)


def _top(token: int, logprob: float, piece: TokenPiece) -> TopLogprob:
    data = piece(token)
    return TopLogprob(token=data.decode("utf-8", errors="replace"), logprob=_finite(logprob), bytes=list(data))


def chat_logprobs(entries: Sequence[TokenLogprob], piece: TokenPiece) -> ChoiceLogprobs:
    content = []
    for entry in entries:
        chosen = _top(entry.token, entry.logprob, piece)
        content.append(TokenLogprobEntry(**chosen.model_dump(), top_logprobs=[_top(t, lp, piece) for t, lp in entry.top]))
    return ChoiceLogprobs(content=content)


def completion_logprobs(entries: Sequence[TokenLogprob], piece: TokenPiece, offset: int) -> tuple[CompletionLogprobs, int]:
    """The legacy shape of `entries`, whose text starts at character `offset` of the completion;
    and the offset after them (a stream's next piece starts there)."""
    tokens = [piece(entry.token).decode("utf-8", errors="replace") for entry in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops = [{piece(t).decode("utf-8", errors="replace"): _finite(lp) for t, lp in entry.top} for entry in entries]
    result = CompletionLogprobs(tokens=tokens, token_logprobs=[_finite(entry.logprob) for entry in entries],
                                top_logprobs=tops, text_offset=offsets)
    return result, offset
