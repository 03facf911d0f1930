"""Presets (localchat.presets): what a chat starts from, how a preset file is read and written, and how a
name finds one (localchat.models). No model is loaded: a preset's model here is a file's path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localchat.backends.base import SamplerSettings
from localchat.errors import InvalidSettingError, ModelError
from localchat.models import installed_models, prune_upload, remove_model, resolve_model
from localchat.presets import (
    SAMPLING_FIELDS,
    ModelPreset,
    PresetMessage,
    preset_from_json,
    read_preset,
    write_preset,
)
from localchat.sampling_defaults import SamplerDefaults
from localchat.server.schemas import SAMPLER_FIELDS
from localchat.settings import Settings
from localchat.templates import Message

PIRATE = ModelPreset("pirate", "base-model", system="You are a pirate.",
                     messages=(PresetMessage("user", "Who are you?"), PresetMessage("assistant", "Captain Hook.")),
                     sampling=(("temperature", 0.0), ("penalty_last_n", 32)), stop=("\n",), max_tokens=20, context=1024)


def test_a_chat_starts_with_the_presets_system_prompt_and_messages() -> None:
    asked = [Message("user", "Where is the treasure?")]
    opening = [Message("user", "Who are you?"), Message("assistant", "Captain Hook.")]
    assert PIRATE.opening(asked) == [Message("system", "You are a pirate."), *opening, *asked]
    # The chat's own system prompt wins, and stays first.
    own = [Message("system", "Be brief."), *asked]
    assert PIRATE.opening(own) == [own[0], *opening, *asked]
    assert ModelPreset("plain", "base-model").opening(asked) == asked


def test_a_presets_settings_go_over_the_models_defaults() -> None:
    model = SamplerDefaults(SamplerSettings(temperature=0.2, top_p=0.9), "family: SmolLM2")
    sampler = PIRATE.sampler(model)
    assert (sampler.settings.temperature, sampler.settings.top_p, sampler.settings.penalty_last_n) == (0.0, 0.9, 32)
    assert sampler.source == "preset pirate over family: SmolLM2"
    assert ModelPreset("plain", "base-model").sampler(model) is model


def test_a_preset_sets_what_a_requests_sampler_fields_set() -> None:
    """/api/create makes a preset's settings of a request's sampler fields (SAMPLER_FIELDS), each of which it keeps."""
    assert set(SAMPLER_FIELDS.values()) == set(SAMPLING_FIELDS)


@pytest.mark.parametrize(("data", "wrong"), [
    ({}, "names no model"),
    ({"model": 3}, "'model' must be str"),
    ({"model": "m", "sampling": {"temperature": -1}}, "temperature must be >= 0"),
    ({"model": "m", "sampling": {"mirostat": 2}}, "'sampling' holds numbers for"),
    ({"model": "m", "sampling": {"top_k": "40"}}, "'sampling' holds numbers for"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
    ({"model": "m", "messages": ["hi"]}, "'messages' must be a list"),
    ({"model": "m", "stop": [""]}, "'stop' must be a list of strings"),
    ({"model": "m", "context": 8}, "too small"),
    ({"model": "m", "max_tokens": True}, "'max_tokens' must be int"),
])
def test_a_bad_preset_says_what_is_wrong(data: dict[str, object], wrong: str) -> None:
    with pytest.raises(InvalidSettingError, match=wrong):
        preset_from_json("bad", data)


def test_a_preset_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = write_preset(PIRATE, tmp_path)
    assert path.name == "pirate.preset.json" and [p.name for p in tmp_path.iterdir()] == [path.name]
    assert read_preset(path) == PIRATE
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match=r"^preset pirate \(.*\) cannot be read: .*; delete it and create it again$"):
        read_preset(path)
    with pytest.raises(InvalidSettingError, match="preset name 'a/b' is invalid"):
        ModelPreset("a/b", "m")


def test_a_name_finds_a_preset_over_its_model_and_rm_removes_only_the_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    settings = Settings()
    model = tmp_path / "weights.gguf"
    model.write_bytes(b"GGUF")  # found by its path; never read here
    write_preset(ModelPreset("pirate", str(model), system="Arr."), settings.models_dir)
    ref = resolve_model("Pirate", settings)
    assert (ref.name, ref.path, ref.format) == ("pirate", model, "gguf")
    assert ref.preset is not None and ref.preset.system == "Arr."

    write_preset(ModelPreset("orphan", "no-such-model"), settings.models_dir)
    with pytest.raises(ModelError, match="^preset orphan runs no-such-model, which cannot be found"):
        resolve_model("orphan", settings)
    write_preset(ModelPreset("second", "pirate"), settings.models_dir)
    with pytest.raises(ModelError, match="^preset second runs another preset, pirate"):
        resolve_model("second", settings)
    rows = {row.name: row for row in installed_models(settings)}
    assert rows["orphan"].problem is not None and rows["second"].problem is not None
    assert rows["pirate"].preset_of == str(model)

    assert remove_model("pirate", settings).names == ("pirate",)
    assert model.exists() and not (settings.models_dir / "pirate.preset.json").exists()
    with pytest.raises(ModelError, match="unknown model 'pirate'"):
        resolve_model("pirate", settings)
    assert json.loads((settings.models_dir / "orphan.preset.json").read_text()) == {"model": "no-such-model"}


def test_an_upload_goes_with_the_last_preset_naming_it_unless_a_create_in_flight_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/api/delete and a failed or repeated /api/create delete the upload no preset names any more (localchat.models
    prune_upload), but not one another client's create still in flight names (it would name a file gone)."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    settings = Settings()
    upload = settings.models_dir / "blobs" / f"sha256-{'a' * 64}"
    upload.parent.mkdir(parents=True)
    upload.write_bytes(b"GGUF")
    for name in ("first", "second"):
        write_preset(ModelPreset(name, str(upload)), settings.models_dir)
    remove_model("first", settings)
    assert upload.exists()  # "second" names it
    assert prune_upload(str(upload), settings) == 0 and upload.exists()
    remove_model("second", settings, uploads_in_use={str(upload)})
    assert upload.exists()  # a create in flight names it
    assert prune_upload(str(upload), settings) == 4 and not upload.exists()
