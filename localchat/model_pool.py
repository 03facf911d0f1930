"""Which models a server keeps loaded, knowing nothing of HTTP.

A request leases a model by name: a loaded one at once; one being loaded after that load (one load
per model at a time); another after room is made for it. Room is memory (each model's RAM and VRAM
as the planner estimates them, against what the machine had free before any model was loaded) and
an optional cap on the count. Idle models are unloaded least recently used first; a model with a
lease out (a reply in flight) is never unloaded: the load waits for leases to end, up to a bound,
then every request waiting on it gets ModelBusyError (a client retries later) rather than waiting
without end, as Ollama's scheduler can (ollama#17408). Loads and unloads run in worker threads, so
requests for loaded models go on while another model loads. State changes only on the event
loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, Literal, Protocol, TypeVar

from localchat.errors import InvalidSettingError, LocalchatError
from localchat.hardware import Hardware
from localchat.planner import (
    CPU_OVERHEAD_BYTES,
    GPU_RESERVE_BYTES,
    RAM_HEADROOM,
    ModelFacts,
    Plan,
    gpu_bytes,
    kv_cache_bytes,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
ModelState = Literal["loading", "loaded", "unloading"]
# busy: the load gave up waiting for models with replies in flight to make room.
PoolEventKind = Literal["loaded", "load_failed", "busy", "unloaded"]


@dataclass(frozen=True)
class MemoryNeed:
    """What one loaded model holds: RAM, and VRAM by GPU index."""

    ram_bytes: int
    gpu_bytes: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryBudget:
    """What the models may hold together: free RAM and free VRAM per GPU, as the planner counts them."""

    ram_bytes: int
    gpu_bytes: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, hardware: Hardware) -> MemoryBudget:
        return cls(int(hardware.ram_available_bytes * RAM_HEADROOM),
                   {gpu.index: gpu.free_bytes - GPU_RESERVE_BYTES for gpu in hardware.gpus})

    def holds(self, needs: Iterable[MemoryNeed]) -> bool:
        ram, gpu = 0, dict.fromkeys(self.gpu_bytes, 0)
        for need in needs:
            ram += need.ram_bytes
            for index, used in need.gpu_bytes.items():
                gpu[index] = gpu.get(index, 0) + used
        return ram <= self.ram_bytes and all(used <= self.gpu_bytes.get(index, 0) for index, used in gpu.items())


def memory_need(facts: ModelFacts, plan: Plan) -> MemoryNeed:
    """The planner's estimate of what `plan` holds once loaded: its VRAM by GPU (`gpu_bytes`), and
    the RAM sum plan_offload checks (the layers and KV cache left on the CPU, the embedding table,
    logits, compute buffers)."""
    on_gpu = min(plan.n_gpu_layers, facts.n_layers) / max(facts.n_layers, 1)
    head_on_gpu = plan.n_gpu_layers > facts.n_layers
    layers = int(facts.n_layers * facts.layer_bytes * (1 - on_gpu))
    kv = int(kv_cache_bytes(facts, plan.n_ctx, plan.kv_type, plan.n_seq) * (1 - on_gpu))
    other = facts.other_bytes // 2 if head_on_gpu else facts.other_bytes
    ram = layers + kv + other + facts.n_vocab * 4 * plan.n_seq + CPU_OVERHEAD_BYTES
    return MemoryNeed(ram, gpu_bytes(facts, plan))


class ModelBusyError(LocalchatError):
    """The model asked for needs room that models with replies in flight hold."""


class ModelLoader(Protocol[T]):
    """How the pool learns a model's size and loads and frees it; each call blocks (a worker thread)."""

    def estimate(self, name: str) -> MemoryNeed: ...

    def load(self, name: str) -> T: ...

    def unload(self, model: T) -> None: ...


@dataclass(frozen=True)
class PoolEvent:
    """A load or unload, for the log and the metrics."""

    kind: PoolEventKind
    name: str
    reason: str
    seconds: float


@dataclass(eq=False)
class _Entry(Generic[T]):
    name: str
    need: MemoryNeed
    state: ModelState
    done: asyncio.Future[None]  # the load (state "loading") or unload ("unloading") in progress
    model: T | None = None
    leases: int = 0
    last_used: float = 0.0
    admitted: bool = False  # its room is counted: it fitted beside the others, or they were unloaded
    keep_alive: float | None = None  # seconds it stays loaded once idle; None: as long as room allows
    expiry: asyncio.Task[None] | None = None  # the wait to unload it once idle for keep_alive


class Lease(Generic[T]):
    """A model held for one request; `release()` (idempotent) when its reply has ended."""

    def __init__(self, model: T, release: Callable[[], None]) -> None:
        self.model = model
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        if self._release is not None:
            self._release, release = None, self._release
            release()


