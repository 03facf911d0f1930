"""Constrained decoding: a grammar (JSON schema, Lark, regex) limits which tokens a reply may take.

llguidance does the grammar work in Rust: per token it writes a bitmask of the allowed ids; the
only vocabulary-sized Python work is applying that mask to the logits row, vectorised in numpy.
Both backends' samplers call `TokenGuide.mask` before choosing and `TokenGuide.consume` after
(localchat.backends.base.TokenGuide, the protocol they know it by).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from localchat.errors import InferenceError, InvalidSettingError

if TYPE_CHECKING:
    import llguidance
    from localchat.backends.base import Backend

ConstraintKind = Literal["json_schema", "lark", "regex"]

# JSON on one line with fixed separators: with free whitespace a small model may loop on newlines
# until max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# How each kind of source becomes an llguidance grammar.
GRAMMAR_FROM: dict[str, Callable[[str], str]] = {
    "json_schema": lambda source: _llguidance().LLMatcher.grammar_from_json_schema(source, defaults=JSON_LAYOUT),
    "lark": lambda source: _llguidance().LLMatcher.grammar_from_lark(source),
    "regex": lambda source: _llguidance().LLMatcher.grammar_from_regex(source),
}
# Any JSON object (OpenAI's response_format {"type": "json_object"}).
JSON_OBJECT_SCHEMA = '{"type": "object"}'


@dataclass(frozen=True)
class Constraint:
    """What a reply must match: a JSON schema (as JSON text), a Lark grammar or a regex.

    Checked when made: a schema or grammar llguidance cannot compile raises InvalidSettingError."""

    kind: ConstraintKind
    source: str

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_FROM:
            raise InvalidSettingError(f"unknown constraint kind '{self.kind}'; use one of {', '.join(GRAMMAR_FROM)}")
        message = _llguidance().LLMatcher.validate_grammar(self.grammar)
        if message:
            detail = " ".join(message.split())[:300]
            raise InvalidSettingError(f"the {self.kind.replace('_', ' ')} cannot be used: {detail}")

    @property
    def grammar(self) -> str:
        try:
            return GRAMMAR_FROM[self.kind](self.source)
        except ValueError as error:  # a JSON schema that is not JSON, or JSON that is no schema (a list, a number)
            problem = "cannot be used" if _is_json(self.source) else "is not valid JSON"
            raise InvalidSettingError(f"the {self.kind.replace('_', ' ')} {problem}: {error}") from None

    @classmethod
    def json_schema(cls, schema: object) -> Constraint:
        return cls("json_schema", json.dumps(schema))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _llguidance():  # type: ignore[no-untyped-def]
    """llguidance, imported when a reply first needs a grammar (15 ms of a start that needs none)."""
    import llguidance

    return llguidance


class _Vocabulary:
    """A backend's vocabulary in the shape llguidance's `TokenizerWrapper` reads."""

    def __init__(self, backend: Backend) -> None:
        info = backend.info
        self.eos_token_id = info.eos_id if info.eos_id is not None else min(info.eog_ids)
        self.bos_token_id = info.bos_id
        self.tokens: list[bytes] = []
        self.special_token_ids: list[int] = []
        for token in range(info.n_vocab):
            piece = backend.token_bytes(token)
            if not piece:
                # A control token prints nothing: llguidance knows it by its spelling, never as text.
                self.special_token_ids.append(token)
                piece = backend.token_text(token).encode()
            self.tokens.append(piece)
        self._tokenize = backend.tokenize

    def __call__(self, text: str) -> list[int]:
        return self._tokenize(text, add_bos=False, special=False)


_tokenizers: weakref.WeakKeyDictionary[object, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def tokenizer_for(backend: Backend) -> llguidance.LLTokenizer:
    """The backend's vocabulary for llguidance, made once per backend (one pass over the vocabulary)."""
    with _tokenizers_lock:
        tokenizer = _tokenizers.get(backend)
        if tokenizer is None:
            llguidance = _llguidance()
            wrapper = llguidance.TokenizerWrapper(_Vocabulary(backend))
            eos = sorted(backend.info.eog_ids) or None
            tokenizer = _tokenizers[backend] = llguidance.LLTokenizer(wrapper, n_vocab=backend.info.n_vocab, eos_token=eos)
        return tokenizer


class TokenGuide:
    """One reply's place in its grammar: which tokens may come next, and the tokens taken."""

    def __init__(self, backend: Backend, constraint: Constraint) -> None:
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self._matcher = _llguidance().LLMatcher(tokenizer_for(backend), constraint.grammar, log_level=0)
        self._check()
        self._bitmask = allocate_token_bitmask(1, backend.info.n_vocab)
        self._fill_bitmask = fill_next_token_bitmask

    def _check(self) -> None:
        if self._matcher.is_error():
            raise InferenceError(f"the reply left its grammar: {self._matcher.get_error()}")

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of the tokens the grammar forbids next to -inf, in place."""
        self._fill_bitmask(self._matcher, self._bitmask)
        self._check()
        allowed = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little", count=len(logits)).view(bool)
        np.copyto(logits, -np.inf, where=~allowed)

    def consume(self, token: int) -> None:
        """The token chosen; once the grammar is complete only end-of-generation tokens are allowed."""
        self._matcher.consume_token(token)
        self._check()


def token_guide(backend: Backend, constraint: Constraint | None) -> TokenGuide | None:
    return None if constraint is None else TokenGuide(backend, constraint)
