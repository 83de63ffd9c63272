"""A batch's output and error files, appended line by line, durably.

The files are the record of what is done: a finished line is written and ``fsync``-ed before
the runner counts it, and after a restart (even a ``kill -9``) the runner reads them back to
know which ``custom_id``s are done, so no line runs twice and none appears twice. A line
torn by a crash mid-write is cut off on reopening (its ``custom_id`` was not done). Lines are
OpenAI's: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: error codes of lines that never ran (not counted as failed requests)
NOT_RUN = ("batch_expired", "batch_cancelled")
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def output_line(custom_id: str, status: int, request_id: str | None, body: Any, error: dict | None) -> bytes:
    response = None if status == 0 else {"status_code": status, "request_id": request_id, "body": body}
    line = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id, "response": response, "error": error}
    return _dumps(line).encode("utf-8") + b"\n"


@dataclass(slots=True)
class Recovered:
    done: set[str] = field(default_factory=set)
    num_completed: int = 0
    num_failed: int = 0


def _read_back(path: Path, into: Recovered, is_errors: bool) -> None:
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # a line torn by a crash: it was not done
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    for raw in data[:end].splitlines():
        line = json.loads(raw)
        into.done.add(line["custom_id"])
        code = (line.get("error") or {}).get("code")
        if not is_errors:
            into.num_completed += 1
        elif code not in NOT_RUN:
            into.num_failed += 1


def recover(output: Path, errors: Path) -> Recovered:
    """What a batch's files say is done (blocking: run it in a worker thread)."""
    found = Recovered()
    _read_back(output, found, False)
    _read_back(errors, found, True)
    return found


class DurableAppender:
    """Appends lines to the output or error file; :meth:`append` returns once the line is on disk."""

    def __init__(self, output: Path, errors: Path) -> None:
        self.paths = {False: output, True: errors}
        self._fds: dict[bool, int] = {}
        self._lock = asyncio.Lock()
        #: writes under way; they finish even when the line's task is cancelled meanwhile
        self._pending: set[asyncio.Future] = set()

    def _write(self, is_error: bool, line: bytes) -> None:
        fd = self._fds.get(is_error)
        if fd is None:
            fd = self._fds[is_error] = os.open(self.paths[is_error], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)

    async def _append(self, is_error: bool, line: bytes) -> None:
        async with self._lock:  # one write at a time: lines never interleave
            await asyncio.to_thread(self._write, is_error, line)

    async def append(self, is_error: bool, line: bytes) -> None:
        """Write ``line``; a cancel of the caller does not stop the write (see :meth:`drain`)."""
        write = asyncio.ensure_future(self._append(is_error, line))
        self._pending.add(write)
        write.add_done_callback(self._pending.discard)
        await asyncio.shield(write)

    async def drain(self) -> None:
        """Wait for every write under way: read the files back only after this."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    def append_now(self, is_error: bool, line: bytes) -> None:
        """Blocking :meth:`append` (expiry writes many lines from a worker thread)."""
        self._write(is_error, line)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
