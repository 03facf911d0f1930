"""LoRA adapters: tiny PEFT adapters on the tiny checkpoints, converted to GGUF, applied by the real
llama.cpp to the converted base model, and compared with transformers running the base model with
the adapter merged by peft."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from checkpoint_fixtures import ADAPTERS, ALPHA, make_adapter
from greedy_reference import GREEDY_TOKENS, compared_until_near_tie, load, logprob_distance, reference_run
from localchat.adapters import LoraSpec
from localchat.backends.base import ARGMAX
from localchat.cli import main
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.lora import convert_adapter
from localchat.engine import Engine
from localchat.errors import LocalchatError, ModelError
from localchat.gguf_file import read_gguf_header
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

# llama.cpp with an adapter is this much nearer transformers with the adapter merged than the adapter
# moves the model (measured on the verify text: at most 0.05 nats a token apart, where the adapters
# move the model by 1.6 to 10).
ADAPTED = 0.1


def greedy_with(engine: Engine, prompt: list[int]) -> list[int]:
    """The reply a user gets: through a session, which applies the engine's adapters."""
    settings = GenerationSettings(max_tokens=GREEDY_TOKENS, sampler=ARGMAX, ignore_eos=True)
    generation = engine.sessions[0].generate(prompt, settings)
    generation.text()
    return list(generation.stats.completion_ids)


@pytest.mark.parametrize("name", ADAPTERS)
def test_adapter_in_llama_cpp_equals_peft_merged_in_transformers(
    name: str, tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    adapter, merged = tiny_lora(name)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_checkpoint(name))
    lora = convert_adapter(adapter, tmp_path / "adapter.gguf", "f32").output
    header = read_gguf_header(lora)
    assert (header.get("general.type"), header.get("adapter.type"), header.get("adapter.lora.alpha")) == ("adapter", "lora", ALPHA)
    assert all(t.name.endswith((".lora_a", ".lora_b")) for t in header.tensors)
    base = convert_checkpoint(tiny_checkpoint(name), tmp_path / "base.gguf", "f32", threads=2).output
    reference, without = reference_run(merged), reference_run(tiny_checkpoint(name))
    with load(base, loras=[LoraSpec(lora)]) as engine:
        ours = greedy_with(engine, reference.prompt)
        adapted = engine.backend.score(0, reference.text_tokens).logprobs  # the adapter stays set
        # A reply asking for no adapter gets the base model.
        plain = GenerationSettings(max_tokens=GREEDY_TOKENS, sampler=ARGMAX, ignore_eos=True, loras=())
        generation = engine.sessions[0].generate(reference.prompt, plain)
        generation.text()
    compared_until_near_tie(reference, ours)
    compared_until_near_tie(without, list(generation.stats.completion_ids))
    # Over the whole verify text, llama.cpp with the adapter is transformers with it merged, not without.
    assert logprob_distance(adapted, reference.logprobs) < ADAPTED * logprob_distance(reference.logprobs, without.logprobs)


