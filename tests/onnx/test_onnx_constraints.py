"""Constrained decoding in the ONNX backend's numpy sampler."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.constraints import Constraint
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}


def test_random_weights_still_give_schema_json(onnx_model: Callable[[str, str], Path], settings: Settings) -> None:
    """A tiny random-weight model says nothing sensible: only the constraint makes its reply JSON."""
    with Engine.load(str(onnx_model("llama", "fp32")), settings, PlanRequest(n_ctx=512)) as engine:
        for sampler in (ARGMAX, SamplerSettings(seed=7)):
            generation = engine.new_chat().send(
                "Describe a person.", GenerationSettings(max_tokens=200, sampler=sampler, constraint=Constraint.json_schema(PERSON))
            )
            person = json.loads(generation.text())
            assert generation.stats is not None and generation.stats.finish_reason == "stop"
            assert list(person) == ["name", "age", "role", "tags"] and person["role"] in ("admin", "user", "guest")
            assert isinstance(person["age"], int) and 0 <= person["age"] <= 120 and 1 <= len(person["tags"]) <= 2
