"""Numbered migrations: fresh files, upgrades of older files, and agreement with the models."""

from __future__ import annotations

import duckdb
import pytest

from tokenops.store import Store, StoreError
from tokenops.store.migrations import LATEST_VERSION, MIGRATIONS, apply_migrations, current_version
from tokenops.store.table_models import ALL_MODELS

_DUCK_TYPES = {"VARCHAR": "VARCHAR", "BIGINT": "BIGINT", "INTEGER": "INTEGER", "DOUBLE": "DOUBLE", "DOUBLE PRECISION": "DOUBLE",
               "BOOLEAN": "BOOLEAN", "TIMESTAMP WITHOUT TIME ZONE": "TIMESTAMP", "TIMESTAMP": "TIMESTAMP"}


def test_fresh_store_has_every_table_and_ledger(tmp_path):
    path = tmp_path / "nested" / "dir" / "t.duckdb"
    with Store.open(path) as store:
        assert path.exists()  # parent folders were created
        assert store.schema_version == LATEST_VERSION == MIGRATIONS[-1][0]
        tables = {r[0] for r in store.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert set(ALL_MODELS) | {"schema_migrations"} <= tables
        ledger = store.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
        assert ledger == [(n, name) for n, name, _ in MIGRATIONS]


def test_schema_matches_sqlmodel_classes(store):
    from duckdb_engine import Dialect

    dialect = Dialect()
    for table, model in ALL_MODELS.items():
        db = store.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
            [table],
        ).fetchall()
        expected = [(c.name, _DUCK_TYPES[c.type.compile(dialect=dialect)]) for c in model.__table__.columns]
        assert db == expected, table


def test_upgrade_from_version_1_keeps_data(tmp_path):
    path = str(tmp_path / "old.duckdb")
    con = duckdb.connect(path)
    assert apply_migrations(con, upto=1) == [1]
    con.execute("INSERT INTO requests (id, model_served, tokens_in) VALUES ('old-1', 'm', 7)")
    con.close()

    with Store.open(path) as store:
        assert store.schema_version == LATEST_VERSION
        assert store.execute("SELECT id, tokens_in FROM requests").fetchall() == [("old-1", 7)]
        applied = [r[0] for r in store.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()]
        assert applied == list(range(1, LATEST_VERSION + 1))
        assert store.record_config_change("x", 1, 2) == 1  # a table from migration 2 works

    with Store.open(path) as store:  # reopening applies nothing
        assert current_version(store.connection) == LATEST_VERSION
        assert apply_migrations(store.connection) == []


def test_read_only_open_refuses_an_old_schema(tmp_path):
    path = str(tmp_path / "old.duckdb")
    con = duckdb.connect(path)
    apply_migrations(con, upto=2)
    con.close()
    with pytest.raises(StoreError, match="schema version 2 and needs"):
        Store.open(path, read_only=True)


def test_file_from_a_newer_tokenops_is_refused(tmp_path):
    path = str(tmp_path / "new.duckdb")
    with Store.open(path) as store:
        store.execute("INSERT INTO schema_migrations VALUES (999, 'future', now()::TIMESTAMP)")
    with pytest.raises(StoreError, match="newer than this tokenops"):
        Store.open(path)


def test_failed_migration_rolls_back(tmp_path, monkeypatch):
    from tokenops.store import migrations

    def broken(con):
        con.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, (LATEST_VERSION + 1, "broken", broken)])
    con = duckdb.connect(str(tmp_path / "b.duckdb"))
    with pytest.raises(RuntimeError, match="boom"):
        migrations.apply_migrations(con)
    assert current_version(con) == LATEST_VERSION
    assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'half_done'").fetchone()[0] == 0
