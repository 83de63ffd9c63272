"""A bound on the bundled engines resident at once: ``[gateway] max_loaded_models`` (issue 40).

Several ``[[models]]`` of the bundled engine may not fit in memory together. With a bound N the
first N of them (configuration order) are built at start; a request naming a model whose engine is
not resident waits while the least recently used resident engine with no request running is closed
(its weights, KV cache and engine thread released) and the named model's engine is built, then runs.
What Ollama does with ``OLLAMA_MAX_LOADED_MODELS`` and LM Studio with its just-in-time loading.

Fairness: a request for a resident engine joins its batch at once, so one engine's burst is served
in one batch, not one request per load. A request that needs a load waits in a FIFO, and a victim is
chosen only :data:`LOAD_GATHER_S` after it arrived (the rest of its burst reaches the resident engines
first). The head of the FIFO then closes the least recently used idle engine or, when all are busy,
picks the least recently used one, which after :data:`DRAIN_GRACE_S` stops taking new requests (they
queue behind) until its running ones end: a busy model cannot keep a waiting one out for ever. One
load per model at a time (later requests for a model being loaded wait for that load), and one build
at a time in all.

Models with LoRA adapters stay resident (their adapters run on their engine; evicting it would drop
them): they count toward the bound and are never evicted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from tokenops.types import BackendError

log = logging.getLogger("tokenops.backends")

#: Seconds a victim still takes new requests after a load chose it: the rest of a burst that reaches
#: it a moment later joins its batch rather than waiting for the victim to go and loading it again. A
#: waiting load is held back by at most this plus the requests it let in. Chosen when a load of
#: SmolLM2's GGUF took 4-15 s on a busy box; since the one-pass header read a load takes ~0.5 s on a
#: quiet one, so the grace can now be longer than the load it protects (not re-tuned since).
DRAIN_GRACE_S = 2.0
#: Seconds a request that needs a load waits before a victim is chosen: the burst it came in reaches
#: the resident engines first, which are then busy rather than idle and evicted before their own
#: requests arrive (at the start of each round of lora_serve.py's load both resident engines were idle,
#: were closed for the first two other models' requests, and loaded again a moment later for theirs).
LOAD_GATHER_S = 0.25


class Swappable(Protocol):
    """What the pool asks of a backend: build its engine, close it (releasing its memory)."""

    name: str
    model: str
    #: why its engine failed to load (it then stays failed), else None
    load_error: str | None

    async def load_engine(self) -> None: ...

    async def unload_engine(self) -> None: ...


@dataclass(slots=True)
class _Waiter:
    backend: Swappable
    future: asyncio.Future[None]
    since: float = 0.0


class ModelSwap:
    """The resident engines of one server and the requests waiting for one (see the module docstring).

    ``max_loaded`` counts every bundled engine, the ``pinned`` ones (never evicted, not managed
    here) included; ``initial`` names the backends built at start."""

    def __init__(
        self,
        max_loaded: int,
        pinned: Iterable[str] = (),
        initial: Iterable[str] = (),
        drain_grace_s: float = DRAIN_GRACE_S,
        gather_s: float = LOAD_GATHER_S,
    ) -> None:
        self.pinned = set(pinned)
        assert max_loaded > len(self.pinned), "ModelSwap needs a slot beyond the pinned engines"
        self.max_loaded = max_loaded
        self.initial = set(initial)
        #: resident engines, least recently used first
        self.resident: OrderedDict[str, Swappable] = OrderedDict()
        self.in_flight: Counter[str] = Counter()
        self.loading: set[str] = set()
        #: the victim chosen by a waiting load: takes no new request until its running ones end
        self.draining: str | None = None
        self.draining_since = 0.0
        self.drain_grace_s = drain_grace_s
        self.gather_s = gather_s
        self._timer: asyncio.TimerHandle | None = None
        self.waiters: deque[_Waiter] = deque()
        self.known: dict[str, Swappable] = {}
        self.num_loads = 0
        self.num_evictions = 0
        self.num_load_failures = 0
        self.load_seconds = 0.0
        self.loads: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        #: one build at a time: two at once contend for the same cores and each holds its file mapping
        #: and new buffers, a higher peak (932-940 MiB against 803 MiB in lora_serve.py, docs/lora.md)
        self._build_lock = asyncio.Lock()

    @property
    def num_slots(self) -> int:
        """Engines this pool may hold (the bound less the pinned ones)."""
        return self.max_loaded - len(self.pinned)

    # -- lifecycle ------------------------------------------------------------

    async def start(self, backend: Swappable) -> None:
        """At server start: build ``backend``'s engine if it is among the first ones, else leave it
        to the first request naming it."""
        self.known[backend.name] = backend
        if backend.name not in self.initial:
            return
        self.loading.add(backend.name)
        try:
            await self._load(backend)
        finally:
            self.loading.discard(backend.name)
            self._pump()

    # -- per request ------------------------------------------------------------

    async def acquire(self, backend: Swappable) -> None:
        """Wait until ``backend``'s engine is resident and count a request on it; pair with
        :meth:`release`. Raises a 503 :class:`BackendError` when its engine fails to load."""
        self.known.setdefault(backend.name, backend)
        if self._can_join(backend.name):
            self._join(backend.name)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(backend, future, time.monotonic())
        self.waiters.append(waiter)
        self._pump()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(backend)  # admitted as the client went away
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
                self._pump()
            raise

    def release(self, backend: Swappable) -> None:
        self.in_flight[backend.name] -= 1
        if self.in_flight[backend.name] <= 0:
            del self.in_flight[backend.name]
            self._pump()

    def _can_join(self, name: str) -> bool:
        if name not in self.resident:
            return False
        return name != self.draining or time.monotonic() - self.draining_since < self.drain_grace_s

    def _join(self, name: str) -> None:
        self.in_flight[name] += 1
        self.resident.move_to_end(name)

    # -- the queue ------------------------------------------------------------

    def _pump(self) -> None:
        """Admit what can run now, in arrival order: requests for resident engines join them; the
        first request needing a load gets a free slot or an idle victim, or marks the least
        recently used engine draining; later ones needing a load wait behind it. A started load
        lifts the draining mark, so the pass is run again for the requests it held."""
        while self._pump_once():
            pass

    def _pump_once(self) -> bool:
        is_blocked = is_load_started = False
        for waiter in list(self.waiters):
            name = waiter.backend.name
            if waiter.future.done():  # cancelled
                self.waiters.remove(waiter)
            elif self._can_join(name):
                self.waiters.remove(waiter)
                self._join(name)
                waiter.future.set_result(None)
            elif name in self.loading or name in self.resident or is_blocked:
                continue  # admitted when its load ends / its draining ends / after the head's load
            elif self._begin_load(waiter):
                is_load_started = True
            else:
                is_blocked = True
        if not is_blocked and self.draining is not None:  # no load waits for the victim any more
            self.draining = None
            return True
        return is_load_started and self.draining is None and any(w.backend.name in self.resident for w in self.waiters)

    def _begin_load(self, waiter: _Waiter) -> bool:
        """Start loading the waiter's backend into a free slot or over an idle victim; False when it must wait."""
        backend, victim = waiter.backend, None
        if len(self.resident) + len(self.loading) >= self.num_slots:
            gather = waiter.since + self.gather_s - time.monotonic()
            if gather > 0:
                self._pump_later(gather)
                return False
            victim = next((n for n in self.resident if not self.in_flight[n]), None)
            if victim is None:
                if self.draining not in self.resident:
                    self.draining = next(iter(self.resident), None)
                    self.draining_since = time.monotonic()
                return False
            del self.resident[victim]
        self.draining = None
        self.loading.add(backend.name)
        old = self.known[victim] if victim is not None else None
        task = asyncio.get_running_loop().create_task(self._swap_in(backend, old), name=f"load {backend.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _pump_later(self, delay: float) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    async def _swap_in(self, backend: Swappable, victim: Swappable | None) -> None:
        try:
            if victim is not None:
                await self._unload(victim)
            await self._load(backend)
        except Exception as e:
            # failed for good, as at start: its requests get the cause at once (no eviction per retry)
            backend.load_error = " ".join(f"{type(e).__name__}: {e}".split())
            self._fail_waiters(backend, backend.load_error)
        else:
            self._admit_waiters(backend.name)
        finally:
            self.loading.discard(backend.name)
            self._pump()

    async def _load(self, backend: Swappable) -> None:
        async with self._build_lock:
            t0 = time.perf_counter()
            try:
                await backend.load_engine()
            except Exception as e:
                self.num_load_failures += 1
                log.error("model %s failed to load: %s", backend.name, e)
                raise
            took = time.perf_counter() - t0
        self.resident[backend.name] = backend
        self.num_loads += 1
        self.loads[backend.name] += 1
        self.load_seconds += took
        log.info("loaded %s in %.2f s (resident: %s)", backend.name, took, ", ".join(self.resident))

    async def _unload(self, victim: Swappable) -> None:
        try:
            await victim.unload_engine()
        except Exception as e:  # its engine is dropped regardless: the load goes on
            log.warning("closing %s failed: %s", victim.name, e)
        self.num_evictions += 1
        await asyncio.to_thread(release_memory)
        log.info("evicted %s (least recently used)", victim.name)

    def _admit_waiters(self, name: str) -> None:
        """Every request that waited for this load joins the engine, before a later load may pick it as victim."""
        for waiter in [w for w in self.waiters if w.backend.name == name and not w.future.done()]:
            self.waiters.remove(waiter)
            self._join(name)
            waiter.future.set_result(None)

    def _fail_waiters(self, backend: Swappable, cause: str) -> None:
        for waiter in [w for w in self.waiters if w.backend.name == backend.name]:
            self.waiters.remove(waiter)
            if not waiter.future.done():
                waiter.future.set_exception(
                    BackendError(
                        f"The model `{backend.model}` failed to load and cannot serve: {cause}",
                        kind="model_load_failed",
                        status=503,
                        backend=backend.name,
                    )
                )

    # -- views ------------------------------------------------------------------

    def is_resident(self, name: str) -> bool:
        return name in self.resident or name in self.pinned

    def stats(self) -> dict[str, Any]:
        """``/admin/stats``' ``model_swap``: the bound, what is resident (replica names, least
        recently used first) and the counts of loads, evictions and seconds spent loading."""
        return {
            "max_loaded_models": self.max_loaded,
            "resident": [*sorted(self.pinned), *self.resident],
            "pinned": sorted(self.pinned),
            "loading": sorted(self.loading),
            "draining": self.draining,
            "waiting": len(self.waiters),
            "num_loads": self.num_loads,
            "num_evictions": self.num_evictions,
            "num_load_failures": self.num_load_failures,
            "load_seconds": round(self.load_seconds, 3),
            "loads": dict(self.loads),
        }


def release_memory() -> None:
    """Give a closed engine's memory back to the system: a full collection (the server froze its
    heap after start, and frozen cycles are never collected, so it is thawed and frozen again),
    then glibc's ``malloc_trim`` for the freed arenas."""
    is_frozen = gc.get_freeze_count() > 0
    if is_frozen:
        gc.unfreeze()
    gc.collect()
    if is_frozen:
        gc.freeze()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def attach(max_loaded: int, replicas: dict[str, list[Any]], lora_bases: Iterable[str] = ()) -> ModelSwap | None:
    """Put the bundled engines of ``replicas`` (model name -> replicas) under a bound of
    ``max_loaded`` resident ones (0: none). The engines of ``lora_bases`` (models with LoRA
    adapters) and those handed in already built are pinned: they count, and are never evicted.
    None when there is no bound or everything fits under it."""
    if max_loaded <= 0:
        return None
    bases = set(lora_bases)
    engines = [r.backend for rs in replicas.values() for r in rs if hasattr(r.backend, "unload_engine")]
    is_pinned = {b.name: b.model in bases or getattr(b, "config", None) is None for b in engines}
    pinned = [name for name, pin in is_pinned.items() if pin]
    swappable = [b for b in engines if not is_pinned[b.name]]
    if len(engines) <= max_loaded:
        return None
    if max_loaded <= len(pinned):
        from tokenops.config import ConfigError

        raise ConfigError(
            f"[gateway] max_loaded_models = {max_loaded} leaves no room to load models on demand: "
            f"{len(pinned)} engine(s) stay resident ({', '.join(pinned)}: models with LoRA adapters); "
            f"raise it to at least {len(pinned) + 1}"
        )
    swap = ModelSwap(max_loaded, pinned, [b.name for b in swappable[: max_loaded - len(pinned)]])
    for backend in swappable:
        backend.swap = swap
    return swap


def resident_models(swap: ModelSwap, replicas: dict[str, list[Any]]) -> dict[str, bool]:
    """Bundled-engine model name -> whether an engine of it is resident (LoRA adapters: their base's)."""
    out = {}
    for model, rs in replicas.items():
        backends = [getattr(r.backend, "base", r.backend) for r in rs]
        if backends and all(hasattr(b, "unload_engine") for b in backends):
            out[model] = any(swap.is_resident(b.name) for b in backends)
    return out


@contextlib.asynccontextmanager
async def engine_held(backend: Any) -> AsyncIterator[None]:
    """Keep ``backend``'s engine resident for the block, loading it first if it is loaded on demand
    (what uses the engine outside a request: ``/tokenize``); nothing for other backends."""
    swap = getattr(backend, "swap", None)
    if swap is None:
        yield
        return
    await swap.acquire(backend)
    try:
        yield
    finally:
        swap.release(backend)
