"""Numbered schema migrations, recorded in ``schema_migrations``.

Each entry of :data:`MIGRATIONS` is ``(number, name, step)`` where ``step`` is
SQL text (statements separated by ``;``) or a callable taking the DuckDB
connection. A migration is never edited once released: change the schema by
appending a new one (and updating :mod:`tokenops.store.table_models`, which a test
compares with the migrated schema). Each migration runs in its own transaction
together with its ``schema_migrations`` row, so a crash leaves a file at a
whole version.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import duckdb

Step = str | Callable[[duckdb.DuckDBPyConnection], None]

_TELEMETRY = """
CREATE TABLE requests (
    id VARCHAR NOT NULL, ts TIMESTAMP, tenant VARCHAR, api_key_id VARCHAR,
    model_requested VARCHAR, model_served VARCHAR, backend VARCHAR,
    route_reason VARCHAR, router VARCHAR, replica VARCHAR,
    cache_hit BOOLEAN, escalated BOOLEAN, ensemble_members VARCHAR,
    tokens_in BIGINT, tokens_out BIGINT, tokens_cached BIGINT,
    ttft_s DOUBLE, tpot_s DOUBLE, e2e_s DOUBLE,
    status VARCHAR, error_kind VARCHAR, http_status INTEGER, stream BOOLEAN,
    cost_usd DOUBLE, decisions VARCHAR
);
CREATE TABLE engine_stats (
    ts TIMESTAMP NOT NULL, replica VARCHAR NOT NULL, model VARCHAR,
    num_running INTEGER, num_waiting INTEGER, kv_cache_usage DOUBLE,
    kv_blocks_used INTEGER, kv_blocks_total INTEGER,
    prefix_cache_queries BIGINT, prefix_cache_hits BIGINT, num_preemptions BIGINT,
    batch_tokens INTEGER, step_time_s DOUBLE,
    gen_tokens_total BIGINT, prompt_tokens_total BIGINT, spec_acceptance DOUBLE
);
CREATE TABLE expert_load (
    ts TIMESTAMP NOT NULL, model VARCHAR, replica VARCHAR NOT NULL,
    layer INTEGER NOT NULL, expert INTEGER NOT NULL, tokens BIGINT
);
"""

_AUDIT_AND_PROFILES = """
CREATE SEQUENCE config_changes_id_seq;
CREATE TABLE config_changes (
    id BIGINT DEFAULT nextval('config_changes_id_seq') PRIMARY KEY,
    ts TIMESTAMP, name VARCHAR NOT NULL, old_value VARCHAR, new_value VARCHAR,
    actor VARCHAR, source VARCHAR
);
CREATE TABLE capability_profiles (
    model VARCHAR NOT NULL, dimension VARCHAR NOT NULL,
    score DOUBLE, ci_low DOUBLE, ci_high DOUBLE, n INTEGER,
    updated_at TIMESTAMP, source VARCHAR,
    PRIMARY KEY (model, dimension)
);
"""

_BENCH_AND_TUNE = """
CREATE TABLE bench_runs (
    id VARCHAR PRIMARY KEY, ts TIMESTAMP, target VARCHAR, workload VARCHAR,
    options VARCHAR, notes VARCHAR
);
CREATE TABLE bench_results (
    run_id VARCHAR NOT NULL, step INTEGER NOT NULL, mode VARCHAR, rate DOUBLE,
    num_requests INTEGER, num_errors INTEGER, duration_s DOUBLE,
    throughput_rps DOUBLE, input_tok_s DOUBLE, output_tok_s DOUBLE,
    ttft_p50 DOUBLE, ttft_p90 DOUBLE, ttft_p95 DOUBLE, ttft_p99 DOUBLE,
    tpot_p50 DOUBLE, tpot_p90 DOUBLE, tpot_p95 DOUBLE, tpot_p99 DOUBLE,
    itl_p50 DOUBLE, itl_p90 DOUBLE, itl_p95 DOUBLE, itl_p99 DOUBLE,
    e2e_p50 DOUBLE, e2e_p90 DOUBLE, e2e_p95 DOUBLE, e2e_p99 DOUBLE,
    goodput_rps DOUBLE, slo_attainment DOUBLE,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE tune_trials (
    id VARCHAR PRIMARY KEY, ts TIMESTAMP, study VARCHAR NOT NULL, trial INTEGER NOT NULL,
    params VARCHAR, goodput DOUBLE, status VARCHAR, slo VARCHAR, metrics VARCHAR,
    is_best BOOLEAN
);
"""

_API_KEYS = """
CREATE TABLE api_keys (
    id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, key_hash VARCHAR NOT NULL, key_prefix VARCHAR,
    name VARCHAR, models VARCHAR, rpm DOUBLE, tpm DOUBLE,
    budget_usd DOUBLE, budget_period VARCHAR, soft_budget_usd DOUBLE,
    created_at TIMESTAMP, expires_at TIMESTAMP, revoked_at TIMESTAMP
);
CREATE TABLE tenants (
    name VARCHAR PRIMARY KEY, budget_usd DOUBLE, budget_period VARCHAR, soft_budget_usd DOUBLE,
    created_at TIMESTAMP
)
"""

_IMAGE_REQUESTS = """
CREATE TABLE image_requests (
    id VARCHAR NOT NULL, ts TIMESTAMP, tenant VARCHAR, model VARCHAR, replica VARCHAR,
    num_images INTEGER, size VARCHAR, class_index INTEGER, sampler VARCHAR,
    steps INTEGER, deep_steps INTEGER, cache_threshold DOUBLE, cache_reuse_ratio DOUBLE,
    e2e_s DOUBLE, status VARCHAR, http_status INTEGER
);
"""

_DISTILL_PAIRS = """
CREATE TABLE distill_pairs (
    id VARCHAR NOT NULL, ts TIMESTAMP, tenant VARCHAR, model VARCHAR, messages VARCHAR, answer VARCHAR,
    prompt_tokens INTEGER, completion_tokens INTEGER
);
"""

_STORED_RESPONSES = """
CREATE TABLE stored_responses (
    id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, model VARCHAR,
    previous_response_id VARCHAR, input_items VARCHAR, response VARCHAR, num_bytes BIGINT
);
CREATE INDEX stored_responses_tenant ON stored_responses (tenant, created_at);
"""

# A response keeps only its own turn and links to the one before; rows written before hold the
# whole conversation (is_whole) and end a chain walk. chain_bytes / chain_items sum the chain up to
# and including the row, so a new turn is checked against the bounds without reading the chain.
_LINKED_RESPONSES = """
ALTER TABLE stored_responses ADD COLUMN chain_bytes BIGINT;
ALTER TABLE stored_responses ADD COLUMN chain_items INTEGER;
ALTER TABLE stored_responses ADD COLUMN is_whole BOOLEAN;
ALTER TABLE stored_responses ADD COLUMN is_hidden BOOLEAN;
UPDATE stored_responses SET chain_bytes = num_bytes, is_whole = true, is_hidden = false,
    chain_items = coalesce(json_array_length(input_items), 0) + coalesce(json_array_length(response, '$.output'), 0)
"""

# The Batch API (tokenops/store/batch_store.py): uploaded and written files, batches; a request
# row says which batch it ran for and its priority class.
_BATCHES = """
CREATE TABLE files (
    id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, purpose VARCHAR NOT NULL, filename VARCHAR,
    num_bytes BIGINT, num_lines INTEGER, created_at TIMESTAMP NOT NULL, batch_id VARCHAR
);
CREATE INDEX files_tenant ON files (tenant, created_at);
CREATE TABLE batches (
    id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, api_key_id VARCHAR, endpoint VARCHAR NOT NULL,
    input_file_id VARCHAR NOT NULL, completion_window VARCHAR, window_s DOUBLE, status VARCHAR NOT NULL,
    output_file_id VARCHAR, error_file_id VARCHAR, metadata_json VARCHAR, errors_json VARCHAR,
    num_total INTEGER, num_completed INTEGER, num_failed INTEGER, created_at TIMESTAMP NOT NULL,
    in_progress_at TIMESTAMP, expires_at TIMESTAMP, finalizing_at TIMESTAMP, completed_at TIMESTAMP,
    failed_at TIMESTAMP, expired_at TIMESTAMP, cancelling_at TIMESTAMP, cancelled_at TIMESTAMP
);
CREATE INDEX batches_tenant ON batches (tenant, created_at);
ALTER TABLE requests ADD COLUMN batch_id VARCHAR;
ALTER TABLE requests ADD COLUMN priority_class VARCHAR
"""

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "telemetry tables", _TELEMETRY),
    (2, "config audit and capability profiles", _AUDIT_AND_PROFILES),
    (3, "bench and tune results", _BENCH_AND_TUNE),
    (4, "managed api keys and tenants", _API_KEYS),
    (5, "image requests", _IMAGE_REQUESTS),
    (6, "reasoning tokens per request", "ALTER TABLE requests ADD COLUMN reasoning_tokens BIGINT"),
    (7, "captured teacher answers for distillation", _DISTILL_PAIRS),
    (
        8,
        "finish reason and teacher confidence of captured pairs",
        "ALTER TABLE distill_pairs ADD COLUMN finish_reason VARCHAR; "
        "ALTER TABLE distill_pairs ADD COLUMN mean_logprob DOUBLE; "
        "ALTER TABLE distill_pairs ADD COLUMN num_logprobs INTEGER",
    ),
    (9, "stored responses of /v1/responses", _STORED_RESPONSES),
    (10, "stored responses linked by previous_response_id", _LINKED_RESPONSES),
    (11, "batch api files and batches", _BATCHES),
    (
        12,
        "files that expire, and the expiry of a batch's output files",
        "ALTER TABLE files ADD COLUMN expires_at TIMESTAMP; ALTER TABLE batches ADD COLUMN output_expires_s INTEGER",
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]

_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL
)
"""


def utcnow() -> datetime:
    """Naive UTC now, the store's timestamp convention."""
    return datetime.now(UTC).replace(tzinfo=None)


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The highest applied migration, 0 for a file without the ledger."""
    exists = _scalar(
        con,
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations' AND table_schema = 'main'",
    )
    if not exists:
        return 0
    return _scalar(con, "SELECT coalesce(max(version), 0) FROM schema_migrations")


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    row = con.execute(sql).fetchone()
    assert row is not None  # an aggregate without GROUP BY always returns one row
    return row[0]


def _run_step(con: duckdb.DuckDBPyConnection, step: Step) -> None:
    if callable(step):
        step(con)
        return
    for statement in step.split(";"):
        if statement.strip():
            con.execute(statement)


def apply_migrations(con: duckdb.DuckDBPyConnection, upto: int | None = None) -> list[int]:
    """Apply every missing migration up to ``upto`` (default: all); returns the numbers applied."""
    numbers = [n for n, _, _ in MIGRATIONS]
    assert numbers == sorted(set(numbers)) and numbers[0] == 1, "migrations must be numbered 1, 2, ... in order"
    con.execute(_LEDGER)
    have = current_version(con)
    applied = []
    for number, name, step in MIGRATIONS:
        if number <= have or (upto is not None and number > upto):
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            _run_step(con, step)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [number, name, utcnow()])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        applied.append(number)
    return applied
