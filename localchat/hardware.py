"""What the machine has: CPU, RAM and NVIDIA GPUs (through NVML when it is present)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

GIB = 1024**3
MIB = 1024**2
# Where a Linux machine with NVIDIA's driver shows it: its kernel module, or WSL's GPU device.
NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/dxg")


@dataclass(frozen=True)
class Gpu:
    # The CUDA device number (what llama.cpp's main_gpu and tensor_split index).
    index: int
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Hardware:
    cpu_name: str
    physical_cores: int
    logical_cores: int
    cpu_flags: frozenset[str]
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[Gpu, ...] = ()

    @property
    def has_amx(self) -> bool:
        return "amx_int8" in self.cpu_flags or "amx_tile" in self.cpu_flags


def _cpu_info() -> tuple[str, frozenset[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), frozenset()
    name, flags = platform.machine(), frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and name == platform.machine():
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return name, flags


def cuda_visible(setting: str | None, uuids: Sequence[str]) -> list[int]:
    """The GPUs that CUDA programs see, in CUDA's numbering, as positions in `uuids` (every GPU's
    UUID in PCI bus order). `setting` is CUDA_VISIBLE_DEVICES: indices or UUID prefixes, read
    up to the first entry that names no GPU (or names one again), as CUDA reads it; unset means all."""
    if setting is None:
        return list(range(len(uuids)))
    visible: list[int] = []
    for entry in (part.strip() for part in setting.split(",")):
        matches = [i for i, uuid in enumerate(uuids) if entry.startswith("GPU-") and uuid.startswith(entry)]
        if entry.isdigit() and int(entry) < len(uuids):
            matches = [int(entry)]
        if len(matches) != 1 or matches[0] in visible:
            break
        visible.append(matches[0])
    return visible


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvidia_gpus() -> tuple[Gpu, ...]:
    """The NVIDIA GPUs CUDA programs may use, with their free memory; none when NVML or its
    driver is absent. NVML ignores CUDA_VISIBLE_DEVICES: the GPUs are numbered here as CUDA
    numbers them under CUDA_DEVICE_ORDER=PCI_BUS_ID, which the llama.cpp backend sets."""
    if sys.platform == "linux" and not any(Path(path).exists() for path in NVIDIA_DRIVER_PATHS):
        return ()  # no driver: NVML's bindings need not be imported (20 ms of a start)
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        # NVML does not promise PCI order; the fixed-width bus ids sort as CUDA orders them.
        handles.sort(key=lambda handle: _text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
        uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in handles]
        gpus = []
        for cuda_index, nvml_index in enumerate(cuda_visible(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)):
            handle = handles[nvml_index]
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                Gpu(
                    index=cuda_index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    total_bytes=int(memory.total),
                    free_bytes=int(memory.free),
                )
            )
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def detect_hardware() -> Hardware:
    memory = psutil.virtual_memory()
    name, flags = _cpu_info()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    # A container may be limited to fewer CPUs than the machine has.
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:
        allowed = logical
    return Hardware(
        cpu_name=name,
        physical_cores=min(physical, allowed),
        logical_cores=min(logical, allowed),
        cpu_flags=flags,
        ram_total_bytes=memory.total,
        ram_available_bytes=memory.available,
        gpus=nvidia_gpus(),
    )


def process_rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports it in KiB)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


def gpu_memory_used_bytes() -> int | None:
    """GPU memory in use on all NVIDIA GPUs, or None without NVML."""
    gpus = nvidia_gpus()
    if not gpus:
        return None
    return sum(gpu.total_bytes - gpu.free_bytes for gpu in gpus)
