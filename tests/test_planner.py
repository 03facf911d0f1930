"""The offload planner on described hardware (pure logic)."""

from __future__ import annotations

import pytest

from localchat.errors import InsufficientMemoryError, InvalidSettingError
from localchat.hardware import GIB, MIB, Gpu, Hardware
from localchat.planner import (
    GPU_RESERVE_BYTES,
    BuildFeatures,
    ModelFacts,
    OneReply,
    PlanRequest,
    gpu_build_advice,
    gpu_bytes,
    plan_offload,
    quantized_kv_possible,
    split_loads,
)

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


def test_a_context_for_one_reply_is_no_larger_than_it_can_fill() -> None:
    def n_ctx(facts: ModelFacts, one_reply: OneReply, ram_gib: float = 32, n_ctx: int | None = None) -> int:
        return plan_offload(facts, machine(ram_gib), CPU_BUILD, PlanRequest(n_ctx=n_ctx, one_reply=one_reply)).n_ctx

    # The text's bytes, the slack and the reply's tokens (300 + 64 + 200), in steps of 256.
    assert n_ctx(LLAMA_7B_Q4_K_M, OneReply(text_bytes=300, max_tokens=200)) == 768
    sized = plan_offload(LLAMA_7B_Q4_K_M, machine(), CPU_BUILD, PlanRequest(one_reply=OneReply(300, 200)))
    assert any("one reply of up to 200 tokens" in reason for reason in sized.reasons)
    # And what the chat template writes around the messages; a nonsense -n sizes as 0 (refused later).
    templated = ModelFacts(**{**LLAMA_7B_Q4_K_M.__dict__, "chat_overhead_bytes": 1000})
    assert n_ctx(templated, OneReply(300, 200)) == 1792 and n_ctx(LLAMA_7B_Q4_K_M, OneReply(0, -2000)) == 256
    # Never past the automatic context; an asked size is what is asked.
    assert n_ctx(LLAMA_7B_Q4_K_M, OneReply(100_000, 200)) == plan_offload(LLAMA_7B_Q4_K_M, machine(), CPU_BUILD).n_ctx
    assert n_ctx(LLAMA_7B_Q4_K_M, OneReply(300, 200), n_ctx=3000) == 3000

    # Short of RAM, it is lowered no further than an automatic context is: to 1024, where that fits.
    def fits(tokens: int, ram_gib: float) -> bool:
        try:
            return n_ctx(LLAMA_7B_Q4_K_M, OneReply(0, 0), ram_gib, n_ctx=tokens) == tokens
        except InsufficientMemoryError:
            return False

    ram_gib = next(r / 100 for r in range(300, 1000) if fits(1024, r / 100) and not fits(1280, r / 100))
    assert n_ctx(LLAMA_7B_Q4_K_M, OneReply(1000, 240), ram_gib) == 1024


def test_amx_cpu_with_amx_build_turns_off_extra_buffers() -> None:
    amx = frozenset({"avx512f", "amx_tile", "amx_int8"})
    assert not plan_offload(LLAMA_7B_Q4_K_M, machine(flags=amx), BuildFeatures(False, amx=True)).use_extra_bufts
    assert plan_offload(LLAMA_7B_Q4_K_M, machine(flags=amx), BuildFeatures(False, amx=False)).use_extra_bufts
    assert plan_offload(LLAMA_7B_Q4_K_M, machine(), BuildFeatures(False, amx=True)).use_extra_bufts


@pytest.mark.parametrize(
    ("request_args", "message"),
    [({"n_ctx": 8}, "context size"), ({"n_threads": 0}, "threads"), ({"n_seq": 0}, "parallel"),
     ({"n_gpu_layers": -1}, "GPU layers must be >= 0")],
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


# The GPU path: KV cache type, flash attention and several GPUs (described hardware).
# Llama-3-70B Q4_K_M: 80 layers, ~40 GiB of weights, 8 KV heads of 128 -> 320 KiB of f16 KV per token.
LLAMA_70B_Q4_K_M = ModelFacts(
    format="gguf",
    n_layers=80,
    n_ctx_train=131072,
    layer_bytes=495 * MIB,
    other_bytes=1331 * MIB,
    kv_bytes_per_token=80 * 8 * (128 + 128) * 2,
    n_vocab=128256,
    kv_head_sizes=(128, 128),
)
# Mistral-7B Q4_K_M: 32 layers, ~4.1 GiB of weights, 8 KV heads of 128 -> 128 KiB of f16 KV per
# token, so 4 GiB at 32k tokens (2.125 GiB in q8_0).
MISTRAL_7B_Q4_K_M = ModelFacts(
    format="gguf",
    n_layers=32,
    n_ctx_train=32768,
    layer_bytes=125 * MIB,
    other_bytes=200 * MIB,
    kv_bytes_per_token=32 * 8 * (128 + 128) * 2,
    n_vocab=32768,
    kv_head_sizes=(128, 128),
)
LLAMA_CUDA_BUILD = BuildFeatures(gpu_offload=True, amx=False, flash_attn=True)
LLAMA_CPU_BUILD = BuildFeatures(gpu_offload=False, amx=False)
RTX_3090 = Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GIB, int(23.5 * GIB))
RTX_3070 = Gpu(0, "NVIDIA GeForce RTX 3070", 8 * GIB, int(7.5 * GIB))


