"""Files that expire, through a real ``tokenops serve`` (the demo chat model) driven by the openai
SDK: an upload's ``expires_after`` and a batch's ``output_expires_after`` give ``expires_at``;
bad values and unknown form fields are 400s naming them; a file past its ``expires_at`` is a 404
at once and is then swept (row and bytes). The clock is not faked in the server: the test moves a
file's ``expires_at`` into the past through the server's own store channel (the only writer of
its store), since users cannot ask for less than an hour."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta

import httpx
import openai
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model, section
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.store.batch_tables import FileRow
from tokenops.store.migrations import utcnow
from tokenops.store.remote import RemoteStore
from tokenops.testing_serve import ServeProcess

API_KEY = "expiry-key-1"
MODEL = "demo"
HOUR = 3600
LINES = [
    {"custom_id": f"e{i}", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}"}], "max_tokens": 2}}
    for i in range(2)
]  # fmt: skip
JSONL = b"".join(json.dumps(line).encode() + b"\n" for line in LINES)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = serve_config(local_model(MODEL, shipped_model_dir()), section("gateway", api_keys={API_KEY: "acme"}))
    with ServeProcess(tmp_path_factory.mktemp("expiry"), config=config) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=60)


def _upload(client: openai.OpenAI, **kwargs):
    return client.files.create(file=("in.jsonl", io.BytesIO(JSONL)), purpose="batch", **kwargs)


def test_an_upload_with_expires_after_shows_expires_at(client):
    made = _upload(client, expires_after={"anchor": "created_at", "seconds": 2 * HOUR})
    assert made.expires_at == made.created_at + 2 * HOUR
    assert client.files.retrieve(made.id).expires_at == made.expires_at
    assert made.id in [f.id for f in client.files.list()]
    assert _upload(client).expires_at is None


def test_bad_expires_after_and_unknown_form_fields_are_400s_naming_them(served, client):
    for value, param in (
        ({"anchor": "created_at", "seconds": 59}, "expires_after[seconds]"),
        ({"anchor": "created_at", "seconds": 31 * 24 * HOUR}, "expires_after[seconds]"),
        ({"anchor": "last_active_at", "seconds": HOUR}, "expires_after[anchor]"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            _upload(client, expires_after=value)
        assert e.value.body["param"] == param and e.value.body["code"] == "invalid_value"
    raw = httpx.post(
        f"{served.base_url}/files",
        headers={"Authorization": f"Bearer {API_KEY}"},
        data={"purpose": "batch", "retention": "forever"},
        files={"file": ("in.jsonl", JSONL, "application/jsonl")},
        timeout=60,
    )
    assert raw.status_code == 400, raw.text
    assert raw.json()["error"]["param"] == "retention" and "unknown form field" in raw.json()["error"]["message"]
    uploaded = _upload(client)
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 10},
        )  # fmt: skip
    assert e.value.body["param"] == "output_expires_after.seconds"


def test_a_batch_with_output_expires_after_writes_files_that_expire(client):
    uploaded = _upload(client)
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 24 * HOUR},
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == len(LINES), batch
    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.expires_at == output.created_at + 24 * HOUR
    assert client.files.retrieve(uploaded.id).expires_at is None


def test_an_expired_file_is_a_404_at_once_and_then_swept(served, client):
    made = _upload(client, expires_after={"anchor": "created_at", "seconds": HOUR})
    kept = _upload(client)
    on_disk = served.store_path.parent / "files" / f"{made.id}.jsonl"
    assert on_disk.exists()
    with RemoteStore(str(served.store_path)) as store:
        found = store.execute("SELECT * FROM files WHERE id = ?", [made.id])
        row = dict(zip([d[0] for d in found.description], found.fetchone()))
        store.add(FileRow(**{**row, "expires_at": utcnow() - timedelta(seconds=1)}))
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            client.files.content(made.id)
        listed = [f.id for f in client.files.list()]
        assert made.id not in listed and kept.id in listed
        deadline = time.monotonic() + 90  # the sweep runs every 10 s from the runner's loop (every 5 s)
        while on_disk.exists():
            assert time.monotonic() < deadline, "the expired file's bytes were not swept"
            time.sleep(0.5)
        assert store.execute("SELECT count(*) FROM files WHERE id = ?", [made.id]).fetchone()[0] == 0
    assert client.files.retrieve(kept.id).id == kept.id
