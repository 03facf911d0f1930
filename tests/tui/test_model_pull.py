"""The model picker pulls a model from the hub by name, with its progress, and can cancel the pull:
the real app and the real huggingface_hub client against the stand-in hub of tests/hub on loopback."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pilot_steps import GEMMA_FILE, GEMMA_REPO, send, wait_until
from stand_in_hub import Fault, StandInHub
from textual.widgets import Input, OptionList, ProgressBar

from localchat.hub import HubModelName, find_cached
from localchat.models import PACKAGED_MODELS
from localchat.settings import Settings
from localchat.tui.app import ChatApp
from localchat.tui.widgets.dialogs import ModelPicker

pytestmark = pytest.mark.anyio
MakeApp = Callable[..., ChatApp]
MIB = 1 << 20
STALL_AT = 100 * MIB  # the transfer stops here until the test releases it


async def ask_for_pull(pilot, app: ChatApp, name: str) -> ModelPicker:  # type: ignore[no-untyped-def]
    await pilot.press("ctrl+o")
    picker = app.screen
    assert isinstance(picker, ModelPicker)
    await pilot.pause()
    await pilot.press("tab")
    assert picker.focused is picker.query_one("#pull-name", Input)
    picker.query_one("#pull-name", Input).value = name  # typing it key by key takes seconds
    await pilot.press("enter")
    return picker


def status(picker: ModelPicker) -> str:
    return str(picker.query_one("#pull-status").render())


async def test_a_pull_shows_its_progress_and_the_model_can_then_be_loaded(
        make_app: MakeApp, model_hub: StandInHub, pull_settings: Settings) -> None:
    file = model_hub.repos[GEMMA_REPO].files[GEMMA_FILE]
    model_hub.add_fault(file, Fault(stall_after=STALL_AT))
    app = make_app()
    app.settings = pull_settings
    async with app.run_test(size=(80, 24)) as pilot:
        picker = await ask_for_pull(pilot, app, f"{GEMMA_REPO}:q4_k_m")
        bar = picker.query_one(ProgressBar)
        await wait_until(pilot, lambda: (bar.progress or 0) >= STALL_AT - 10 * MIB)
        assert bar.total == file.size and (bar.progress or 0) < file.size and picker.query_one("#pull").display
        assert status(picker).startswith(f"Pulling {GEMMA_REPO}:q4_k_m: ") and f"of {file.size / MIB:,.1f} MiB" in status(picker)
        assert find_cached(HubModelName(GEMMA_REPO), pull_settings) is None  # nothing taken while it runs

        model_hub.release.set()  # the stalled connection closes; the client resumes from where it was
        await wait_until(pilot, lambda: picker.pulling is None)
        name = f"{GEMMA_REPO}:Q4_K_M"
        assert status(picker) == f"Pulled {name}: Enter loads it" and not picker.query_one("#pull").display
        labels = [c.label for c in picker.choices]
        assert name in labels and picker.query_one(OptionList).highlighted == labels.index(name)
        assert find_cached(HubModelName(GEMMA_REPO), pull_settings) is not None

        engine = app.engine
        await pilot.press("enter")  # the pulled model is highlighted: Enter loads it
        await wait_until(pilot, lambda: not app.loading)
        assert app.engine is not engine and app.model_label == name and app.status.state == "ready"
        await send(pilot, "Hello")
        assert app.last_stats is not None and app.last_stats.completion_tokens > 0


async def test_escape_cancels_a_pull_and_no_model_file_is_left(
        make_app: MakeApp, model_hub: StandInHub, pull_settings: Settings) -> None:
    file = model_hub.repos[GEMMA_REPO].files[GEMMA_FILE]
    model_hub.add_fault(file, Fault(stall_after=STALL_AT))
    app = make_app()
    app.settings = pull_settings
    async with app.run_test(size=(80, 24)) as pilot:
        picker = await ask_for_pull(pilot, app, GEMMA_REPO)
        bar = picker.query_one(ProgressBar)
        await wait_until(pilot, lambda: (bar.progress or 0) >= STALL_AT - 10 * MIB)
        await pilot.press("escape")  # cancels the pull; the dialog stays
        assert isinstance(app.screen, ModelPicker) and status(picker).startswith("Cancelling the pull")
        model_hub.release.set()  # the transfer moves again and meets the cancel at its next chunk
        await wait_until(pilot, lambda: picker.pulling is None)
        assert status(picker).startswith(f"Pull cancelled: the pull of {GEMMA_REPO} was cancelled; what was fetched is kept")
        assert [c.label for c in picker.choices] == list(PACKAGED_MODELS)
        assert find_cached(HubModelName(GEMMA_REPO), pull_settings) is None
        assert not list(pull_settings.hf_cache_dir.rglob("*.gguf"))  # no model file, not even a link
        kept = list(pull_settings.hf_cache_dir.rglob("*.incomplete"))
        assert len(kept) == 1 and STALL_AT <= kept[0].stat().st_size < file.size  # for the next pull to resume
        await pilot.press("escape")  # now it closes the dialog
        assert not isinstance(app.screen, ModelPicker)


async def test_a_name_that_is_not_a_hub_name_is_one_line(make_app: MakeApp, pull_settings: Settings) -> None:
    app = make_app()
    app.settings = pull_settings
    async with app.run_test(size=(80, 24)) as pilot:
        picker = await ask_for_pull(pilot, app, "not a name")
        await pilot.pause()
        assert picker.pulling is None and status(picker) == "'not a name' is not a hub model name: write user/repo or user/repo:QUANT"
        assert picker.query_one("#pull-status").has_class("error")
