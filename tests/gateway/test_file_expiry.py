"""Files that expire, in-process: the store's expiry (reads leave an expired file out to the
second; the sweep deletes row and bytes, but not a running batch's input), the checks of
``expires_after`` / ``output_expires_after``, a store made by the last version upgraded, and the
routes driven by the openai SDK over an in-process app (the SDK's own multipart encoding of
``expires_after``). Through a real ``tokenops serve``: tests/gateway/test_file_expiry_serve.py."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta

import duckdb
import openai
import pytest
from starlette.testclient import TestClient
from tokenops.config import Settings
from tokenops.gateway.app import create_app
from tokenops.gateway.batches.batches_api import _parse
from tokenops.gateway.batches.file_expiry import MAX_EXPIRES_S, MIN_EXPIRES_S, sweep, upload_expiry
from tokenops.gateway.errors import APIError
from tokenops.store import Store
from tokenops.store.batch_store import BatchStore, unix
from tokenops.store.migrations import apply_migrations, utcnow
from tokenops.testing_gateway import FakeBackend

HOUR = 3600


@pytest.fixture
def batch_store(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        yield BatchStore(store, tmp_path / "files")


def _add(store: BatchStore, file_id: str, tenant: str = "acme", expires_after_s: int | None = None) -> dict:
    store.path(file_id).write_bytes(b'{"custom_id": "a"}\n')
    return store.add_file(file_id, tenant, "batch", "in.jsonl", 1, expires_after_s=expires_after_s)


def _expire(store: BatchStore, file_id: str, seconds_ago: float = 1.0) -> None:
    """Move a file's ``expires_at`` into the past (the test's clock; users cannot go under an hour)."""
    store.store.execute(
        "UPDATE files SET expires_at = ? WHERE id = ?", [utcnow() - timedelta(seconds=seconds_ago), file_id]
    )


def test_expires_at_is_created_at_plus_the_seconds_and_none_without(batch_store):
    row = _add(batch_store, "file-a", expires_after_s=2 * HOUR)
    assert row["expires_at"] - row["created_at"] == timedelta(hours=2)
    assert batch_store.file("acme", "file-a")["expires_at"] == row["expires_at"]
    assert _add(batch_store, "file-b")["expires_at"] is None
    assert batch_store.file("acme", "file-b")["expires_at"] is None


def test_an_expired_file_reads_as_missing_before_any_sweep(batch_store):
    _add(batch_store, "file-old", expires_after_s=HOUR)
    _add(batch_store, "file-new", expires_after_s=HOUR)
    _add(batch_store, "file-kept")
    assert batch_store.num_files("acme") == 3
    _expire(batch_store, "file-old")
    assert batch_store.file("acme", "file-old") is None
    assert {f["id"] for f in batch_store.files("acme")} == {"file-new", "file-kept"}
    assert {f["id"] for f in batch_store.files("acme", newest_first=False)} == {"file-new", "file-kept"}
    assert batch_store.num_files("acme") == 2  # an expired file does not count against max_files_per_tenant
    assert batch_store.path("file-old").exists()  # its bytes stay until the sweep
    assert batch_store.expired_files(utcnow()) == [("acme", "file-old")]


def test_the_sweep_deletes_rows_and_bytes_of_expired_files_only(batch_store):
    _add(batch_store, "file-1", expires_after_s=HOUR)
    _add(batch_store, "file-2", "globex", expires_after_s=3 * HOUR)
    _add(batch_store, "file-3")
    assert sweep(batch_store) == []  # nothing expired yet
    later = utcnow() + timedelta(hours=2)  # an injected clock: the first file has expired then
    assert sweep(batch_store, now=later) == ["file-1"]
    assert not batch_store.path("file-1").exists()
    assert batch_store.store.execute("SELECT count(*) FROM files WHERE id = 'file-1'").fetchone()[0] == 0
    assert batch_store.path("file-2").exists() and batch_store.path("file-3").exists()
    assert sweep(batch_store, now=later) == []  # a second sweep finds nothing (and harms nothing)
    assert sorted(sweep(batch_store, now=utcnow() + timedelta(days=365))) == ["file-2"]  # file-3 never expires
    assert batch_store.file("acme", "file-3") is not None


def test_the_input_of_a_batch_that_has_not_finished_is_kept_until_it_finishes(batch_store):
    _add(batch_store, "file-in", expires_after_s=HOUR)
    now = utcnow()
    row = {
        "id": "batch_x", "tenant": "acme", "endpoint": "/v1/chat/completions", "input_file_id": "file-in",
        "status": "in_progress", "created_at": now,
    }  # fmt: skip
    batch_store.add_batch(row)
    later = now + timedelta(hours=2)
    assert sweep(batch_store, now=later) == []
    assert batch_store.path("file-in").exists()
    batch_store.update_batch("batch_x", status="completed", completed_at=later)
    assert sweep(batch_store, now=later) == ["file-in"]
    assert not batch_store.path("file-in").exists()


def test_a_store_of_the_last_version_is_upgraded_with_its_files_never_expiring(tmp_path):
    path = tmp_path / "v11.duckdb"
    con = duckdb.connect(str(path))
    apply_migrations(con, upto=11)
    con.execute(
        "INSERT INTO files (id, tenant, purpose, num_bytes, num_lines, created_at) VALUES ('file-v11', 'acme', 'batch', 1, 1, ?)",
        [utcnow()],
    )
    con.close()
    with Store.open(path) as store:
        found = BatchStore(store, tmp_path / "files").file("acme", "file-v11")
        assert found is not None and found["expires_at"] is None
        assert "output_expires_s" in BatchStore(store, tmp_path / "files").batch_columns


class _Form(dict):
    def get(self, key, default=None):  # starlette's FormData.get
        return super().get(key, default)


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"expires_after[anchor]": "created_at"}, "expires_after[seconds]", "required with"),
        ({"expires_after[seconds]": "3600"}, "expires_after[anchor]", "required with"),
        ({"expires_after[anchor]": "last_accessed_at", "expires_after[seconds]": "3600"}, "expires_after[anchor]", "created_at"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"}, "expires_after[seconds]", "3600"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": str(MAX_EXPIRES_S + 1)}, "expires_after[seconds]", "2592000"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1h"}, "expires_after[seconds]", "integer"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "-3600"}, "expires_after[seconds]", "integer"),
    ],
)  # fmt: skip
def test_upload_expiry_fields_are_checked_naming_the_field(fields, param, says):
    with pytest.raises(APIError) as e:
        upload_expiry(_Form(fields))
    assert e.value.status == 400 and e.value.param == param and says in e.value.message


def test_upload_expiry_fields_accepted_at_both_bounds():
    assert upload_expiry(_Form()) is None
    for seconds in (MIN_EXPIRES_S, MAX_EXPIRES_S):
        fields = {"expires_after[anchor]": "created_at", "expires_after[seconds]": str(seconds)}
        assert upload_expiry(_Form(fields)) == seconds


_BATCH = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": MAX_EXPIRES_S + 1}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds"),
        ({"anchor": "created_at"}, "output_expires_after.seconds"),
        ({"anchor": "expires_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 3600, "extra": 1}, "output_expires_after.extra"),
        ("3600", "output_expires_after"),
    ],
)
def test_output_expires_after_is_checked_naming_the_field(value, param):
    with pytest.raises(APIError) as e:
        _parse(json.dumps({**_BATCH, "output_expires_after": value}).encode())
    assert e.value.status == 400 and e.value.param == param


def test_output_expires_after_accepted():
    body = _parse(json.dumps({**_BATCH, "output_expires_after": {"anchor": "created_at", "seconds": 7200}}).encode())
    assert body.output_expires_after is not None and body.output_expires_after.seconds == 7200


# -- the routes, in-process, driven by the openai SDK -------------------------------------------

MODEL = "fake-model"
LINES = [
    {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 3}}
    for i in range(3)
]  # fmt: skip
JSONL = b"".join(json.dumps(line).encode() + b"\n" for line in LINES)


@pytest.fixture
def app_sdk(tmp_path):
    """``(app, openai client)`` on an in-process app with a store (its runner and sweep started)."""
    store = Store.open(tmp_path / "store" / "t.duckdb")
    app = create_app(Settings(), backends=[FakeBackend()], store=store)
    with TestClient(app, base_url="http://localhost") as http:
        yield app, openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=http, max_retries=0)
    store.close()


def test_upload_with_expires_after_shows_expires_at_and_expires_to_the_second(app_sdk):
    app, client = app_sdk
    made = client.files.create(
        file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch", expires_after={"anchor": "created_at", "seconds": 7200}
    )
    assert made.expires_at == made.created_at + 7200
    assert client.files.retrieve(made.id).expires_at == made.expires_at
    plain = client.files.create(file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch")
    assert plain.expires_at is None
    store = app.state.batch_store
    _expire(store, made.id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(made.id)
    assert [f.id for f in client.files.list()] == [plain.id]
    with pytest.raises(openai.NotFoundError):  # an expired input cannot start a batch
        client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert store.path(made.id).exists()
    assert sweep(store) == [made.id] and not store.path(made.id).exists()


def test_upload_refusals_name_the_field(app_sdk):
    _, client = app_sdk
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(
            file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch", expires_after={"anchor": "created_at", "seconds": 60}
        )
    assert e.value.body["param"] == "expires_after[seconds]" and e.value.body["code"] == "invalid_value"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(
            file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch", extra_body={"expires_after[anchor]": "created_at"}
        )
    assert e.value.body["param"] == "expires_after[seconds]"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch", extra_body={"user_note": "x"})
    assert e.value.body["param"] == "user_note" and "unknown form field" in e.value.message
    assert client.files.list().data == []  # nothing of a refused upload is kept


def test_batch_output_files_expire_after_output_expires_after(app_sdk):
    app, client = app_sdk
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    output = client.files.retrieve(batch.output_file_id)
    assert output.expires_at == output.created_at + 3600
    assert uploaded.expires_at is None and client.files.retrieve(uploaded.id).expires_at is None
    stored = app.state.batch_store.store.execute("SELECT expires_at FROM files WHERE id = ?", [output.id]).fetchone()
    assert unix(stored[0]) == output.expires_at


def test_the_runner_loop_sweeps_at_most_every_period_and_survives_a_failing_store():
    import asyncio

    from tokenops.gateway.batches.file_expiry import FileSweeper

    class Store:
        def __init__(self, fail: bool) -> None:
            self.fail, self.num_calls = fail, 0

        def expired_files(self, now):
            self.num_calls += 1
            if self.fail:
                raise RuntimeError("database gone")
            return []

    async def twice(sweeper: FileSweeper) -> None:
        await sweeper.maybe_sweep()
        await sweeper.maybe_sweep()  # within the period: not run again

    for fail in (False, True):
        store = Store(fail)
        asyncio.run(twice(FileSweeper(store, every_s=60.0)))
        assert store.num_calls == 1
    store = Store(False)
    asyncio.run(twice(FileSweeper(store, every_s=0.0)))
    assert store.num_calls == 2
