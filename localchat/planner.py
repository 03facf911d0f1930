"""Hardware + model metadata -> backend, GPU layers, context size and threads, with the reasons."""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.errors import InsufficientMemoryError, InvalidSettingError
from localchat.hardware import GIB, MIB, Hardware

DEFAULT_CONTEXT = 8192
MIN_AUTO_CONTEXT = 1024
# Left free on the GPU for the CUDA context and llama.cpp's compute buffers (measured ~0.6 GiB
# for 7B models with n_batch 512) plus a margin for other programs.
GPU_RESERVE_BYTES = 1 * GIB
# Compute buffers, the logits buffer and Python itself on the CPU side.
CPU_OVERHEAD_BYTES = 512 * MIB
# Keep this share of available RAM for the rest of the machine.
RAM_HEADROOM = 0.9
BACKEND_FOR_FORMAT = {"gguf": "llama.cpp", "onnx": "onnxruntime"}
# How to get a GPU-enabled build of each backend.
GPU_BUILD_HINT = {
    "llama.cpp": "reinstall llama-cpp-python with CMAKE_ARGS=-DGGML_CUDA=on",
    "onnxruntime": "install onnxruntime-gpu in place of onnxruntime",
}
# Backends that run a model whole on one device: no split of layers between GPU and CPU.
WHOLE_MODEL_BACKENDS = frozenset({"onnxruntime"})


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know of a model, read from its file before loading it."""

    format: str
    n_layers: int
    n_ctx_train: int
    layer_bytes: int
    other_bytes: int
    kv_bytes_per_token: int
    n_vocab: int
    # Format-specific lines for `localchat info` (an ONNX graph's fused operators).
    details: tuple[str, ...] = ()

    @property
    def weight_bytes(self) -> int:
        return self.n_layers * self.layer_bytes + self.other_bytes


@dataclass(frozen=True)
class BuildFeatures:
    """What the inference library was compiled with."""

    gpu_offload: bool
    amx: bool
    description: str = ""


@dataclass(frozen=True)
class PlanRequest:
    """The user's overrides; None means choose."""

    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_threads: int | None = None
    n_seq: int = 1

    def __post_init__(self) -> None:
        if self.n_ctx is not None and self.n_ctx < 16:
            raise InvalidSettingError(f"context size {self.n_ctx} is too small: give at least 16 tokens")
        if self.n_threads is not None and self.n_threads < 1:
            raise InvalidSettingError(f"threads must be >= 1, got {self.n_threads}")
        if self.n_seq < 1:
            raise InvalidSettingError(f"parallel sequences must be >= 1, got {self.n_seq}")


@dataclass(frozen=True)
class Plan:
    backend: str
    n_ctx: int
    n_gpu_layers: int
    n_threads: int
    n_threads_batch: int
    n_seq: int
    use_extra_bufts: bool
    gpu_index: int | None
    reasons: tuple[str, ...] = field(default=())

    @property
    def uses_gpu(self) -> bool:
        return self.n_gpu_layers > 0


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _auto_context(model: ModelFacts, request: PlanRequest) -> int:
    if request.n_ctx is not None:
        return request.n_ctx
    return min(model.n_ctx_train or DEFAULT_CONTEXT, DEFAULT_CONTEXT)


