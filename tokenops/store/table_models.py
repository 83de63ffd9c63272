"""SQLModel classes of every store table.

The classes describe the current schema for sessions and for the telemetry
writer's column conversion; the DDL itself lives in :mod:`tokenops.store.migrations`
(frozen per version) and ``tests/store/test_migrations.py`` checks the two agree.

Conventions: timestamps are naive UTC ``TIMESTAMP``; JSON payloads are ``VARCHAR``
holding JSON text (DuckDB's ``json_*`` functions read them); ``*_s`` are seconds.

The three telemetry tables (``requests``, ``engine_stats``, ``expert_load``) are
append-only and have no primary-key constraint in the database, so bulk inserts
stay fast; the keys declared here only satisfy the ORM mapper.

``engine_stats`` counters (``prefix_cache_*``, ``num_preemptions``, ``*_tokens_total``)
are cumulative since the engine started, like Prometheus counters; queries take
their increase per replica. ``expert_load.tokens`` counts tokens routed to one
expert during the interval that ends at ``ts``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from tokenops.store.batch_tables import BatchRow, FileRow


def _col(sa_type: Any, *, primary_key: bool = False, nullable: bool = True, is_json: bool = False) -> Any:
    """A field with an explicit SQL type (SQLModel's defaults would pick REAL for float).

    ``is_json`` marks VARCHAR columns holding JSON text: the writer serialises
    non-string values put there."""
    kwargs = {"info": {"json": True}} if is_json else {}
    return Field(default=None, primary_key=primary_key, sa_type=sa_type, nullable=nullable, sa_column_kwargs=kwargs)


STR, INT, BIGINT, DOUBLE, BOOL, TS = sa.String, sa.Integer, sa.BigInteger, sa.Double, sa.Boolean, sa.DateTime

# ---------------------------------------------------------------------------
# telemetry (batched writer)
# ---------------------------------------------------------------------------


class RequestRow(SQLModel, table=True):
    """One row per request handled by the gateway, with every pipeline decision."""

    __tablename__ = "requests"

    id: str = _col(STR, primary_key=True, nullable=False)
    ts: datetime | None = _col(TS)  # arrival
    tenant: str | None = _col(STR)
    api_key_id: str | None = _col(STR)
    model_requested: str | None = _col(STR)
    model_served: str | None = _col(STR)
    backend: str | None = _col(STR)
    route_reason: str | None = _col(STR)
    router: str | None = _col(STR)
    replica: str | None = _col(STR)
    cache_hit: bool | None = _col(BOOL)
    escalated: bool | None = _col(BOOL)
    ensemble_members: str | None = _col(STR, is_json=True)  # JSON list of models
    tokens_in: int | None = _col(BIGINT)
    tokens_out: int | None = _col(BIGINT)
    tokens_cached: int | None = _col(BIGINT)
    ttft_s: float | None = _col(DOUBLE)
    tpot_s: float | None = _col(DOUBLE)
    e2e_s: float | None = _col(DOUBLE)
    status: str | None = _col(STR)  # ok | error | rejected | disconnected (RequestRecord.outcome)
    error_kind: str | None = _col(STR)
    http_status: int | None = _col(INT)
    stream: bool | None = _col(BOOL)
    cost_usd: float | None = _col(DOUBLE)
    decisions: str | None = _col(STR, is_json=True)
    #: Of tokens_out, those spent thinking (reasoning models), when counted (migration 6 appends it).
    reasoning_tokens: int | None = _col(BIGINT)
    #: The batch a request ran for, and its priority class ("interactive" | "batch"; migration 11).
    batch_id: str | None = _col(STR)
    priority_class: str | None = _col(STR)


class EngineStatsRow(SQLModel, table=True):
    """A snapshot of one engine replica, written about once a second."""

    __tablename__ = "engine_stats"

    ts: datetime = _col(TS, primary_key=True, nullable=False)
    replica: str = _col(STR, primary_key=True, nullable=False)
    model: str | None = _col(STR)
    num_running: int | None = _col(INT)
    num_waiting: int | None = _col(INT)
    kv_cache_usage: float | None = _col(DOUBLE)  # 0..1
    kv_blocks_used: int | None = _col(INT)
    kv_blocks_total: int | None = _col(INT)
    prefix_cache_queries: int | None = _col(BIGINT)  # cumulative, in tokens
    prefix_cache_hits: int | None = _col(BIGINT)  # cumulative, in tokens
    num_preemptions: int | None = _col(BIGINT)  # cumulative
    batch_tokens: int | None = _col(INT)  # tokens in the last step
    step_time_s: float | None = _col(DOUBLE)
    gen_tokens_total: int | None = _col(BIGINT)
    prompt_tokens_total: int | None = _col(BIGINT)
    spec_acceptance: float | None = _col(DOUBLE)  # None without speculative decoding


class ExpertLoadRow(SQLModel, table=True):
    """Tokens routed to one MoE expert of one layer during the interval ending at ``ts``."""

    __tablename__ = "expert_load"

    ts: datetime = _col(TS, primary_key=True, nullable=False)
    model: str | None = _col(STR)
    replica: str = _col(STR, primary_key=True, nullable=False)
    layer: int = _col(INT, primary_key=True, nullable=False)
    expert: int = _col(INT, primary_key=True, nullable=False)
    tokens: int | None = _col(BIGINT)


# ---------------------------------------------------------------------------
# low-rate entities (SQLModel sessions)
# ---------------------------------------------------------------------------


class CapabilityProfile(SQLModel, table=True):
    """Quality of one model on one dimension (a task suite), with its confidence interval."""

    __tablename__ = "capability_profiles"

    model: str = _col(STR, primary_key=True, nullable=False)
    dimension: str = _col(STR, primary_key=True, nullable=False)
    score: float | None = _col(DOUBLE)
    ci_low: float | None = _col(DOUBLE)
    ci_high: float | None = _col(DOUBLE)
    n: int | None = _col(INT)
    updated_at: datetime | None = _col(TS)
    source: str | None = _col(STR)


config_change_id_seq = sa.Sequence("config_changes_id_seq")


class ConfigChange(SQLModel, table=True):
    """Audit of one live tunable change."""

    __tablename__ = "config_changes"

    # duckdb-engine cannot create SERIAL columns: the id comes from an explicit sequence.
    id: int | None = Field(
        default=None,
        sa_column=sa.Column(
            sa.BigInteger, config_change_id_seq, server_default=config_change_id_seq.next_value(), primary_key=True
        ),
    )
    ts: datetime | None = _col(TS)
    name: str = _col(STR, nullable=False)
    old_value: str | None = _col(STR, is_json=True)
    new_value: str | None = _col(STR, is_json=True)
    actor: str | None = _col(STR)
    source: str | None = _col(STR)  # admin-api | tui | tune | config


class BenchRun(SQLModel, table=True):
    """One ``tokenops bench`` invocation."""

    __tablename__ = "bench_runs"

    id: str = _col(STR, primary_key=True, nullable=False)
    ts: datetime | None = _col(TS)
    target: str | None = _col(STR)  # base URL
    workload: str | None = _col(STR)
    options: str | None = _col(STR, is_json=True)
    notes: str | None = _col(STR)


class BenchResult(SQLModel, table=True):
    """Aggregates of one step (one offered rate or concurrency) of a bench run."""

    __tablename__ = "bench_results"

    run_id: str = _col(STR, primary_key=True, nullable=False)
    step: int = _col(INT, primary_key=True, nullable=False)
    mode: str | None = _col(STR)  # poisson | constant | concurrency | throughput
    rate: float | None = _col(DOUBLE)  # req/s offered, or the concurrency
    num_requests: int | None = _col(INT)
    num_errors: int | None = _col(INT)
    duration_s: float | None = _col(DOUBLE)
    throughput_rps: float | None = _col(DOUBLE)
    input_tok_s: float | None = _col(DOUBLE)
    output_tok_s: float | None = _col(DOUBLE)
    ttft_p50: float | None = _col(DOUBLE)
    ttft_p90: float | None = _col(DOUBLE)
    ttft_p95: float | None = _col(DOUBLE)
    ttft_p99: float | None = _col(DOUBLE)
    tpot_p50: float | None = _col(DOUBLE)
    tpot_p90: float | None = _col(DOUBLE)
    tpot_p95: float | None = _col(DOUBLE)
    tpot_p99: float | None = _col(DOUBLE)
    itl_p50: float | None = _col(DOUBLE)
    itl_p90: float | None = _col(DOUBLE)
    itl_p95: float | None = _col(DOUBLE)
    itl_p99: float | None = _col(DOUBLE)
    e2e_p50: float | None = _col(DOUBLE)
    e2e_p90: float | None = _col(DOUBLE)
    e2e_p95: float | None = _col(DOUBLE)
    e2e_p99: float | None = _col(DOUBLE)
    goodput_rps: float | None = _col(DOUBLE)  # requests/s that met every SLO
    slo_attainment: float | None = _col(DOUBLE)  # 0..1


class TuneTrial(SQLModel, table=True):
    """One trial of a ``tokenops tune`` study."""

    __tablename__ = "tune_trials"

    id: str = _col(STR, primary_key=True, nullable=False)
    ts: datetime | None = _col(TS)
    study: str = _col(STR, nullable=False)
    trial: int = _col(INT, nullable=False)
    params: str | None = _col(STR, is_json=True)
    goodput: float | None = _col(DOUBLE)
    status: str | None = _col(STR)  # complete | pruned | failed | infeasible
    slo: str | None = _col(STR, is_json=True)
    metrics: str | None = _col(STR, is_json=True)
    is_best: bool | None = _col(BOOL)


class ApiKeyRow(SQLModel, table=True):
    """A managed API key (``/admin/keys``); the secret is kept only as its SHA-256."""

    __tablename__ = "api_keys"

    id: str = _col(STR, primary_key=True, nullable=False)
    tenant: str = _col(STR, nullable=False)
    key_hash: str = _col(STR, nullable=False)
    key_prefix: str | None = _col(STR)
    name: str | None = _col(STR)
    models: str | None = _col(STR, is_json=True)  # JSON list; NULL: every model
    rpm: float | None = _col(DOUBLE)
    tpm: float | None = _col(DOUBLE)
    budget_usd: float | None = _col(DOUBLE)
    budget_period: str | None = _col(STR)  # daily | monthly | <N>h
    soft_budget_usd: float | None = _col(DOUBLE)
    created_at: datetime | None = _col(TS)
    expires_at: datetime | None = _col(TS)
    revoked_at: datetime | None = _col(TS)


class TenantRow(SQLModel, table=True):
    """A tenant known to the key registry, with its optional spend budget."""

    __tablename__ = "tenants"

    name: str = _col(STR, primary_key=True, nullable=False)
    budget_usd: float | None = _col(DOUBLE)
    budget_period: str | None = _col(STR)
    soft_budget_usd: float | None = _col(DOUBLE)
    created_at: datetime | None = _col(TS)


class StoredResponseRow(SQLModel, table=True):
    """A ``/v1/responses`` answer kept for ``previous_response_id`` and ``GET /v1/responses/{id}``
    (:mod:`tokenops.store.stored_responses`). ``input_items`` holds this turn's own input (the
    earlier turns are the rows ``previous_response_id`` links to; rows stored before migration 10
    hold the whole conversation: ``is_whole``); ``response`` the Response object as sent, both JSON.
    ``num_bytes`` is the row's size, ``chain_bytes`` and ``chain_items`` the sums over its chain
    (output items included). A deleted or evicted response that a later one still links to stays
    as a link only (``is_hidden``)."""

    __tablename__ = "stored_responses"

    id: str = _col(STR, primary_key=True, nullable=False)
    tenant: str = _col(STR, nullable=False)
    created_at: datetime = _col(TS, nullable=False)
    model: str | None = _col(STR)
    previous_response_id: str | None = _col(STR)
    input_items: str | None = _col(STR, is_json=True)
    response: str | None = _col(STR, is_json=True)
    num_bytes: int | None = _col(BIGINT)
    chain_bytes: int | None = _col(BIGINT)
    chain_items: int | None = _col(INT)
    is_whole: bool | None = _col(BOOL)
    is_hidden: bool | None = _col(BOOL)


class ImageRequestRow(SQLModel, table=True):
    """One row per ``/v1/images/generations`` request: the denoising path it ran.

    ``steps`` counts denoising steps, ``deep_steps`` those that ran the UNet's deep
    path (the others reused it from the step cache): ``cache_reuse_ratio`` is
    ``1 - deep_steps / steps``. The same request also has its ``requests`` row."""

    __tablename__ = "image_requests"

    id: str = _col(STR, primary_key=True, nullable=False)
    ts: datetime | None = _col(TS)
    tenant: str | None = _col(STR)
    model: str | None = _col(STR)
    replica: str | None = _col(STR)
    num_images: int | None = _col(INT)
    size: str | None = _col(STR)
    class_index: int | None = _col(INT)
    sampler: str | None = _col(STR)
    steps: int | None = _col(INT)
    deep_steps: int | None = _col(INT)
    cache_threshold: float | None = _col(DOUBLE)
    cache_reuse_ratio: float | None = _col(DOUBLE)
    e2e_s: float | None = _col(DOUBLE)
    status: str | None = _col(STR)
    http_status: int | None = _col(INT)


class DistillPairRow(SQLModel, table=True):
    """One captured (prompt messages, teacher answer) pair of an opted-in tenant and model
    (``distill_capture`` plugin); ``messages`` is the request's chat messages as JSON."""

    __tablename__ = "distill_pairs"

    id: str = _col(STR, primary_key=True, nullable=False)
    ts: datetime | None = _col(TS)
    tenant: str | None = _col(STR)
    model: str | None = _col(STR)
    messages: str | None = _col(STR, is_json=True)
    answer: str | None = _col(STR)
    prompt_tokens: int | None = _col(INT)
    completion_tokens: int | None = _col(INT)
    #: Why the answer ended ("stop", "length": truncated at max_tokens) and the teacher's mean
    #: token logprob over ``num_logprobs`` answer tokens (None when the backend gave none):
    #: the quality filters of ``tokenops distill`` (migration 8).
    finish_reason: str | None = _col(STR)
    mean_logprob: float | None = _col(DOUBLE)
    num_logprobs: int | None = _col(INT)