def test_70b_on_two_24gb_gpus_offloads_every_layer_split_in_half() -> None:
    gpus = (RTX_3090, Gpu(1, RTX_3090.name, 24 * GIB, int(23.5 * GIB)))
    plan = plan_offload(LLAMA_70B_Q4_K_M, machine(ram_gib=64, gpus=gpus), LLAMA_CUDA_BUILD)
    # 80 x (495 MiB + 32 MiB of KV at 8192 tokens) + 1331 MiB = 42.5 GiB, against 2 x 22.5 GiB usable.
    assert plan.n_ctx == 8192 and plan.n_gpu_layers == 81
    assert plan.tensor_split == pytest.approx((0.5, 0.5))
    assert plan.gpu_index == 0 and plan.kv_type == "f16" and plan.flash_attn == "on"
    # As llama.cpp places them: 41 layers on GPU 0; 39 and the output head on GPU 1; each within its room.
    per_layer = LLAMA_70B_Q4_K_M.layer_bytes + 320 * 1024 * 8192 // 80
    loads = split_loads(LLAMA_70B_Q4_K_M, per_layer, plan.n_gpu_layers, plan.tensor_split)
    assert loads == [41 * per_layer, 39 * per_layer + LLAMA_70B_Q4_K_M.other_bytes]
    assert all(load <= 23.5 * GIB - GPU_RESERVE_BYTES for load in loads)
    assert "split GPU 0 50% / GPU 1 50%, main GPU 0" in plan.describe()
    assert gpu_bytes(LLAMA_70B_Q4_K_M, plan) == dict(enumerate(loads))
    assert any("across 2 GPUs in proportion to free memory, main GPU 0" in reason for reason in plan.reasons)


def test_unequal_gpus_split_by_free_memory_with_the_roomier_one_as_main() -> None:
    gpus = (Gpu(0, "RTX 3060", 12 * GIB, 11 * GIB), Gpu(1, "RTX 4090", 24 * GIB, 21 * GIB))
    plan = plan_offload(LLAMA_70B_Q4_K_M, machine(ram_gib=64, gpus=gpus), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=4096))
    assert plan.tensor_split == pytest.approx((10 / 30, 20 / 30))
    assert plan.gpu_index == 1
    # 30 GiB usable holds only part of 40 GiB of weights; the rest runs on the CPU.
    assert 40 < plan.n_gpu_layers < 80
    per_layer = LLAMA_70B_Q4_K_M.layer_bytes + 320 * 1024 * 4096 // 80
    loads = split_loads(LLAMA_70B_Q4_K_M, per_layer, plan.n_gpu_layers, plan.tensor_split)
    assert loads[0] <= 10 * GIB and loads[1] <= 20 * GIB
    assert loads[1] + per_layer > 20 * GIB  # the bigger GPU is full: one more layer would not fit


def test_a_model_one_gpu_holds_stays_on_that_gpu_alone() -> None:
    gpus = (Gpu(0, "RTX 3060", 12 * GIB, 11 * GIB), Gpu(1, "RTX 4090", 24 * GIB, 23 * GIB))
    plan = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=gpus), LLAMA_CUDA_BUILD)
    assert plan.n_gpu_layers == 33 and plan.tensor_split == () and plan.gpu_index == 1
    assert "on GPU 1" in plan.describe()


def test_7b_at_32k_on_an_8gb_gpu_quantizes_the_kv_cache_to_fit() -> None:
    plan = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=(RTX_3070,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=32768))
    # 6.5 GiB usable. f16: 4.1 GiB of weights + 4 GiB of KV do not fit (125 + 128 MiB a layer: 26 of
    # 32 layers). q8_0: 125 + 68 MiB a layer, 32 x 193 + 200 = 6376 MiB: everything fits.
    assert plan.kv_type == "q8_0" and plan.flash_attn == "on"
    assert plan.n_gpu_layers == 33 and plan.n_ctx == 32768
    assert gpu_bytes(MISTRAL_7B_Q4_K_M, plan) == {0: 32 * (125 + 68) * MIB + 200 * MIB}
    assert any("KV cache q8_0 (2.12 GiB instead of 4.00 GiB in f16): in f16 only 26 layers fit" in r for r in plan.reasons)
    assert "KV cache q8_0, flash attention on" in plan.describe()


