"""The bound on resident LoRA adapters (tokenops/backends/lora.py: LoraPool) on a real engine: the
least recently used adapter with no request running is unloaded for room and reloaded on demand."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from test_lora import ADAPTERS, make_adapter, make_engine
from tokenops.backends.lora import LoraPool
from tokenops.engine.core.async_engine import AsyncLLMEngine
from tokenops.types import BackendError

pytest.importorskip("peft")


def test_lru_eviction_and_reload(tiny_llama_dir, tmp_path):
    paths = {n: str(make_adapter(tiny_llama_dir, tmp_path / n, *ADAPTERS["beta"][:4], seed))
             for seed, n in enumerate(("a", "b", "c"), start=3)}
    engine = AsyncLLMEngine(make_engine(tiny_llama_dir))
    base = SimpleNamespace(engine=engine, name="tiny#0", model="tiny")
    pool = LoraPool(base, max_loaded=2)

    async def run() -> None:
        for n in ("a", "b"):
            assert (await pool.acquire(n, paths[n]))["name"] == n
            pool.release(n)
        assert await pool.acquire("a", paths["a"]) is None  # resident: a is now the most recent
        pool.release("a")
        await pool.acquire("c", paths["c"])  # evicts b, the least recently used
        assert list(pool.resident) == ["a", "c"] and sorted(engine.lora_names()) == ["a", "c"]
        await pool.acquire("a", paths["a"])  # a and c both busy: no room for b
        with pytest.raises(BackendError, match="busy"):
            await pool.acquire("b", paths["b"])
        pool.release("c")
        assert (await pool.acquire("b", paths["b"]))["name"] == "b"  # c evicted, b reloaded from its folder
        assert sorted(engine.lora_names()) == ["a", "b"]
        with pytest.raises(ValueError, match="running"):
            await pool.drop("a")
        pool.release("a")
        pool.release("b")
        await pool.drop("a")
        assert engine.lora_names() == ["b"]
        assert (pool.num_loads, pool.num_evictions) == (4, 2)

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
