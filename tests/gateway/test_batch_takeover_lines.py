"""Finished batch lines saved for a takeover (issue 55, shared state), in process: the group commit
of :class:`~tokenops.gateway.batches.batch_run.LineSaver` (a line returns once the write carrying
it is done; lines that finish during a write go together in the next) and
:meth:`~tokenops.gateway.batches.batch_run.BatchRun.recover` (the lines another replica saved are
appended to the local files and count as done). Through two real ``tokenops serve`` on one
PostgreSQL: ``tests/gateway/test_shared_batches_serve.py`` (slow: kill -9, then the takeover)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from tokenops.gateway.batches.batch_output import output_line
from tokenops.gateway.batches.batch_run import BatchRun, LineSaver


class SlowSharedStore:
    """The part of a shared ``BatchState`` the run uses; each save takes ``delay_s``."""

    is_shared = True

    def __init__(self, files_dir: Path, delay_s: float = 0.05) -> None:
        self.files_dir, self.delay_s = files_dir, delay_s
        self.writes: list[list[str]] = []
        self.saved: dict[str, tuple[str, bool, bytes]] = {}
        self.lock = threading.Lock()

    def path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    def save_lines(self, batch_id: str, lines: list[tuple[str, bool, bytes]]) -> None:
        time.sleep(self.delay_s)
        with self.lock:
            self.writes.append([c for c, _, _ in lines])
            for line in lines:
                self.saved.setdefault(line[0], line)

    def saved_lines(self, batch_id: str) -> list[tuple[str, bool, bytes]]:
        return list(self.saved.values())


def test_lines_finishing_together_are_saved_in_few_writes_each_before_it_returns():
    store = SlowSharedStore(Path("."))
    saver = LineSaver(store, "batch_x")
    returned: list[tuple[str, int]] = []

    async def line(i: int) -> None:
        await asyncio.sleep(0.001 * (i % 3))
        await saver.save(f"c{i}", False, b"{}\n")
        returned.append((f"c{i}", len(store.writes)))  # how many writes were done when it returned

    async def main() -> None:
        await asyncio.gather(*(line(i) for i in range(40)))
        await saver.drain()

    asyncio.run(main())
    assert sorted(store.saved) == sorted(f"c{i}" for i in range(40))
    assert 1 <= len(store.writes) <= 4, store.writes  # group commit: not one round trip per line
    for custom_id, num_writes in returned:  # each returned only once a write carrying it was done
        assert any(custom_id in w for w in store.writes[:num_writes]), (custom_id, num_writes)


def test_a_cancelled_line_is_still_saved():
    store = SlowSharedStore(Path("."), delay_s=0.2)
    saver = LineSaver(store, "batch_x")

    async def main() -> None:
        task = asyncio.ensure_future(saver.save("c0", True, b"{}\n"))
        await asyncio.sleep(0.05)
        task.cancel()
        await saver.drain()

    asyncio.run(main())
    assert "c0" in store.saved


def test_a_takeover_appends_the_lines_the_other_replica_saved_and_counts_them_done(tmp_path):
    store = SlowSharedStore(tmp_path, delay_s=0.0)
    done_elsewhere = [("a", False), ("b", True), ("c", False)]
    for custom_id, is_error in done_elsewhere:
        line = output_line(custom_id, 500 if is_error else 200, "req-1", {}, {"code": "x"} if is_error else None)
        store.saved[custom_id] = (custom_id, is_error, line)
    run = BatchRun({"id": "batch_abc"}, store)  # type: ignore[arg-type]
    # this replica itself had finished "a" before (its own local file): it stays once
    run.appender.append_now(False, output_line("a", 200, "req-0", {}, None))
    found = run.recover()
    run.appender.close()
    assert found.done == {"a", "b", "c"}
    assert (found.num_completed, found.num_failed) == (2, 1)
    assert run.paths[0].read_text().count('"custom_id":"a"') == 1
    assert '"custom_id":"b"' in run.paths[1].read_text()
    assert run.recover().done == {"a", "b", "c"}  # read again: nothing appended twice
    assert run.paths[0].read_text().count("\n") == 2