def test_7b_at_32k_on_a_6gb_gpu_offloads_more_layers_with_a_q8_0_cache() -> None:
    gpu = Gpu(0, "RTX 2060", 6 * GIB, int(5.5 * GIB))
    plan = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=(gpu,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=32768))
    # 4608 MiB usable: 18 layers of 253 MiB in f16, 23 of 193 MiB in q8_0.
    assert plan.kv_type == "q8_0" and plan.n_gpu_layers == 23 and plan.flash_attn == "on"


def test_7b_at_8k_on_an_8gb_gpu_keeps_an_f16_cache() -> None:
    plan = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=(RTX_3070,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=8192))
    assert plan.kv_type == "f16" and plan.n_gpu_layers == 33 and plan.flash_attn == "on"
    assert plan.tensor_split == () and plan.gpu_index == 0


@pytest.mark.parametrize(
    ("facts", "build", "reason"),
    [
        # q8_0 blocks of 32 values cannot tile a head of 80.
        (ModelFacts(**{**MISTRAL_7B_Q4_K_M.__dict__, "kv_head_sizes": (80, 80)}), LLAMA_CUDA_BUILD, "heads of 80"),
        # Without flash attention llama.cpp refuses a quantized V cache.
        (MISTRAL_7B_Q4_K_M, BuildFeatures(gpu_offload=True, amx=False), None),
    ],
)
def test_no_quantized_kv_cache_where_llama_cpp_cannot_run_one(facts: ModelFacts, build: BuildFeatures, reason: str | None) -> None:
    plan = plan_offload(facts, machine(gpus=(RTX_3070,)), build, PlanRequest(n_ctx=32768))
    assert plan.kv_type == "f16" and plan.n_gpu_layers == 26
    assert plan.flash_attn == ("on" if reason else "auto")
    assert not quantized_kv_possible(facts, build)
    assert reason is None or any(reason in r for r in plan.reasons)


def test_cpu_plans_keep_llama_cpp_defaults() -> None:
    for facts in (MISTRAL_7B_Q4_K_M, LLAMA_7B_Q4_K_M):
        plan = plan_offload(facts, machine(), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=32768))
        assert (plan.n_gpu_layers, plan.kv_type, plan.flash_attn, plan.tensor_split, plan.gpu_index) == (0, "f16", "auto", (), None)
        assert gpu_bytes(facts, plan) == {}


def test_asked_gpu_layers_on_several_gpus_are_split_by_free_memory() -> None:
    gpus = (RTX_3090, Gpu(1, RTX_3090.name, 24 * GIB, int(11.5 * GIB)))
    plan = plan_offload(LLAMA_70B_Q4_K_M, machine(ram_gib=64, gpus=gpus), LLAMA_CUDA_BUILD, PlanRequest(n_gpu_layers=40))
    assert plan.n_gpu_layers == 40 and plan.kv_type == "f16"
    assert plan.tensor_split == pytest.approx((22.5 / 33, 10.5 / 33)) and plan.gpu_index == 0


def test_a_cpu_only_llama_cpp_build_on_a_gpu_machine_says_how_to_rebuild() -> None:
    hardware = machine(gpus=(RTX_3090,))
    advice = gpu_build_advice("llama.cpp", hardware, LLAMA_CPU_BUILD)
    assert advice == (
        "NVIDIA GeForce RTX 3090 found, but llama-cpp-python 0.3.36 was built without CUDA; to use the GPU run: "
        'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
    )
    plan = plan_offload(MISTRAL_7B_Q4_K_M, hardware, LLAMA_CPU_BUILD, PlanRequest(n_gpu_layers=10))
    assert plan.n_gpu_layers == 0 and f"CPU only: {advice}" in plan.reasons


def test_onnxruntime_without_cuda_on_a_gpu_machine_names_onnxruntime_gpu() -> None:
    gpus = (RTX_3090, Gpu(1, RTX_3090.name, 24 * GIB, 23 * GIB))
    advice = gpu_build_advice("onnxruntime", machine(gpus=gpus), CPU_BUILD)
    assert advice == (
        "NVIDIA GeForce RTX 3090 found, but onnxruntime has no CUDA execution provider; to use the GPU run: "
        "pip uninstall -y onnxruntime && pip install onnxruntime-gpu"
    )


def test_no_build_advice_without_a_gpu_or_with_a_gpu_build() -> None:
    assert gpu_build_advice("llama.cpp", machine(), LLAMA_CPU_BUILD) is None
    assert gpu_build_advice("llama.cpp", machine(gpus=(RTX_3090,)), LLAMA_CUDA_BUILD) is None


