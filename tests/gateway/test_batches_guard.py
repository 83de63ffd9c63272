"""A keyless server reads only JSON bodies (a cross-site form cannot send JSON without a CORS
preflight); a Batch API upload is multipart, so it passes only with a credential header, which
a form cannot set. In-process: the guard answers before any route runs."""

from __future__ import annotations

import json

from starlette.testclient import TestClient
from tokenops.config import Settings
from tokenops.gateway.app import create_app

LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}


def test_a_keyless_server_takes_a_multipart_upload_only_with_a_credential_header():
    app = create_app(Settings(), backends={})
    files = {"file": ("in.jsonl", json.dumps(LINE).encode() + b"\n", "application/jsonl")}
    with TestClient(app, base_url="http://localhost") as client:
        refused = client.post("/v1/files", data={"purpose": "batch"}, files=files)
        assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported_media_type"
        passed = client.post("/v1/files", data={"purpose": "batch"}, files=files, headers={"Authorization": "Bearer x"})
        # past the guard: the line is checked (no model "m" here), not refused for its content type
        assert passed.status_code == 400 and passed.json()["error"]["message"].startswith("line 1: body.model 'm'")
        form = client.post("/v1/batches", data={"input_file_id": "x"}, headers={"Authorization": "Bearer x"})
        assert form.status_code == 415  # only the upload route takes a form


def _upload(client: TestClient, raw: bytes):
    files = {"file": ("in.jsonl", raw, "application/jsonl")}
    return client.post("/v1/files", data={"purpose": "batch"}, files=files, headers={"Authorization": "Bearer x"})


def test_upload_bounds_are_refused_naming_the_setting():
    from tokenops.batch_settings import BatchSettings
    from tokenops.testing_gateway import FakeBackend

    settings = Settings(batches=BatchSettings(max_file_bytes=4000, max_lines=2))
    app = create_app(settings, backends=[FakeBackend()])
    line = {**LINE, "body": {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}}
    with TestClient(app, base_url="http://localhost") as client:
        ok = _upload(client, b"".join(json.dumps({**line, "custom_id": f"c{i}"}).encode() + b"\n" for i in range(2)))
        assert ok.status_code == 200 and ok.json()["purpose"] == "batch" and ok.json()["bytes"] > 0
        three = b"".join(json.dumps({**line, "custom_id": f"c{i}"}).encode() + b"\n" for i in range(3))
        refused = _upload(client, three)
        assert refused.status_code == 400 and "line 3: the file has more than [batches] max_lines = 2" in refused.text
        big = json.dumps({**line, "body": {**line["body"], "user": "x" * 5000}}).encode() + b"\n"
        assert _upload(client, big).status_code == 413  # over max_file_bytes, within the form's slack
        assert _upload(client, b"x" * 200_000).status_code == 413  # refused while it arrives
        listed = client.get("/v1/files", headers={"Authorization": "Bearer x"}).json()["data"]
        assert [f["id"] for f in listed] == [ok.json()["id"]]  # nothing of a refused upload is kept
