"""Write a study's outcome: the winner as ``profiles/engines/<model>-<hardware>-<slo>.toml``
and every trial as a row of the store's ``tune_trials``."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from tokenops.slo import SLO
from tokenops.tune.runner import TuneReport


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-") or "x"


def hardware_name() -> str:
    """``cuda-<gpu name>`` when torch sees a GPU (only checked if torch is already loaded), else ``<arch>-<N>cpu``."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return "cuda-" + slug(torch.cuda.get_device_name(0))
    return f"{platform.machine() or 'cpu'}-{os.cpu_count()}cpu"


def slo_slug(slos: list[SLO]) -> str:
    return "_".join(f"{s.metric}-p{s.percentile:g}-{s.threshold_s * 1000:g}ms" for s in slos)


def profile_path(report: TuneReport, directory: str | Path, hardware: str | None = None) -> Path:
    model = slug(Path(report.model).name)
    if report.plan.launch and report.plan.engine != "tokenops":  # the same model tuned on vLLM and SGLang
        model = f"{slug(report.plan.engine)}-{model}"
    return Path(directory) / f"{model}-{slug(hardware or hardware_name())}-{slo_slug(report.plan.slos)}.toml"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_profile(
    report: TuneReport, directory: str | Path = "profiles/engines", hardware: str | None = None
) -> Path | None:
    """Write the winner's profile; None when no configuration met the SLO."""
    best, default = report.outcome.best, report.outcome.default
    if best is None:
        return None
    path = profile_path(report, directory, hardware)
    path.parent.mkdir(parents=True, exist_ok=True)
    ratio = report.outcome.ratio
    meta = {
        "model": report.model,
        "hardware": hardware or hardware_name(),
        "slo": [s.label for s in report.plan.slos],
        "workload": report.plan.workload,
        "study": report.study,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "goodput_rps": round(best.goodput, 4),
        # the default's own sustained goodput (same procedure); 0 and its status when it had none
        "default_goodput_rps": round(default.goodput, 4) if default and default.result.status == "complete" else 0.0,
        "default_status": default.result.status if default else "not measured",
        "num_trials": len(report.outcome.trials),
        "winner_trial": best.number,
    }
    if ratio is not None:
        meta["goodput_ratio"] = round(ratio, 4)
    if report.plan.launch:
        meta["engine"] = report.plan.engine
    if report.launch_flags:
        meta["launch_flags"] = report.launch_flags
    for v in report.validation:
        meta[f"validation_{v['name']}_met_at_{v['rate']:.3g}_rps".replace(".", "_")] = bool(v["met"])
    lines = [
        f"# Written by `tokenops tune` (study {report.study}). [tunables] holds the winning values.",
        f'# Start with them: tokenops serve --engine-profile {path.stem}   (or [engine] profile = "{path.stem}");',
        "# `tokenops tune --apply` pushes the live ones to a running server; launcher ones (vllm.*, sglang.*)",
        "# are that server's command-line flags (docs/tune.md). serve warns when model, hardware or SLO differ.",
        "",
        "[tune]",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in meta.items()]
    for k, v in sorted(report.plan.workload_options.items()):
        if v is not None:
            lines.append(f"workload_{k} = {_toml_value(v)}")
    lines += ["", "[tunables]"]
    # only what the study searched: a value it never varied (or could not measure) is no finding
    searched = set(report.space.names)
    lines += [f'"{k}" = {_toml_value(v)}' for k, v in sorted(best.params.items()) if k in searched]
    path.write_text("\n".join(lines) + "\n")
    return path


def trial_rows(report: TuneReport) -> list[dict[str, Any]]:
    best = report.outcome.best
    slo = json.dumps([s.label for s in report.plan.slos])
    ts = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    rows = []
    for t in report.outcome.trials:
        metrics = {k: v for k, v in t.to_dict().items() if k not in ("params", "trial", "goodput", "status")}
        metrics.update({"model": report.model, "workload": report.plan.workload, "is_default": t.number == 0})
        rows.append(
            {
                "id": f"{report.study}-{t.number}",
                "ts": ts,
                "study": report.study,
                "trial": t.number,
                "params": json.dumps(t.params),
                "goodput": t.goodput,
                "status": t.result.status,
                "slo": slo,
                "metrics": json.dumps(metrics, default=str),
                "is_best": best is not None and t is best,
            }
        )
    return rows


def save_trials(report: TuneReport, store_path: str, target: Any = None) -> str:
    """Insert the study's trials into ``tune_trials`` of ``target`` (the tuned server's store, a
    :class:`~tokenops.store.run_target.RunTarget`) or ``store_path`` (a JSON file beside the
    store when it cannot be opened); returns where they went."""
    from tokenops.store import StoreError
    from tokenops.store.run_target import RunTarget, save_rows
    from tokenops.store.table_models import TuneTrial

    rows = trial_rows(report)
    try:
        where = save_rows(target or RunTarget(store_path), [TuneTrial(**r) for r in rows])
    except StoreError as e:
        d = Path(store_path).expanduser().parent / "tune-trials"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{report.study}.json"
        path.write_text(json.dumps(rows, default=str, indent=1))
        return f"store unavailable ({e}); trials saved to {path}"
    return f"{len(rows)} trials saved to {where} (tune_trials study {report.study})"
