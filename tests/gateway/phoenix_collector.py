"""Arize Phoenix as the tests' OpenTelemetry collector: a real OTLP/HTTP receiver whose spans are read
back through its REST API (``GET /v1/projects/{project}/spans/otlpv1``).

Phoenix runs from an environment of its own (``.venv-phoenix``, made by ``make install`` from
``requirements-phoenix.txt``): ``arize-phoenix`` pins ``anthropic<2`` and the project pins 2.10.0, so it
cannot share ``.venv``. ``TOKENOPS_PHOENIX_PYTHON`` names another interpreter that has it. The server
is started as ``python -m phoenix.server.main serve`` on free loopback ports with a fresh working
directory (its SQLite database), telemetry and its agent tools off; nothing leaves the machine.

What Phoenix keeps of a span, and so what a test can read back: trace and span ids, the parent, name,
times, status and attributes (plus ``openinference.*`` / ``llm.*`` ones it derives from ``gen_ai.*``).
It does not return the span kind (it keeps its own ``openinference.span.kind``) nor the resource.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import httpx

REPO = Path(__file__).resolve().parents[2]
#: Minutes, on a loaded 2-core box: its first start runs its database migrations.
START_TIMEOUT_S = 300.0


def phoenix_python() -> Path | None:
    """The interpreter with Phoenix installed, or None when there is none."""
    named = os.environ.get("TOKENOPS_PHOENIX_PYTHON")
    path = Path(named) if named else REPO / ".venv-phoenix" / "bin" / "python"
    return path if path.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _value(v: dict[str, Any]) -> Any:
    """An OTLP/JSON ``AnyValue`` as a Python value (int64s may come as strings)."""
    for kind, value in v.items():
        if value is None:
            continue
        if kind == "int_value":
            return int(value)
        if kind == "array_value":
            return [_value(x) for x in (value.get("values") or [])]
        return value
    return None


def plain_span(s: dict[str, Any]) -> dict[str, Any]:
    """One ``OtlpSpan`` of Phoenix's API as the dict the tests read."""
    status = s.get("status") or {}
    return {"trace_id": s["trace_id"], "span_id": s["span_id"], "parent_span_id": s.get("parent_span_id") or None,
            "name": s["name"], "start_ns": s.get("start_time_unix_nano"), "end_ns": s.get("end_time_unix_nano"),
            "status": status.get("code") or 0,
            "attributes": {a["key"]: _value(a.get("value") or {}) for a in s.get("attributes") or []}}


class Phoenix:
    """``with Phoenix(workdir) as p: p.url`` (the OTLP base URL), ``p.wait_ready()``, ``p.spans()``.

    Entering only starts the process, so a test can start its other servers meanwhile; call
    :meth:`wait_ready` before anything is exported to it."""

    def __init__(self, workdir: Path, python: Path | None = None, project: str = "default") -> None:
        found = python or phoenix_python()
        assert found is not None, "Arize Phoenix is not installed: run `make install` (it makes .venv-phoenix)"
        self.python = found
        self.workdir = workdir
        self.project = project
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "phoenix.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        # none of the test process's OpenTelemetry or Python settings: Phoenix is a program of its own
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "PHOENIX_", "PYTHON", "TOKENOPS_")) and k != "VIRTUAL_ENV"}
        env.update({"PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(self.port),
                    "PHOENIX_GRPC_PORT": str(_free_port()), "PHOENIX_WORKING_DIR": str(self.workdir / "phoenix"),
                    "PHOENIX_TELEMETRY_ENABLED": "false", "PHOENIX_AGENTS_DISABLE_BASH": "true",
                    "PHOENIX_AGENTS_DISABLE_WEB_ACCESS": "true", "PHOENIX_AGENTS_DISABLE_GITHUB": "true",
                    "PHOENIX_LOG_MIGRATIONS": "false"})
        return env

    def __enter__(self) -> "Phoenix":
        (self.workdir / "phoenix").mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(self.python), "-m", "phoenix.server.main", "serve"], env=self._env(),
                                         cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"Phoenix exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"Phoenix not ready after {timeout_s:.0f} s:\n{self._log_tail()}"
            time.sleep(0.5)

    def spans(self) -> list[dict[str, Any]]:
        """Every span of the project, read through Phoenix's REST API (all pages)."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            r = httpx.get(f"{self.url}/v1/projects/{self.project}/spans/otlpv1", params=params, timeout=30.0)
            if r.status_code == 404:  # the project is made by its first span
                return out
            r.raise_for_status()
            page = r.json()
            out += [plain_span(s) for s in page.get("data") or []]
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def wait_for(self, condition: Callable[[list[dict[str, Any]]], bool],
                 timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The spans once ``condition(spans)`` holds (Phoenix writes what it receives in batches)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if condition(spans):
                return spans
            assert time.monotonic() < deadline, f"Phoenix: condition not met; spans: {sorted(s['name'] for s in spans)}"
            time.sleep(0.5)

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
