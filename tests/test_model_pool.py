"""The model pool's rules over a fake loader (pure logic: no model, no HTTP, milliseconds)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from localchat.errors import ModelError
from localchat.hardware import GIB, MIB
from localchat.model_pool import (
    MemoryBudget,
    MemoryNeed,
    ModelBusyError,
    ModelPool,
    PoolEvent,
    memory_need,
)
from localchat.planner import CPU_OVERHEAD_BYTES, ModelFacts, Plan


@dataclass
class FakeLoader:
    """Models of given sizes; a load waits until the test opens its gate (threading: it runs in a worker)."""

    sizes: dict[str, int]
    gated: set[str] = field(default_factory=set)
    gates: dict[str, threading.Event] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    def open(self, name: str) -> None:
        self.gates.setdefault(name, threading.Event()).set()

    def estimate(self, name: str) -> MemoryNeed:
        self.calls.append(f"estimate {name}")
        return MemoryNeed(self.sizes[name])

    def load(self, name: str) -> str:
        self.calls.append(f"load {name}")
        if name in self.gated:
            assert self.gates.setdefault(name, threading.Event()).wait(5)
        if name in self.failing:
            raise ModelError(f"{name} is damaged")
        return f"model {name}"

    def unload(self, model: str) -> None:
        self.calls.append(f"unload {model.removeprefix('model ')}")


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 5))


def pool_of(loader: FakeLoader, ram: int = 10, **options: object) -> tuple[ModelPool[str], list[PoolEvent]]:
    events: list[PoolEvent] = []
    return ModelPool(loader, MemoryBudget(ram), on_event=events.append, **options), events  # type: ignore[arg-type]


def test_loads_once_and_keeps_what_fits() -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 4, "b": 4})
        pool, events = pool_of(loader)
        first, second = await asyncio.gather(pool.acquire("a"), pool.acquire("a"))
        assert first.model == second.model == "model a" and pool.leases("a") == 2
        await pool.acquire("b")
        assert loader.calls == ["estimate a", "load a", "estimate b", "load b"]  # once for two requests; both fit
        assert pool.states() == {"a": "loaded", "b": "loaded"}
        assert [(e.kind, e.name) for e in events] == [("loaded", "a"), ("loaded", "b")]

    run(test)


@pytest.mark.parametrize(("ram", "max_models"), [(10, 2), (100, 2), (7, None)])
def test_unloads_the_least_recently_used_idle_model(ram: int, max_models: int | None) -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 3, "b": 3, "c": 3})
        pool, events = pool_of(loader, ram, max_models=max_models)
        for name in ("a", "b", "a"):
            (await pool.acquire(name)).release()
        await pool.acquire("c")  # room for two at most (7 holds two of 3): b is the least recently used
        assert sorted(pool.loaded()) == ["a", "c"]
        assert loader.calls[-2:] == ["unload b", "load c"]  # b's memory is free before c loads
        assert events[-1].reason == "asked for; unloaded b to make room"
        assert events[-2] == PoolEvent("unloaded", "b", "to make room for c", events[-2].seconds)

    run(test)


def test_a_model_with_a_reply_in_flight_is_never_unloaded() -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 6, "b": 6})
        pool, _ = pool_of(loader, wait_s=2)
        lease = await pool.acquire("a")
        waiting = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and loader.calls == ["estimate a", "load a", "estimate b"]  # b waits for a's reply
        lease.release()
        lease.release()  # a second release changes nothing
        assert (await waiting).model == "model b"
        assert loader.calls == ["estimate a", "load a", "estimate b", "unload a", "load b"] and pool.leases("a") == 0

    run(test)


def test_a_long_wait_ends_in_model_busy() -> None:
    async def test() -> None:
        pool, events = pool_of(FakeLoader({"a": 6, "b": 6}), wait_s=0.1)
        await pool.acquire("a")
        with pytest.raises(ModelBusyError, match="'b' needs the room that a hold"):
            await pool.acquire("b")
        assert [e.kind for e in events] == ["loaded", "busy"] and pool.states() == {"a": "loaded"}

    run(test)


def test_requests_for_a_loaded_model_do_not_wait_behind_another_load() -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 1, "b": 1}, gated={"b"})
        pool, _ = pool_of(loader)
        (await pool.acquire("a")).release()
        loading = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.05)
        assert pool.states() == {"a": "loaded", "b": "loading"}
        assert (await pool.acquire("a")).model == "model a"  # at once, b still loading
        assert not loading.done()
        loader.open("b")
        assert (await loading).model == "model b"

    run(test)


def test_a_failed_load_reaches_every_waiter_and_the_next_request_tries_again() -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 1}, gated={"a"}, failing={"a"})
        pool, events = pool_of(loader)
        waiters = [asyncio.create_task(pool.acquire("a")) for _ in range(2)]
        await asyncio.sleep(0.05)
        loader.open("a")
        for waiter in waiters:
            with pytest.raises(ModelError, match="a is damaged"):
                await waiter
        assert pool.states() == {} and events[0].kind == "load_failed"
        loader.failing.clear()
        assert (await pool.acquire("a")).model == "model a"
        assert loader.calls == ["estimate a", "load a", "estimate a", "load a"]  # read afresh after a failure

    run(test)


def test_close_unloads_everything() -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 1, "b": 1})
        pool, _ = pool_of(loader)
        pool.add_loaded("a", "model a", MemoryNeed(1))
        await pool.acquire("b")
        await pool.close()
        assert pool.states() == {} and sorted(loader.calls) == ["estimate b", "load b", "unload a", "unload b"]

    run(test)


def test_models_loading_together_count_against_each_other() -> None:
    async def test() -> None:
        loader = FakeLoader({"a": 6, "b": 6}, gated={"a", "b"})
        pool, _ = pool_of(loader, wait_s=0.1)
        loads = [asyncio.create_task(pool.acquire(name)) for name in ("a", "b")]
        await asyncio.sleep(0.05)
        loader.open("a")
        loader.open("b")
        done = await asyncio.gather(*loads, return_exceptions=True)
        # One of them fits; the other waits for it, and its reply's lease keeps it: busy.
        assert sorted(type(d).__name__ for d in done) == ["Lease", "ModelBusyError"]

    run(test)


def test_the_first_model_is_admitted_even_if_the_estimate_exceeds_the_budget() -> None:
    async def test() -> None:
        pool, _ = pool_of(FakeLoader({"huge": 50}), ram=10)
        assert (await pool.acquire("huge")).model == "model huge"

    run(test)


def test_memory_need_splits_ram_and_vram_as_the_planner_does() -> None:
    facts = ModelFacts("gguf", n_layers=10, n_ctx_train=4096, layer_bytes=100 * MIB, other_bytes=200 * MIB,
                       kv_bytes_per_token=10 * 1024, n_vocab=1000)
    kv = 10 * 1024 * 4096
    cpu = Plan("llama.cpp", 4096, 0, 2, 2, 1, True, None)
    assert memory_need(facts, cpu) == MemoryNeed(1000 * MIB + kv + 200 * MIB + 4000 + CPU_OVERHEAD_BYTES)
    gpu = Plan("llama.cpp", 4096, 11, 2, 2, 1, True, 0)  # every layer and the head
    assert memory_need(facts, gpu) == MemoryNeed(100 * MIB + 4000 + CPU_OVERHEAD_BYTES, {0: 1000 * MIB + kv + 200 * MIB})
    q8 = Plan("llama.cpp", 4096, 11, 2, 2, 1, True, 0, kv_type="q8_0")  # a smaller KV cache in the same VRAM
    assert memory_need(facts, q8).gpu_bytes[0] < memory_need(facts, gpu).gpu_bytes[0]
    budget = MemoryBudget(2 * GIB, {0: 1 * GIB})
    assert budget.holds([memory_need(facts, cpu)]) and not budget.holds([memory_need(facts, gpu)])
    assert not MemoryBudget(100 * GIB).holds([memory_need(facts, gpu)])  # no such GPU here
