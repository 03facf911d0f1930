"""The offload planner on described hardware (pure logic)."""

from __future__ import annotations

import pytest

from localchat.errors import InsufficientMemoryError, InvalidSettingError
from localchat.hardware import GIB, MIB, Gpu, Hardware
from localchat.planner import BuildFeatures, ModelFacts, PlanRequest, plan_offload

# Llama-2-7B Q4_K_M: 32 layers, ~3.9 GiB of weights, 32 KV heads of 128 -> 512 KiB of f16 KV per token.
LLAMA_7B_Q4_K_M = ModelFacts(
    format="gguf",
    n_layers=32,
    n_ctx_train=4096,
    layer_bytes=114 * MIB,
    other_bytes=250 * MIB,
    kv_bytes_per_token=32 * 2 * 32 * 128 * 2,
    n_vocab=32000,
)
CUDA_BUILD = BuildFeatures(gpu_offload=True, amx=False)
CPU_BUILD = BuildFeatures(gpu_offload=False, amx=False)


def machine(ram_gib: float = 32, gpus: tuple[Gpu, ...] = (), flags: frozenset[str] = frozenset()) -> Hardware:
    return Hardware("Test CPU", 8, 16, flags, int(ram_gib * GIB), int(ram_gib * GIB), gpus)


def test_8gb_gpu_with_7b_q4km_offloads_part_of_the_model() -> None:
    gpu = Gpu(0, "RTX 3070", 8 * GIB, int(7.5 * GIB))
    plan = plan_offload(LLAMA_7B_Q4_K_M, machine(gpus=(gpu,)), CUDA_BUILD, PlanRequest(n_ctx=8192))
    # 8192 tokens of KV (4 GiB) plus 3.9 GiB of weights exceed 6.5 GiB usable: partial offload.
    assert 0 < plan.n_gpu_layers < LLAMA_7B_Q4_K_M.n_layers
    # Each layer costs 114 MiB of weights + 128 MiB of KV (8192 x 512 KiB / 32); 7.5 GiB free less a
    # 1 GiB reserve is 6656 MiB: 27 layers (6534 MiB) fit, 28 (6776 MiB) do not.
    assert plan.n_gpu_layers == 27
    assert plan.gpu_index == 0
    assert any("of 32 layers on RTX 3070" in reason for reason in plan.reasons)


def test_gpu_with_room_for_everything_offloads_all_layers_and_the_head() -> None:
    gpu = Gpu(0, "RTX 4090", 24 * GIB, 23 * GIB)
    plan = plan_offload(LLAMA_7B_Q4_K_M, machine(gpus=(gpu,)), CUDA_BUILD)
    assert plan.n_gpu_layers == LLAMA_7B_Q4_K_M.n_layers + 1
    assert plan.n_ctx == 4096  # the model's training context, under the 8192 cap


def test_no_gpu_runs_on_the_cpu() -> None:
    plan = plan_offload(LLAMA_7B_Q4_K_M, machine(), CPU_BUILD)
    assert plan.n_gpu_layers == 0 and not plan.uses_gpu
    assert plan.gpu_index is None
    assert plan.n_threads == 8 and plan.n_threads_batch == 16
    assert any("no NVIDIA GPU" in reason for reason in plan.reasons)


def test_gpu_without_a_gpu_build_says_how_to_get_one() -> None:
    gpu = Gpu(0, "RTX 4090", 24 * GIB, 23 * GIB)
    plan = plan_offload(LLAMA_7B_Q4_K_M, machine(gpus=(gpu,)), CPU_BUILD)
    assert plan.n_gpu_layers == 0
    assert any("GGML_CUDA" in reason for reason in plan.reasons)


def test_too_little_ram_is_refused_clearly() -> None:
    with pytest.raises(InsufficientMemoryError, match="not enough memory.*GiB"):
        plan_offload(LLAMA_7B_Q4_K_M, machine(ram_gib=2), CPU_BUILD)


def test_tight_ram_lowers_an_automatic_context_but_not_an_asked_one() -> None:
    plan = plan_offload(LLAMA_7B_Q4_K_M, machine(ram_gib=6), CPU_BUILD)
    assert plan.n_ctx < 4096
    assert any("context lowered" in reason for reason in plan.reasons)
    with pytest.raises(InsufficientMemoryError):
        plan_offload(LLAMA_7B_Q4_K_M, machine(ram_gib=6), CPU_BUILD, PlanRequest(n_ctx=4096))


def test_amx_cpu_with_amx_build_turns_off_extra_buffers() -> None:
    amx = frozenset({"avx512f", "amx_tile", "amx_int8"})
    assert not plan_offload(LLAMA_7B_Q4_K_M, machine(flags=amx), BuildFeatures(False, amx=True)).use_extra_bufts
    assert plan_offload(LLAMA_7B_Q4_K_M, machine(flags=amx), BuildFeatures(False, amx=False)).use_extra_bufts
    assert plan_offload(LLAMA_7B_Q4_K_M, machine(), BuildFeatures(False, amx=True)).use_extra_bufts


@pytest.mark.parametrize(
    ("request_args", "message"),
    [({"n_ctx": 8}, "context size"), ({"n_threads": 0}, "threads"), ({"n_seq": 0}, "parallel")],
)
def test_invalid_requests_are_rejected(request_args: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        PlanRequest(**request_args)


ONNX_7B_INT4 = ModelFacts(**{**LLAMA_7B_Q4_K_M.__dict__, "format": "onnx"})


def test_onnx_runs_whole_on_a_gpu_that_holds_it() -> None:
    gpu = Gpu(0, "RTX 4090", 24 * GIB, 23 * GIB)
    plan = plan_offload(ONNX_7B_INT4, machine(gpus=(gpu,)), CUDA_BUILD)
    assert plan.backend == "onnxruntime" and plan.n_gpu_layers == ONNX_7B_INT4.n_layers + 1


def test_onnx_that_does_not_fit_the_gpu_runs_on_the_cpu_with_the_reason() -> None:
    gpu = Gpu(0, "RTX 3070", 8 * GIB, int(7.5 * GIB))
    plan = plan_offload(ONNX_7B_INT4, machine(gpus=(gpu,)), CUDA_BUILD, PlanRequest(n_ctx=8192))
    assert plan.n_gpu_layers == 0
    assert any("runs a model whole" in reason for reason in plan.reasons)


def test_onnx_without_a_gpu_build_names_onnxruntime_gpu() -> None:
    gpu = Gpu(0, "RTX 4090", 24 * GIB, 23 * GIB)
    plan = plan_offload(ONNX_7B_INT4, machine(gpus=(gpu,)), CPU_BUILD)
    assert plan.n_gpu_layers == 0 and any("onnxruntime-gpu" in reason for reason in plan.reasons)
