"""Streaming rules of a Generation over a scripted backend: UTF-8 split across tokens, stop strings,
end-of-generation tokens, limits. The backend is a stand-in that replays tokens (pure logic)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from localchat.backends.base import ModelInfo, SamplerSettings, TokenScores
from localchat.session import GenerationSettings, Session, _StopMatcher

EOS = 0


class _Sampler:
    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


class ScriptedBackend:
    """Plays back `script` as the sampled tokens; token i's bytes are `pieces[i]`."""

    name = "scripted"
    even_rows = False
    rewinds = True
    saved_states_rewind = True
    first_shape_steps = 0.0
    n_seq = 1

    def __init__(self, pieces: dict[int, bytes], script: list[int], n_ctx: int = 64) -> None:
        self.pieces = pieces
        self.script = list(script)
        self.n_ctx = n_ctx
        self.evaluated: list[tuple[int, int]] = []
        self.info = ModelInfo(Path("x"), "x", "test", 10, n_ctx, 1, None, None, False, frozenset({EOS}), None, 0)

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return [1] * len(text)

    def token_bytes(self, token: int) -> bytes:
        return self.pieces[token]

    def token_text(self, token: int) -> str:
        return self.pieces[token].decode(errors="replace")

    def evaluate(self, seq: int, tokens: Sequence[int], start: int) -> None:
        self.evaluated.append((start, len(tokens)))

    def evaluate_batch(self, items: Sequence[tuple[int, int, int]], *, spare_cell: bool = False) -> None: ...

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        """A prompt-lookup draft is checked against the script (the next tokens `sample` gives)."""
        self.evaluate(seq, tokens, start)
        return np.zeros((len(tokens), self.info.n_vocab), dtype=np.float32)

    def truncate(self, seq: int, start: int) -> None: ...

    def use_loras(self, scales: tuple) -> None:
        assert scales == (), "no adapters on this stand-in"

    def make_sampler(self, settings: SamplerSettings, guide: object = None, *, seq: int | None = None, raw_logits: bool = False) -> _Sampler:
        return _Sampler()

    def sample(self, seq: int, sampler: _Sampler, row: int = -1) -> int:
        return self.script.pop(0)

    def score(self, seq: int, tokens: Sequence[int]) -> TokenScores:
        raise NotImplementedError

    def save_state(self, seq: int) -> bytes:
        return b""

    def restore_state(self, seq: int, state: bytes) -> None: ...

    def close(self, *, process_ends: bool = False) -> None: ...


SNAKE = "🐍".encode()  # 4 bytes, streamed one token each
PIECES = {EOS: b"", 1: b"a", 2: SNAKE[:1], 3: SNAKE[1:2], 4: SNAKE[2:3], 5: SNAKE[3:], 6: b" END", 7: b"b"}


def run(script: list[int], settings: GenerationSettings = GenerationSettings(), n_ctx: int = 64) -> tuple[list[str], str]:
    session = Session(ScriptedBackend(PIECES, script, n_ctx))
    generation = session.generate([1, 1], settings)
    pieces = list(generation)
    assert generation.stats is not None
    return pieces, generation.stats.finish_reason


def test_a_character_split_across_tokens_streams_whole() -> None:
    pieces, finish = run([1, 2, 3, 4, 5, 1, EOS])
    assert pieces == ["a", "🐍", "a"]
    assert all(piece.isprintable() for piece in pieces)
    assert finish == "stop"


def test_a_character_cut_by_the_reply_s_end_is_left_out() -> None:
    """max_tokens, or the model's end, after a character's first bytes: the reply is what its tokens completed,
    not a U+FFFD (clients would show and keep it)."""
    assert run([1, 2, 3], GenerationSettings(max_tokens=3)) == (["a"], "length")
    assert run([1, 2, 3, 4, EOS]) == (["a"], "stop")
    assert run([1, 2, 3, 4, 5, 7], GenerationSettings(max_tokens=6)) == (["a", "🐍", "b"], "length")


def test_a_stop_string_ends_the_reply_and_is_not_shown() -> None:
    pieces, finish = run([1, 6, 1, 1], GenerationSettings(stop=(" EN",)))
    assert "".join(pieces) == "a" and finish == "stop"


def test_text_that_only_looks_like_a_stop_string_is_released() -> None:
    pieces, finish = run([1, 6, 7, EOS], GenerationSettings(stop=(" ENDX",)))
    assert "".join(pieces) == "a ENDb" and finish == "stop"


def test_max_tokens_and_a_full_context_end_with_length() -> None:
    assert run([1] * 10, GenerationSettings(max_tokens=3)) == (["a", "a", "a"], "length")
    pieces, finish = run([1] * 100, GenerationSettings(max_tokens=None), n_ctx=8)
    assert finish == "length" and len(pieces) == 7  # 2 prompt tokens + 6 evaluated + the last sampled


def test_ignore_eos_keeps_going() -> None:
    pieces, _ = run([EOS, 1, 1], GenerationSettings(max_tokens=3, ignore_eos=True))
    assert "".join(pieces) == "aa"


def test_stop_matcher_holds_back_only_a_possible_stop_start() -> None:
    matcher = _StopMatcher(["</s>"])
    assert matcher.feed("hello <") == ("hello ", False)
    assert matcher.feed("/") == ("", False)
    assert matcher.feed("x") == ("</x", False)
    assert matcher.feed("ok</s>more") == ("ok", True)


@pytest.mark.parametrize("settings", [{"max_tokens": 0}, {"stop": ("",)}])
def test_invalid_generation_settings(settings: dict[str, object]) -> None:
    from localchat.errors import InvalidSettingError

    with pytest.raises(InvalidSettingError):
        GenerationSettings(**settings)  # type: ignore[arg-type]
