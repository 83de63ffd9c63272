"""Models & routing: traffic share and cost per model, route reasons, spend per tenant and API key
(with budget use), escalations, cache hits."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable

from tokenops.tui.bars import usage_bar
from tokenops.tui.format import fmt_int, fmt_pct, fmt_usd, ratio
from tokenops.tui.screens.base import DashboardScreen
from tokenops.tui.tables import ensure_columns, sync_rows
from tokenops.tui.widgets.metric_tile import MetricTile

MODEL_COLUMNS = (
    ("model", "model"),
    ("share", "traffic share"),
    ("requests", "requests"),
    ("errors", "errors"),
    ("input", "in tokens"),
    ("output", "out tokens"),
    ("thinking", "thinking"),
    ("cost", "cost"),
    ("cost_h", "cost/hour"),
)
ROUTE_COLUMNS = (("reason", "route reason"), ("count", "requests"), ("share", "share"))
SPEND_COLUMNS = (
    ("tenant", "tenant"),
    ("key", "key"),
    ("spend", "spend"),
    ("period", "budget period"),
    ("used", "used"),
    ("left", "left"),
)


def model_cells(name: str, model: dict[str, Any]) -> list[Any]:
    return [
        # under [gateway] max_loaded_models, a model whose engine is not resident (it loads on demand)
        f"{name} (not loaded)" if model.get("resident") is False else name,
        usage_bar(model.get("share"), width=8, warn=2, danger=2),
        fmt_int(model.get("requests")),
        fmt_int(model.get("errors")),
        fmt_int(model.get("input_tokens")),
        fmt_int(model.get("output_tokens")),
        # the share of output spent thinking, for reasoning models (usage reasoning_tokens)
        fmt_pct(ratio(model["reasoning_tokens"], model.get("output_tokens")))
        if model.get("reasoning_tokens") is not None
        else "-",
        fmt_usd(model.get("cost_usd")),
        fmt_usd(model.get("cost_per_hour_usd")),
    ]


def models_title(swap: dict[str, Any] | None) -> str:
    """The models table's title: with a bound on resident engines, what is loaded and how often."""
    if not swap:
        return "models"
    return (
        f"models: {len(swap.get('resident') or [])} of at most {swap.get('max_loaded_models')} engines loaded, "
        f"{fmt_int(swap.get('num_loads'))} loads, {fmt_int(swap.get('num_evictions'))} evictions, "
        f"{swap.get('load_seconds', 0.0):.1f} s loading"
    )


def spend_rows(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``stats["spend"]``: per tenant (``key_id`` None: all its keys) and key, with budget use."""
    out = {}
    for r in rows:
        budget = r.get("budget_usd")
        used = None if budget is None else usage_bar(ratio(r.get("period_spent_usd"), budget), width=8)
        out[f"{r['tenant']}/{r.get('key_id') or '*'}"] = [
            r["tenant"],
            r.get("key_id") or "(all keys)",
            fmt_usd(r.get("spend_usd")),
            r.get("period") or "-",
            used if used is not None else fmt_usd(r.get("period_spent_usd")) if r.get("period") else "-",
            fmt_usd(r.get("remaining_usd")) if r.get("remaining_usd") is not None else "-",
        ]
    return out


def route_rows(routes: dict[str, int]) -> dict[str, list[Any]]:
    total = sum(routes.values())
    ordered = sorted(routes.items(), key=lambda kv: (-kv[1], kv[0]))
    return {reason: [reason, fmt_int(count), fmt_pct(ratio(count, total))] for reason, count in ordered}


class ModelsScreen(DashboardScreen):
    SCREEN_TITLE = "Models & routing"
    DEFAULT_CSS = """
    ModelsScreen #spend { max-height: 8; }
    """

    def compose_body(self) -> ComposeResult:
        models: DataTable[Any] = DataTable(id="models", cursor_type="row", zebra_stripes=True)
        models.border_title = "models"
        yield models
        spend: DataTable[Any] = DataTable(id="spend", cursor_type="row")
        spend.border_title = "spend by tenant / key (this gateway) and budget use in the period"
        yield spend
        with Horizontal(id="routing"):
            routes: DataTable[Any] = DataTable(id="routes", cursor_type="row")
            routes.border_title = "route reasons"
            yield routes
            with Vertical(id="routing-tiles"):
                yield MetricTile("cache hits", id="cache")
                yield MetricTile("cascade escalations", id="escalations")
                yield MetricTile("total cost/hour", id="cost_h")

    def on_mount(self) -> None:
        self._ensure_columns()

    def _ensure_columns(self) -> None:
        ensure_columns(self.query_one("#models", DataTable), MODEL_COLUMNS)
        ensure_columns(self.query_one("#routes", DataTable), ROUTE_COLUMNS)
        ensure_columns(self.query_one("#spend", DataTable), SPEND_COLUMNS)

    def show_stats(self, stats: dict[str, Any]) -> None:
        models = stats.get("models") or {}
        cache = stats.get("cache") or {}
        self._ensure_columns()  # stats may arrive before on_mount
        with self.app.batch_update():
            table = self.query_one("#models", DataTable)
            table.border_title = models_title(stats.get("model_swap"))
            sync_rows(table, {n: model_cells(n, m) for n, m in sorted(models.items())})
            sync_rows(self.query_one("#routes", DataTable), route_rows(stats.get("routes") or {}))
            sync_rows(self.query_one("#spend", DataTable), spend_rows(stats.get("spend") or []))
            hits, lookups = cache.get("hits", 0), cache.get("lookups", 0)
            self.query_one("#cache", MetricTile).show(
                f"{fmt_int(hits)}/{fmt_int(lookups)} ({fmt_pct(ratio(hits, lookups))})"
            )
            self.query_one("#escalations", MetricTile).show(fmt_int(stats.get("escalations", 0)))
            total = sum(m.get("cost_per_hour_usd") or 0.0 for m in models.values())
            self.query_one("#cost_h", MetricTile).show(fmt_usd(total))
