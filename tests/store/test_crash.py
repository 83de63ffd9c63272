"""SIGKILL a process that is writing telemetry: the store reopens cleanly and at
most about one second of rows (the unflushed queue) is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tokenops.store import Store

_CHILD = textwrap.dedent(
    """
    import sys, time
    from tokenops.store import Store
    store = Store.open(sys.argv[1])
    writer = store.writer(flush_interval_s=0.5)
    side = open(sys.argv[2], "w", buffering=1)
    print("ready", flush=True)
    n = 0
    while True:
        writer.write_many("requests", [{"id": f"r{n + k}", "tokens_in": n + k} for k in range(50)])
        n += 50
        side.write(f"{time.time():.6f} {n}\\n")  # after the enqueue: n rows are queued
        time.sleep(0.002)
    """
)

#: Rows enqueued this long before the kill must be in the file (flush interval 0.5 s + scheduling slack).
MAX_LOSS_S = 1.25


def test_sigkill_loses_at_most_about_one_second(tmp_path):
    db, side = str(tmp_path / "crash.duckdb"), str(tmp_path / "enqueued.txt")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, db, side], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(2.5)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    marks = [tuple(map(float, line.split())) for line in open(side) if line.count(" ") == 1 and line.endswith("\n")]
    total = int(marks[-1][1])
    must_have = max((int(n) for t, n in marks if t <= killed_at - MAX_LOSS_S), default=0)
    assert must_have > 0, "the child enqueued nothing early enough to check"

    with Store.open(db, read_only=True) as store:  # `tokenops report` right after the crash
        committed = store.execute("SELECT count(*) FROM requests").fetchone()[0]
    with Store.open(db) as store:  # a clean reopen replays the write-ahead log
        count, distinct, highest = store.execute(
            "SELECT count(*), count(DISTINCT id), coalesce(max(tokens_in), -1) FROM requests"
        ).fetchone()
        assert count == distinct == highest + 1  # committed flushes form a prefix, nothing duplicated or torn
        print(f"enqueued {total}, committed {count}, required {must_have}")
        assert must_have <= count <= total, (must_have, count, total)
        assert count == committed
        store.writer().write("requests", {"id": "after-restart"})
    with Store.open(db, read_only=True) as store:
        assert store.execute("SELECT count(*) FROM requests").fetchone()[0] == count + 1
