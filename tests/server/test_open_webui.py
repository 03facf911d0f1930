"""Open WebUI, a real web chat, on `localchat serve` in a real browser (opt-in: `pytest -m open_webui`).

Open WebUI (PyPI `open-webui`, with CUDA torch: several GB) lives in a venv of its own, with
Playwright (`pip install open-webui==0.12.4 playwright==1.65.2`); LOCALCHAT_OPEN_WEBUI_PYTHON names
that venv's python. Playwright drives Debian's `chromium` (`apt-get install chromium`) by its path,
as its own browser download is not reachable here. Open WebUI starts offline with no login, with
localchat as its Ollama connection, as its OpenAI connection (its models under the prefix
"openai.") and as the engine that embeds its documents (Ollama's /api/embed). Off for a 135M model:
Open WebUI's built-in agent tools (36 tool schemas, 8,000 tokens in front of every question) and its
search-query writing before retrieval (the model writes on to max_tokens rather than the JSON asked
for, minutes on 2 cores): the question itself is embedded as the query.

Checked: Open WebUI lists localchat's models through both connections; a chat through each streams
an answer (its text seen growing in the page); a document uploaded to a chat is embedded through
localchat and the answer cites it. A screenshot of each chat is kept (LOCALCHAT_OPEN_WEBUI_SHOTS, or
the test's folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import API_KEY, LiveServer, free_loopback_port, other_server, start_server

from localchat.models import DEFAULT_MODEL_NAME

OPEN_WEBUI_PYTHON = os.environ.get("LOCALCHAT_OPEN_WEBUI_PYTHON")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_SCRIPT = Path(__file__).with_name("open_webui_browser.py")
DOCUMENT = """The Vellmar lighthouse stands on the northern cape of Orsk island. It was built in 1871 by the
engineer Hanne Drostvik, and its lamp burned whale oil until 1923, when it was fitted with an electric lamp.
"""
pytestmark = [
    pytest.mark.open_webui,
    pytest.mark.skipif(OPEN_WEBUI_PYTHON is None or not Path(CHROMIUM).exists(),
                       reason="no Open WebUI: set LOCALCHAT_OPEN_WEBUI_PYTHON to the python of a venv with "
                              "open-webui==0.12.4 and playwright==1.65.2, install Debian's chromium, and run "
                              "`pytest -m open_webui`"),
]


@pytest.fixture(scope="module")
def localchat(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("open-webui-localchat"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_webui(localchat: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Open WebUI on loopback, offline and without login, on localchat's two APIs; its root URL."""
    assert OPEN_WEBUI_PYTHON is not None
    data = tmp_path_factory.mktemp("open-webui")
    port = free_loopback_port()
    env = {
        **os.environ, "DATA_DIR": str(data), "WEBUI_SECRET_KEY": "localchat-test", "WEBUI_AUTH": "False", "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1",
        "OLLAMA_BASE_URL": localchat.url, "OLLAMA_API_CONFIGS": json.dumps({"0": {"key": API_KEY}}),
        "OPENAI_API_BASE_URL": f"{localchat.url}/v1", "OPENAI_API_KEY": API_KEY,
        "OPENAI_API_CONFIGS": json.dumps({"0": {"prefix_id": "openai"}}),
        "RAG_EMBEDDING_ENGINE": "ollama", "RAG_EMBEDDING_MODEL": DEFAULT_MODEL_NAME,
        "RAG_OLLAMA_BASE_URL": localchat.url, "RAG_OLLAMA_API_KEY": API_KEY,
        "DEFAULT_MODEL_METADATA": json.dumps({"capabilities": {"builtin_tools": False}}),
        # Replies of a 135M model kept short and from looping (Open WebUI passes these to both connections).
        "DEFAULT_MODEL_PARAMS": json.dumps({"max_tokens": 96, "repeat_penalty": 1.1}),
        "ENABLE_TITLE_GENERATION": "false", "ENABLE_FOLLOW_UP_GENERATION": "false", "ENABLE_TAGS_GENERATION": "false",
        "ENABLE_AUTOCOMPLETE_GENERATION": "false", "ENABLE_EVALUATION_ARENA_MODELS": "false",
        # The question itself is the search query: a 135M model asked to write queries as JSON writes on to max_tokens.
        "ENABLE_RETRIEVAL_QUERY_GENERATION": "false",
        "ANONYMIZED_TELEMETRY": "false", "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true",
    }
    # Its console script, run by its venv's python (the package has no __main__).
    command = [OPEN_WEBUI_PYTHON, "-c", "from open_webui import app; app()", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with other_server("Open WebUI", command, port, "/health", data / "open-webui.log", timeout_s=300, env=env, cwd=data) as url:
        yield url


def _streamed(chat: dict[str, object]) -> bool:
    """The answer was seen growing: at least two partial texts before the whole."""
    grew = [text for text in chat["grew"] if str(text).strip()]  # type: ignore[attr-defined]
    return chat["ended"] is True and len(grew) >= 3 and len(str(grew[0])) < len(str(chat["answer"]))


def test_open_webui_chats_and_embeds_through_localchat(localchat: LiveServer, open_webui: str,
                                                      tmp_path: Path) -> None:
    shots = Path(os.environ.get("LOCALCHAT_OPEN_WEBUI_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    document = tmp_path / "vellmar.txt"
    document.write_text(DOCUMENT)
    assert OPEN_WEBUI_PYTHON is not None
    run = subprocess.run([OPEN_WEBUI_PYTHON, str(BROWSER_SCRIPT), open_webui, DEFAULT_MODEL_NAME, str(document), str(shots),
                          CHROMIUM], capture_output=True, text=True, timeout=2400, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))

    models = {model_id: owner for model_id, owner in report["models"]}
    assert models[DEFAULT_MODEL_NAME] == "ollama" and models[f"openai.{DEFAULT_MODEL_NAME}"] == "openai"
    for chat in ("ollama_chat", "openai_chat"):
        assert _streamed(report[chat]), (chat, report[chat])
    assert localchat.metric('localchat_http_requests_total{path="/api/chat",status="200"}') >= 1
    assert localchat.metric('localchat_http_requests_total{path="/v1/chat/completions",status="200"}') >= 1
    # The document and the question were embedded through localchat, and the answer cites the document.
    assert localchat.metric('localchat_http_requests_total{path="/api/embed",status="200"}') >= 2
    assert report["document_chat"]["ended"] and report["document_chat"]["sources"] >= 1, report["document_chat"]
