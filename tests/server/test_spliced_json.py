"""Streamed lines written from a model's JSON cut at its strings are the bytes the model writes (pure logic)."""

from __future__ import annotations

import pytest

from localchat.server.ollama_schemas import ChatResponse, GenerateResponse, ReplyMessage
from localchat.server.schemas import ChatChunkChoice, ChatCompletionChunk, ChatDelta
from localchat.server.spliced_json import CONTENT_MARK, STAMP_MARK, SplicedJson

TEXTS = ["Tokyo", " wörld\n", 'say "hi"\\', "\x00\x1f", "😀", "\u2028", ""]


def chunk(content: str) -> ChatCompletionChunk:
    return ChatCompletionChunk(id="chatcmpl-1", created=1, model='a "model"',
                               choices=[ChatChunkChoice(index=0, delta=ChatDelta(content=content))])


@pytest.mark.parametrize("content", TEXTS)
def test_an_openai_chunk_is_the_bytes_its_model_writes(content: str) -> None:
    assert SplicedJson(chunk(CONTENT_MARK), [CONTENT_MARK])(content) == chunk(content).model_dump_json()


@pytest.mark.parametrize("content", TEXTS)
def test_an_ollama_line_is_the_bytes_its_model_writes(content: str) -> None:
    """Two holes, filled in the order the markers are given, not the order they appear in."""
    def chat(stamp: str, text: str) -> ChatResponse:
        return ChatResponse(model="m", created_at=stamp, message=ReplyMessage(content=text), done=False)

    def generate(stamp: str, text: str) -> GenerateResponse:
        return GenerateResponse(model="m", created_at=stamp, response=text, done=False)

    stamp = "2026-11-26T20:00:00.123456Z"
    for line in (chat, generate):
        spliced = SplicedJson(line(STAMP_MARK, CONTENT_MARK), [CONTENT_MARK, STAMP_MARK])
        assert spliced(content, stamp) == line(stamp, content).model_dump_json()


def test_a_marker_the_model_does_not_hold_once_is_refused() -> None:
    with pytest.raises(ValueError):
        SplicedJson(chunk("no marker"), [CONTENT_MARK])
