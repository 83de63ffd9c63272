"""Hardening III against a real ``tokenops serve`` (the demo chat model; the gateway is what is
tested), driven with httpx and the openai SDK:

- a body nested deeper than 200 levels is a 400 ``invalid_json`` on every POST/PUT/PATCH route the
  OpenAPI document lists, big bodies (msgspec's message count used to raise ``RecursionError``: 500)
  and small, at the top and inside ``metadata``, a tool's ``parameters``, ``response_format`` and an
  unknown field;
- a failed admin write changes nothing: keys, tenants and adapters are the same before and after a
  batch of bad requests (out-of-range ``expires_at`` used to answer 500 and keep the key);
- ``POST /admin/lora`` reads only under ``[lora] roots`` (the block copied from docs/lora.md): one
  answer for every path outside them, existing or not; a malformed ``adapter_config.json`` is a 400
  naming the field;
- ``GET /admin/requests`` lists a request made before a restart (same store file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest
from tests.serve_configs import config as serve_config
from tests.serve_configs import local_model, section
from tokenops.engine.models.default_model import shipped_model_dir
from tokenops.testing_serve import ServeProcess

API_KEY, ADMIN_KEY = "h3-api-key-123", "h3-admin-key-123"
MODEL = "demo"
DOCS = Path(__file__).resolve().parents[2] / "docs"
DEPTH_LIMIT = 200  # tokenops.gateway.edge.body.MAX_JSON_DEPTH


def _lora_block(root: Path) -> str:
    """docs/lora.md's ``[lora]`` example with its folder replaced by ``root``."""
    text = (DOCS / "lora.md").read_text()
    block = next(b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if b.startswith("[lora]"))
    assert '"/adapters"' in block
    return block.replace('"/adapters"', json.dumps(str(root)))


def _config(root: Path) -> str:
    return serve_config(
        local_model(MODEL, shipped_model_dir()), section("gateway", api_keys={API_KEY: "acme"}), _lora_block(root)
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("hardening3")
    root = work / "adapters-root"
    root.mkdir()
    with ServeProcess(work / "serve", config=_config(root), admin_key=ADMIN_KEY) as srv:
        yield srv, root


@pytest.fixture(scope="module")
def admin(served):
    srv, _ = served
    with httpx.Client(base_url=srv.url, headers={"X-Admin-Key": ADMIN_KEY}, timeout=120) as c:
        yield c


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _bodies(depth: int) -> dict[str, str]:
    """Where a hostile client puts a deep value: the top level and the fields that take free JSON."""
    d, msgs = _nested(depth), '"messages":[{"role":"user","content":"hi"}]'
    return {
        "top": d,
        "unknown field": f'{{"model":"{MODEL}",{msgs},"extra_thing":{d}}}',
        "metadata": f'{{"model":"{MODEL}",{msgs},"metadata":{d}}}',
        "tools[0].function.parameters": f'{{"model":"{MODEL}",{msgs},"tools":[{{"type":"function",'
        f'"function":{{"name":"f","parameters":{d}}}}}]}}',
        "response_format": f'{{"model":"{MODEL}",{msgs},"response_format":{{"type":"json_schema",'
        f'"json_schema":{{"name":"x","schema":{d}}}}}}}',
    }


def _body_routes(srv) -> list[tuple[str, str, bool]]:
    """``(method, path, has_target)`` of every POST/PUT/PATCH operation of the OpenAPI document;
    ``has_target``: the path names something (``{key_id}``) that may be a 404 before any body is read."""
    spec = httpx.get(f"{srv.url}/openapi.json", timeout=60).json()
    routes = []
    for path, item in spec["paths"].items():
        for method in item:
            if method in ("post", "put", "patch"):
                routes.append((method.upper(), re.sub(r"\{[^}]+\}", "x-h3", path), "{" in path))
    return routes


def _error_message(r: httpx.Response) -> str:
    err = r.json()["error"]  # OpenAI's shape and Anthropic's both keep it under "error"
    return err["message"]


def test_deep_nesting_is_a_400_on_every_body_route(served):
    srv, _ = served
    routes = _body_routes(srv)
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/messages"), ("POST", "/admin/keys")} <= {
        (m, p) for m, p, _ in routes
    }
    assert len(routes) >= 14
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Admin-Key": ADMIN_KEY, "Content-Type": "application/json"}
    failures = []
    with httpx.Client(base_url=srv.url, headers=headers, timeout=120) as c:
        for depth in (20_000, DEPTH_LIMIT + 1):  # a 100 KB body (msgspec's count first) and a 1 KB one
            for method, path, has_target in routes:
                for where, body in _bodies(depth).items():
                    r = c.request(method, path, content=body)
                    assert r.status_code < 500, (depth, method, path, where, r.text[:300])
                    if has_target and r.status_code == 404:  # no such batch, key...: nothing to read a body for
                        continue
                    if r.status_code == 415:  # the route reads no JSON at all (a file upload: multipart)
                        continue
                    if r.status_code != 400 or "nested too deeply" not in _error_message(r):
                        failures.append((depth, method, path, where, r.status_code, r.text[:200]))
    assert not failures, "\n".join(map(str, failures))
    # the limit is named, and a body at the limit is parsed (what it holds is then judged on its own)
    r = httpx.post(f"{srv.url}/v1/chat/completions", content=_bodies(DEPTH_LIMIT + 1)["metadata"], headers=headers)
    assert f"more than {DEPTH_LIMIT} levels" in _error_message(r) and r.json()["error"]["code"] == "invalid_json"
    at_limit = f'{{"model":"{MODEL}","max_tokens":1,"messages":[{{"role":"user","content":"hi"}}],"metadata":{{"a":{_nested(DEPTH_LIMIT - 3)}}}}}'
    r = httpx.post(f"{srv.url}/v1/chat/completions", content=at_limit, headers=headers, timeout=120)
    assert r.status_code < 500 and "nested too deeply" not in r.text, r.text


