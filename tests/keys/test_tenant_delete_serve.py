"""Deleting a tenant through a running ``tokenops serve`` (openai SDK as the tenant's client):
its keys stop at once, and what plugins kept for it goes with it — session memory, captured
distillation pairs, cached answers — while another tenant's data stays."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from tokenops.testing_serve import ServeProcess

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tokenops" / "demo_models" / "ladder-small"

CONFIG = f"""
[[models]]
name = "ladder-small"
path = "{SMALL}"

[gateway]
api_keys = {{ "key-static" = "static" }}

[plugins.session_memory]
enabled = true
embedder = "lexical"

[plugins.distill_capture]
models = ["ladder-small"]
tenants = ["acme", "globex"]

[plugins.semantic_cache]
embedder = "lexical"
"""


def _ask(client: openai.OpenAI, text: str) -> str:
    out = client.chat.completions.create(model="ladder-small", max_tokens=6, temperature=0,
                                         messages=[{"role": "user", "content": text}],
                                         extra_headers={"x-session-id": "s1"})
    return out.choices[0].message.content


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + 15
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_deleting_a_tenant_revokes_its_keys_and_purges_its_data(tmp_path):
    from tokenops.cli import build_app

    with ServeProcess(tmp_path, config=CONFIG) as srv, \
            httpx.Client(base_url=srv.url, headers=srv.admin_headers, timeout=15) as admin:
        clients = {}
        for tenant in ("acme", "globex"):
            assert admin.put(f"/admin/tenants/{tenant}", json={"budget_usd": 5}).status_code == 201
            key = admin.post("/admin/keys", json={"tenant": tenant}).json()["key"]
            clients[tenant] = openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
            for text in ("Note: the vault access code is 4821.", "Which is larger, 7 or 9?"):
                assert _ask(clients[tenant], text) is not None

        def pairs() -> dict[str, int]:
            rows = admin.get("/admin/distill/pairs").json()["pairs"]
            return {p["tenant"]: p["count"] for p in rows}

        def sessions() -> set[str]:
            return {s["tenant"] for s in admin.get("/admin/memory/sessions").json()["sessions"]}

        _wait(lambda: pairs() == {"acme": 2, "globex": 2}, "both tenants' answers captured")
        _wait(lambda: sessions() == {"acme", "globex"}, "both tenants have session memory")

        r = admin.delete("/admin/tenants/acme")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["deleted"] is True and len(body["revoked_keys"]) == 1
        assert body["purged"]["distill_pairs"] == 2 and body["purged"]["session_memory_entries"] > 0
        assert body["purged"]["semantic_cache_entries"] == 2

        with pytest.raises(openai.AuthenticationError) as e:  # the key stops at once
            _ask(clients["acme"], "hello")
        assert e.value.body["code"] == "revoked_api_key"
        assert pairs() == {"globex": 2} and sessions() == {"globex"}
        assert "acme" not in {t["name"] for t in admin.get("/admin/tenants").json()["tenants"]}
        assert _ask(clients["globex"], "Which is larger, 7 or 9?") is not None  # the other tenant is untouched

        # clear errors: unknown tenant 404, a config tenant 409, no admin key 401
        r = admin.delete("/admin/tenants/acme")
        assert r.status_code == 404 and r.json()["error"]["code"] == "tenant_not_found"
        r = admin.delete("/admin/tenants/static")
        assert r.status_code == 409 and "api_keys" in r.json()["error"]["message"]
        assert httpx.delete(f"{srv.url}/admin/tenants/globex").status_code == 401

        # the CLI goes through the same endpoint, and asks for --yes first
        runner = CliRunner()
        res = runner.invoke(build_app(), ["keys", "delete-tenant", "globex", "--url", srv.url,
                                          "--admin-key", srv.admin_key])
        assert res.exit_code != 0 and "--yes" in str(res.exception) and globex_alive(admin)
        res = runner.invoke(build_app(), ["keys", "delete-tenant", "globex", "--yes", "--url", srv.url,
                                          "--admin-key", srv.admin_key, "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["purged"]["distill_pairs"] == 2
        assert pairs() == {} and sessions() == set()


def globex_alive(admin: httpx.Client) -> bool:
    return "globex" in {t["name"] for t in admin.get("/admin/tenants").json()["tenants"]}


@pytest.mark.slow  # ~13 s of CLI start-ups; the server path above runs by default
def test_delete_tenant_on_the_store_when_no_server_runs(tmp_path):
    """``tokenops keys delete-tenant`` without a server works on the store file: keys
    revoked, record gone, captured pairs purged (another tenant's stay)."""
    from tokenops.cli import build_app
    from tokenops.store import Store
    from tokenops.testing_serve import free_port

    config = tmp_path / "cli.toml"
    config.write_text(f"[gateway]\nport = {free_port()}\n")  # no server answers there
    env = {"TOKENOPS_URL": None, "TOKENOPS_STORE": str(tmp_path / "t.duckdb"), "TOKENOPS_CONFIG": str(config)}

    def cli(*args: str):
        return CliRunner().invoke(build_app(), list(args), env=env)

    assert cli("keys", "tenant", "acme").exit_code == 0
    res = cli("keys", "create", "--tenant", "acme", "--json")
    assert res.exit_code == 0, res.output
    with Store.open(env["TOKENOPS_STORE"]) as s:
        s.execute("INSERT INTO distill_pairs (id, tenant, model, messages, answer, prompt_tokens, completion_tokens, ts)"
                  " VALUES ('r1', 'acme', 'm', '[]', 'a', 1, 1, now()), ('r2', 'other', 'm', '[]', 'b', 1, 1, now())")
    res = cli("keys", "delete-tenant", "acme", "--yes", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["revoked_keys"]) == 1 and out["purged"] == {"distill_pairs": 1, "stored_responses": 0, "files": 0, "batches": 0}
    with Store.open(env["TOKENOPS_STORE"]) as s:
        assert s.execute("SELECT tenant FROM distill_pairs").fetchall() == [("other",)]
        assert s.execute("SELECT count(*) FROM tenants WHERE name = 'acme'").fetchone()[0] == 0
        assert s.execute("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL").fetchone()[0] == 0
    res = cli("keys", "delete-tenant", "acme", "--yes")
    assert res.exit_code != 0 and "no tenant 'acme'" in str(res.output) + str(res.exception)
