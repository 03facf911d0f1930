"""What the machine has: CPU, RAM and NVIDIA GPUs (through NVML when it is present)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import psutil

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Gpu:
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


def nvidia_gpus() -> tuple[Gpu, ...]:
    """NVIDIA GPUs with their free memory; none when NVML or its driver is absent."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else name,
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
