"""Constrained decoding: grammars checked when made, and replies that follow them on the real model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.constraints import Constraint, TokenGuide
from localchat.engine import Engine
from localchat.errors import InvalidSettingError
from localchat.session import GenerationSettings

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("kind", "source", "message"),
    [
        ("json_schema", '{"type": "bogus"}', "Invalid type"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", "[1, 2, 3]", "the json schema cannot be used"),  # JSON, but no schema
        ("regex", "a(", "unclosed group"),
        ("lark", "start: missing_rule", "missing_rule"),
    ],
)
def test_a_grammar_llguidance_cannot_use_is_refused_when_made(kind: str, source: str, message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        Constraint(kind, source)  # type: ignore[arg-type]


def test_usable_grammars_are_accepted() -> None:
    Constraint.json_schema(PERSON)
    Constraint("regex", r"[0-9]{3}-[a-z]{2}")
    Constraint("lark", 'start: "yes" | "no"')


def _constrained(engine: Engine, constraint: Constraint, sampler: SamplerSettings, max_tokens: int = 60) -> tuple[str, str]:
    generation = engine.new_chat().send("Describe a person.", GenerationSettings(max_tokens=max_tokens, sampler=sampler, constraint=constraint))
    text = generation.text()
    assert generation.stats is not None
    return text, generation.stats.finish_reason


@pytest.mark.parametrize("sampler", [ARGMAX, SamplerSettings(seed=3)], ids=["greedy", "sampled"])
def test_llamacpp_replies_follow_the_schema_and_stop(engine: Engine, sampler: SamplerSettings) -> None:
    text, finish = _constrained(engine, Constraint.json_schema(PERSON), sampler)
    person = json.loads(text)
    assert finish == "stop"
    assert list(person) == ["name", "age", "role"] and person["role"] in ("admin", "user", "guest")
    assert isinstance(person["age"], int) and 0 <= person["age"] <= 120 and len(person["name"]) <= 16


def test_stop_strings_never_cut_a_constrained_reply(engine: Engine) -> None:
    """A stop string matched inside the grammar's text would leave JSON that does not parse (`run
    --json-schema --stop`, a server's response_format)."""
    settings = GenerationSettings(max_tokens=60, sampler=ARGMAX, constraint=Constraint.json_schema(PERSON), stop=("}", ",", '"'))
    generation = engine.new_chat().send("Describe a person.", settings)
    text = generation.text()
    assert generation.stats is not None and generation.stats.finish_reason == "stop"
    assert list(json.loads(text)) == ["name", "age", "role"]


def test_llamacpp_follows_a_regex(engine: Engine) -> None:
    text, finish = _constrained(engine, Constraint("regex", r"[0-9]{3}-[a-z]{2}"), SamplerSettings(seed=5))
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text) and finish == "stop"


def test_the_mask_leaves_only_allowed_tokens(engine: Engine) -> None:
    backend = engine.backend
    guide = TokenGuide(backend, Constraint("lark", 'start: "yes" | "no"'))
    logits = np.zeros(backend.info.n_vocab, dtype=np.float32)
    guide.mask(logits)
    allowed = np.flatnonzero(np.isfinite(logits))
    # Every allowed token starts "yes" or "no"; both words can start.
    pieces = {backend.token_bytes(int(t)) for t in allowed}
    assert pieces and all(b"yes".startswith(p) or b"no".startswith(p) for p in pieces)
    assert any(p.startswith(b"y") for p in pieces) and any(p.startswith(b"n") for p in pieces)


def test_cli_json_schema(tmp_path: Path, localchat_home: Path, default_model: Path) -> None:
    schema, bad = tmp_path / "person.json", tmp_path / "bad.json"
    schema.write_text(json.dumps(PERSON))
    bad.write_text('{"type": "bogus"}')
    env = {**os.environ, "LOCALCHAT_HOME": str(localchat_home)}
    run = [sys.executable, "-m", "localchat", "run", "-n", "60", "--json-schema"]
    good = subprocess.run([*run, str(schema), "Describe a person."], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert good.returncode == 0, good.stderr
    assert set(json.loads(good.stdout)) == {"name", "age", "role"}
    refused = subprocess.run([*run, str(bad), "x"], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        f"localchat: error: --json-schema {bad}: the json schema cannot be used: Invalid type: bogus"
    ]
