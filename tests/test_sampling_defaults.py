"""Sampling defaults come from the model (general.sampling.*), else its family's row, else llama.cpp's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from localchat.backends.base import SamplerSettings
from localchat.backends.llamacpp_natives import dry_key, open_model
from localchat.cli import main
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.onnx import convert_to_onnx
from localchat.engine import Engine
from localchat.gguf_file import generation_config_sampling, read_gguf_header
from localchat.model_loading import open_backend, plan_model
from localchat.planner import PlanRequest
from localchat.sampling_defaults import FAMILY_DEFAULTS, sampler_defaults
from localchat.session import GenerationSettings
from localchat.settings import Settings


def test_a_model_of_no_known_family_gets_llama_cpps_defaults() -> None:
    defaults = sampler_defaults({"general.name": "Mistral 7B Instruct", "general.architecture": "llama"})
    assert defaults == sampler_defaults({}) and defaults.source == "llama.cpp"
    assert defaults.settings == SamplerSettings() and not defaults.settings.penalized


def test_a_family_row_applies_by_name() -> None:
    smol = sampler_defaults({"general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "general.basename": "smollm2"})
    assert smol.source == "family: SmolLM2" and (smol.settings.temperature, smol.settings.top_p) == (0.2, 0.9)
    gemma_base = sampler_defaults({"general.name": "Gemma 3 270m"})
    assert gemma_base.source == "family: Gemma 3 270M base" and gemma_base.settings.repeat_penalized
    # The instruction-tuned Gemma is another model: it does not loop, so no penalty for it.
    assert sampler_defaults({"general.name": "Gemma 3 270m It", "general.finetune": "it"}).source == "llama.cpp"
    assert all(row.why for row in FAMILY_DEFAULTS)


def test_the_file_s_own_keys_come_first_and_bad_values_are_ignored() -> None:
    metadata = {"general.name": "Smollm2 135M", "general.sampling.temp": "0.6", "general.sampling.top_k": "20",
                "general.sampling.penalty_repeat": "not a number"}
    defaults = sampler_defaults(metadata)
    assert defaults.source == "model"
    assert (defaults.settings.temperature, defaults.settings.top_k, defaults.settings.top_p) == (0.6, 20, 0.95)
    assert not defaults.settings.repeat_penalized
    out_of_range = sampler_defaults({"general.sampling.top_p": "7"})  # a damaged file: llama.cpp's defaults
    assert out_of_range.settings == SamplerSettings()


def test_generation_config_maps_as_llama_cpps_converter_maps_it() -> None:
    written = generation_config_sampling({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05,
                                          "do_sample": True, "min_p": None, "bos_token_id": 1})
    assert written == {"general.sampling.temp": 0.6, "general.sampling.top_p": 0.95, "general.sampling.top_k": 20,
                       "general.sampling.penalty_repeat": 1.05}
    assert isinstance(written["general.sampling.top_k"], int)


def test_a_converted_checkpoint_carries_its_generation_config_into_the_model_s_defaults(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = shutil.copytree(tiny_checkpoint("qwen3"), tmp_path / "with-generation-config")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                               "repetition_penalty": 1.05}))
    output = convert_checkpoint(folder, tmp_path / "tiny.gguf", "f16", threads=2).output
    header = read_gguf_header(output)
    assert (header.get("general.sampling.temp"), header.get("general.sampling.top_k")) == (0.6000000238418579, 20)
    with Engine.load(str(output), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=256)) as engine:
        defaults = engine.sampler_defaults
        assert defaults.source == "model"
        settings = defaults.settings
        assert (settings.top_k, round(settings.temperature, 4), round(settings.top_p, 4)) == (20, 0.6, 0.9)
        assert round(settings.repeat_penalty, 4) == 1.05 and settings.repeat_penalized
        # A reply that names no sampler is sampled with them.
        generation = engine.sessions[0].generate(engine.backend.tokenize("hello", add_bos=True, special=False))
        generation.text()
        assert generation.stats is not None and generation.stats.sampler == settings



def test_an_onnx_conversion_starts_from_the_same_defaults_as_the_gguf_one(
    tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The converter copies generation_config.json into the ONNX folder; its sampling values were
    unread there, and an ONNX model sampled with llama.cpp's defaults."""
    folder = shutil.copytree(tiny_checkpoint("qwen3"), tmp_path / "with-generation-config")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                               "repetition_penalty": 1.05}))
    output = convert_to_onnx(folder, tmp_path / "tiny-onnx", "fp32").output
    with Engine.load(str(output), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=256)) as engine:
        assert engine.backend.name == "onnxruntime"
        defaults = engine.sampler_defaults
        assert defaults.source == "model"
        settings = defaults.settings
        assert (settings.top_k, round(settings.temperature, 4), round(settings.top_p, 4)) == (20, 0.6, 0.9)
        assert round(settings.repeat_penalty, 4) == 1.05
    # `info` shows them, as for a GGUF file.
    capsys.readouterr()
    assert main(["info", "-m", str(output)]) == 0
    sampler = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sampler "))
    assert "top_k=20" in sampler and "temp=0.6" in sampler and "(defaults: model;" in sampler
    (output / "generation_config.json").write_text("{")  # damaged: the defaults without the maker's
    with Engine.load(str(output), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=256)) as engine:
        assert engine.sampler_defaults.source == "llama.cpp"

def test_the_default_chat_model_gets_its_family_s_defaults(engine: Engine) -> None:
    assert engine.sampler_defaults.source == "family: SmolLM2"
    assert engine.sessions[0].sampler_defaults == engine.sampler_defaults.settings


def test_the_default_sampler_s_dry_is_made_with_the_model_not_by_the_first_reply(default_model: Path, tmp_path: Path) -> None:
    """llama.cpp's DRY reads the whole vocabulary when it is made (50 ms of Gemma 3 270M's first token):
    the load starts it for the model's defaults once the model is read, on a thread of its own beside
    the context, and a reply with them takes it."""
    # A context llama.cpp pads (500 cells to 512): the DRY begun for the 500 asked is the one the reply asks for.
    with Engine.load(str(default_model), Settings(cache_dir=tmp_path), PlanRequest(n_ctx=500)) as engine:
        defaults = engine.sampler_defaults.settings
        assert defaults.dry
        dry = engine.backend._dry_samplers  # type: ignore[attr-defined]
        assert len(dry) == 1  # before any reply
        made = next(iter(dry.values()))
        engine.new_chat().send("Hi", GenerationSettings(max_tokens=2)).text()
        assert list(dry.values()) == [made]


def test_the_load_begins_the_first_sampler_s_dry_beside_the_context(default_model: Path, settings: Settings) -> None:
    """For the context asked for (500 tokens, of the 512 cells llama.cpp makes), and for no draft model (it drafts its argmax)."""
    model_plan = plan_model(str(default_model), settings, PlanRequest(n_ctx=500))
    load = model_plan.plan.load_params
    opened = open_model(default_model, load, first_sampler=lambda metadata: sampler_defaults(metadata).settings)
    try:
        first = sampler_defaults(opened.metadata).settings
        assert first.dry and list(opened.dry_samplers) == [dry_key(first, 500)]
    finally:
        opened.close()
    opened = open_model(default_model, load)
    try:
        assert opened.dry_samplers == {}
    finally:
        opened.close()
    draft = open_backend(model_plan, replies=False)
    try:
        assert draft._dry_samplers == {}  # type: ignore[attr-defined]
    finally:
        draft.close()