def test_deep_nesting_through_the_openai_sdk(served):
    srv, _ = served
    client = openai.OpenAI(base_url=srv.base_url, api_key=API_KEY, max_retries=0, timeout=120)
    deep = json.loads(_nested(DEPTH_LIMIT + 50).replace('{"a":', "[").replace("}", "]"))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body={"extra_thing": deep}
        )
    assert "nested too deeply" in e.value.message


def _state(admin: httpx.Client) -> dict:
    return {
        "keys": admin.get("/admin/keys").json(),
        "tenants": admin.get("/admin/tenants").json(),
        "lora": admin.get("/admin/lora").json(),
        "models": sorted(m["id"] for m in admin.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
                         .json()["data"]),
    }  # fmt: skip


def _write_adapter_config(folder: Path, config: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(config)
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_failed_admin_writes_change_nothing(served, admin):
    srv, root = served
    assert admin.put("/admin/tenants/h3-tenant", json={"budget_usd": 5}).status_code in (200, 201)
    key = admin.post("/admin/keys", json={"tenant": "h3-tenant", "name": "kept"}).json()
    before = _state(admin)
    bad_config = _write_adapter_config(root / "bad-rank", '{"peft_type": "LORA", "r": "four"}')
    statuses = []
    for expires in (1e20, 253402300800, -5, 0, "10000-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00",
                    "9999-12-31T23:59:59-01:00", True, 1e308):  # fmt: skip
        r = admin.post("/admin/keys", json={"tenant": "h3-tenant", "expires_at": expires})
        assert r.status_code == 400 and r.json()["error"]["param"] == "expires_at", (expires, r.text)
        r = admin.patch(f"/admin/keys/{key['id']}", json={"expires_at": expires, "name": "changed"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "expires_at", (expires, r.text)
    bad = [
        ("post", "/admin/keys", {"tenant": "nobody-h3", "name": "x"}),  # 404 tenant_not_found
        ("post", "/admin/keys", {"tenant": "h3-tenant", "rpm": -1}),
        ("post", "/admin/keys", {"tenant": "h3-tenant", "models": ["no-such-model"]}),
        ("post", "/admin/keys", {"tenant": "h3-tenant", "budget_usd": 1, "soft_budget_usd": 2}),
        ("put", "/admin/tenants/a%20b", {"budget_usd": 1}),
        ("put", "/admin/tenants/x:y", {"budget_usd": 1}),
        ("put", "/admin/tenants/h3-new", {"budget_usd": -1}),
        ("put", "/admin/tenants/h3-new", {"budget_period": "fortnightly"}),
        ("put", "/admin/tenants/h3-tenant", {"budget_usd": 1, "soft_budget_usd": 3}),
        ("post", "/admin/lora", {"name": "bad-rank", "path": str(bad_config)}),
        ("post", "/admin/lora", {"name": "outside", "path": str(shipped_model_dir())}),
        ("post", "/admin/lora", {"name": "../escape", "path": str(bad_config)}),
        ("post", "/admin/lora", {"name": "a" * 65, "path": str(bad_config)}),
        ("post", "/admin/lora", {"name": MODEL, "path": str(bad_config)}),  # 409: the model exists
        ("post", "/admin/lora", {"name": "nope", "path": str(root / "missing")}),
    ]
    for method, path, body in bad:
        r = admin.request(method.upper(), path, json=body)
        statuses.append(r.status_code)
        assert 400 <= r.status_code < 500, (method, path, body, r.status_code, r.text)
    assert _state(admin) == before
    assert 409 in statuses and 404 in statuses


def test_lora_paths_outside_the_roots_get_one_answer(served, admin, tmp_path):
    _, root = served
    outside = _write_adapter_config(tmp_path / "real-adapter", '{"peft_type": "LORA", "r": 4}')
    (root / "link-out").symlink_to(outside)
    paths = [
        str(outside),  # an adapter folder that exists
        str(tmp_path / "no-such-folder"),  # nothing there
        "/etc/passwd",  # a file
        "/",
        str(root / ".." / outside.name),  # out of the root by '..'
        str(root / "link-out"),  # a link inside the root pointing out
        "relative/adapter",
        "bad\x00path",
        "~tokenops-no-such-user/adapter",  # expanduser raised RuntimeError: a 500 (schemathesis found it)
        "~\u00ed;\t\U0009860c",  # the path schemathesis sent
    ]
    answers = []
    for path in paths:
        r = admin.post("/admin/lora", json={"name": "probe", "path": path})
        assert r.status_code == 400, (path, r.text)
        answers.append(r.json())
    assert all(a == answers[0] for a in answers), answers
    assert answers[0]["error"]["code"] == "lora_path_not_allowed" and answers[0]["error"]["param"] == "path"
    assert str(root) in answers[0]["error"]["message"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ('{"peft_type": "LORA", "r": "four"}', '"r"'),
        ('{"peft_type": "LORA", "r": [4]}', '"r"'),
        ('{"peft_type": "LORA", "r": 0}', '"r"'),
        ('{"peft_type": "LORA", "r": true}', '"r"'),
        ('{"peft_type": "LORA"}', '"r"'),
        ('{"peft_type": "LORA", "r": 4, "lora_alpha": "big"}', '"lora_alpha"'),
        ('{"peft_type": "LORA", "r": 4, "lora_alpha": 1e999}', '"lora_alpha"'),
        ('{"peft_type": "LORA", "r": 4, "base_model_name_or_path": 5}', '"base_model_name_or_path"'),
        ('{"peft_type": "LORA", "r": 4, "use_rslora": "yes"}', '"use_rslora"'),
        ('{"peft_type": ["LORA"], "r": 4}', '"peft_type"'),
        ('{"peft_type": "LORA", "r": 4, "modules_to_save": "lm_head"}', '"modules_to_save"'),
        ("[1, 2]", "JSON object"),
        ("{not json", "not valid JSON"),
        ('{"peft_type": "LORA", "r": NaN}', "not valid JSON"),
        ('{"x":' * 500 + "1" + "}" * 500, "not valid JSON"),
    ],
    ids=lambda v: v[:40],
)
def test_a_malformed_adapter_config_is_a_400_naming_the_field(served, admin, config, field):
    _, root = served
    folder = _write_adapter_config(root / f"cfg-{abs(hash(config))}", config)
    r = admin.post("/admin/lora", json={"name": "malformed", "path": str(folder)})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_lora_adapter" and err["param"] == "path"
    assert "adapter_config.json" in err["message"] and field in err["message"], err


@pytest.mark.slow
def test_admin_requests_lists_requests_made_before_a_restart(tmp_path):
    """Two serves, one after the other, on one store file: the second lists the first's request
    before it has served any, then both, newest first."""
    config = serve_config(local_model(MODEL, shipped_model_dir()))

    def ask(srv: ServeProcess, text: str) -> None:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=2)

    def listed(srv: ServeProcess) -> list[dict]:
        r = httpx.get(f"{srv.url}/admin/requests", params={"limit": 10}, headers=srv.admin_headers, timeout=60)
        return r.json()["requests"]

    with ServeProcess(tmp_path, config=config, admin_key=ADMIN_KEY) as srv:
        ask(srv, "before the restart")
        (first,) = listed(srv)
    with ServeProcess(tmp_path, config=config, admin_key=ADMIN_KEY) as srv:
        (again,) = listed(srv)  # nothing asked of this process yet
        ask(srv, "after the restart")
        rows = listed(srv)
    assert again["id"] == first["id"] and again["ts"] == pytest.approx(first["ts"], abs=1e-3)
    assert again["model_requested"] == MODEL and again["status"] == "ok" and again["tokens_out"] >= 1
    assert again["decisions"] == json.loads(json.dumps(first["decisions"]))
    assert [r["id"] for r in rows][1:] == [first["id"]] and len(rows) == 2  # newest first


def test_request_history_reads_what_an_earlier_process_wrote(tmp_path):
    """The fast half of the restart test: rows the telemetry writer stored are read back in the
    summary's shape after the store is closed and opened again, and merged with the ones in memory."""
    import time

    from tokenops.gateway.observability.records import RequestRecord
    from tokenops.store.request_history import latest_requests, merge_newest
    from tokenops.store.store import Store

    now = time.time()
    old = RequestRecord("req-old", "chat", "acme", MODEL, now - 60, 0.0, model_served=MODEL, tokens_out=3)
    old.decisions["route"] = {"router": "default"}
    old.finish(200)
    path = tmp_path / "store" / "tokenops.duckdb"
    with Store.open(path) as store:
        writer = store.writer()
        writer.write("requests", old.row(), ts=old.arrival)
        writer.flush()
    with Store.open(path) as store:
        (row,) = latest_requests(store, 10)
    assert row["id"] == "req-old" and row["ts"] == pytest.approx(old.arrival, abs=1e-3)
    assert row["tokens_out"] == 3 and row["status"] == "ok" and row["decisions"] == {"route": {"router": "default"}}
    new = RequestRecord("req-new", "chat", "acme", MODEL, now, 0.0)
    new.finish(200)
    merged = merge_newest([new.summary()], [row, {**row, "id": "req-new"}], 10)
    assert [r["id"] for r in merged] == ["req-new", "req-old"] and merged[0]["kind"] == "chat"
    assert [r["id"] for r in merge_newest([new.summary()], [row], 1)] == ["req-new"]


class _DownRedis:
    """A Redis whose every command fails (the connection dropped between two requests)."""

    def pipeline(self, transaction: bool = False):
        return self

    def __getattr__(self, name):  # hset, hsetnx, incr, get... queued or sent: all fail at the end
        return lambda *a, **k: self

    def execute(self):
        raise ConnectionError("redis is down")


def test_a_key_whose_redis_write_fails_is_not_kept_in_the_store(tmp_path):
    """The registry's write order: store, then Redis; a Redis failure deletes the new store rows (and
    puts an updated key's old row back), so the next start does not bring back a half-made key."""
    from tokenops.keys.registry import KeyRegistry
    from tokenops.store.store import Store

    with Store.open(tmp_path / "tokenops.duckdb") as store:
        seeded = KeyRegistry(store, config_tenants={"acme"})
        kept, _ = seeded.create({"tenant": "acme", "name": "kept"})
        registry = KeyRegistry(store, redis_client=_DownRedis(), config_tenants={"acme"})
        with pytest.raises(ConnectionError):
            registry.create({"tenant": "acme", "name": "half-made"})
        with pytest.raises(ConnectionError):
            registry.update(kept.id, {"name": "changed"})
        with pytest.raises(ConnectionError):
            registry.put_tenant("new-tenant", {"budget_usd": 1.0})
        rows = store.execute("SELECT id, name FROM api_keys").fetchall()
        assert rows == [(kept.id, "kept")]
        assert store.execute("SELECT count(*) FROM tenants").fetchone() == (0,)
        assert [k.name for k in KeyRegistry(store, config_tenants={"acme"}).keys()] == ["kept"]
