"""Planning a model, then opening its backend on a thread of its own while the caller goes on."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from localchat.engine import Engine
from localchat.errors import ModelError
from localchat.model_loading import ProgressRelay, start_loading
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

LOAD_THREAD = "localchat-model-load"


def test_the_backend_opens_on_a_thread_of_its_own_and_the_engine_takes_it(default_model: Path, settings: Settings) -> None:
    loaded_on: set[str] = set()
    loading = start_loading(str(default_model), settings, PlanRequest(n_ctx=512),
                            on_progress=lambda _fraction: loaded_on.add(threading.current_thread().name))
    assert loading.model_plan.model.path == default_model and loading.model_plan.plan.n_ctx == 512
    with Engine.load(loading) as engine:
        assert loaded_on == {LOAD_THREAD}  # llama.cpp reported its progress from there
        assert engine.model_plan is loading.model_plan and engine.backend.n_ctx == 512
        reply = engine.new_chat().send("What is the capital of Japan?", GenerationSettings(max_tokens=8))
        assert reply.text().strip()
        with pytest.raises(RuntimeError, match="taken already"):
            loading.backend()  # the engine owns it: no second owner


def test_a_load_left_untaken_is_waited_for_and_closed(default_model: Path, settings: Settings) -> None:
    """A caller that stops before taking the backend (an error, Ctrl-C) leaves the `with` after the load,
    not while llama.cpp still runs in it, and closes what was loaded."""
    with start_loading(str(default_model), settings, PlanRequest(n_ctx=512)) as loading:
        pass
    assert loading._opening.done()  # waited for
    opened = loading._opening.result()
    assert opened.model.pointer is None and opened.context.pointer is None  # type: ignore[attr-defined]  # and closed
    with pytest.raises(ModelError, match="was given up"):
        loading.backend()  # a taker too late (the chat app's load, when the app quit first) is told so


def test_a_model_that_cannot_be_planned_is_refused_before_any_thread_starts(settings: Settings) -> None:
    before = threading.active_count()
    with pytest.raises(ModelError, match="does not exist"):
        start_loading("/nowhere/model.gguf", settings)
    assert threading.active_count() == before


def test_a_relay_hands_the_latest_progress_to_a_listener_attached_later() -> None:
    relay = ProgressRelay()
    relay(0.25)
    relay(0.5)
    heard: list[float] = []
    relay.attach(heard.append)
    relay(1.0)
    assert heard == [0.5, 1.0]


def test_a_gguf_model_starts_loading_before_numpy_is_imported(default_model: Path, tmp_path: Path) -> None:
    """Planning and the load's start import no numpy (40 ms here): `localchat run` imports it, and the rest of
    the engine, while llama.cpp loads the model."""
    code = (
        "import sys\n"
        "import localchat.backends.llamacpp_natives as natives\n"
        "open_model = natives.open_model\n"
        "def opening(*args, **kwargs):\n"
        "    print('numpy' in sys.modules, flush=True)\n"
        "    return open_model(*args, **kwargs)\n"
        "natives.open_model = opening\n"
        "from localchat.cli import main\n"
        f"sys.exit(main(['run', '-m', {str(default_model)!r}, '-n', '1', 'Hi']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "False"


def test_llama_cpp_s_log_keeps_its_latest_error_lines_and_drops_the_rest() -> None:
    """The log callback (C: localchat/backends/_llama_log.c) called as llama.cpp calls it."""
    from localchat.backends import _llama_log
    from localchat.backends.llamacpp_natives import log_callback

    _llama_log.clear_errors()
    log_callback(2, b"llama_model_loader: loaded meta data\n", None)  # INFO: dropped
    assert _llama_log.recent_errors() == []
    for line in range(10):
        log_callback(4, f"error {line}\n".encode(), None)
        log_callback(3, b"a warning\n", None)
    log_callback(4, b"\xff cut \xe2\x82\n", None)
    assert _llama_log.recent_errors() == [*(f"error {line}" for line in range(3, 10)), "\ufffd cut \ufffd"]
    _llama_log.clear_errors()
    assert _llama_log.recent_errors() == []


def test_a_model_file_cut_short_is_refused_with_what_llama_cpp_found(default_model: Path, settings: Settings, tmp_path: Path) -> None:
    from localchat.backends.llamacpp_natives import LlamaModel, ensure_initialized
    from localchat.model_loading import plan_model

    ensure_initialized()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_model.read_bytes()[: default_model.stat().st_size // 2])
    load = plan_model(str(default_model), settings, PlanRequest()).plan.load_params
    with pytest.raises(ModelError, match=r"could not load .*cut\.gguf: .*not within the file bounds"):
        LlamaModel(cut, load, None)
