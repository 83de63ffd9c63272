"""A LoRA adapter served as a model of its own: ``model`` = the adapter's name in every endpoint.

Each ``[[models]] lora = {name = "folder"}`` entry (or ``--lora NAME=FOLDER``) becomes one more model
in the gateway whose replicas are :class:`LoraBackend` objects, one per replica of the base. They hold
no engine: a request is run by the base replica's engine with the adapter named
(:meth:`LocalBackend.stream`'s ``lora``), so base and adapter rows share one batch
(tokenops/engine/lora/lora_adapters.py). Which adapter answers is thus a routing decision like any model name.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from tokenops.backends.base import Delta, collect
from tokenops.types import BackendError, GatewayRequest, GatewayResponse


class LoraPool:
    """The adapters resident on one base engine: at most ``max_loaded`` (0: no bound), the least
    recently used one that no request is running on unloaded to make room, and reloaded from its
    folder when a request names it again."""

    def __init__(self, base: Any, max_loaded: int = 0) -> None:
        self.base = base
        self.max_loaded = max_loaded
        self.resident: OrderedDict[str, None] = OrderedDict()
        self.in_flight: Counter[str] = Counter()
        self.num_loads = 0
        self.num_evictions = 0
        self._lock = asyncio.Lock()

    async def acquire(self, name: str, path: str, check_base: bool = True) -> dict[str, Any] | None:
        """Make ``name`` resident (loading it, evicting another if needed) and count a request on it;
        returns the adapter's info when this call loaded it. Pair with :meth:`release`."""
        async with self._lock:
            info = None
            engine = self.base.engine
            if engine is None:
                raise BackendError(
                    f"{self.base.name} is not loaded", kind="unavailable", status=503, backend=self.base.name
                )
            if name in self.resident:
                self.resident.move_to_end(name)
            else:
                while self.max_loaded and len(self.resident) >= self.max_loaded:
                    victim = next((n for n in self.resident if not self.in_flight[n]), None)
                    if victim is None:
                        raise BackendError(
                            f"all {self.max_loaded} LoRA adapter slots of {self.base.model!r} are busy; retry shortly",
                            kind="unavailable",
                            status=503,
                            backend=self.base.name,
                        )
                    await asyncio.to_thread(engine.unload_lora, victim)
                    del self.resident[victim]
                    self.num_evictions += 1
                info = await asyncio.to_thread(engine.load_lora, name, path, check_base)
                self.resident[name] = None
                self.num_loads += 1
            self.in_flight[name] += 1
            return info

    def release(self, name: str) -> None:
        self.in_flight[name] -= 1

    async def drop(self, name: str) -> None:
        """Unload ``name`` for good (ValueError while a request runs on it)."""
        async with self._lock:
            if self.in_flight[name]:
                raise ValueError(f"LoRA adapter {name!r} has {self.in_flight[name]} request(s) running")
            if name in self.resident:
                await asyncio.to_thread(self.base.engine.unload_lora, name)
                del self.resident[name]


def lora_pool(base: Any, max_loaded: int = 0) -> LoraPool:
    """The one pool of a base backend (made on first use)."""
    pool = getattr(base, "lora_pool", None)
    if pool is None:
        pool = base.lora_pool = LoraPool(base, max_loaded)
    return pool


class LoraBackend:
    """One adapter on one replica of its base model."""

    kind = "local"

    def __init__(
        self, name: str, path: str, base: Any, index: int = 0, max_loaded: int = 0, check_base: bool = True
    ) -> None:
        self.model = name
        self.name = f"{name}#{index}"
        self.path = path
        #: the base model's backend (a LocalBackend) whose engine runs this adapter's rows
        self.base = base
        #: /v1/models' ``parent``
        self.parent = base.model
        self.upstream_model = name
        #: the adapter was checked and is served (it may be unloaded for room and reloaded on demand)
        self.is_loaded = False
        self.info: dict[str, Any] | None = None
        self.pool = lora_pool(base, max_loaded)
        self.check_base = check_base

    @property
    def ready(self) -> bool:
        return self.is_loaded and self.base.ready

    @property
    def engine(self) -> Any:
        """The base's engine (its tokenizer is the adapter's: /tokenize reads it)."""
        return self.base.engine

    @property
    def max_model_len(self) -> int | None:
        return self.base.max_model_len

    async def start(self) -> None:
        """Wait for the base engine, then load the adapter onto it (a bad adapter fails this model only)."""
        await self.base.started.wait()
        if self.base.engine is None:
            raise RuntimeError(f"its base model {self.parent!r} failed to load")
        await self.load()

    async def load(self) -> None:
        """Load and check the adapter once (it stays registered when the pool later evicts it)."""
        self.info = await self.pool.acquire(self.model, self.path, self.check_base) or self.info
        self.pool.release(self.model)
        self.is_loaded = True

    async def close(self) -> None:
        pass  # the base's engine goes with the base

    def stats(self) -> dict[str, Any] | None:
        return None  # the base reports the engine (its stats list the adapters under "lora")

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        return {}  # engine tunables are the base's

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        return await collect(self.stream(request), self.model, self.name)

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        return await collect(self.stream(request), self.model, self.name)

    async def stream(self, request: GatewayRequest) -> AsyncIterator[Delta]:
        if not self.is_loaded:
            raise BackendError(
                f"LoRA adapter {self.model!r} is not loaded", kind="unavailable", status=503, backend=self.name
            )
        info = await self.pool.acquire(self.model, self.path, self.check_base)
        self.info = info or self.info
        try:
            async for delta in self.base.stream(request, lora=self.model):
                yield delta
        finally:
            self.pool.release(self.model)


def add_lora_replicas(out: dict[str, list[Any]], base_name: str, adapters: dict[str, str], max_loaded: int = 0) -> None:
    """Add a model per adapter of ``base_name`` to ``out`` (model name -> replicas)."""
    from tokenops.backends.base import Replica
    from tokenops.config import ConfigError

    for name, path in adapters.items():
        if name in out:
            raise ConfigError(f"model {base_name!r}: lora adapter {name!r} has the name of another model")
        out[name] = [
            Replica(
                name=f"{name}#{r.index}",
                model=name,
                backend=LoraBackend(name, path, r.backend, r.index, max_loaded),
                index=r.index,
            )
            for r in out[base_name]
        ]