def test_adapter_at_half_scale_is_half_the_delta(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """--lora FILE:0.5 is PEFT's adapter with its scaling halved (alpha 4 instead of 8)."""
    base = tiny_checkpoint("llama")
    adapter, merged_full = make_adapter(base, tmp_path / "full", 0, target_modules="all-linear")
    _, merged_half = make_adapter(base, tmp_path / "half", 0, target_modules="all-linear", alpha_pattern={".*": ALPHA / 2})
    lora = convert_adapter(adapter, tmp_path / "adapter.gguf", "f16").output
    model = convert_checkpoint(base, tmp_path / "base.gguf", "f32", threads=2).output
    half, full, base_run = reference_run(merged_half), reference_run(merged_full), reference_run(base)
    with load(model, loras=[LoraSpec.parse(f"{lora}:0.5")]) as engine:
        greedy_with(engine, half.prompt)  # a reply sets the adapters
        ours = engine.backend.score(0, half.text_tokens).logprobs
    assert logprob_distance(ours, half.logprobs) < ADAPTED * min(logprob_distance(half.logprobs, other.logprobs)
                                                                  for other in (full, base_run))


def test_cli_converts_an_adapter_and_runs_it(
    tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    adapter, _ = tiny_lora("llama")
    assert main(["convert", str(adapter), "--to", "gguf", "-o", "/proc/a.gguf"]) == 1  # /proc takes no files, even root's
    assert capsys.readouterr().err.strip().splitlines()[-1] == "localchat: error: cannot write to the output folder /proc (No such file or directory); choose another path with -o"
    assert main(["convert", str(adapter), "--to", "gguf", "-o", str(tmp_path / "a.gguf")]) == 0
    assert "LoRA adapter" in capsys.readouterr().out
    base = convert_checkpoint(tiny_checkpoint("llama"), tmp_path / "base.gguf", "q8_0", threads=2).output
    argv = ["run", "-m", str(base), "--lora", f"{tmp_path / 'a.gguf'}:0.7", "--raw", "-n", "8", "--temperature", "0", "--stats", "The"]
    assert main(argv) == 0
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["completion_tokens"] == 8 or stats["finish_reason"] == "stop"


# Adapters that do not belong to the model: one line each, naming what is wrong.
def _adapter_for_qwen3(tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp: Path) -> tuple[Path, Path]:
    lora = convert_adapter(tiny_lora("llama")[0], tmp / "llama-adapter.gguf").output
    return convert_checkpoint(tiny_checkpoint("qwen3"), tmp / "qwen3.gguf", "q8_0", threads=2).output, lora


def _adapter_for_mixtral_shapes(tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp: Path) -> tuple[Path, Path]:
    # Mixtral is "llama" to llama.cpp too, 256 wide where the tiny Llama is 64.
    lora = convert_adapter(tiny_lora("llama")[0], tmp / "llama-adapter.gguf").output
    return convert_checkpoint(tiny_checkpoint("mixtral"), tmp / "mixtral.gguf", "q8_0", threads=2).output, lora


def _model_as_adapter(tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp: Path) -> tuple[Path, Path]:
    model = convert_checkpoint(tiny_checkpoint("llama"), tmp / "llama.gguf", "q8_0", threads=2).output
    return model, model


WRONG_ADAPTERS = {
    "another architecture": (_adapter_for_qwen3, "is a LoRA adapter for llama models and the model is qwen3"),
    "another base model's shapes": (_adapter_for_mixtral_shapes, "has incorrect shape.*the base model it was made for"),
    "a model given as an adapter": (_model_as_adapter, "is not a LoRA adapter"),
}


@pytest.mark.parametrize("case", WRONG_ADAPTERS)
def test_adapter_of_another_model_is_refused_in_one_line(
    case: str, tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    make, message = WRONG_ADAPTERS[case]
    model, lora = make(tiny_checkpoint, tiny_lora, tmp_path)
    with pytest.raises(ModelError, match=message) as raised:
        load(model, loras=[LoraSpec(lora)])
    assert "\n" not in str(raised.value)


def test_conversion_against_another_base_is_refused_in_one_line(
    tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    adapter, _ = tiny_lora("llama")
    with pytest.raises(ModelError, match=r"LoRA matrices are \[4, (64|128)\].* is 256 x 256; the adapter was made for another base") as raised:
        convert_adapter(adapter, tmp_path / "out.gguf", base=str(tiny_checkpoint("mixtral")))
    assert "\n" not in str(raised.value) and not list(tmp_path.iterdir())
    with pytest.raises(ModelError, match="names no base model"):
        config = json.loads((adapter / "adapter_config.json").read_text())
        orphan = tmp_path / "orphan"
        shutil.copytree(adapter, orphan)
        (orphan / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": None}))
        convert_adapter(orphan, tmp_path / "out.gguf")


def test_dora_and_expert_parameter_adapters_are_refused_by_name(tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    adapter, _ = tiny_lora("llama")
    for key, value, message in (("use_dora", True, "DoRA"), ("target_parameters", ["gate_up_proj"], "experts' fused parameters")):
        changed = tmp_path / key
        shutil.copytree(adapter, changed)
        config = json.loads((changed / "adapter_config.json").read_text())
        (changed / "adapter_config.json").write_text(json.dumps(config | {key: value}))
        with pytest.raises(ModelError, match=message):
            convert_adapter(changed, tmp_path / f"{key}.gguf")


def test_onnx_backend_refuses_adapters_by_name(tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path) -> None:
    from localchat.converters.onnx import convert_to_onnx

    model = convert_to_onnx(tiny_checkpoint("llama"), tmp_path / "onnx", "fp32").output
    lora = convert_adapter(tiny_lora("llama")[0], tmp_path / "adapter.gguf").output
    with pytest.raises(LocalchatError, match=r"the ONNX backend \(onnxruntime\) cannot apply LoRA adapters"):
        Engine.load(str(model), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=256), loras=[LoraSpec(lora)])