def test_onnx_uses_one_gpu_whatever_the_others_hold() -> None:
    gpus = (Gpu(0, "RTX 3060", 12 * GIB, 11 * GIB), Gpu(1, RTX_3090.name, 24 * GIB, 23 * GIB))
    plan = plan_offload(ONNX_7B_INT4, machine(gpus=gpus), CUDA_BUILD)
    assert plan.n_gpu_layers == ONNX_7B_INT4.n_layers + 1 and plan.gpu_index == 1 and plan.tensor_split == ()
    assert "KV cache" not in plan.describe()


# Mixtures of experts. Qwen3-30B-A3B Q4_K_M: 48 layers of 360 MiB, 340 MiB of them the 128 routed
# experts (a token reads 8); 4 KV heads of 128 -> 96 KiB of f16 KV per token.
QWEN3_30B_A3B_Q4_K_M = ModelFacts(
    format="gguf",
    n_layers=48,
    n_ctx_train=40960,
    layer_bytes=360 * MIB,
    other_bytes=300 * MIB,
    kv_bytes_per_token=48 * 4 * (128 + 128) * 2,
    n_vocab=151936,
    kv_head_sizes=(128, 128),
    expert_bytes=340 * MIB,
)
RTX_3060 = Gpu(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 11 * GIB)


def test_moe_that_does_not_fit_keeps_the_fewest_layers_experts_in_ram() -> None:
    plan = plan_offload(QWEN3_30B_A3B_Q4_K_M, machine(ram_gib=64, gpus=(RTX_3060,)), CUDA_BUILD, PlanRequest(n_ctx=8192))
    # 48 x (360 + 16 MiB of KV) + 300 = 18348 MiB against 10 GiB usable: 8108 MiB too much, so the
    # experts of 24 layers (24 x 340 = 8160 MiB) stay in RAM and everything else is on the GPU.
    assert (plan.n_gpu_layers, plan.n_cpu_moe, plan.kv_type) == (49, 24, "f16")
    used = gpu_bytes(QWEN3_30B_A3B_Q4_K_M, plan)[0]
    assert used <= RTX_3060.free_bytes - GPU_RESERVE_BYTES < used + QWEN3_30B_A3B_Q4_K_M.expert_bytes
    assert any("routed experts of the first 24" in reason for reason in plan.reasons)
    assert "experts of 24 layers in RAM" in plan.describe()


def test_moe_with_a_quantized_kv_cache_leaves_fewer_experts_in_ram() -> None:
    plan = plan_offload(QWEN3_30B_A3B_Q4_K_M, machine(ram_gib=64, gpus=(RTX_3060,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=32768))
    # f16: 48 x (360 + 64) + 300 = 20652 MiB, 31 layers' experts in RAM; q8_0 (34 MiB of KV a layer): 19212, 27.
    assert (plan.n_gpu_layers, plan.n_cpu_moe, plan.kv_type) == (49, 27, "q8_0")
    assert any("in f16 the experts of 31 layers would stay in RAM" in reason for reason in plan.reasons)


def test_moe_that_fits_keeps_its_experts_on_the_gpu() -> None:
    plan = plan_offload(QWEN3_30B_A3B_Q4_K_M, machine(ram_gib=64, gpus=(Gpu(0, "H100", 80 * GIB, 78 * GIB),)), LLAMA_CUDA_BUILD)
    assert (plan.n_gpu_layers, plan.n_cpu_moe) == (49, 0)


def test_moe_whose_dense_part_does_not_fit_offloads_whole_layers() -> None:
    gpu = Gpu(0, "GT 1030", 2 * GIB, int(1.9 * GIB))
    plan = plan_offload(QWEN3_30B_A3B_Q4_K_M, machine(ram_gib=64, gpus=(gpu,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=32768))
    # 48 x (20 MiB of dense weights + 34 MiB of q8_0 KV) + 300 MiB exceed 0.9 GiB: whole layers, experts with them.
    assert plan.n_cpu_moe == 0 and 0 < plan.n_gpu_layers < 48


def test_experts_left_in_ram_count_against_the_ram() -> None:
    with pytest.raises(InsufficientMemoryError, match="needs about"):
        plan_offload(QWEN3_30B_A3B_Q4_K_M, machine(ram_gib=8, gpus=(RTX_3060,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=8192))
    dense = ModelFacts(**{**QWEN3_30B_A3B_Q4_K_M.__dict__, "expert_bytes": 0})
    plan = plan_offload(dense, machine(ram_gib=64, gpus=(RTX_3060,)), LLAMA_CUDA_BUILD, PlanRequest(n_ctx=8192))
    assert plan.n_cpu_moe == 0 and plan.n_gpu_layers < 48  # a dense model of that size offloads whole layers
