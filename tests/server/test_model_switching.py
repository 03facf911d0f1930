"""A real server with two local models (the default Gemma file and a second name for it, each loaded
into its own llama.cpp engine), switched by request and driven by the openai client."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import openai
import pytest
from live_server import API_KEY, LiveServer, start_server

from localchat.models import DEFAULT_MODEL_NAME, GEMMA_MODEL_FILE, PACKAGED_MODELS, installed_models
from localchat.remote import RemoteServer
from localchat.remote_endpoint import RemoteEndpoint
from localchat.settings import Settings

SECOND = "gemma-3-270m-copy"
BROKEN = "broken"
HUB = "local/gemma-3-270m-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HELLO = [{"role": "user", "content": "Say hello."}]


def _home_with_two_models(home: Path, gemma_model: Path) -> Path:
    """A localchat home whose models folder holds Gemma 3 270M (a packaged model's copy), a second name for it
    and a damaged file; the default model stays where its package put it."""
    models = home / "cache" / "models"
    models.mkdir(parents=True)
    for name in (GEMMA_MODEL_FILE, f"{SECOND}.gguf"):
        _link_or_copy(gemma_model, models / name)
    shutil.copy2(gemma_model.with_name(GEMMA_MODEL_FILE + ".verified"), models / (GEMMA_MODEL_FILE + ".verified"))
    (models / f"{BROKEN}.gguf").write_bytes(gemma_model.read_bytes()[:4096])  # cut short: a download gone wrong
    # Gemma as a hub repo in this home's own Hugging Face cache, as a pull leaves it.
    repo = home / "hf" / "models--local--gemma-3-270m-GGUF"
    (repo / "blobs").mkdir(parents=True)
    _link_or_copy(gemma_model, repo / "blobs" / "d3f4017")
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "gemma-3-270m-Q4_K_M.gguf").symlink_to(Path("../../blobs/d3f4017"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return home


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system: a copy, with its modification time (the marker checks it)
        shutil.copy2(source, target)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory, gemma_model: Path) -> Path:
    return _home_with_two_models(tmp_path_factory.mktemp("two-models"), gemma_model)


@pytest.fixture(scope="module")
def switching(two_models: Path) -> Iterator[LiveServer]:
    """Models loaded as memory allows (all fit)."""
    running = start_server(two_models, env=_hub_cache(two_models))
    yield running
    running.stop()


def _hub_cache(home: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(home / "hf"), "HF_HUB_OFFLINE": "1"}


def _models(server: LiveServer) -> dict[str, str]:
    return {card.id: card.model_extra["status"] for card in server.client().models.list().data}  # type: ignore[index]


def _log(server: LiveServer, home: Path) -> str:
    return (home / f"serve-{server.url.rsplit(':', 1)[1]}.log").read_text()


def _stream_raw(server: LiveServer, body: dict[str, object], arrivals: list[tuple[float, str]]) -> None:
    """Reads a streamed reply's SSE lines as they come, each with its arrival time."""
    with server.post("/v1/chat/completions", body, stream=True) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line:
                arrivals.append((time.monotonic(), line.decode()))


def test_models_lists_every_local_model_and_marks_the_loaded_one(switching: LiveServer, two_models: Path) -> None:
    listed = _models(switching)
    settings = Settings(data_dir=two_models / "data", cache_dir=two_models / "cache", hf_cache_dir=two_models / "hf")
    assert set(listed) == {model.name for model in installed_models(settings)} == {*PACKAGED_MODELS, SECOND, BROKEN,
                                                                                   f"{HUB}:Q4_K_M"}
    assert listed[DEFAULT_MODEL_NAME] == "loaded" and listed[SECOND] == "unloaded"
    # A remote chat on this server without a model named takes the one loaded.
    with RemoteServer(RemoteEndpoint(f"{switching.url}/v1", api_key=API_KEY)) as remote:
        assert remote.model == DEFAULT_MODEL_NAME


def test_a_request_for_another_model_loads_it_while_the_first_model_streams(switching: LiveServer, two_models: Path) -> None:
    first: list[tuple[float, str]] = []
    body = {"model": DEFAULT_MODEL_NAME, "messages": HELLO, "max_tokens": 120, "ignore_eos": True, "stream": True,
            "temperature": 0}
    streaming = threading.Thread(target=_stream_raw, args=(switching, body, first))
    streaming.start()
    while len(first) < 5:
        assert streaming.is_alive(), first
        time.sleep(0.01)
    asked = time.monotonic()
    reply = switching.client().chat.completions.create(model=SECOND, messages=HELLO, max_tokens=8, stream=True,
                                                       temperature=0)
    first_token = next(time.monotonic() for chunk in reply if chunk.choices and chunk.choices[0].delta.content)
    assert [chunk.model for chunk in reply] and all(chunk.model == SECOND for chunk in reply)
    streaming.join(120)

    load_s = switching.metric(f'localchat_model_load_seconds_sum{{model="{SECOND}"}}')
    ttft = first_token - asked
    print(f"\nload {load_s:.2f} s, first token of the new model after {ttft:.2f} s")
    # The target is the load + 1 s: measured +0.65 to +1.5 s with the load average at 6 on 2 cores,
    # the new model's prefill sharing them with the streaming model's threads; the bound leaves room.
    assert ttft <= load_s + 3.0
    # The first model's stream went on during the load, and ended whole.
    during = [line for at, line in first if asked <= at <= asked + load_s]
    assert during, f"no token of the first model arrived during the {load_s:.2f} s load"
    gaps = [b - a for (a, _), (b, _) in pairwise(first) if asked <= b <= first_token]
    print(f"longest gap between the first model's chunks meanwhile: {max(gaps):.2f} s")
    assert first[-1][1] == "data: [DONE]" and '"finish_reason":"length"' in first[-2][1]
    # Every token streamed (a chunk holds the text of its tokens; a character split across tokens comes whole).
    assert sum('"content":' in line for _, line in first) >= 100

    listed = _models(switching)
    assert (listed[DEFAULT_MODEL_NAME], listed[SECOND]) == ("loaded", "loaded")
    assert switching.metric(f'localchat_model_loads_total{{model="{SECOND}",result="loaded"}}') == 1
    assert switching.metric("localchat_models_loaded") == 2
    assert f"localchat: loaded {SECOND} in " in _log(switching, two_models)


def test_an_unknown_model_is_404_model_not_found(switching: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        switching.client().chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=4)
    error = raised.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found" and error["param"] == "model"
    assert "'gpt-4o'" in error["message"] and "GET /v1/models" in error["message"]
    # No model named: the server's first model, as with one model.
    completion = switching.client().chat.completions.create(model="", messages=HELLO, max_tokens=4)
    assert completion.model == DEFAULT_MODEL_NAME


def test_a_hub_model_in_the_cache_loads_by_its_name(switching: LiveServer) -> None:
    completion = switching.client().chat.completions.create(model=f"hf.co/{HUB}", messages=HELLO, max_tokens=2)
    assert completion.model == f"{HUB}:Q4_K_M" and _models(switching)[f"{HUB}:Q4_K_M"] == "loaded"


def test_a_model_that_cannot_load_is_one_error_and_the_others_go_on(switching: LiveServer, two_models: Path) -> None:
    response = switching.post("/v1/chat/completions", {"model": BROKEN, "messages": HELLO, "max_tokens": 4})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "model_load_failed" and error["message"].startswith(f"the model '{BROKEN}' could not be loaded: ")
    assert "\n" not in error["message"] and "Traceback" not in _log(switching, two_models)
    assert f"localchat: loading {BROKEN} failed after " in _log(switching, two_models)
    assert switching.metric(f'localchat_model_loads_total{{model="{BROKEN}",result="failed"}}') == 1
    assert switching.client().chat.completions.create(model=DEFAULT_MODEL_NAME, messages=HELLO, max_tokens=2).choices


def test_with_max_models_1_the_idle_model_is_unloaded_and_a_busy_one_waits(two_models: Path) -> None:
    server = start_server(two_models, "--max-models", "1", env=_hub_cache(two_models))
    try:
        client = server.client()
        assert client.chat.completions.create(model=SECOND, messages=HELLO, max_tokens=4).model == SECOND
        assert _models(server)[DEFAULT_MODEL_NAME] == "unloaded" and _models(server)[SECOND] == "loaded"
        assert server.metric("localchat_models_loaded") == 1
        assert server.metric(f'localchat_model_unloads_total{{model="{DEFAULT_MODEL_NAME}"}}') == 1
        unloaded = rf"localchat: unloaded {DEFAULT_MODEL_NAME} in [0-9.]+ s \(to make room for {SECOND}\)"
        assert re.search(unloaded, _log(server, two_models))

        # A stream on the loaded model is never cut to make room: the other request waits for its end.
        streamed: list[tuple[float, str]] = []
        body = {"model": SECOND, "messages": HELLO, "max_tokens": 40, "ignore_eos": True, "stream": True}
        streaming = threading.Thread(target=_stream_raw, args=(server, body, streamed))
        streaming.start()
        while not streamed:
            time.sleep(0.01)
        answer = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=HELLO, max_tokens=4)
        answered = time.monotonic()
        streaming.join(60)
        assert answer.model == DEFAULT_MODEL_NAME and streamed[-1][1] == "data: [DONE]"
        assert '"finish_reason":"length"' in streamed[-2][1] and streamed[-1][0] <= answered
    finally:
        server.stop()
