"""A benchmark run: its settings, and per load level the summary and the raw
per-request results. Saved as JSON and into the store (bench_runs/bench_results)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenops.bench.metrics import BenchSummary, RequestResult


@dataclass(slots=True)
class LevelResult:
    """One load level (a rate or a concurrency) of a run."""

    label: str
    summary: BenchSummary
    results: list[RequestResult] = field(default_factory=list)

    def to_dict(self, with_requests: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"label": self.label, "summary": self.summary.to_dict()}
        if with_requests:
            d["requests"] = [r.to_dict() for r in self.results]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LevelResult:
        return cls(
            d["label"],
            BenchSummary.from_dict(d["summary"]),
            [RequestResult.from_dict(r) for r in d.get("requests", [])],
        )


@dataclass(slots=True)
class BenchRun:
    """A whole ``tokenops bench`` invocation."""

    url: str
    model: str
    workload: str
    settings: dict[str, Any]
    slos: list[str] = field(default_factory=list)
    levels: list[LevelResult] = field(default_factory=list)
    id: str = field(default_factory=lambda: "bench-" + uuid.uuid4().hex[:12])
    created: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def to_dict(self, with_requests: bool = True) -> dict[str, Any]:
        return {
            "id": self.id,
            "created": self.created,
            "url": self.url,
            "model": self.model,
            "workload": self.workload,
            "settings": self.settings,
            "slos": self.slos,
            "levels": [lv.to_dict(with_requests) for lv in self.levels],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchRun:
        return cls(
            url=d["url"],
            model=d["model"],
            workload=d["workload"],
            settings=d.get("settings", {}),
            slos=d.get("slos", []),
            levels=[LevelResult.from_dict(x) for x in d.get("levels", [])],
            id=d["id"],
            created=d.get("created", ""),
        )

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load_json(cls, path: str | Path) -> BenchRun:
        data = json.loads(Path(path).read_text())
        if "levels" not in data:
            raise ValueError(f"{path} is not a tokenops bench result (no 'levels')")
        return cls.from_dict(data)