def _gpu_layers(model: ModelFacts, n_ctx: int, free_bytes: int) -> int:
    """How many layers fit in `free_bytes`: weights plus that layer's share of the KV cache.
    `n_layers + 1` means everything, the output head included."""
    budget = free_bytes - GPU_RESERVE_BYTES
    kv_per_layer = model.kv_bytes_per_token * n_ctx // max(model.n_layers, 1)
    per_layer = model.layer_bytes + kv_per_layer
    if model.n_layers * per_layer + model.other_bytes <= budget:
        return model.n_layers + 1
    return max(0, min(model.n_layers, budget // per_layer)) if per_layer > 0 else 0


def plan_offload(model: ModelFacts, hardware: Hardware, build: BuildFeatures, request: PlanRequest = PlanRequest()) -> Plan:
    """Choose how to run `model` on `hardware`; raise InsufficientMemoryError if it cannot run."""
    reasons: list[str] = []
    backend = BACKEND_FOR_FORMAT[model.format]
    reasons.append(f"backend {backend}: the model is a {model.format.upper()} file")
    n_ctx = _auto_context(model, request)
    if request.n_ctx is None:
        reasons.append(f"context {n_ctx}: the model's training context capped at {DEFAULT_CONTEXT}")
    elif model.n_ctx_train and n_ctx > model.n_ctx_train:
        reasons.append(f"context {n_ctx}: as asked, beyond the {model.n_ctx_train} tokens the model was trained on")

    gpu = max(hardware.gpus, key=lambda g: g.free_bytes) if hardware.gpus else None
    if request.n_gpu_layers is not None:
        n_gpu_layers = request.n_gpu_layers if build.gpu_offload else 0
        reasons.append(f"GPU layers {n_gpu_layers}: as asked")
    elif gpu is None:
        n_gpu_layers = 0
        reasons.append("CPU only: no NVIDIA GPU found")
    elif not build.gpu_offload:
        n_gpu_layers = 0
        reasons.append(
            f"CPU only: {gpu.name} found but this {backend} build has no GPU support ({GPU_BUILD_HINT[backend]})"
        )
    else:
        n_gpu_layers = _gpu_layers(model, n_ctx, gpu.free_bytes)
        if backend in WHOLE_MODEL_BACKENDS and 0 < n_gpu_layers <= model.n_layers:
            reasons.append(f"CPU only: {backend} runs a model whole and it does not fit in {gpu.name}'s {_gib(gpu.free_bytes)} free")
            n_gpu_layers = 0
        elif n_gpu_layers > model.n_layers:
            reasons.append(f"all {model.n_layers} layers on {gpu.name}: {_gib(gpu.free_bytes)} free holds the model and its KV cache")
        elif n_gpu_layers > 0:
            reasons.append(
                f"{n_gpu_layers} of {model.n_layers} layers on {gpu.name}: {_gib(gpu.free_bytes)} free, "
                f"{_gib(model.weight_bytes)} of weights plus {_gib(model.kv_bytes_per_token * n_ctx)} of KV cache do not all fit"
            )
        else:
            reasons.append(f"CPU only: {gpu.name} has {_gib(gpu.free_bytes)} free, too little for one layer")

    gpu_share = min(n_gpu_layers, model.n_layers) / max(model.n_layers, 1)
    head_on_gpu = n_gpu_layers > model.n_layers

    def cpu_bytes(ctx: int) -> int:
        layers = int(model.n_layers * model.layer_bytes * (1 - gpu_share))
        kv = int(model.kv_bytes_per_token * ctx * (1 - gpu_share))
        # The embedding table stays in RAM even on a GPU; the output head moves with the last layer.
        other = model.other_bytes // 2 if head_on_gpu else model.other_bytes
        logits = model.n_vocab * 4 * request.n_seq
        return layers + kv + other + logits + CPU_OVERHEAD_BYTES

    ram = int(hardware.ram_available_bytes * RAM_HEADROOM)
    if cpu_bytes(n_ctx) > ram:
        if request.n_ctx is None:
            while n_ctx > MIN_AUTO_CONTEXT and cpu_bytes(n_ctx) > ram:
                n_ctx //= 2
            reasons.append(f"context lowered to {n_ctx}: the KV cache must fit in {_gib(ram)} of free RAM")
        if cpu_bytes(n_ctx) > ram:
            raise InsufficientMemoryError(
                f"not enough memory: this model with a {n_ctx}-token context needs about {_gib(cpu_bytes(n_ctx))} "
                f"of RAM but {_gib(hardware.ram_available_bytes)} is available; use a smaller or more quantized "
                "model, a smaller --ctx, or close other programs"
            )

    n_threads = request.n_threads or hardware.physical_cores
    n_threads_batch = request.n_threads or hardware.logical_cores
    reasons.append(f"threads {n_threads} for generation, {n_threads_batch} for prompts: {hardware.physical_cores} physical cores")

    # llama.cpp issue 20824: the AMX buffer type segfaults in ggml_backend_amx_mul_mat with Q4_K
    # weights; without the extra buffer types weights stay in plain CPU buffers.
    use_extra_bufts = not (hardware.has_amx and build.amx)
    if not use_extra_bufts:
        reasons.append("AMX weight buffers off: the CPU and the llama.cpp build have AMX, which crashes on Q4_K (llama.cpp #20824)")

    return Plan(
        backend=backend,
        n_ctx=n_ctx,
        n_gpu_layers=n_gpu_layers,
        n_threads=n_threads,
        n_threads_batch=n_threads_batch,
        n_seq=request.n_seq,
        use_extra_bufts=use_extra_bufts,
        gpu_index=gpu.index if gpu is not None and n_gpu_layers > 0 else None,
        reasons=tuple(reasons),
    )
