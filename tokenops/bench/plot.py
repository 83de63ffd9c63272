"""Latency–throughput plots: a text plot for the terminal, an HTML page with
inline SVG (no dependencies) and a PNG when matplotlib is installed."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from tokenops.bench.results import BenchRun

#: (metric, percentile key, marker) series drawn against achieved requests/s.
SERIES = (("ttft", "p50", "o"), ("ttft", "p95", "*"), ("tpot", "p95", "+"), ("e2e", "p95", "x"))
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def series(run: BenchRun) -> dict[str, list[tuple[float, float]]]:
    """label -> [(requests/s, latency ms)] over the run's load levels."""
    out: dict[str, list[tuple[float, float]]] = {}
    for metric, key, _ in SERIES:
        pts = []
        for lv in run.levels:
            y = lv.summary.latency[metric].get(key)
            if y is not None and lv.summary.request_rate > 0:
                pts.append((lv.summary.request_rate, y * 1000))
        out[f"{metric} {key}"] = sorted(pts)
    return out


def text_plot(run: BenchRun, width: int = 60, height: int = 14) -> str:
    """A character plot of latency (ms) against achieved throughput (req/s)."""
    data = series(run)
    pts = [p for s in data.values() for p in s]
    if len(run.levels) < 2 or not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(p[1] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > 0 else 1
    grid = [[" "] * width for _ in range(height)]
    for (_label, pts_), (_, _, mark) in zip(data.items(), SERIES):
        for x, y in pts_:
            col = min(width - 1, int((x - x0) / (x1 - x0) * (width - 1)))
            row = height - 1 - min(height - 1, int(y / y1 * (height - 1)))
            grid[row][col] = mark
    lines = []
    for i, grid_row in enumerate(grid):
        yv = y1 * (height - 1 - i) / (height - 1)
        lines.append(f"{yv:9.1f} |" + "".join(grid_row))
    lines.append(" " * 10 + "+" + "-" * width)
    lines.append(" " * 11 + f"{x0:<10.2f}{'requests/s':^{width - 20}}{x1:>10.2f}")
    lines.append("  ms    " + "   ".join(f"{mark} {metric} {key}" for metric, key, mark in SERIES))
    return "\n".join(lines)


def _svg(run: BenchRun, w: int = 720, h: int = 420) -> str:
    data = series(run)
    pts = [p for s in data.values() for p in s] or [(0.0, 0.0)]
    x1 = max(p[0] for p in pts) * 1.05 or 1.0
    y1 = max(p[1] for p in pts) * 1.1 or 1.0
    ml, mb, mt, mr = 60, 40, 20, 150

    def sx(x: float) -> float:
        return ml + x / x1 * (w - ml - mr)

    def sy(y: float) -> float:
        return h - mb - y / y1 * (h - mb - mt)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>',
        f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>',
    ]
    for i in range(6):
        xv, yv = x1 * i / 5, y1 * i / 5
        parts.append(f'<text x="{sx(xv):.1f}" y="{h - mb + 15}" text-anchor="middle">{xv:.2f}</text>')
        parts.append(f'<text x="{ml - 5}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.0f}</text>')
    parts.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 5}" text-anchor="middle">achieved requests/s</text>')
    parts.append(
        f'<text x="15" y="{(mt + h - mb) / 2}" transform="rotate(-90 15 {(mt + h - mb) / 2})" '
        f'text-anchor="middle">latency (ms)</text>'
    )
    for k, (label, pts_) in enumerate(data.items()):
        color = _COLORS[k % len(_COLORS)]
        if pts_:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts_)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in pts_]
        parts.append(f'<text x="{w - mr + 10}" y="{mt + 15 + 18 * k}" fill="{color}">{html.escape(label)}</text>')
    for s in run.levels[0].summary.slo if run.levels else []:
        y = s["threshold_s"] * 1000
        if y <= y1:
            parts.append(
                f'<line x1="{ml}" y1="{sy(y):.1f}" x2="{w - mr}" y2="{sy(y):.1f}" stroke="gray" '
                f'stroke-dasharray="4 3"/><text x="{w - mr + 10}" y="{sy(y) + 4:.1f}" fill="gray">'
                f"SLO {html.escape(s['label'])}</text>"
            )
    parts.append("</svg>")
    return "\n".join(parts)


def _table_html(run: BenchRun) -> str:
    head = (
        "<tr><th>level</th><th>req/s</th><th>out tok/s</th><th>TTFT p50</th><th>TTFT p95</th>"
        "<th>TPOT p95</th><th>E2E p95</th><th>goodput</th><th>errors</th></tr>"
    )
    rows = []
    for lv in run.levels:
        s = lv.summary

        def ms(m: str, k: str, s: Any = s) -> str:  # s bound now: the loop moves on
            v = s.latency[m].get(k)
            return "-" if v is None else f"{v * 1000:.1f}"

        good = "-" if s.goodput_rps is None else f"{s.goodput_rps:.2f}"
        rows.append(
            f"<tr><td>{html.escape(lv.label)}</td><td>{s.request_rate:.2f}</td><td>{s.output_tps:.1f}</td>"
            f"<td>{ms('ttft', 'p50')}</td><td>{ms('ttft', 'p95')}</td><td>{ms('tpot', 'p95')}</td>"
            f"<td>{ms('e2e', 'p95')}</td><td>{good}</td><td>{s.num_errors}</td></tr>"
        )
    return f"<table border='1' cellpadding='4' style='border-collapse:collapse'>{head}{''.join(rows)}</table>"


def check_target(path: str | Path) -> None:
    """Fail before a run, not after it: a known suffix, a writable place, matplotlib for PNG.

    :raises ValueError: with a one-line reason."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".html", ".png"):
        raise ValueError(f"--plot {path}: use a .html or .png file")
    check_writable(path, "--plot")
    if suffix == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError(
                "--plot FILE.png needs matplotlib (pip install 'tokenops[plot]'); or use --plot FILE.html"
            ) from None


def check_writable(path: str | Path, option: str) -> None:
    """``path`` can be created or overwritten (its folder exists and is writable)."""
    import os

    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder; give a file name")
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: folder {folder} does not exist")
    if (path.exists() and not os.access(path, os.W_OK)) or not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {path}: not writable")


def write_plot(run: BenchRun, path: str | Path) -> Path:
    """Write ``path`` (.html: inline SVG; .png: needs matplotlib)."""
    path = Path(path)
    if path.suffix.lower() == ".html":
        title = html.escape(f"tokenops bench {run.id}: {run.model} @ {run.url} ({run.workload})")
        path.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><h2>{title}</h2>{_svg(run)}<h3>Levels</h3>{_table_html(run)}</body></html>"
        )
        return path
    if path.suffix.lower() == ".png":
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ValueError(
                "a PNG plot needs matplotlib (pip install matplotlib); use --plot FILE.html instead"
            ) from None
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, pts in series(run).items():
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("achieved requests/s")
        ax.set_ylabel("latency (ms)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path
    raise ValueError(f"--plot {path}: use a .html or .png file name")
