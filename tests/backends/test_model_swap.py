"""The pool behind ``[gateway] max_loaded_models`` (tokenops/backends/model_swap.py) with fake engines:
least recently used idle engine evicted, busy ones never, waiters served in arrival order, one load
per model at a time, a failed load failing only its own requests."""

from __future__ import annotations

import asyncio

import pytest
from tokenops.backends.model_swap import ModelSwap
from tokenops.types import BackendError


class FakeEngine:
    """A backend whose engine 'loads' when the test lets it (``gate``), recording what happened."""

    def __init__(self, name: str, log: list[str], *, fails: bool = False) -> None:
        self.name, self.model = f"{name}#0", name
        self.log = log
        self.fails = fails
        self.gate: asyncio.Event | None = None
        self.load_error: str | None = None

    async def load_engine(self) -> None:
        self.log.append(f"load {self.model}")
        if self.gate is not None:
            await self.gate.wait()
        if self.fails:
            raise FileNotFoundError(f"no weights for {self.model}")

    async def unload_engine(self) -> None:
        self.log.append(f"unload {self.model}")


@pytest.fixture(autouse=True)
def _no_memory_to_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake engines hold no memory; the real release (a full collection) takes ~0.5 s in a process
    that imported torch and more than 1 s late in the suite, which the stall guards below would count."""
    monkeypatch.setattr("tokenops.backends.model_swap.release_memory", lambda: None)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def started(
    slots: int, names: str, initial: int, log: list[str], grace_s: float = 0.0, gather_s: float = 0.0
) -> tuple[ModelSwap, dict[str, FakeEngine]]:
    engines = {n: FakeEngine(n, log) for n in names}
    first = [e.name for e in list(engines.values())[:initial]]
    swap = ModelSwap(slots, initial=first, drain_grace_s=grace_s, gather_s=gather_s)
    for e in engines.values():
        await swap.start(e)
    return swap, engines


async def use(swap: ModelSwap, engine: FakeEngine) -> None:
    await swap.acquire(engine)
    swap.release(engine)


def test_least_recently_used_idle_engine_is_evicted():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(2, "abc", 2, log)
        assert log == ["load a", "load b"] and list(swap.resident) == ["a#0", "b#0"]
        await use(swap, e["a"])  # a is now the most recently used
        await use(swap, e["c"])
        assert log[2:] == ["unload b", "load c"]
        assert list(swap.resident) == ["a#0", "c#0"]
        await use(swap, e["a"])  # resident: no load
        assert swap.stats()["num_loads"] == 3 and swap.stats()["num_evictions"] == 1
        assert swap.stats()["loads"] == {"a#0": 1, "b#0": 1, "c#0": 1}

    asyncio.run(main())


def test_busy_engine_is_not_evicted_and_waiters_are_served_in_order():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(1, "abc", 1, log)
        await swap.acquire(e["a"])  # a runs a request
        order: list[str] = []

        async def request(name: str) -> None:
            await swap.acquire(e[name])
            order.append(name)
            await asyncio.sleep(0.01)
            swap.release(e[name])

        tasks = [asyncio.create_task(request(n)) for n in ("b", "c", "a", "b")]
        await settle()
        assert order == [] and log == ["load a"]  # a is busy: not evicted, nobody admitted
        assert swap.draining == "a#0" and swap.stats()["waiting"] == 4  # a takes no new request meanwhile
        swap.release(e["a"])
        await asyncio.gather(*tasks)
        # b (twice: the second joins b's batch), then c, then a: in arrival order of the loads
        assert order == ["b", "b", "c", "a"]
        assert log == ["load a", "unload a", "load b", "unload b", "load c", "unload c", "load a"]
        assert not swap.in_flight and not swap.waiters

    asyncio.run(main())


def test_requests_for_a_loading_model_share_one_load():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(1, "ab", 1, log)
        e["b"].gate = asyncio.Event()
        tasks = [asyncio.create_task(use(swap, e["b"])) for _ in range(5)]
        await settle()
        assert swap.loading == {"b#0"}
        e["b"].gate.set()
        await asyncio.gather(*tasks)
        assert log == ["load a", "unload a", "load b"]

    asyncio.run(main())


def test_a_failed_load_fails_its_requests_only():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(1, "ab", 1, log)
        e["b"].fails = True
        with pytest.raises(BackendError) as info:
            await use(swap, e["b"])
        assert info.value.status == 503 and info.value.kind == "model_load_failed"
        assert "`b` failed to load" in str(info.value) and "no weights for b" in str(info.value)
        assert e["b"].load_error == "FileNotFoundError: no weights for b"  # failed for good, as at start
        await use(swap, e["a"])  # a serves again (reloaded into the freed slot)
        assert log == ["load a", "unload a", "load b", "load a"]
        assert swap.stats()["num_load_failures"] == 1 and list(swap.resident) == ["a#0"]

    asyncio.run(main())


def test_a_waiter_that_goes_away_leaves_the_queue():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(1, "ab", 1, log)
        await swap.acquire(e["a"])
        waiting = asyncio.create_task(use(swap, e["b"]))
        await settle()
        waiting.cancel()
        await settle()
        assert not swap.waiters
        swap.release(e["a"])
        await settle()
        assert log == ["load a"] and swap.draining is None  # nobody wants b any more: a stays

    asyncio.run(main())


def test_attach_pins_lora_bases_and_needs_room_beyond_them():
    from types import SimpleNamespace

    from tokenops.backends.model_swap import attach
    from tokenops.config import ConfigError

    def replicas(*names: str) -> dict:
        out = {}
        for n in names:
            backend = FakeEngine(n, [])
            backend.config, backend.swap = object(), None  # a bundled engine built from its config
            out[n] = [SimpleNamespace(backend=backend)]
        return out

    assert attach(0, replicas("a", "b")) is None  # no bound
    assert attach(2, replicas("a", "b")) is None  # everything fits
    models = replicas("base", "a", "b")
    swap = attach(2, models, lora_bases=["base"])
    assert swap is not None and swap.pinned == {"base#0"} and swap.initial == {"a#0"} and swap.num_slots == 1
    assert models["base"][0].backend.swap is None and models["b"][0].backend.swap is swap
    with pytest.raises(ConfigError, match="raise it to at least 2"):
        attach(1, replicas("base", "a"), lora_bases=["base"])


def test_a_victim_takes_a_burst_during_its_grace_then_drains():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(1, "ab", 1, log, grace_s=0.5)
        await swap.acquire(e["a"])
        wants_b = asyncio.create_task(swap.acquire(e["b"]))
        await settle()
        assert swap.draining == "a#0"
        await asyncio.wait_for(swap.acquire(e["a"]), 10)  # within the grace: joins a's batch
        await asyncio.sleep(0.6)
        late = asyncio.create_task(swap.acquire(e["a"]))  # after it: waits behind b's load
        await settle()
        assert not late.done() and not wants_b.done() and swap.in_flight["a#0"] == 2
        swap.release(e["a"])
        swap.release(e["a"])
        await asyncio.wait_for(wants_b, 10)
        assert log == ["load a", "unload a", "load b"] and not late.done()
        swap.release(e["b"])
        await asyncio.wait_for(late, 10)
        assert log[-2:] == ["unload b", "load a"]

    asyncio.run(main())


def test_a_load_lets_the_burst_it_came_in_reach_the_resident_engines_first():
    async def main() -> None:
        log: list[str] = []
        swap, e = await started(1, "ab", 1, log, gather_s=0.5)
        wants_b = asyncio.create_task(swap.acquire(e["b"]))
        await settle()
        assert log == ["load a"]  # a is idle, but b's load waits for the burst
        await asyncio.wait_for(swap.acquire(e["a"]), 10)  # a's request a moment later: a is still there
        await asyncio.sleep(0.6)
        assert swap.draining == "a#0" and not wants_b.done()  # now busy: b waits for it
        swap.release(e["a"])
        await asyncio.wait_for(wants_b, 10)
        assert log == ["load a", "unload a", "load b"]

    asyncio.run(main())