#: Tables the batched writer accepts (the rest go through sessions).
TELEMETRY_MODELS: dict[str, type[SQLModel]] = {
    m.__tablename__: m for m in (RequestRow, EngineStatsRow, ExpertLoadRow, ImageRequestRow, DistillPairRow)
}
ALL_MODELS: dict[str, type[SQLModel]] = {
    m.__tablename__: m
    for m in (
        RequestRow,
        EngineStatsRow,
        ExpertLoadRow,
        CapabilityProfile,
        ConfigChange,
        BenchRun,
        BenchResult,
        TuneTrial,
        ApiKeyRow,
        TenantRow,
        ImageRequestRow,
        DistillPairRow,
        StoredResponseRow,
        FileRow,
        BatchRow,
    )
}


def column_kinds(table: str) -> list[tuple[str, str]]:
    """``(column, kind)`` pairs in table order; kind is str, json, int, float, bool or ts."""
    out = []
    # SQLModel's annotations declare __table__ only as the metaclass sets it on table=True classes
    for col in ALL_MODELS[table].__table__.columns:  # type: ignore[attr-defined]
        t = col.type
        if col.info.get("json"):
            kind = "json"
        elif isinstance(t, sa.DateTime):
            kind = "ts"
        elif isinstance(t, sa.Boolean):
            kind = "bool"
        elif isinstance(t, sa.Integer):  # BigInteger is a subclass
            kind = "int"
        elif isinstance(t, (sa.Double, sa.Float)):
            kind = "float"
        else:
            kind = "str"
        out.append((col.name, kind))
    return out
