"""The planner's GPU choices reach llama.cpp: model and context parameters (real llama.cpp structs)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import llama_cpp
import pytest

from localchat.backends.llamacpp import LlamaCppBackend
from localchat.backends.llamacpp_natives import FLASH_ATTN_TYPES, KV_CACHE_TYPES, log_callback, open_model, place_layers
from localchat.model_loading import plan_model
from localchat.hardware import GIB, Gpu, Hardware
from localchat.planner import FlashAttn, KvType, PlanRequest, plan_offload
from localchat.settings import Settings
from test_planner import LLAMA_70B_Q4_K_M, LLAMA_CUDA_BUILD, MISTRAL_7B_Q4_K_M, RTX_3090, machine


def test_every_planner_choice_has_a_llama_cpp_value() -> None:
    assert set(KV_CACHE_TYPES) == set(typing.get_args(KvType))
    assert set(FLASH_ATTN_TYPES) == set(typing.get_args(FlashAttn))


def test_a_split_plan_sets_layer_mode_the_shares_and_the_main_gpu() -> None:
    gpus = (Gpu(0, "RTX 3060", 12 * GIB, 11 * GIB), Gpu(1, "RTX 4090", 24 * GIB, 21 * GIB))
    plan = plan_offload(LLAMA_70B_Q4_K_M, machine(ram_gib=64, gpus=gpus), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=4096))
    params = llama_cpp.llama_model_default_params()
    split = place_layers(params, plan)
    assert split is not None and len(split) == llama_cpp.llama_max_devices()
    assert params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_LAYER and params.main_gpu == 1
    assert params.n_gpu_layers == plan.n_gpu_layers
    assert [params.tensor_split[i] for i in range(3)] == pytest.approx([1 / 3, 2 / 3, 0.0])


def test_a_plan_on_one_of_several_gpus_keeps_llama_cpp_off_the_others() -> None:
    gpus = (Gpu(0, "RTX 3060", 12 * GIB, 11 * GIB), dataclasses.replace(RTX_3090, index=1))
    plan = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=gpus), LLAMA_CUDA_BUILD)
    params = llama_cpp.llama_model_default_params()
    assert place_layers(params, plan) is None
    # Layer mode, llama.cpp's default, would spread the model over both GPUs.
    assert params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_NONE and params.main_gpu == 1 and params.n_gpu_layers == 33


def test_a_cpu_plan_leaves_llama_cpp_defaults() -> None:
    plan = plan_offload(MISTRAL_7B_Q4_K_M, Hardware("CPU", 2, 2, frozenset(), 16 * GIB, 16 * GIB), LLAMA_CUDA_BUILD)
    params, defaults = llama_cpp.llama_model_default_params(), llama_cpp.llama_model_default_params()
    assert place_layers(params, plan) is None
    assert (params.n_gpu_layers, params.split_mode, params.main_gpu) == (0, defaults.split_mode, defaults.main_gpu)


def test_a_q8_0_kv_cache_with_flash_attention_reaches_llama_cpp(gemma_model: Path, settings: Settings) -> None:
    """On the CPU too: the plan's cache type holds the sequence in 34 bytes per 32 values."""
    model_plan = plan_model(str(gemma_model), settings, PlanRequest(n_ctx=256, n_threads=2))
    assert model_plan.facts.kv_head_sizes == (256, 256)  # from the GGUF header's key/value_length
    backend = LlamaCppBackend(open_model(gemma_model, dataclasses.replace(model_plan.plan.load_params, kv_type="q8_0", flash_attn="on")))
    try:
        tokens = backend.tokenize("The capital of France is Paris.", add_bos=True, special=False)
        backend.evaluate(0, tokens, 0)
        state = len(backend.save_state(0))
    finally:
        backend.close()
    # Gemma 3 270M: 18 layers x 1 KV head x (256 + 256) values a token, 18 KiB in f16; the state
    # adds a header of about 2 KiB (1,864 bytes measured).
    kv = len(tokens) * model_plan.facts.kv_bytes_per_token * 34 // 64
    assert kv < state < kv + 4096


def test_experts_left_in_ram_reach_llama_cpp_as_tensor_buffer_overrides(tiny_checkpoint, tmp_path: Path) -> None:
    """On the CPU build too: every routed expert of the plan's layers is overridden to the CPU
    buffer type (llama.cpp logs each), no other tensor is, and the model answers as without."""
    from localchat.converters.gguf import convert_checkpoint
    from localchat.converters.verify import greedy_continuation

    model = convert_checkpoint(tiny_checkpoint("qwen2moe"), tmp_path / "moe.gguf", "f16", threads=2).output
    plan = plan_model(str(model), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=256, n_threads=2)).plan.load_params
    prompt = list(range(1, 20))
    plain = LlamaCppBackend(open_model(model, plan))
    try:
        expected = greedy_continuation(plain, prompt, 12)
    finally:
        plain.close()

    overridden: list[str] = []

    @llama_cpp.llama_log_callback
    def record(level: int, text: bytes | None, _data: object) -> None:
        if text and b"buffer type overridden to CPU" in text:
            overridden.append(text.decode().split()[1])

    llama_cpp.llama_log_set(record, None)
    try:
        backend = LlamaCppBackend(open_model(model, dataclasses.replace(plan, n_cpu_moe=1)))
    finally:
        llama_cpp.llama_log_set(log_callback, None)
    try:
        assert sorted(overridden) == ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"]
        assert greedy_continuation(backend, prompt, 12) == expected
    finally:
        backend.close()
