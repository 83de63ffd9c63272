"""Named queries: the only SQL the admin API (``GET /admin/query/{name}``), the
dashboard and ``tokenops report`` run against the store.

:data:`QUERIES` maps a name to a :class:`NamedQuery` (SQL, description,
parameters). :func:`run_query` converts parameters from strings (the admin API
passes query-string values), runs the query on its own cursor and returns
``{"columns": [...], "rows": [[...], ...]}`` with JSON-ready values (timestamps
as ISO-8601 strings, naive UTC).

Latency percentiles count successful requests only (``status = 'ok'``).

For an HTTP front end: :class:`UnknownQueryError` is a 404, any other
:class:`QueryError` a 400; :func:`describe` lists the queries and parameters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from tokenops.store.errors import StoreError


class QueryError(StoreError):
    """A bad parameter for a named query."""


class UnknownQueryError(QueryError):
    """No named query has this name."""


@dataclass(frozen=True, slots=True)
class QueryParam:
    name: str
    kind: str  # since | int | float | str
    default: Any
    help: str


@dataclass(frozen=True, slots=True)
class NamedQuery:
    name: str
    sql: str
    description: str
    params: tuple[QueryParam, ...] = ()


SINCE = QueryParam("since", "since", "7d", "start of the window: 7d, 24h, 30m, 2026-11-01, an ISO time, or all")
LIMIT = QueryParam("limit", "int", 50, "maximum number of rows")

_MODEL = "coalesce(model_served, model_requested)"

_QUERIES = [
    NamedQuery(
        "usage_by_model_day",
        f"""
        SELECT CAST(ts AS DATE) AS day, {_MODEL} AS model,
               count(*) AS requests,
               count(*) FILTER (WHERE status = 'error') AS errors,
               count(*) FILTER (WHERE status = 'rejected') AS rejected,
               count(*) FILTER (WHERE status = 'disconnected') AS disconnected,
               coalesce(sum(tokens_in), 0) AS tokens_in,
               coalesce(sum(tokens_out), 0) AS tokens_out,
               coalesce(sum(tokens_cached), 0) AS tokens_cached,
               coalesce(sum(cost_usd), 0.0) AS cost_usd,
               quantile_cont(ttft_s, 0.5) FILTER (WHERE status = 'ok') AS ttft_p50,
               quantile_cont(ttft_s, 0.95) FILTER (WHERE status = 'ok') AS ttft_p95,
               quantile_cont(e2e_s, 0.5) FILTER (WHERE status = 'ok') AS e2e_p50,
               quantile_cont(e2e_s, 0.95) FILTER (WHERE status = 'ok') AS e2e_p95
        FROM requests WHERE ts >= $since
        GROUP BY ALL ORDER BY day, model
        """,
        "Requests, tokens in/out/cached, cost and TTFT/E2E p50/p95 by model and day.",
        (SINCE,),
    ),
    NamedQuery(
        "latency_by_model_hour",
        f"""
        SELECT hour, model, requests,
               ttft[1] AS ttft_p50, ttft[2] AS ttft_p95, tpot[1] AS tpot_p50, tpot[2] AS tpot_p95,
               e2e[1] AS e2e_p50, e2e[2] AS e2e_p95
        FROM (
            SELECT date_trunc('hour', ts) AS hour, {_MODEL} AS model, count(*) AS requests,
                   quantile_cont(ttft_s, [0.5, 0.95]) AS ttft,
                   quantile_cont(tpot_s, [0.5, 0.95]) AS tpot,
                   quantile_cont(e2e_s, [0.5, 0.95]) AS e2e
            FROM requests WHERE ts >= $since AND status = 'ok'
            GROUP BY ALL
        ) ORDER BY hour, model
        """,
        "TTFT, TPOT and E2E p50/p95 of successful requests by model and hour.",
        (SINCE,),
    ),
    NamedQuery(
        "cache_hit_rates",
        f"""
        WITH gateway AS (
            SELECT 'gateway' AS cache, {_MODEL} AS model, count(*) AS lookups,
                   count(*) FILTER (WHERE cache_hit) AS hits
            FROM requests WHERE ts >= $since GROUP BY ALL
        ), steps AS (
            SELECT model, prefix_cache_queries AS q, prefix_cache_hits AS h,
                   lag(prefix_cache_queries) OVER w AS prev_q, lag(prefix_cache_hits) OVER w AS prev_h
            FROM engine_stats WHERE ts >= $since
            WINDOW w AS (PARTITION BY replica, model ORDER BY ts)
        ), prefix AS (
            -- counters are cumulative; a drop means the engine restarted from zero
            SELECT 'prefix' AS cache, model,
                   CAST(coalesce(sum(CASE WHEN q >= prev_q THEN q - prev_q ELSE q END), 0) AS BIGINT) AS lookups,
                   CAST(coalesce(sum(CASE WHEN h >= prev_h THEN h - prev_h ELSE h END), 0) AS BIGINT) AS hits
            FROM steps WHERE prev_q IS NOT NULL GROUP BY ALL
        )
        SELECT cache, model, lookups, hits,
               CASE WHEN lookups > 0 THEN hits / lookups END AS hit_rate
        FROM (SELECT * FROM gateway UNION ALL SELECT * FROM prefix)
        ORDER BY cache, model
        """,
        "Gateway response-cache hits per request and engine prefix-cache hits per prompt token, by model.",
        (SINCE,),
    ),
    NamedQuery(
        "recent_requests",
        """
        SELECT id, ts, tenant, model_requested, model_served, backend, replica, router, route_reason,
               status, error_kind, http_status, stream, cache_hit, escalated,
               tokens_in, tokens_out, tokens_cached, ttft_s, tpot_s, e2e_s, cost_usd
        FROM requests ORDER BY ts DESC, id DESC LIMIT $limit
        """,
        "The latest requests, newest first.",
        (LIMIT,),
    ),
    NamedQuery(
        "config_changes",
        "SELECT id, ts, name, old_value, new_value, actor, source FROM config_changes ORDER BY id DESC LIMIT $limit",
        "Audit of live tunable changes, newest first.",
        (QueryParam("limit", "int", 100, "maximum number of rows"),),
    ),
    NamedQuery(
        "route_reasons",
        """
        SELECT model_requested, model_served, router, route_reason, count(*) AS requests,
               count(*) / sum(count(*)) OVER () AS share,
               count(*) FILTER (WHERE escalated) AS escalated,
               max(ensemble_members) AS ensemble_members
        FROM requests WHERE ts >= $since
        GROUP BY ALL ORDER BY requests DESC, model_served, route_reason
        """,
        "How requests were routed: requested vs served model, router and reason, with shares.",
        (SINCE,),
    ),
    NamedQuery(
        "expert_load_latest",
        """
        WITH latest AS (
            SELECT model, max(ts) AS ts FROM expert_load
            WHERE $model IS NULL OR model = $model GROUP BY model
        )
        SELECT model, layer, expert, tokens,
               tokens / sum(tokens) OVER (PARTITION BY model, layer) AS share
        FROM (
            SELECT e.model, e.layer, e.expert, sum(e.tokens) AS tokens
            FROM expert_load e JOIN latest l ON e.model IS NOT DISTINCT FROM l.model
            WHERE e.ts > l.ts - to_microseconds(CAST($window_s * 1e6 AS BIGINT))
            GROUP BY e.model, e.layer, e.expert
        ) ORDER BY model, layer, expert
        """,
        "Tokens per MoE expert and layer over the last window_s seconds of each model's data.",
        (
            QueryParam("model", "str", None, "only this model"),
            QueryParam("window_s", "float", 60.0, "window length in seconds"),
        ),
    ),
    NamedQuery(
        "engine_stats_recent",
        """
        SELECT * FROM engine_stats WHERE $replica IS NULL OR replica = $replica
        ORDER BY ts DESC LIMIT $limit
        """,
        "The latest engine snapshots, newest first.",
        (
            QueryParam("replica", "str", None, "only this replica"),
            QueryParam("limit", "int", 120, "maximum number of rows"),
        ),
    ),
    NamedQuery(
        "images_by_model_hour",
        """
        SELECT date_trunc('hour', ts) AS hour, model, sampler,
               count(*) AS requests,
               count(*) FILTER (WHERE status = 'error') AS errors,
               coalesce(sum(num_images) FILTER (WHERE status = 'ok'), 0) AS images,
               avg(steps) FILTER (WHERE status = 'ok') AS steps_avg,
               avg(cache_reuse_ratio) FILTER (WHERE status = 'ok') AS cache_reuse,
               quantile_cont(e2e_s, 0.5) FILTER (WHERE status = 'ok') AS e2e_p50,
               quantile_cont(e2e_s, 0.95) FILTER (WHERE status = 'ok') AS e2e_p95
        FROM image_requests WHERE ts >= $since
        GROUP BY ALL ORDER BY hour, model, sampler
        """,
        "Image requests by model, sampler and hour: images, mean denoising steps, step-cache reuse ratio, E2E p50/p95.",
        (SINCE,),
    ),
    NamedQuery(
        "bench_results",
        """
        SELECT r.id AS run_id, r.ts, r.target, r.workload, b.* EXCLUDE (run_id)
        FROM bench_runs r JOIN bench_results b ON b.run_id = r.id
        WHERE $run_id IS NULL OR r.id = $run_id
        ORDER BY r.ts DESC, b.step LIMIT $limit
        """,
        "Per-step results of bench runs, newest run first.",
        (QueryParam("run_id", "str", None, "only this run"), QueryParam("limit", "int", 200, "maximum number of rows")),
    ),
    NamedQuery(
        "bench_runs",
        """
        SELECT r.id AS run_id, r.ts, r.target, r.workload, count(b.step) AS levels,
               sum(b.num_requests) AS requests, sum(b.num_errors) AS errors,
               max(b.throughput_rps) AS max_throughput_rps, max(b.goodput_rps) AS max_goodput_rps,
               min(b.ttft_p50) AS best_ttft_p50
        FROM bench_runs r LEFT JOIN bench_results b ON b.run_id = r.id
        WHERE r.ts >= $since
        GROUP BY ALL ORDER BY r.ts DESC, r.id LIMIT $limit
        """,
        "One line per bench run (newest first): levels, requests, errors, best throughput, goodput and TTFT p50.",
        (SINCE, LIMIT),
    ),
    NamedQuery(
        "tune_trials",
        """
        SELECT id, ts, study, trial, status, goodput, is_best, params, slo, metrics FROM tune_trials
        WHERE $study IS NULL OR study = $study ORDER BY ts DESC, trial DESC LIMIT $limit
        """,
        "Trials of tune studies, newest first.",
        (
            QueryParam("study", "str", None, "only this study"),
            QueryParam("limit", "int", 200, "maximum number of rows"),
        ),
    ),
]


def _spend_query(name: str, columns: str, what: str) -> NamedQuery:
    return NamedQuery(
        name,
        f"""
        SELECT {columns}, {_MODEL} AS model,
               count(*) AS requests, count(*) FILTER (WHERE status != 'ok') AS not_ok,
               coalesce(sum(tokens_in), 0) AS tokens_in, coalesce(sum(tokens_out), 0) AS tokens_out,
               coalesce(sum(cost_usd), 0.0) AS cost_usd
        FROM requests WHERE ts >= $since
        GROUP BY ALL ORDER BY cost_usd DESC, {columns.replace(" AS key_id", "")}, model
        """,
        f"Spend per {what} and model: requests (not_ok: refused or failed), tokens, cost in USD "
        "(a cascade's or ensemble's members included in its request's cost).",
        (SINCE,),
    )


_QUERIES += [
    _spend_query("spend_by_tenant", "tenant", "tenant"),
    _spend_query(
        "spend_by_key",
        "tenant, api_key_id AS key_id",
        "API key (key id: a managed key's id, or the first 12 hex of a config key's hash)",
    ),
]

QUERIES: dict[str, NamedQuery] = {q.name: q for q in _QUERIES}

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
#: Window starts are clamped to these (earlier ones mean "all", later ones "nothing yet").
_EPOCH, _END = datetime(1970, 1, 1), datetime(9999, 1, 1)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(value: str | datetime | date | None, now: datetime | None = None) -> datetime:
    """A window start as naive UTC: ``7d``/``24h``/``30m``/``90s``/``2w`` ago,
    ``2026-11-01``, an ISO time (naive means UTC), or ``all``."""
    now = now or datetime.now(UTC).replace(tzinfo=None)
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return datetime(1970, 1, 1)
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    m = _RELATIVE.match(value)
    try:
        if m:
            return max(_EPOCH, now - timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)]))
        parsed = datetime.fromisoformat(value.strip())
        return min(max(_EPOCH, parse_since(parsed)), _END)
    except (ValueError, OverflowError):
        # a window reaching before year 1 (since=999999999999d) or a date a time zone
        # moves out of the calendar: say what can be read
        raise QueryError(
            f"cannot read since={value[:64]!r}; use 7d, 24h, 30m, 2026-11-01, an ISO time (year 1970 to 9999), or all"
        ) from None


#: Integer parameters (row limits, counts) stay in DuckDB's INTEGER range.
_MAX_INT_PARAM = 2**31 - 1


def _convert(param: QueryParam, value: Any) -> Any:
    if value is None:
        return parse_since(param.default) if param.kind == "since" and param.default is not None else None
    try:
        if param.kind == "since":
            return parse_since(value)
        if param.kind == "int":
            number = int(str(value)[:20])
            if not 0 <= number <= _MAX_INT_PARAM:
                raise ValueError
            return number
        if param.kind == "float":
            real = float(value)
            if not math.isfinite(real):
                raise ValueError
            return real
        return str(value)
    except (TypeError, ValueError):
        raise QueryError(
            f"parameter {param.name}={str(value)[:64]!r} is not a valid {param.kind} ({param.help})"
        ) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def bind_params(name: str, params: dict[str, Any]) -> tuple[NamedQuery, dict[str, Any]]:
    """The named query and its converted parameters (defaults filled in)."""
    query = QUERIES.get(name)
    if query is None:
        raise UnknownQueryError(f"unknown query {name!r}; known queries: {', '.join(sorted(QUERIES))}")
    known = {p.name: p for p in query.params}
    extra = sorted(set(params) - set(known))
    if extra:
        allowed = ", ".join(known) or "none"
        raise QueryError(f"query {name!r} takes no parameter(s) {', '.join(extra)}; allowed: {allowed}")
    bound = {}
    for p in query.params:
        value = params.get(p.name)
        bound[p.name] = _convert(p, p.default if value is None else value)
    return query, bound


def run_query(con: Any, name: str, **params: Any) -> dict[str, list]:
    """Run the named query on a new cursor of ``con`` (a DuckDB connection or a Store)."""
    query, bound = bind_params(name, params)
    connection = getattr(con, "connection", con)
    cur = connection.cursor()
    try:
        result = cur.execute(query.sql, bound) if bound else cur.execute(query.sql)
        columns = [d[0] for d in result.description]
        rows = [[_jsonable(v) for v in row] for row in result.fetchall()]
    finally:
        cur.close()
    return {"columns": columns, "rows": rows}


def describe() -> list[dict[str, Any]]:
    """Every named query with its description and parameters (for ``/admin/query``)."""
    return [
        {
            "name": q.name,
            "description": q.description,
            "params": [{"name": p.name, "type": p.kind, "default": p.default, "help": p.help} for p in q.params],
        }
        for q in _QUERIES
    ]
