"""Issue 37: with every configuration block of docs/engine-optimizations.md set, a real ``tokenops
serve`` shows the configured values (not the registry's defaults) in ``/admin/tunables``, the
dashboard's Tuning screen and ``tokenops models --url``; the engine stats say how each model runs
(weight encoding, KV dtype, speculative method, compile state)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from pilot_wait import wait_until
from textual.widgets import DataTable
from typer.testing import CliRunner

from tokenops.testing_serve import ServeProcess
from tokenops.tui.app import DashboardApp
from tokenops.tui.client import AdminClient

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tokenops" / "demo_models" / "ladder-small"
DOCS = REPO / "docs" / "engine-optimizations.md"
#: Values for the documented blocks whose examples name a path or a disk tier this test cannot use.
OVERRIDES = {"speculative": {"method": "ngram"}, "kv_offload": {"disk_mb": 0, "host_mb": 64}}
#: (num_tokens: the docs' second speculative block says 8)
EXPECTED = {"speculative.method": "ngram", "speculative.num_tokens": 8, "quantization.weights": "int8",
            "kv_policy.window_tokens": 256, "kv_offload.host_mb": 64.0, "compile.enabled": True}


def documented_blocks() -> dict[str, dict]:
    """The [plugins.X] tables the engine-optimization docs print (TOML blocks and inline settings)."""
    import tomllib

    text = DOCS.read_text()
    blocks: dict[str, dict] = {}
    for body in re.findall(r"```toml\n(.*?)```", text, re.S):
        for name, conf in tomllib.loads(body).get("plugins", {}).items():
            blocks.setdefault(name, {}).update(conf)
    for name, settings in re.findall(r"`\[plugins\.(\w+)\] (\w+ = [^`]+)`", text):
        for part in settings.split(", "):  # `[plugins.kv_policy] sink_tokens = 4, window_tokens = 256`
            key, value = part.split(" = ", 1)
            blocks.setdefault(name, {}).setdefault(key, tomllib.loads(f"v = {value}")["v"])
    return blocks


def config() -> str:
    blocks = documented_blocks()
    assert {"speculative", "quantization", "kv_policy", "kv_offload", "compile"} <= set(blocks), blocks
    lines = [f'[[models]]\nname = "small"\nbackend = "local"\npath = "{MODEL}"\n']
    for name in ("speculative", "quantization", "kv_policy", "kv_offload", "compile"):
        conf = {**blocks[name], **OVERRIDES.get(name, {})}
        conf.pop("draft_model", None), conf.pop("draft_min_confidence", None), conf.pop("disk_path", None)
        lines.append(f"[plugins.{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in conf.items()))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("settings"), config=config()) as server:
        yield server


def test_tunables_show_what_the_engine_runs(srv):
    tunables = {t["name"]: t for t in httpx.get(f"{srv.url}/admin/tunables", headers=srv.admin_headers).json()["tunables"]}
    assert {name: tunables[name]["value"] for name in EXPECTED} == EXPECTED
    engine = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()["engines"]["small#0"]
    assert engine["weight_encoding"].startswith("int8") and engine["kv_dtype"] == "int8"
    assert engine["speculative"] == "ngram" and engine["compiled"] is True


async def test_tuning_screen_and_models_command_show_the_configured_values(srv):
    app = DashboardApp(AdminClient(srv.url, srv.admin_key), poll_interval_s=1.0)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("5")
        table = app.screen.query_one("#tunables", DataTable)
        await wait_until(pilot, lambda: table.row_count > len(EXPECTED), timeout_s=30, what="tunables")
        keys = [str(k.value) for k in table.rows]
        shown = {name: str(table.get_row(name)[1]) for name in EXPECTED if name in keys}
        assert set(shown) == set(EXPECTED), keys
    assert shown["speculative.method"] == "ngram" and shown["quantization.weights"] == "int8"
    assert shown["kv_policy.window_tokens"] == "256" and shown["compile.enabled"] in ("True", "true", "yes", "on")
    from tokenops.cli import build_app

    r = CliRunner().invoke(build_app(), ["models", "--config", str(srv.workdir / "tokenops.toml"), "--url", srv.url,
                                         "--admin-key", srv.admin_key, "--json"])
    assert r.exit_code == 0, r.output
    running = {m["name"]: m for m in json.loads(r.output)["models"]}["small"]["running"]
    assert running["replicas"]["small#0"]["weight_encoding"].startswith("int8")
    assert running["tunables"]["speculative.method"] == "ngram"
