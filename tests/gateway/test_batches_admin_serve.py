"""Batches seen and removed by the operator, against a real ``tokenops serve`` (the demo chat model):
``GET /admin/batches`` and the dashboard's batch view (key ``b``) show a running batch's progress,
rate and ETA beside the interactive latency; deleting a tenant removes its files and batches, the
bytes on disk too, and stops its running batch (issue 55)."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model, section
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

API_KEY, ADMIN_KEY = "batch-admin-view-key-1", "batch-admin-view-admin-1"
MODEL = "demo"


def _lines(n: int, prefix: str, max_tokens: int = 24) -> bytes:
    lines = [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {i}"}],
                     "max_tokens": max_tokens, "ignore_eos": True},
        }
        for i in range(n)
    ]  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _submit(client: openai.OpenAI, n: int, prefix: str, max_tokens: int = 24):
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(_lines(n, prefix, max_tokens))), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")


def _until(predicate, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = serve_config(
        local_model(MODEL, shipped_model_dir()),
        section("gateway", api_keys={API_KEY: "acme"}),
        section("batches", max_in_flight=2),  # a few lines at a time: the batch lasts while the test looks
        section("slo", targets=["ttft_p95=30s"]),
    )
    with ServeProcess(tmp_path_factory.mktemp("batches-admin"), config=config, admin_key=ADMIN_KEY) as srv:
        yield srv


def _admin_batches(srv: ServeProcess) -> dict:
    r = httpx.get(f"{srv.url}/admin/batches", headers=srv.admin_headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _row(view: dict, batch_id: str) -> dict | None:
    return next((b for b in view["batches"] if b["id"] == batch_id), None)


async def test_admin_batches_and_the_dashboard_batch_view(served):
    from tests.tui.pilot_wait import wait_until
    from textual.widgets import DataTable
    from tokenops.tui.app import DashboardApp
    from tokenops.tui.client import AdminClient

    client = openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=60)
    batch = _submit(client, 2000, "view")
    for _ in range(3):  # interactive traffic beside it
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)

    def running():
        row = _row(view := _admin_batches(served), batch.id)
        return view if row and row["status"] == "in_progress" and row["lines_per_s"] and row["eta_s"] else None

    view = _until(running, "the batch running with a rate")
    row = _row(view, batch.id)
    assert row["tenant"] == "acme" and row["endpoint"] == "/v1/chat/completions"
    assert row["request_counts"]["total"] == 2000 and 0 < row["progress"] < 1
    assert row["tokens_per_s"] > 0 and row["eta_s"] > 0
    assert view["lines_running"] >= 1 and view["tokens_per_s"] > 0
    inter = view["interactive"]
    assert inter["num_requests"] >= 3 and inter["ttft_p95_s"] is not None  # the batch lines are not counted
    assert [(t["metric"], t["threshold_s"], t["met"]) for t in inter["slo"]] == [("ttft", 30.0, True)]
    assert httpx.get(f"{served.url}/admin/batches", timeout=30).status_code == 401  # the admin key only
    assert httpx.get(f"{served.url}/admin/batches", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).status_code == 401  # fmt: skip

    admin = AdminClient(served.url, ADMIN_KEY, timeout_s=30)
    app = DashboardApp(admin, poll_interval_s=0.5, max_backoff_s=2.0)
    async with app.run_test(size=(150, 30)) as pilot:
        await wait_until(pilot, lambda: app.last_stats is not None, timeout_s=60, what="first stats")
        await pilot.press("b")

        def shown() -> bool:
            if app.current_mode != "batches":
                return False
            table = app.screen.query_one("#batches", DataTable)
            return batch.id in [k.value for k in table.rows]

        await wait_until(pilot, shown, timeout_s=60, what="the batch in the batch view")
        cells = [str(c) for c in app.screen.query_one("#batches", DataTable).get_row(batch.id)]
        assert cells[1:3] == ["acme", "in_progress"] and cells[4].endswith("/ 2,000")
        assert "interactive requests only" in app.screen_text()
    admin.close()
    client.batches.cancel(batch.id)
    _until(lambda: client.batches.retrieve(batch.id).status == "cancelled", "the cancel")


def test_deleting_a_tenant_removes_its_files_and_batches(served):
    admin = httpx.Client(base_url=served.url, headers=served.admin_headers, timeout=30)
    assert admin.put("/admin/tenants/doomed", json={}).status_code in (200, 201)
    key = admin.post("/admin/keys", json={"tenant": "doomed"})
    assert key.status_code == 201, key.text
    doomed = openai.OpenAI(base_url=served.base_url, api_key=key.json()["key"], max_retries=0, timeout=60)
    acme = openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=60)

    finished = _submit(doomed, 2, "done", max_tokens=2)
    finished = _until(
        lambda: (b := doomed.batches.retrieve(finished.id)).status == "completed" and b, "the small batch"
    )
    running = _submit(doomed, 2000, "long")
    _until(lambda: doomed.batches.retrieve(running.id).status == "in_progress", "the long batch running")
    kept = acme.files.create(file=("keep.jsonl", io.BytesIO(_lines(1, "keep"))), purpose="batch")
    files_dir = served.store_path.parent / "files"
    mine = [finished.input_file_id, finished.output_file_id, running.input_file_id]
    assert all((files_dir / f"{f}.jsonl").exists() for f in mine)

    gone = admin.delete("/admin/tenants/doomed")
    assert gone.status_code == 200, gone.text
    assert gone.json()["purged"]["files"] == 3 and gone.json()["purged"]["batches"] == 2
    left = {p.name for p in files_dir.iterdir()}
    suffix = running.id.removeprefix("batch_")
    assert not [n for n in left if any(n.startswith(f) for f in mine) or suffix in n], left  # bytes gone too
    assert f"{kept.id}.jsonl" in left and acme.files.retrieve(kept.id).id == kept.id  # another tenant's stay
    view = _admin_batches(served)
    assert not [b for b in view["batches"] if b["tenant"] == "doomed"]
    time.sleep(1.5)  # the stopped batch writes nothing more, and the runner does not take it up again
    assert not [n for n in (p.name for p in files_dir.iterdir()) if suffix in n]
    assert not [b for b in _admin_batches(served)["batches"] if b["id"] == running.id]
    with pytest.raises(openai.AuthenticationError):
        doomed.batches.retrieve(running.id)
    admin.close()
