"""Asyncio streaming over :class:`LLMEngine` for the gateway.

The engine loop runs on ONE background thread, the only thread that touches the
engine apart from ``stats``/``apply_tunables`` (which take the same lock as a step).
Requests go in through a thread-safe queue; outputs come back to each caller's
event loop with ``loop.call_soon_threadsafe``. A failing request raises in its own
iterator only; a consumer that stops iterating aborts its request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import EngineRequestError, LLMEngine
from tokenops.engine.core.outputs import RequestOutput
from tokenops.engine.sampling.sampling import SamplingParams

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5


class AsyncLLMEngine:
    """Runs an :class:`LLMEngine` on a background thread and streams its outputs."""

    def __init__(self, config: EngineConfig | LLMEngine) -> None:
        self.engine = config if isinstance(config, LLMEngine) else LLMEngine(config)
        self.config = self.engine.config
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self.vocab_size = self.engine.vocab_size
        self._inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._streams_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._is_stopping = threading.Event()
        self._ids = itertools.count()
        self._last_stats: dict[str, Any] = self.engine.stats()

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    def build_on_engine_thread(cls, factory: Callable[[], LLMEngine]) -> AsyncLLMEngine:
        """Build the engine with ``factory`` on the thread that then runs its steps, and start it.

        Why: torch and the fused step's C library run their parallel regions on OpenMP (libgomp),
        which keeps one pool of worker threads per thread that opened a region. An engine loaded on
        one thread (weights packed, warm-up steps) and stepped on another leaves two pools, more
        OpenMP threads than this 2-core box has CPUs, and libgomp then cuts every barrier's spin to
        about 100 iterations before a futex sleep: batch-1 decode ran at ~90 tok/s that way against
        ~155 with one thread doing both (issue 35, ``tests/benchmarks/decode_overhead.py
        --async-engine``). Blocks until the engine is built; a failing build raises here."""
        ready: concurrent.futures.Future[AsyncLLMEngine] = concurrent.futures.Future()

        def main() -> None:
            try:
                self = cls(factory())
            except BaseException as e:  # the caller sees the build's own error
                ready.set_exception(e)
                return
            self._thread = threading.current_thread()
            ready.set_result(self)
            self._run()

        threading.Thread(target=main, name="tokenops-engine", daemon=True).start()
        return ready.result()

    def start(self) -> None:
        """Start the engine thread (does nothing if it runs already)."""
        with self._streams_lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._is_stopping.clear()
            self._thread = threading.Thread(target=self._run, name="tokenops-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still running get an error."""
        self._is_stopping.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._streams_lock:
            streams, self._streams = self._streams, {}
        for loop, q in streams.values():
            _deliver(loop, q, EngineRequestError("the engine was shut down"))

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- thread-safe API ---------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Fresh stats, or those taken right after the last step while a step runs
        (a dashboard poll never waits for a long step)."""
        if self._engine_lock.acquire(blocking=False):
            try:
                self._last_stats = self.engine.stats()
            finally:
                self._engine_lock.release()
        return dict(self._last_stats)

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        """Validate and apply live tunables; they take effect on the next step."""
        with self._engine_lock:
            return self.engine.apply_tunables(values)

    @property
    def grammar_compiler(self) -> Any:
        """Compiles grammars on its own pool (thread-safe): see :mod:`tokenops.engine.sampling.grammar`."""
        return self.engine.grammar_compiler

    def load_lora(self, name: str, path: str, check_base: bool = True) -> dict[str, Any]:
        """Load a LoRA adapter (blocking: call it from a worker thread). The files are read and
        checked beside the running loop; only adding it to the served set waits for a step's end."""
        adapter = self.engine.runner.prepare_lora(name, path, check_base)
        self._between_steps(self.engine.runner.lora.add, adapter)
        return adapter.info()

    def unload_lora(self, name: str) -> dict[str, Any]:
        return self._between_steps(self.engine.unload_lora, name)

    def _between_steps(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the engine thread between two steps (blocking: call it from a worker thread).
        Waiting for the engine lock instead could take seconds under load: the engine thread takes it
        again for the next step before a waiting thread wakes (measured: a 4 s adapter load)."""
        if not self.is_running:
            with self._engine_lock:
                return fn(*args)
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, args, done))
        while True:
            try:
                return done.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if not self.is_running and done.cancel():  # stopped before it ran: run it here
                    with self._engine_lock:
                        return fn(*args)

    def lora_names(self) -> list[str]:
        return self.engine.lora_names()

    def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with ``finish_reason="abort"``."""
        self._inbox.put(("abort", request_id))

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        tenant: str = "default",
        priority: int = 0,
        lora: str | None = None,
        priority_class: str = "interactive",
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request: one output per step that produced tokens, the last one
        with ``finished`` set. Raises the engine's error (e.g. PromptTooLongError)."""
        self.start()
        request_id = request_id or f"async-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = (loop, q)
        self._inbox.put(("add", request_id, prompt, params, tenant, priority, lora, priority_class))
        is_done = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    is_done = True
                    raise item
                if item.error is not None:
                    is_done = True
                    raise EngineRequestError(f"request {request_id} failed: {item.error}")
                is_done = item.finished
                yield item
                if is_done:
                    return
        finally:
            if not is_done:  # the consumer left (cancelled, disconnected, broke out)
                with self._streams_lock:
                    self._streams.pop(request_id, None)
                self._inbox.put(("abort", request_id))

    # -- the engine thread -------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while not self._is_stopping.is_set():
            self._drain_inbox(block=not engine.has_unfinished())
            if self._is_stopping.is_set() or not engine.has_unfinished():
                continue
            try:
                with self._engine_lock:
                    outputs = engine.step()
                    self._last_stats = engine.stats()
            except Exception as e:  # a bug in a step: fail what is in flight, keep serving
                log.exception("engine step failed")
                self._fail_all(e)
                continue
            self._dispatch_step(outputs)

    def _drain_inbox(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt, params, tenant, priority, lora, priority_class = command
            with self._streams_lock:
                if request_id not in self._streams:
                    return  # the consumer already left
            try:
                with self._engine_lock:
                    self.engine.add_request(
                        request_id,
                        prompt,
                        params,
                        tenant=tenant,
                        priority=priority,
                        lora=lora,
                        priority_class=priority_class,
                    )
            except Exception as e:
                self._dispatch(request_id, e, True)
        elif kind == "abort":
            with self._engine_lock:
                self.engine.abort(command[1])
        elif kind == "call":
            _, fn, args, done = command
            if not done.set_running_or_notify_cancel():
                return
            try:
                with self._engine_lock:
                    done.set_result(fn(*args))
            except Exception as e:  # the caller raises it
                done.set_exception(e)

    def _dispatch(self, request_id: str, item: Any, is_last: bool) -> None:
        with self._streams_lock:
            stream = self._streams.pop(request_id, None) if is_last else self._streams.get(request_id)
        if stream is None:
            return
        if not _deliver(*stream, item):  # the caller's loop is gone
            with self._streams_lock:
                self._streams.pop(request_id, None)
            with self._engine_lock:
                self.engine.abort(request_id)

    def _dispatch_step(self, outputs: list) -> None:
        """A step's outputs, handed to each event loop in ONE call (every ``call_soon_threadsafe``
        writes to the loop's wake-up pipe; a step of 48 decodes would otherwise make 48)."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any, str]]] = {}
        with self._streams_lock:
            for out in outputs:
                rid = out.request_id
                stream = self._streams.pop(rid, None) if out.finished else self._streams.get(rid)
                if stream is not None:
                    batches.setdefault(stream[0], []).append((stream[1], out, rid))
        for loop, items in batches.items():
            if _deliver_all(loop, items):
                continue
            for _, _, rid in items:  # the caller's loop is gone
                with self._streams_lock:
                    self._streams.pop(rid, None)
                with self._engine_lock:
                    self.engine.abort(rid)

    def _fail_all(self, error: Exception) -> None:
        with self._streams_lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            with self._engine_lock:
                try:
                    self.engine.abort(request_id)
                except Exception:
                    log.exception("abort after a failed step failed")
            self._dispatch(request_id, EngineRequestError(f"engine step failed: {type(error).__name__}: {error}"), True)


def _put_all(items: list[tuple[asyncio.Queue, Any, str]]) -> None:
    for q, item, _ in items:
        q.put_nowait(item)


def _deliver_all(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, Any, str]]) -> bool:
    try:
        loop.call_soon_threadsafe(_put_all, items)
        return True
    except RuntimeError:  # loop closed
        return False


def _deliver(loop: asyncio.AbstractEventLoop, q: asyncio.Queue, item: Any) -> bool:
    try:
        loop.call_soon_threadsafe(q.put_nowait, item)
        return True
    except RuntimeError:  # loop closed
        return False
