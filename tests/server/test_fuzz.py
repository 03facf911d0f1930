"""Schemathesis fuzzes the server's OpenAPI schema: whatever the body, never a 5xx, and every
answer matches the schema (status codes, content types, bodies)."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from live_server import LiveServer
from schemathesis import checks

# Replies are real generations: keep them a few tokens long so the fuzz stays quick.
FUZZ_REPLY_TOKENS = 4
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance]


# Valid and invalid bodies, from the fuzzing phase only: the coverage phase's hundreds of
# boundary cases would each run a real generation.
FUZZ_CONFIG = {"generation": {"mode": "all"}, "phases": {"coverage": {"enabled": False}}}


@pytest.fixture(scope="session")
def api_schema(server: LiveServer) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(FUZZ_CONFIG)
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.auth, config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


def _short_replies(body: Any) -> None:
    """Cap the reply length of a body the server would accept (strict JSON ints only): OpenAI's
    max_tokens (max_output_tokens in the Responses API), Ollama's options.num_predict (Ollama's API
    reads a number of any kind), llama-server's n_predict (-1: no limit)."""
    if isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = body.get(field)
            if value is None or (type(value) is int and value > FUZZ_REPLY_TOKENS):
                body[field] = FUZZ_REPLY_TOKENS
        n_predict = body.get("n_predict")
        if n_predict is None or (type(n_predict) is int and not 0 <= n_predict <= FUZZ_REPLY_TOKENS):
            body["n_predict"] = FUZZ_REPLY_TOKENS
        if "messages" in body or "prompt" in body:
            options = body.get("options")
            body["options"] = {**(options if isinstance(options, dict) else {}), "num_predict": FUZZ_REPLY_TOKENS}


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_api_never_answers_with_a_server_error(case: schemathesis.Case, server: LiveServer) -> None:
    _short_replies(case.body)
    case.call_and_validate(base_url=server.url, headers=server.auth, checks=CHECKS, timeout=60)
