"""Files that expire with shared state (``[shared] postgres_url``): a database made by the last
version (no ``files.expires_at``, no ``batches.output_expires_s``) gains the columns when a
replica first uses it; expired files read as missing; any replica may sweep them (row, the bytes
in PostgreSQL and its local copy), and a second sweep is harmless. Skips without PostgreSQL
(CI has it)."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
import sqlalchemy as sa
from tokenops.gateway.batches.file_expiry import sweep
from tokenops.store.batch_tables import BatchRow, FileRow
from tokenops.store.migrations import utcnow
from tokenops.testing_postgres import PostgresUnavailable, postgres_server

HOUR = 3600


@pytest.fixture(scope="module")
def url():
    with contextlib.ExitStack() as stack:
        try:
            yield stack.enter_context(postgres_server())
        except PostgresUnavailable as e:
            pytest.skip(str(e))


def _last_version_tables(url: str) -> None:
    """The ``files`` and ``batches`` tables as the last version created them, with one file."""
    engine = sa.create_engine(url)
    with engine.begin() as con:
        for table in (FileRow.__table__, BatchRow.__table__):
            table.create(con, checkfirst=True)
        con.execute(sa.text("ALTER TABLE files DROP COLUMN expires_at"))
        con.execute(sa.text("ALTER TABLE batches DROP COLUMN output_expires_s"))
        con.execute(
            sa.text(
                "INSERT INTO files (id, tenant, purpose, num_bytes, num_lines, created_at) "
                "VALUES ('file-old', 'acme', 'batch', 1, 1, :now)"
            ),
            {"now": utcnow()},
        )
    engine.dispose()


def _add(store, file_id: str, expires_after_s: int | None = None) -> dict:
    store.path(file_id).write_bytes(b'{"custom_id": "a"}\n')
    return store.add_file(file_id, "acme", "batch", "in.jsonl", 1, expires_after_s=expires_after_s)


def test_an_old_database_gains_the_columns_and_replicas_sweep_expired_files(url, tmp_path):
    from tokenops.shared_state.postgres_batches import PostgresBatchStore

    _last_version_tables(url)
    a = PostgresBatchStore(url, tmp_path / "a")
    b = PostgresBatchStore(url, tmp_path / "b")
    try:
        old = a.file("acme", "file-old")
        assert old is not None and old["expires_at"] is None
        assert "output_expires_s" in a.batch_columns
        made = _add(a, "file-exp", expires_after_s=HOUR)
        assert made["expires_at"] - made["created_at"] == timedelta(hours=1)
        assert b.file("acme", "file-exp")["expires_at"] == made["expires_at"]
        assert b.path("file-exp").exists()  # replica b's local copy
        _add(a, "file-kept")
        a.store.execute("UPDATE files SET expires_at = ? WHERE id = ?", [utcnow() - timedelta(seconds=1), "file-exp"])
        assert a.file("acme", "file-exp") is None and b.file("acme", "file-exp") is None
        assert {f["id"] for f in b.files("acme")} == {"file-old", "file-kept"}
        assert b.num_files("acme") == 2
        assert sweep(b) == ["file-exp"]
        assert sweep(a) == []  # already swept by the other replica: harmless
        assert not b.path("file-exp").exists()  # the bytes in PostgreSQL went too (nothing to fetch)
        assert a.store.execute("SELECT count(*) FROM batch_file_bytes WHERE id = 'file-exp'").fetchone()[0] == 0
        assert a.file("acme", "file-kept") is not None
    finally:
        a.close()
        b.close()
