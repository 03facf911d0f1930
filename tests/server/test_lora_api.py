"""LoRA adapters through the API, as llama-server takes them: GET/POST /lora-adapters, a request's
`lora` list applied to its reply alone, replies with different adapters never in one batch, and no
KV reused across adapters. Scripted backend (the scheduler and server are real); the real model
with a real adapter is tests/server/test_lora_live.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from localchat.adapters import LoraSpec
from scripted_app import ScriptedBackend, scripted_client

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
# Longer than the prefix cache's least match and save sizes (32 and 64 tokens; one a character here).
PROMPT = "a long shared opening that a client sends again and again, " * 2


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, ScriptedBackend]]:
    backend = ScriptedBackend(TEMPLATE, n_seq=1)
    loras = [LoraSpec(tmp_path / "tone.gguf", 1.0), LoraSpec(tmp_path / "style.gguf", 0.5)]
    with scripted_client(backend, tmp_path, loras=loras) as (_, http):
        yield http, backend


def complete(http: TestClient, **fields: object) -> dict:
    response = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_lora_adapters_lists_the_loaded_adapters_and_their_scales(served: tuple[TestClient, ScriptedBackend], tmp_path: Path) -> None:
    http, _ = served
    assert http.get("/lora-adapters").json() == [
        {"id": 0, "path": str(tmp_path / "tone.gguf"), "scale": 1.0},
        {"id": 1, "path": str(tmp_path / "style.gguf"), "scale": 0.5},
    ]


@pytest.mark.parametrize(("lora", "applied"), [
    (None, ((0, 1.0), (1, 0.5))),  # the --lora scales
    ([{"id": 1, "scale": 2.0}], ((1, 2.0),)),  # the adapters named, the others off
    ([], ()),
    ([{"id": 0, "scale": 0.0}], ()),  # a zero scale is no adapter
])
def test_a_reply_computes_with_the_adapters_its_request_names(
    served: tuple[TestClient, ScriptedBackend], lora: list[dict] | None, applied: tuple
) -> None:
    http, backend = served
    complete(http, **({} if lora is None else {"lora": lora}))
    assert backend.evaluated and {loras for _, loras in backend.evaluated} == {applied}


def test_an_unknown_adapter_is_a_400_naming_the_loaded_ones(served: tuple[TestClient, ScriptedBackend]) -> None:
    http, _ = served
    response = http.post("/v1/completions", json={"prompt": "hi", "lora": [{"id": 5, "scale": 1.0}]})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "no LoRA adapter has id 5; loaded: 0 (tone.gguf), 1 (style.gguf)"


def test_post_lora_adapters_sets_the_default_scales(served: tuple[TestClient, ScriptedBackend]) -> None:
    http, backend = served
    assert http.post("/lora-adapters", json=[{"id": 0, "scale": 0.25}]).json() == {"success": True}
    assert [a["scale"] for a in http.get("/lora-adapters").json()] == [0.25, 0.5]
    complete(http)
    assert {loras for _, loras in backend.evaluated} == {((0, 0.25), (1, 0.5))}
    assert http.post("/lora-adapters", json=[{"id": 9, "scale": 1.0}]).status_code == 400


def test_no_kv_is_reused_across_adapters(served: tuple[TestClient, ScriptedBackend]) -> None:
    """The KV of a prompt depends on the adapters it was computed with: the same prompt under other
    adapters is computed afresh; under the same ones again it is reused (here from the prefix cache,
    the one slot having computed another reply in between)."""
    http, _ = served
    tuned = [{"id": 0, "scale": 1.0}]
    first = complete(http, lora=tuned)["usage"]
    plain = complete(http, lora=[])["usage"]
    again = complete(http, lora=tuned)["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert plain["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1


def test_replies_with_different_adapters_are_never_batched_together(tmp_path: Path) -> None:
    backend = ScriptedBackend(TEMPLATE, n_seq=2, seconds_per_token=0.01)
    backend.replies.extend(["x" * 40, "y" * 40])
    with scripted_client(backend, tmp_path, loras=[LoraSpec(tmp_path / "tone.gguf")]) as (_, http):
        requests = [{"lora": [{"id": 0, "scale": 1.0}]}, {"lora": []}]
        threads = [threading.Thread(target=complete, args=(http,), kwargs=dict(body, max_tokens=40)) for body in requests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    prefilled_with: dict[int, tuple] = {}
    for seq, loras in backend.evaluated:
        prefilled_with.setdefault(seq, loras)  # a sequence's first evaluation is its prompt's
    assert len(set(prefilled_with.values())) == 2
    # The two were decoded step by step in turns, each always with its own adapters.
    order = [seq for seq, _ in backend.evaluated]
    assert sum(a != b for a, b in zip(order, order[1:])) > 10
    assert all(prefilled_with[seq] == loras for seq, loras in backend.evaluated)
    assert all(prefilled_with[seq] == loras for loras, seqs in backend.batches for seq in seqs)
