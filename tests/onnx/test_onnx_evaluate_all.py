"""`evaluate_all` and KV rollback on the ONNX backend (the real Gemma 3 270M)."""

from __future__ import annotations

from test_evaluate_all import check_evaluate_all

from localchat.engine import Engine


def test_evaluate_all_equals_one_token_at_a_time(gemma_engine: Engine) -> None:
    gemma_engine.sessions[0].reset()
    check_evaluate_all(gemma_engine.backend, gemma_engine.sessions[0].seq)
