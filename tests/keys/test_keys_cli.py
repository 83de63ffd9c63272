"""`tokenops keys` against a running server's admin API, and on the store when none runs."""

from __future__ import annotations

import json

import openai
import pytest
from typer.testing import CliRunner

from tests.keys.conftest import serve
from tokenops.cli import build_app


def _cli(*args: str, env: dict | None = None):
    result = CliRunner().invoke(build_app(), list(args), env={"COLUMNS": "200", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _main(*args: str, env: dict, capsys) -> tuple[int, str, str]:
    """Through ``tokenops.cli.main`` (known errors become one line and exit 2)."""
    import os

    from tokenops.cli import main

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with pytest.raises(SystemExit) as e:
            main(list(args))
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_keys_cli_through_the_admin_api(server, capsys):
    env = {"TOKENOPS_URL": server.url, "TOKENOPS_ADMIN_KEY": server.admin_key}
    assert _cli("keys", "tenant", "cli-co", "--budget-usd", "2", "--budget-period", "24h", env=env).exit_code == 0
    created = _cli("keys", "create", "-t", "cli-co", "-m", "small", "--rpm", "600", "--json", env=env)
    assert created.exit_code == 0, created.output
    key = json.loads(created.stdout)
    client = openai.OpenAI(base_url=server.base_url, api_key=key["key"], max_retries=0)
    client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    listed = _cli("keys", "list", "-t", "cli-co", env=env)
    assert key["id"] in listed.stdout and "cli-co" in listed.stdout and "small" in listed.stdout
    assert "shown once" in _cli("keys", "create", "-t", "cli-co", env=env).stdout
    assert _cli("keys", "update", key["id"], "--clear", "models", "--json", env=env).exit_code == 0
    assert _cli("keys", "revoke", key["id"], env=env).stdout.startswith(f"{key['id']} revoked at")
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    code, out, err = _main("keys", "create", "-t", "cli-co", "--budget-usd", "-3", env=env, capsys=capsys)
    assert code == 2 and err.strip() == "error: budget_usd must be >= 0, got -3"
    code, out, err = _main("keys", "create", "-t", "no-such-tenant", env=env, capsys=capsys)
    assert code == 2 and err.startswith("error: unknown tenant 'no-such-tenant'") and err.count("\n") == 1


def test_keys_made_on_the_store_work_when_the_server_starts(tmp_path):
    # keys in the store count as API keys: a non-loopback bind needs no --allow-open
    srv = serve(tmp_path, args=["--host", "0.0.0.0"])
    env = {"TOKENOPS_URL": None, "TOKENOPS_STORE": str(srv.store_path), "TOKENOPS_CONFIG": None}
    from tests.keys.conftest import CONFIG
    from tokenops.testing_serve import free_port

    config = tmp_path / "cli.toml"
    config.write_text(CONFIG + f"\n[gateway]\nport = {free_port()}\n")
    env["TOKENOPS_CONFIG"] = str(config)
    # no server answers at the config's host:port: the CLI works on the store
    assert _cli("keys", "tenant", "offline", env=env).exit_code == 0
    made = _cli("keys", "create", "-t", "offline", "-m", "small", "--json", env=env)
    assert made.exit_code == 0, made.output
    key = json.loads(made.stdout)
    with srv:
        assert "API keys: 0 configured, 1 managed" in srv.log()
        client = openai.OpenAI(base_url=srv.base_url, api_key=key["key"], max_retries=0)
        assert client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4).usage.completion_tokens == 4
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model="large", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def test_report_by_key_and_tenant_while_serving(server):
    import time

    import httpx

    admin = httpx.Client(base_url=server.url, headers=server.admin_headers)
    admin.put("/admin/tenants/report-co", json={})
    key = admin.post("/admin/keys", json={"tenant": "report-co"}).json()
    client = openai.OpenAI(base_url=server.base_url, api_key=key["key"], max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi there"}], max_tokens=4)
    env = {"TOKENOPS_STORE": str(server.store_path), "TOKENOPS_URL": None}
    deadline = time.monotonic() + 30
    while True:  # the telemetry writer flushes about every 0.5 s
        rows = json.loads(_cli("report", "--by", "key", "--since", "all", "--json", env=env).stdout)["spend_by_key"]
        mine = [r for r in rows["rows"] if r[1] == key["id"]]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    cols = rows["columns"]
    assert mine, f"no telemetry row of {key['id']} reached the store in 30 s:\n{server.log()[-2000:]}"
    assert mine[0][cols.index("requests")] == 2
    assert mine[0][cols.index("cost_usd")] == pytest.approx(2 * 0.013)
    text = _cli("report", "--by", "tenant", "--since", "all", env=env).stdout
    assert "Spend by tenant and model" in text and "report-co" in text
    assert _cli("report", "--by", "model", env=env).exit_code == 2  # key or tenant only
