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