class ModelPool(Generic[T]):
    """Loaded models by name; see the module's docstring for the rules."""

    def __init__(self, loader: ModelLoader[T], budget: MemoryBudget, *, max_models: int | None = None,
                 wait_s: float = 30.0, on_event: Callable[[PoolEvent], None] = lambda event: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_models is not None and max_models < 1:
            raise InvalidSettingError(f"the most models loaded must be >= 1, got {max_models}")
        self._loader = loader
        self._budget = budget
        self._max_models = max_models
        self._wait_s = wait_s
        self._on_event = on_event
        self._clock = clock
        self._entries: dict[str, _Entry[T]] = {}
        self._needs: dict[str, MemoryNeed] = {}
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    # -- what the pool holds ----------------------------------------------------------

    def states(self) -> dict[str, ModelState]:
        return {name: entry.state for name, entry in self._entries.items()}

    def loaded(self) -> dict[str, T]:
        return {name: e.model for name, e in self._entries.items() if e.state == "loaded" and e.model is not None}

    def leases(self, name: str) -> int:
        entry = self._entries.get(name)
        return entry.leases if entry is not None else 0

    def need(self, name: str) -> MemoryNeed | None:
        """What the model holds (the planner's estimate), once its load has started."""
        return self._needs.get(name)

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """How long the loaded model `name` stays loaded once idle: it is unloaded after `seconds`
        without a lease (0: as soon as its last lease ends); None: as long as room allows."""
        entry = self._entries.get(name)
        if entry is None or entry.state != "loaded":
            return
        entry.keep_alive = seconds
        if entry.leases == 0:
            self._schedule_expiry(entry)

    async def unload(self, name: str, reason: str) -> None:
        """Unload `name` now if it is loaded (after its load, if one is under way); raises
        ModelBusyError while a reply holds it."""
        entry = self._entries.get(name)
        while entry is not None and entry.state == "loading":
            await asyncio.gather(asyncio.shield(entry.done), return_exceptions=True)
            entry = self._entries.get(name)
        if entry is None:
            return
        if entry.leases:
            raise ModelBusyError(f"'{name}' has replies in flight; retry when they end")
        await (self._start_unload(entry, reason) if entry.state == "loaded" else asyncio.shield(entry.done))

    def expiry(self, name: str) -> float | None:
        """When (on the pool's clock) the idle model `name` will be unloaded; None: not planned."""
        entry = self._entries.get(name)
        if entry is None or entry.keep_alive is None:
            return None
        return (self._clock() if entry.leases else entry.last_used) + entry.keep_alive

    def add_loaded(self, name: str, model: T, need: MemoryNeed) -> None:
        """A model loaded before the pool existed (the one `localchat serve` starts with)."""
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        self._entries[name] = _Entry(name, need, "loaded", done, model, last_used=self._clock(), admitted=True)
        self._needs[name] = need

    # -- leasing ----------------------------------------------------------------------

    async def acquire(self, name: str) -> Lease[T]:
        """The model `name`, loaded first if need be; raises the load's error or ModelBusyError."""
        while True:
            entry = self._entries.get(name)
            if entry is not None and entry.state == "loaded":
                assert entry.model is not None
                entry.leases += 1
                entry.last_used = self._clock()
                return Lease(entry.model, partial(self._release, entry))
            if entry is None:
                entry = self._start_load(name)
            # Its load (or its unload, before it loads again) is under way: wait for it. Shielded:
            # a request that gives up must not cancel the load others wait for.
            await asyncio.shield(entry.done)

    def _release(self, entry: _Entry[T]) -> None:
        entry.leases -= 1
        entry.last_used = self._clock()
        if entry.leases == 0:
            self._schedule_expiry(entry)
        self._notify()

    def _schedule_expiry(self, entry: _Entry[T]) -> None:
        if entry.expiry is not None:
            entry.expiry.cancel()
            entry.expiry = None
        if entry.keep_alive is None:
            return
        if entry.keep_alive <= 0:
            self._start_unload(entry, "its keep_alive is 0")
        else:
            entry.expiry = self._spawn(self._expire(entry, entry.last_used))

    async def _expire(self, entry: _Entry[T], idle_since: float) -> None:
        assert entry.keep_alive is not None
        await asyncio.sleep(max(0.0, idle_since + entry.keep_alive - self._clock()))
        # Unless it was used (or unloaded) meanwhile.
        if self._entries.get(entry.name) is entry and entry.state == "loaded" and not entry.leases \
                and entry.last_used == idle_since:
            self._start_unload(entry, f"idle for its keep_alive of {entry.keep_alive:g} s")

    def _room_for(self, need: MemoryNeed) -> list[_Entry[T]] | None:
        """The idle models to unload, least recently used first, so that `need` fits beside the
        rest; None when models with replies in flight hold the room. An empty pool always admits one."""
        kept = [e for e in self._entries.values() if e.admitted and e.state != "unloading"]
        idle = sorted((e for e in kept if e.state == "loaded" and e.leases == 0), key=lambda e: e.last_used)
        victims: list[_Entry[T]] = []
        while kept and not self._fits(kept, need):
            if not idle:
                return None
            victim = idle.pop(0)
            victims.append(victim)
            kept.remove(victim)
        return victims

    def _fits(self, kept: list[_Entry[T]], need: MemoryNeed) -> bool:
        if self._max_models is not None and len(kept) + 1 > self._max_models:
            return False
        return self._budget.holds([*(e.need for e in kept), need])

    async def _wait_for_change(self, name: str, deadline: float) -> None:
        left = deadline - self._clock()
        busy = sorted(n for n, e in self._entries.items() if e.leases)
        if left > 0:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
                return
            except TimeoutError:
                pass
        raise ModelBusyError(
            f"'{name}' needs the room that {', '.join(busy) or 'other models'} hold while replies are in flight; "
            "retry when they end"
        )

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- loading and unloading (worker threads) ---------------------------------------

    def _start_load(self, name: str) -> _Entry[T]:
        entry: _Entry[T] = _Entry(name, MemoryNeed(0), "loading", asyncio.get_running_loop().create_future())
        self._entries[name] = entry
        self._spawn(self._load(entry))
        return entry

    def _start_unload(self, entry: _Entry[T], reason: str) -> asyncio.Future[None]:
        entry.state, entry.done = "unloading", asyncio.get_running_loop().create_future()
        self._spawn(self._unload(entry, reason))
        return entry.done

    def _spawn(self, work: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, entry: _Entry[T]) -> None:
        """Estimate (once per model), make room, load. The seconds reported are the estimate's and
        the load's, as `Engine.load` plans then loads; waiting for room is not loading."""
        name, started = entry.name, time.perf_counter()
        working = 0.0
        try:
            if name not in self._needs:
                self._needs[name] = await asyncio.to_thread(self._loader.estimate, name)
            entry.need = self._needs[name]
            working = time.perf_counter() - started
            deadline = self._clock() + self._wait_s
            while (victims := self._room_for(entry.need)) is None:
                await self._wait_for_change(name, deadline)
            entry.admitted = True
            # The memory of the models unloaded to make room must be free before this load starts.
            await asyncio.gather(*(self._start_unload(v, f"to make room for {name}") for v in victims))
            reason = f"asked for; unloaded {', '.join(v.name for v in victims)} to make room" if victims else "asked for"
            started = time.perf_counter()
            entry.model = await asyncio.to_thread(self._loader.load, name)
        except Exception as error:
            del self._entries[name]
            if not isinstance(error, ModelBusyError):
                self._needs.pop(name, None)  # the next try reads the model afresh
            kind: PoolEventKind = "busy" if isinstance(error, ModelBusyError) else "load_failed"
            self._report(PoolEvent(kind, name, str(error) or type(error).__name__, working + time.perf_counter() - started))
            entry.done.set_exception(error)
            entry.done.exception()  # marks it retrieved: a load nobody waits for any more logs nothing
        else:
            entry.state, entry.last_used = "loaded", self._clock()
            self._report(PoolEvent("loaded", name, reason, working + time.perf_counter() - started))
            entry.done.set_result(None)
        self._notify()

    async def _unload(self, entry: _Entry[T], reason: str) -> None:
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self._loader.unload, entry.model)  # type: ignore[arg-type]
        except Exception:
            logger.exception("unloading %s failed", entry.name)
        finally:
            del self._entries[entry.name]
            self._report(PoolEvent("unloaded", entry.name, reason, time.perf_counter() - started))
            entry.done.set_result(None)
            self._notify()

    def _report(self, event: PoolEvent) -> None:
        try:
            self._on_event(event)
        except Exception:  # a metrics or log failure must not leave a load unfinished
            logger.exception("reporting %s failed", event)

    async def close(self) -> None:
        """Wait for loads under way, then unload every model (the server is stopping)."""
        for entry in self._entries.values():
            if entry.expiry is not None:
                entry.expiry.cancel()
        while self._entries:
            entry = next(iter(self._entries.values()))
            if entry.state == "loaded":
                self._start_unload(entry, "the server is stopping")
            await asyncio.gather(entry.done, return_exceptions=True)
