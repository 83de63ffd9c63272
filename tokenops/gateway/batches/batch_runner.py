"""The batch runner: an asyncio task of the server that feeds batch lines into the pipeline.

Batches with work left are taken oldest first (after a restart too: their state is in the
store). A batch is ``validating`` (every line's ``url`` must be its endpoint; else ``failed``
with the lines named), then ``in_progress``: its lines not yet in its output or error file
run through the same pipeline as API requests (:mod:`.batch_lines`), marked
``priority_class = "batch"``, at most ``[batches] max_in_flight`` at once over all batches.
Each finished line is appended durably (:mod:`.batch_output`), and saved to the shared state
where replicas share it (:mod:`.batch_run`), before it is counted. Then
``finalizing`` -> ``completed``. A cancel stops feeding and cancels the lines in flight
(``cancelling`` -> ``cancelled``); past its ``completion_window`` a batch stops the same way
and its lines that did not run go to the error file as ``batch_expired`` (``expired``).
Stopping the server cancels the lines in flight without writing them: they run after restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Any

from tokenops.batch_settings import BatchSettings
from tokenops.gateway.batches.batch_input import parse_line, raw_lines
from tokenops.gateway.batches.batch_lines import build_call, num_generated, num_tokens, run_call
from tokenops.gateway.batches.batch_output import output_line, recover
from tokenops.gateway.batches.batch_run import BatchRun
from tokenops.gateway.batches.file_expiry import FileSweeper
from tokenops.gateway.errors import APIError
from tokenops.prometheus_text import PREFIX
from tokenops.store.batch_store import BatchStore, output_ids
from tokenops.store.migrations import utcnow

log = logging.getLogger("tokenops.batches")
#: refusals worth another try later (a full queue, a rate limit, a model still loading)
_RETRY_STATUSES = (429, 503)
_RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)
_COUNTS_EVERY_S = 0.25
#: a claim on a batch lasts this long unless renewed (each second or five while it runs)
_CLAIM_TTL_S = 30.0


class BatchRunner:
    """Runs the store's batches (see the module docstring); one per app."""

    def __init__(self, gw: Any, store: BatchStore, settings: BatchSettings) -> None:
        self.gw = gw
        self.store = store
        self.settings = settings
        self.runs: dict[str, BatchRun] = {}
        self.num_lines = {"completed": 0, "failed": 0, "expired": 0}
        self.num_tokens = 0
        self._tasks: dict[str, asyncio.Task] = {}
        self._main: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        #: batches stopped for good (their tenant deleted): never taken up again
        self._dropped: set[str] = set()
        #: who runs a batch, where several gateway replicas share the state (BatchState.claim)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.sweeper = FileSweeper(store)  # expired files go from this loop too

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        if self._main is None:
            self._wakeup = asyncio.Event()
            self._slots = asyncio.Semaphore(self.settings.max_in_flight)
            self._event_loop = asyncio.get_running_loop()
            self._main = asyncio.get_running_loop().create_task(self._loop(), name="tokenops-batch-runner")

    async def stop(self) -> None:
        """Cancel everything; lines in flight are not written (they run after a restart)."""
        tasks = [t for t in (self._main, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for run in list(self.runs.values()):
            await run.drain()
            run.appender.close()
        self._main = None

    def wake(self) -> None:
        """A batch was created or cancelled: look at the store now."""
        if self._wakeup is not None:
            self._wakeup.set()

    def live_rate(self, batch_id: str) -> dict[str, float] | None:
        """Recent lines/s and generated tokens/s of a batch this process runs (None: not running here)."""
        run = self.runs.get(batch_id)
        return None if run is None else run.rate()

    def live_counts(self, batch_id: str) -> dict[str, int] | None:
        run = self.runs.get(batch_id)
        return None if run is None else {"completed": run.num_completed, "failed": run.num_failed}

    def cancel(self, batch_id: str) -> None:
        """Stop feeding ``batch_id`` and cancel its lines in flight (its state is already ``cancelling``)."""
        run = self.runs.get(batch_id)
        if run is not None:
            run.is_cancelled = True
            for task in list(run.in_flight):
                task.cancel()
        self.wake()

    def drop_tenant(self, tenant: str, timeout_s: float = 30.0) -> None:
        """From a worker thread: stop the tenant's running batches for good (their lines in flight
        too, nothing more written) and wait until they stopped; the caller then deletes them."""
        if self._event_loop is not None and self._event_loop.is_running():
            asyncio.run_coroutine_threadsafe(self._drop_tenant(tenant), self._event_loop).result(timeout_s)

    async def _drop_tenant(self, tenant: str) -> None:
        ids = [b for b, run in self.runs.items() if run.row["tenant"] == tenant]
        self._dropped.update(ids)
        tasks = [self._tasks[b] for b in ids if b in self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def _forget(self, task: asyncio.Task) -> None:
        self._tasks = {b: t for b, t in self._tasks.items() if t is not task}

    async def _loop(self) -> None:
        assert self._wakeup is not None
        await self.gw.wait_started()
        # shared state: other replicas may cancel or take up batches, so look each second
        period = 1.0 if getattr(self.store, "is_shared", False) else 5.0
        while True:
            self._wakeup.clear()
            try:
                await asyncio.to_thread(self._take_up)
            except Exception:
                log.exception("batch runner: reading the store failed")
            await self.sweeper.maybe_sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), period)

    def _take_up(self) -> None:
        """(worker thread) Start the batches with work left that this process may run; renew the
        claims of those it runs, and stop those another replica cancelled."""
        loop = self._event_loop
        assert loop is not None
        for batch_id, run in list(self.runs.items()):
            self.store.claim(batch_id, self.owner, _CLAIM_TTL_S)
            if self.store.is_shared and not run.is_cancelled:
                row = self.store.batch(None, batch_id)
                if row is None or row["status"] == "cancelling":
                    loop.call_soon_threadsafe(self.cancel, batch_id)
        for row in self.store.active_batches():
            batch_id = row["id"]
            if batch_id in self._tasks or batch_id in self._dropped:
                continue
            if self.store.claim(batch_id, self.owner, _CLAIM_TTL_S):
                loop.call_soon_threadsafe(self._start_run, row)

    def _start_run(self, row: dict[str, Any]) -> None:
        if row["id"] not in self._tasks:
            task = asyncio.get_running_loop().create_task(self._run(row), name=f"batch-{row['id']}")
            self._tasks[row["id"]] = task
            task.add_done_callback(self._forget)

    # -- one batch ----------------------------------------------------------

    async def _run(self, row: dict[str, Any]) -> None:
        run = self.runs[row["id"]] = BatchRun(row, self.store)
        try:
            if row["status"] == "validating" and not await self._validate(run):
                return
            if row["status"] in ("validating", "in_progress"):
                now = utcnow()
                if row["in_progress_at"] is None:
                    await self._update(run, status="in_progress", in_progress_at=now)
                remaining = (row["expires_at"] - now).total_seconds() if row["expires_at"] else None
                try:
                    async with asyncio.timeout(max(0.0, remaining) if remaining is not None else None):
                        await self._feed(run)
                except TimeoutError:
                    await self._finish(run, "expired")
                    return
            # a batch found cancelling, or finalizing after a cancel (a restart in between), ends cancelled
            is_cancelled = run.is_cancelled or row["status"] == "cancelling" or row["cancelling_at"] is not None
            await self._finish(run, "cancelled" if is_cancelled else "completed")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("batch %s failed", run.id)
            await self._update(
                run, status="failed", failed_at=utcnow(), errors_json=_errors([(None, "internal_error", str(e))])
            )
        finally:
            await run.drain()  # a line being written when the server stops is written (and saved) whole
            run.appender.close()
            self.runs.pop(run.id, None)

    async def _validate(self, run: BatchRun) -> bool:
        """Every line's url is the batch's endpoint; else the batch is ``failed`` naming the lines."""
        endpoint = run.row["endpoint"]

        def check() -> tuple[int, list[tuple[int | None, str, str]]]:
            problems: list[tuple[int | None, str, str]] = []
            total = 0
            with open(self.store.path(run.row["input_file_id"]), "rb") as f:
                for number, raw in raw_lines(f):
                    total += 1
                    url = parse_line(number, raw).url
                    if url != endpoint and len(problems) < 100:
                        problems.append(
                            (
                                number,
                                "invalid_url",
                                f"line {number}: url {url!r} is not the batch's endpoint {endpoint!r}",
                            )
                        )
            return total, problems

        try:
            total, problems = await asyncio.to_thread(check)
        except (OSError, APIError) as e:
            total, problems = 0, [(None, "invalid_file", f"the input file cannot be read: {e}")]
        if problems:
            await self._update(run, status="failed", failed_at=utcnow(), num_total=total, errors_json=_errors(problems))
            return False
        await self._update(run, num_total=total)
        return True

    async def _feed(self, run: BatchRun) -> None:
        assert self._slots is not None
        found = await asyncio.to_thread(run.recover)  # after a takeover, the lines the other one finished
        run.num_completed, run.num_failed = found.num_completed, found.num_failed
        await self._write_counts(run)
        with open(self.store.path(run.row["input_file_id"]), "rb") as f:
            lines = list(raw_lines(f))
        try:
            for number, raw in lines:
                if run.is_cancelled:
                    break
                line = parse_line(number, raw)
                if line.custom_id in found.done:
                    continue
                await self._slots.acquire()
                if run.is_cancelled:
                    self._slots.release()
                    break
                task = asyncio.get_running_loop().create_task(self._line(run, line.custom_id, line.url, line.body))
                run.in_flight.add(task)
                task.add_done_callback(functools.partial(self._line_done, run))
            while run.in_flight:
                await asyncio.gather(*list(run.in_flight), return_exceptions=True)
        finally:
            for task in list(run.in_flight):
                task.cancel()
            if run.in_flight:
                await asyncio.gather(*list(run.in_flight), return_exceptions=True)
        await self._write_counts(run, force=True)

    def _line_done(self, run: BatchRun, task: asyncio.Task) -> None:
        run.in_flight.discard(task)
        assert self._slots is not None
        self._slots.release()

    async def _line(self, run: BatchRun, custom_id: str, url: str, body: dict[str, Any]) -> None:
        request_id, status, answer, error = None, 200, None, None
        for delay in (*_RETRY_DELAYS_S, None):
            try:
                call = build_call(self.gw, url, body)
                request = call.request
                request.tenant, request.api_key_id = run.row["tenant"], run.row["api_key_id"]
                request.priority_class, request.batch_id = "batch", run.id
                request_id = request.id
                answer, status, error = await run_call(self.gw, call), 200, None
                break
            except APIError as e:
                status, answer = e.status, e.body()
                error = {"code": e.code or e.type, "message": e.message}
                if status not in _RETRY_STATUSES or delay is None or e.code == "shutting_down":
                    break
                await asyncio.sleep(delay)
            except Exception as e:  # a bug, not the line's fault: written as a 500, the batch goes on
                log.exception("batch %s: line %s failed", run.id, custom_id)
                status, answer = 500, {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error"}}
                error = {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}
                break
        is_error = status >= 400
        await run.record(custom_id, is_error, output_line(custom_id, status, request_id, answer, error))
        if is_error:
            run.num_failed += 1
            self.num_lines["failed"] += 1
        else:
            run.num_completed += 1
            self.num_lines["completed"] += 1
            run.finished.append((time.monotonic(), num_generated(answer or {})))
            self.num_tokens += num_tokens(answer or {})
        await self._write_counts(run)

    async def _finish(self, run: BatchRun, final: str) -> None:
        """``finalizing``, then ``final``: lines that never ran are written when expired; the
        output and error files become files of the tenant (when they hold lines)."""
        await run.drain()  # lines cancelled while being written are in the files first
        await self._update(run, status="finalizing", finalizing_at=utcnow())

        def files() -> dict[str, Any]:
            found = recover(*run.paths)
            if final == "expired":
                with open(self.store.path(run.row["input_file_id"]), "rb") as f:
                    for number, raw in raw_lines(f):
                        custom_id = parse_line(number, raw).custom_id
                        if custom_id not in found.done:
                            message = "This request could not be executed before the completion window expired."
                            run.appender.append_now(
                                True,
                                output_line(custom_id, 0, None, None, {"code": "batch_expired", "message": message}),
                            )
                            self.num_lines["expired"] += 1
            ids: dict[str, Any] = {"num_completed": found.num_completed, "num_failed": found.num_failed}
            for (name, path), file_id in zip(
                (("output_file_id", run.paths[0]), ("error_file_id", run.paths[1])), output_ids(run.id)
            ):
                if path.exists() and path.stat().st_size > 0:
                    tenant, expires_s = run.row["tenant"], run.row.get("output_expires_s")
                    self.store.add_file(file_id, tenant, "batch_output", path.name, _num_lines(path), run.id, expires_s)
                    ids[name] = file_id
            return ids

        ids = await asyncio.to_thread(files)
        run.num_completed, run.num_failed = ids["num_completed"], ids["num_failed"]
        await self._update(run, status=final, **{f"{final}_at": utcnow()}, **ids)
        await run.forget_saved()

    async def _update(self, run: BatchRun, **fields: Any) -> None:
        await asyncio.shield(asyncio.to_thread(self.store.update_batch, run.id, **fields))
        run.row.update(fields)

    async def _write_counts(self, run: BatchRun, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - run.counts_written_at >= _COUNTS_EVERY_S:
            run.counts_written_at = now
            await self._update(run, num_completed=run.num_completed, num_failed=run.num_failed)

    # -- metrics ------------------------------------------------------------

    def prometheus_lines(self) -> list[str]:
        lines_name, tokens_name = PREFIX + "batch_lines_total", PREFIX + "batch_tokens_total"
        out = [f"# HELP {lines_name} Batch API lines finished, by outcome.", f"# TYPE {lines_name} counter"]
        out += [f'{lines_name}{{status="{status}"}} {n}' for status, n in self.num_lines.items()]
        out += [
            f"# HELP {tokens_name} Tokens (prompt and generated) of completed batch lines.",
            f"# TYPE {tokens_name} counter",
        ]
        out.append(f"{tokens_name} {self.num_tokens}")
        running = PREFIX + "batch_lines_running"
        out += [f"# HELP {running} Batch lines in flight.", f"# TYPE {running} gauge"]
        out.append(f"{running} {sum(len(r.in_flight) for r in self.runs.values())}")
        return out


def _errors(problems: list[tuple[int | None, str, str]]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"code": code, "message": message, "param": None, "line": number} for number, code, message in problems
        ],
    }


def _num_lines(path: Any) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def expiry(created_at: Any, window_s: float) -> Any:
    return created_at + timedelta(seconds=window_s)
