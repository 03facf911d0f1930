"""Hardware + model metadata -> backend, GPU layers, context size and threads, with the reasons."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from localchat.backends.base import BuildFeatures, FlashAttn, KvType, LoadParams, ModelFacts
from localchat.errors import InsufficientMemoryError, InvalidSettingError
from localchat.hardware import GIB, MIB, Gpu, Hardware

DEFAULT_CONTEXT = 8192
MIN_AUTO_CONTEXT = 1024
# A context sized to one reply (PlanRequest.one_reply) grows in steps of this many tokens.
CONTEXT_STEP = 256
# Beside a reply's messages and what its chat template writes around them, what its context may hold: BOS, a
# SentencePiece space prefix to each piece of text, the few tokens a template's options add (Qwen 3's empty
# thinking for enable_thinking=False). llama.cpp allocates and clears the KV cache of the whole context:
# SmolLM2's 2304 tokens took 31 ms to make, 256 tokens 7 ms (AMD EPYC).
ONE_REPLY_SLACK = 64
# One reply's limit where neither its command (`run -n`) nor the preset the model runs as gives one.
ONE_REPLY_TOKENS = 256
# Left free on the GPU for the CUDA context and llama.cpp's compute buffers (measured ~0.6 GiB
# for 7B models with n_batch 512) plus a margin for other programs.
GPU_RESERVE_BYTES = 1 * GIB
# Compute buffers, the logits buffer and Python itself on the CPU side.
CPU_OVERHEAD_BYTES = 512 * MIB
# Keep this share of available RAM for the rest of the machine.
RAM_HEADROOM = 0.9
BACKEND_FOR_FORMAT = {"gguf": "llama.cpp", "onnx": "onnxruntime"}
# Each backend's package, what its CPU-only build lacks, and the command that installs a CUDA
# build ({pin}: "==" and the installed version, so nothing else changes).
GPU_BUILDS: dict[str, tuple[str, str, str]] = {
    "llama.cpp": (
        "llama-cpp-python",
        "was built without CUDA",
        'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python{pin}',
    ),
    # Both wheels install the `onnxruntime` module: the CPU one must go first.
    "onnxruntime": ("onnxruntime", "has no CUDA execution provider", "pip uninstall -y onnxruntime && pip install onnxruntime-gpu"),
}
# Backends that run a model whole on one device: no split of layers between GPU and CPU, or
# between GPUs.
WHOLE_MODEL_BACKENDS = frozenset({"onnxruntime"})
# Bytes per cached K or V value (q8_0: blocks of 32 values in 34 bytes).
KV_VALUE_BYTES: dict[KvType, float] = {"f16": 2.0, "q8_0": 34 / 32}
Q8_0_BLOCK = 32
# (K, V) head sizes that llama.cpp's CUDA flash attention has kernels for (ggml-cuda/fattn.cu);
# for others the attention would fall back to the CPU.
FLASH_ATTN_HEAD_SIZES = frozenset({(d, d) for d in (40, 64, 72, 80, 96, 112, 128, 256)} | {(576, 512)})


@dataclass(frozen=True)
class OneReply:
    """A context for one reply and no more (`localchat run`): the UTF-8 bytes of its messages' text and the
    most tokens it may add (None: the reply limit of the preset the model runs as, which plan_model puts in,
    else ONE_REPLY_TOKENS)."""

    text_bytes: int
    max_tokens: int | None

    @property
    def reply_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else ONE_REPLY_TOKENS

    def tokens_bound(self, model: ModelFacts) -> int:
        """At least the tokens such a context holds: a token holds one byte of its text or more, the text of the
        messages and what the chat template writes around them."""
        return self.text_bytes + model.chat_overhead_bytes + ONE_REPLY_SLACK + max(self.reply_tokens, 0)


@dataclass(frozen=True)
class PlanRequest:
    """The user's overrides; None means choose."""

    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_threads: int | None = None
    n_seq: int = 1
    # A chosen context is no larger than this one reply can fill: llama.cpp allocates and clears no KV
    # cache it would not use.
    one_reply: OneReply | None = None

    def __post_init__(self) -> None:
        if self.n_ctx is not None and self.n_ctx < 16:
            raise InvalidSettingError(f"context size {self.n_ctx} is too small: give at least 16 tokens")
        if self.n_threads is not None and self.n_threads < 1:
            raise InvalidSettingError(f"threads must be >= 1, got {self.n_threads}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < 0:
            raise InvalidSettingError(f"GPU layers must be >= 0 (0: CPU only; more than the model has, e.g. 999: all), "
                                      f"got {self.n_gpu_layers}")
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
    # The main GPU (with a split, the one with most free memory); None on the CPU.
    gpu_index: int | None
    reasons: tuple[str, ...] = field(default=())
    kv_type: KvType = "f16"
    flash_attn: FlashAttn = "auto"
    # llama.cpp samples inside its graph, where the output layer is on a GPU (see LoadParams).
    backend_sampling: bool = False
    # The share of the offloaded layers each GPU holds, by GPU index; empty when one GPU (or
    # none) holds them all.
    tensor_split: tuple[float, ...] = ()
    # A mixture of experts whose layers are all on the GPU but for the routed experts of the first
    # `n_cpu_moe` layers, which stay in RAM (llama-server's --n-cpu-moe).
    n_cpu_moe: int = 0

    @property
    def uses_gpu(self) -> bool:
        return self.n_gpu_layers > 0

    @property
    def load_params(self) -> LoadParams:
        """What the backend takes to load the model this way."""
        return LoadParams(
            n_ctx=self.n_ctx, n_seq=self.n_seq, n_threads=self.n_threads, n_threads_batch=self.n_threads_batch,
            n_gpu_layers=self.n_gpu_layers, gpu_index=self.gpu_index, tensor_split=self.tensor_split,
            use_extra_bufts=self.use_extra_bufts, kv_type=self.kv_type, flash_attn=self.flash_attn,
            backend_sampling=self.backend_sampling, n_cpu_moe=self.n_cpu_moe,
        )

    def describe(self) -> str:
        """One line: backend, context, where the layers go, KV cache and threads."""
        parts = [self.backend, f"context {self.n_ctx}", f"GPU layers {self.n_gpu_layers}"]
        if self.tensor_split:
            shares = " / ".join(f"GPU {i} {share:.0%}" for i, share in enumerate(self.tensor_split) if share > 0)
            parts.append(f"split {shares}, main GPU {self.gpu_index}")
        elif self.gpu_index is not None:
            parts.append(f"on GPU {self.gpu_index}")
        if self.n_cpu_moe:
            parts.append(f"experts of {self.n_cpu_moe} layers in RAM")
        if self.backend not in WHOLE_MODEL_BACKENDS:
            parts.append(f"KV cache {self.kv_type}, flash attention {self.flash_attn}")
        parts.append(f"threads {self.n_threads}/{self.n_threads_batch}")
        return ", ".join(parts)


@dataclass(frozen=True)
class _Placement:
    """Where the layers go with one KV cache type."""

    kv_type: KvType
    n_gpu_layers: int
    tensor_split: tuple[float, ...] = ()
    n_cpu_moe: int = 0

    def holds_more_than(self, other: _Placement) -> bool:
        """More layers on the GPUs, or as many with fewer experts left in RAM."""
        return (self.n_gpu_layers, -self.n_cpu_moe) > (other.n_gpu_layers, -other.n_cpu_moe)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _capped_training_context(model: ModelFacts) -> int:
    return min(model.n_ctx_train or DEFAULT_CONTEXT, DEFAULT_CONTEXT)


def _auto_context(model: ModelFacts, request: PlanRequest) -> int:
    if request.n_ctx is not None:
        return request.n_ctx
    if request.one_reply is not None:
        return min(_capped_training_context(model), -(-request.one_reply.tokens_bound(model) // CONTEXT_STEP) * CONTEXT_STEP)
    return _capped_training_context(model)


def kv_cache_bytes(model: ModelFacts, n_ctx: int, kv_type: KvType = "f16", n_seq: int = 1) -> int:
    """The KV cache of `n_ctx` tokens (`kv_bytes_per_token` is in the backend's default type, f16), with
    the recurrent state of each of `n_seq` sequences (f32 whatever the cache type)."""
    tokens = int(model.kv_bytes_per_token * n_ctx * KV_VALUE_BYTES[kv_type] / KV_VALUE_BYTES["f16"])
    return tokens + model.state_bytes_per_sequence * n_seq


def _usable(gpu: Gpu) -> int:
    return max(gpu.free_bytes - GPU_RESERVE_BYTES, 0)


def _gpu_layers(model: ModelFacts, per_layer: int, gpu: Gpu) -> int:
    """How many layers of `per_layer` bytes (weights and KV) fit on `gpu`. `n_layers + 1` means
    everything, the output head included."""
    budget = _usable(gpu)
    if model.n_layers * per_layer + model.other_bytes <= budget:
        return model.n_layers + 1
    return max(0, min(model.n_layers, budget // per_layer)) if per_layer > 0 else 0


def split_loads(model: ModelFacts, per_layer: int, n_gpu_layers: int, shares: tuple[float, ...]) -> list[int]:
    """The bytes each GPU gets when llama.cpp spreads the last `n_gpu_layers` layers (the output
    head counting as layer `n_layers`) by `shares`, as its load_tensors does: layer i of the
    offloaded ones goes to the first GPU whose cumulative share exceeds i / n_offloaded."""
    bounds = list(itertools.accumulate(shares))
    loads = [0] * len(shares)
    first = max(model.n_layers - n_gpu_layers, 0)
    offloaded = min(n_gpu_layers, model.n_layers + 1)
    for layer in range(first, first + offloaded):
        gpu = min(bisect.bisect_right(bounds, (layer - first) / offloaded * bounds[-1]), len(loads) - 1)
        loads[gpu] += per_layer if layer < model.n_layers else model.other_bytes
    return loads


def _shares(gpus: tuple[Gpu, ...]) -> tuple[float, ...]:
    """Each GPU's share of the offloaded layers, by index: proportional to its usable memory."""
    total = sum(_usable(gpu) for gpu in gpus)
    if total == 0:
        return ()
    shares = [0.0] * (max(gpu.index for gpu in gpus) + 1)
    for gpu in gpus:
        shares[gpu.index] = _usable(gpu) / total
    return tuple(shares)


def _split_layers(model: ModelFacts, per_layer: int, gpus: tuple[Gpu, ...]) -> tuple[int, tuple[float, ...]]:
    """The most layers several GPUs hold when split by `_shares`."""
    shares = _shares(gpus)
    room = {gpu.index: _usable(gpu) for gpu in gpus}
    for n in range(model.n_layers + 1, 0, -1) if shares else ():
        loads = split_loads(model, per_layer, n, shares)
        if all(load <= room.get(index, 0) for index, load in enumerate(loads)):
            return n, shares
    return 0, ()


def _experts_in_ram(model: ModelFacts, per_layer: int, gpu: Gpu) -> int | None:
    """The fewest layers whose routed experts must stay in RAM for everything else, with the KV
    cache and the output head, to fit on `gpu`; None if not even the rest fits."""
    excess = model.n_layers * per_layer + model.other_bytes - _usable(gpu)
    n = max(0, -(-excess // model.expert_bytes))
    return n if n <= model.n_layers else None


def _place(model: ModelFacts, n_ctx: int, n_seq: int, kv_type: KvType, gpus: tuple[Gpu, ...], split: bool) -> _Placement:
    """The most the GPUs hold with this KV cache type: everything on the GPU with most free memory
    when it fits there (no traffic between GPUs), else everything split across all of them; else,
    for a mixture of experts, every layer on the one GPU but for the experts of as few layers as
    need to stay in RAM (a token reads few experts, so the CPU's share of the work is small, as
    with llama-server's --n-cpu-moe); else as many whole layers as fit, split or not."""
    per_layer = model.layer_bytes + kv_cache_bytes(model, n_ctx, kv_type, n_seq) // max(model.n_layers, 1)
    main = max(gpus, key=lambda g: g.free_bytes)
    single = _Placement(kv_type, _gpu_layers(model, per_layer, main))
    if single.n_gpu_layers > model.n_layers:
        return single
    spread = _Placement(kv_type, *_split_layers(model, per_layer, gpus)) if split and len(gpus) > 1 else single
    if spread.n_gpu_layers > model.n_layers:
        return spread
    if split and model.expert_bytes and (n_cpu_moe := _experts_in_ram(model, per_layer, main)) is not None:
        return _Placement(kv_type, model.n_layers + 1, n_cpu_moe=n_cpu_moe)
    return spread if spread.n_gpu_layers > single.n_gpu_layers else single


def gpu_bytes(model: ModelFacts, plan: Plan) -> dict[int, int]:
    """What `plan` puts on each GPU, by index, as the planner counts it (layers with their KV
    cache in the plan's type, the output head); the reserve for the CUDA context is not included."""
    if plan.gpu_index is None or plan.n_gpu_layers == 0:
        return {}
    per_layer = model.layer_bytes + kv_cache_bytes(model, plan.n_ctx, plan.kv_type, plan.n_seq) // max(model.n_layers, 1)
    if plan.tensor_split:
        loads = split_loads(model, per_layer, plan.n_gpu_layers, plan.tensor_split)
        return {index: load for index, load in enumerate(loads) if load}
    head = model.other_bytes if plan.n_gpu_layers > model.n_layers else 0
    in_ram = plan.n_cpu_moe * model.expert_bytes
    return {plan.gpu_index: min(plan.n_gpu_layers, model.n_layers) * per_layer + head - in_ram}


def quantized_kv_possible(model: ModelFacts, build: BuildFeatures) -> bool:
    """llama.cpp quantizes the V cache only under flash attention, and q8_0 blocks must tile a head."""
    heads = model.kv_head_sizes
    return build.flash_attn and heads in FLASH_ATTN_HEAD_SIZES and all(size % Q8_0_BLOCK == 0 for size in heads or ())


def gpu_build_advice(backend: str, hardware: Hardware, build: BuildFeatures) -> str | None:
    """One line for a machine with an NVIDIA GPU that the backend's build cannot use: what is
    wrong and the command that installs a build that can. None when there is nothing to say."""
    if not hardware.gpus or build.gpu_offload:
        return None
    package, lacks, command = GPU_BUILDS[backend]
    names = ", ".join(dict.fromkeys(gpu.name for gpu in hardware.gpus))
    version = _installed_version(package) if "{pin}" in command else ""  # a rebuild pinned to it
    installed = f"{package} {version}" if version else package
    pin = f"=={version}" if version else ""
    return f"{names} found, but {installed} {lacks}; to use the GPU run: {command.format(pin=pin)}"


def _installed_version(package: str) -> str:
    import importlib.metadata  # here alone: 14 ms to import, on the path of every model's start

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _placement_reasons(model: ModelFacts, n_ctx: int, n_seq: int, placement: _Placement, gpus: tuple[Gpu, ...],
                       f16: _Placement) -> list[str]:
    main = max(gpus, key=lambda g: g.free_bytes)
    kv = kv_cache_bytes(model, n_ctx, placement.kv_type, n_seq)
    if placement.tensor_split:
        shares = ", ".join(f"{gpu.name} (GPU {gpu.index}) {placement.tensor_split[gpu.index]:.0%} of {_gib(gpu.free_bytes)} free"
                           for gpu in gpus)
        where = f"across {len(gpus)} GPUs in proportion to free memory, main GPU {main.index}: {shares}"
    else:
        where = f"on {main.name}, {_gib(main.free_bytes)} free"
    if placement.n_cpu_moe:
        reasons = [
            f"all {model.n_layers} layers {where} but for the routed experts of the first {placement.n_cpu_moe}, "
            f"{_gib(placement.n_cpu_moe * model.expert_bytes)} left in RAM: the whole model ({_gib(model.weight_bytes)} "
            f"of weights plus {_gib(kv)} of KV cache) does not fit, and a token reads only a few experts"
        ]
    elif placement.n_gpu_layers > model.n_layers:
        reasons = [f"all {model.n_layers} layers {where} (the model and its KV cache fit)"]
    elif placement.n_gpu_layers > 0:
        weights = _gib(model.weight_bytes)
        reasons = [f"{placement.n_gpu_layers} of {model.n_layers} layers {where} ({weights} of weights plus {_gib(kv)} of KV cache do not all fit)"]
    else:
        return [f"CPU only: {main.name} has {_gib(main.free_bytes)} free, too little for one layer"]
    if placement.kv_type != "f16":
        if f16.n_cpu_moe:
            in_f16 = f"the experts of {f16.n_cpu_moe} layers would stay in RAM"
        else:
            in_f16 = "no layer fits" if f16.n_gpu_layers == 0 else f"only {min(f16.n_gpu_layers, model.n_layers)} layers fit"
        reasons.append(
            f"KV cache {placement.kv_type} ({_gib(kv)} instead of {_gib(kv_cache_bytes(model, n_ctx, n_seq=n_seq))} in f16): "
            f"in f16 {in_f16} with a {n_ctx}-token context; flash attention on, which llama.cpp needs for a quantized V cache"
        )
    return reasons


def plan_offload(model: ModelFacts, hardware: Hardware, build: BuildFeatures, request: PlanRequest = PlanRequest()) -> Plan:
    """Choose how to run `model` on `hardware`; raise InsufficientMemoryError if it cannot run."""
    reasons: list[str] = []
    backend = BACKEND_FOR_FORMAT[model.format]
    reasons.append(f"backend {backend}: the model is a {model.format.upper()} file")
    n_ctx = _auto_context(model, request)
    if request.n_ctx is None and request.one_reply is not None and n_ctx < _capped_training_context(model):
        reasons.append(f"context {n_ctx}: enough for one reply of up to {request.one_reply.reply_tokens} tokens to this prompt")
    elif request.n_ctx is None:
        reasons.append(f"context {n_ctx}: the model's training context capped at {DEFAULT_CONTEXT}")
    elif model.n_ctx_train and n_ctx > model.n_ctx_train:
        reasons.append(f"context {n_ctx}: as asked, beyond the {model.n_ctx_train} tokens the model was trained on")

    gpus = hardware.gpus
    gpu = max(gpus, key=lambda g: g.free_bytes) if gpus else None
    splits = backend not in WHOLE_MODEL_BACKENDS
    placement = _Placement("f16", 0)
    if advice := gpu_build_advice(backend, hardware, build):
        reasons.append(f"CPU only: {advice}")
    elif request.n_gpu_layers is not None:
        n_asked = request.n_gpu_layers if build.gpu_offload else 0
        shares = _shares(gpus) if n_asked > 0 and splits and len(gpus) > 1 else ()
        placement = _Placement("f16", n_asked, shares)
        reasons.append(f"GPU layers {n_asked}: as asked" + (" (split across the GPUs by free memory)" if shares else ""))
    elif gpu is None:
        reasons.append("CPU only: no NVIDIA GPU found")
    else:
        f16 = _place(model, n_ctx, request.n_seq, "f16", gpus, splits)
        placement = f16
        if (f16.n_gpu_layers <= model.n_layers or f16.n_cpu_moe) and quantized_kv_possible(model, build):
            q8 = _place(model, n_ctx, request.n_seq, "q8_0", gpus, splits)
            if q8.holds_more_than(f16):
                placement = q8
        if not splits and 0 < placement.n_gpu_layers <= model.n_layers:
            reasons.append(f"CPU only: {backend} runs a model whole and it does not fit in {gpu.name}'s {_gib(gpu.free_bytes)} free")
            placement = _Placement("f16", 0)
        else:
            reasons += _placement_reasons(model, n_ctx, request.n_seq, placement, gpus, f16)
    n_gpu_layers = placement.n_gpu_layers
    kv_type = placement.kv_type
    flash_attn: FlashAttn = "auto"
    if n_gpu_layers > 0 and build.flash_attn and model.kv_head_sizes in FLASH_ATTN_HEAD_SIZES:
        flash_attn = "on"
        if kv_type == "f16":
            reasons.append(f"flash attention on: this build has GPU kernels for heads of {model.kv_head_sizes[0]}")

    gpu_share = min(n_gpu_layers, model.n_layers) / max(model.n_layers, 1)
    head_on_gpu = n_gpu_layers > model.n_layers

    def cpu_bytes(ctx: int) -> int:
        layers = int(model.n_layers * model.layer_bytes * (1 - gpu_share)) + placement.n_cpu_moe * model.expert_bytes
        kv = int(kv_cache_bytes(model, ctx, kv_type, request.n_seq) * (1 - gpu_share))
        # The embedding table stays in RAM even on a GPU; the output head moves with the last layer.
        other = model.other_bytes // 2 if head_on_gpu else model.other_bytes
        logits = model.n_vocab * 4 * request.n_seq
        return layers + kv + other + logits + CPU_OVERHEAD_BYTES

    ram = int(hardware.ram_available_bytes * RAM_HEADROOM)
    if cpu_bytes(n_ctx) > ram:
        if request.n_ctx is None:
            while n_ctx > MIN_AUTO_CONTEXT and cpu_bytes(n_ctx) > ram:
                n_ctx = max(n_ctx // 2, MIN_AUTO_CONTEXT)
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

    # With the output layer on a GPU, llama.cpp samples there: the logits row (128k floats for Llama 3)
    # is not copied back each token. On the CPU its top-k sorts the whole row (slower than localchat's sampler).
    backend_sampling = backend == "llama.cpp" and head_on_gpu
    if backend_sampling and request.n_seq == 1:
        reasons.append("sampling on the GPU: the output layer is there (llama.cpp's backend sampling)")
    elif backend_sampling:  # the backend's rule: localchat.backends.llamacpp_sampler.device_sampleable
        reasons.append(f"greedy replies sampled on the GPU, where the output layer is; others on the CPU, as "
                       f"{request.n_seq} sequences' chains are slower on the GPU")

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
        kv_type=kv_type,
        flash_attn=flash_attn,
        tensor_split=placement.tensor_split,
        backend_sampling=backend_sampling,
        n_cpu_moe=placement.n_cpu_moe,
    )
