"""Experts: per-layer expert-load heatmap of MoE replicas, imbalance per layer, EPLB plan."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.widgets.expert_heatmap import ExpertHeatmap, expert_matrix


def eplb_text(name: str, plan: dict[str, Any]) -> Text:
    """A compact listing of an EPLB plan: scalars first, then nested items as JSON."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{name} · EPLB plan", style="bold")
    for key, value in plan.items():
        shown = value if isinstance(value, (int, float, str, bool)) or value is None else json.dumps(value)
        if isinstance(value, float):
            shown = f"{value:.3f}"
        text.append(f"\n  {key}: {shown}")
    return text


class ExpertsScreen(DashboardScreen):
    SCREEN_TITLE = "Experts"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="experts"):
            yield Static(id="no-moe")

    def show_stats(self, stats: dict[str, Any]) -> None:
        engines = stats.get("engines") or {}
        matrices = {name: expert_matrix(e.get("expert_load")) for name, e in sorted(engines.items())}
        moe = {name: m for name, m in matrices.items() if m}
        container = self.query_one("#experts", VerticalScroll)
        notice = self.query_one("#no-moe", Static)
        with self.app.batch_update():
            notice.display = not moe
            if not moe:
                notice.update(
                    f"No MoE model: none of the {len(engines)} replica(s) reports expert load.\n"
                    "Serve a Mixtral / Qwen-MoE model with the bundled engine to see per-layer expert balance."
                )
            for widget in list(container.query(".moe")):
                replica = widget.name
                if replica not in moe:
                    widget.remove()
            for name, matrix in moe.items():
                heatmaps = container.query(f"#heat-{_ident(name)}")
                if heatmaps:
                    heatmaps.first(ExpertHeatmap).set_matrix(matrix)
                else:
                    container.mount(ExpertHeatmap(name, matrix, id=f"heat-{_ident(name)}", name=name, classes="moe"))
                plan = engines[name].get("eplb")
                plans = container.query(f"#eplb-{_ident(name)}")
                if plan and plans:
                    plans.first(Static).update(eplb_text(name, plan))
                elif plan:
                    container.mount(
                        Static(eplb_text(name, plan), id=f"eplb-{_ident(name)}", name=name, classes="moe eplb")
                    )
                elif plans:
                    plans.first().remove()


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
