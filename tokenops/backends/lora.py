"""A LoRA adapter served as a model of its own: ``model`` = the adapter's name in every endpoint.

Each ``[[models]] lora = {name = "folder"}`` entry (or ``--lora NAME=FOLDER``) becomes one more model
in the gateway whose replicas are :class:`LoraBackend` objects, one per replica of the base. They hold
no engine: a request is run by the base replica's engine with the adapter named
(:meth:`LocalBackend.stream`'s ``lora``), so base and adapter rows share one batch
(tokenops/engine/lora.py). Which adapter answers is thus a routing decision like any model name.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from tokenops.backends.base import Delta, collect
from tokenops.types import BackendError, GatewayRequest, GatewayResponse


class LoraBackend:
    """One adapter on one replica of its base model."""

    kind = "local"

    def __init__(self, name: str, path: str, base: Any, index: int = 0) -> None:
        self.model = name
        self.name = f"{name}#{index}"
        self.path = path
        #: the base model's backend (a LocalBackend) whose engine runs this adapter's rows
        self.base = base
        #: /v1/models' ``parent``
        self.parent = base.model
        self.upstream_model = name
        self.is_loaded = False
        self.info: dict[str, Any] | None = None

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
        self.info = await asyncio.to_thread(self.base.engine.load_lora, self.model, self.path)
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
            raise BackendError(f"LoRA adapter {self.model!r} is not loaded", kind="unavailable", status=503,
                               backend=self.name)
        async for delta in self.base.stream(request, lora=self.model):
            yield delta


def add_lora_replicas(out: dict[str, list[Any]], base_name: str, adapters: dict[str, str]) -> None:
    """Add a model per adapter of ``base_name`` to ``out`` (model name -> replicas)."""
    from tokenops.config import ConfigError
    from tokenops.backends.base import Replica

    for name, path in adapters.items():
        if name in out:
            raise ConfigError(f"model {base_name!r}: lora adapter {name!r} has the name of another model")
        out[name] = [Replica(name=f"{name}#{r.index}", model=name, backend=LoraBackend(name, path, r.backend, r.index),
                             index=r.index) for r in out[base_name]]
