"""Starting the models of one gateway, each backend timed and reported as it goes.

``tokenops serve`` shows the start as it happens (:mod:`tokenops.cli.serve_progress`): which
model is loading, which loaded and in how long, which failed. A model that loads on its first
request (``engine = {load = "lazy"}``, or beyond ``[gateway] max_loaded_models``) is said to be
so rather than shown as loaded. A backend whose start raises keeps the one-line cause as its
``load_error`` (``/ready``, ``GET /v1/models/{id}`` and requests to the model show it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol


class StartReport(Protocol):
    """Who hears how the start goes (called on the event loop). ``label`` is the model's name
    (the replica's when the model has several); ``detail`` says what is loaded from where."""

    def loading(self, label: str, detail: str) -> None: ...

    def on_demand(self, label: str, detail: str) -> None: ...

    def loaded(self, label: str, seconds: float, kernels: str = "") -> None: ...

    def failed(self, label: str, seconds: float) -> None: ...


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line (the cause a failed model is reported with)."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def describe(backend: Any, config: Any) -> str:
    """What a backend loads, from where: ``bundled engine, /models/x.gguf`` or ``upstream URL``."""
    kind = getattr(config, "backend", None) or getattr(backend, "kind", None) or "backend"
    if kind == "local":
        kind = "bundled engine"
    source = getattr(config, "path", None) or getattr(config, "url", None) or getattr(backend, "url", None)
    if kind == "openai":
        return f"upstream {source}" if source else "upstream"
    return f"{kind}, {source}" if source else str(kind)


def kernels_of(backend: Any) -> str:
    """The CPU kernels a bundled engine runs, from its stats: ``kernels avx512-vnni, cpu_isa native`` (the
    quantized products' instruction set, for GGUF weights kept quantized, and the ``cpu_isa`` switch);
    ``""`` for other backends."""
    try:
        stats = backend.stats() if callable(getattr(backend, "stats", None)) else None
    except Exception:  # a backend's stats must never fail its start
        return ""
    if not isinstance(stats, dict) or not stats.get("cpu_isa"):
        return ""
    chosen = [f"kernels {stats['quant_kernels']}"] if stats.get("quant_kernels") else []
    return ", ".join([*chosen, f"cpu_isa {stats['cpu_isa']}"])


def is_on_demand(backend: Any, config: Any) -> bool:
    """Whether the backend's start leaves its model to the first request that names it."""
    engine = getattr(config, "engine", None)
    if isinstance(engine, dict) and engine.get("load") == "lazy":
        return True
    swap = getattr(backend, "swap", None)
    return swap is not None and getattr(backend, "name", None) not in getattr(swap, "initial", ())


async def start_backends(
    replicas: dict[str, list[Any]], models: dict[str, Any], report: StartReport | None
) -> list[BaseException | None]:
    """Start every backend of ``replicas`` at once; per backend, the exception its start raised or None."""

    async def start_one(label: str, backend: Any, config: Any) -> BaseException | None:
        began = time.monotonic()
        on_demand = is_on_demand(backend, config)
        if report is not None:
            (report.on_demand if on_demand else report.loading)(label, describe(backend, config))
        try:
            await backend.start()
        except Exception as e:
            backend.load_error = one_line(e)
            if report is not None:
                report.failed(label, time.monotonic() - began)
            return e
        if report is not None and not on_demand:
            report.loaded(label, time.monotonic() - began, kernels_of(backend))
        return None

    starts = [
        start_one(r.name if len(rs) > 1 else model, r.backend, models.get(model))
        for model, rs in replicas.items()
        for r in rs
    ]
    return list(await asyncio.gather(*starts))


def nothing_to_serve(replicas: dict[str, list[Any]]) -> str:
    """One line naming why no configured model loaded (each model's first cause)."""
    causes = [f"model {name!r} failed to load: {rs[0].backend.load_error}" for name, rs in replicas.items() if rs]
    if len(causes) == 1:
        return f"nothing to serve: {causes[0]}"
    return f"nothing to serve: all {len(causes)} models failed to load; " + "; ".join(causes)
