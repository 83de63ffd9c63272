"""Admin API: key checks, stats document, tunables (validated, applied, audited), recent requests, queries."""

from __future__ import annotations

from tokenops.testing_gateway import FakeBackend, gateway_client

ADMIN = {"Authorization": "Bearer test-admin-key"}
MSG = [{"role": "user", "content": "hello"}]


async def test_admin_endpoints_need_the_admin_key():
    async with gateway_client([FakeBackend()]) as c:
        for path in ("/admin/stats", "/admin/tunables", "/admin/requests", "/admin/query/recent_requests"):
            r = await c.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key", path
            assert (await c.get(path, headers={"Authorization": "Bearer nope"})).status_code == 401
        assert (await c.get("/admin/stats", headers={"X-Admin-Key": "test-admin-key"})).status_code == 200
        assert (await c.patch("/admin/tunables", json={"values": {}})).status_code == 401


async def test_stats_document_has_the_contract_shape():
    from tokenops.config import Settings

    settings = Settings(slo=["p95=500ms", "e2e_p99=2s"])
    async with gateway_client([FakeBackend(reply="a b c")], settings=settings) as c:
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG})).status_code == 200
        await c.post("/v1/chat/completions", json={"model": "missing", "messages": MSG})
        s = (await c.get("/admin/stats", headers=ADMIN)).json()
    assert s["window_s"] == 60.0 and s["uptime_s"] >= 0
    # an unknown model is the client's mistake: rejected, not an error (one definition everywhere)
    assert s["requests"]["total"] == 4 and s["requests"]["errors"] == 0 and s["requests"]["rejected"] == 1
    assert s["requests"]["in_flight"] == 0 and s["requests"]["error_rate"] == 0.0
    assert s["tokens"]["total_output"] == 9
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert set(s["latency"][metric]) == {"p50", "p90", "p95", "p99"}
    assert s["latency"]["e2e"]["p50"] > 0
    assert [t["label"] for t in s["slo"]["targets"]] == ["ttft_p95=500ms", "e2e_p99=2000ms"]
    assert s["slo"]["targets"][0]["met"] is True and s["slo"]["attainment"] == 0.75
    assert s["engines"]["fake-model#0"]["total_generation_tokens"] == 9
    assert s["models"]["fake-model"]["requests"] == 3 and s["models"]["fake-model"]["output_tokens"] == 9
    assert s["routes"] == {"requested": 3} and s["cache"] == {"lookups": 4, "hits": 0}  # the unknown model was looked up too
    assert isinstance(s["history"], list)


async def test_patch_tunables_validates_whole_patch_applies_live_and_audits(tokenops_store):
    backend_a, backend_b = FakeBackend(name="fake-model#0"), FakeBackend(name="fake-model#1")
    async with gateway_client({"fake-model": [backend_a, backend_b]}, store=tokenops_store) as c:
        tunables = (await c.get("/admin/tunables", headers=ADMIN)).json()["tunables"]
        by_name = {t["name"]: t for t in tunables}
        assert by_name["engine.max_num_seqs"]["value"] == 32 and by_name["engine.max_num_seqs"]["live"] is True
        # external engines' launch flags (tokenops tune --engine vllm) are not this server's knobs
        assert not [n for n in by_name if n.startswith(("vllm.", "sglang."))]

        r = await c.patch("/admin/tunables", headers=ADMIN,
                          json={"values": {"engine.max_num_seqs": 8, "engine.max_num_batched_tokens": 3}})
        assert r.status_code == 400 and "minimum" in r.json()["error"]["message"]
        assert backend_a.applied == {}  # nothing applied when one value is bad

        r = await c.patch("/admin/tunables", headers=ADMIN, json={"values": {"engine.block_size": 32}})
        assert r.status_code == 400 and "restart" in r.json()["error"]["message"]

        r = await c.patch("/admin/tunables", headers=ADMIN, json={"values": {"engine.no_such": 1}})
        assert r.status_code == 400 and "unknown tunable" in r.json()["error"]["message"]

        r = await c.patch("/admin/tunables", headers=ADMIN,
                          json={"values": {"engine.max_num_seqs": "8", "engine.schedule_policy": "priority"},
                                "actor": "test-suite"})
        assert r.status_code == 200, r.text
        assert r.json()["applied"] == {"engine.max_num_seqs": 8, "engine.schedule_policy": "priority"}
        assert backend_a.applied == backend_b.applied == {"engine.max_num_seqs": 8, "engine.schedule_policy": "priority"}
        values = {t["name"]: t["value"] for t in r.json()["tunables"]}
        assert values["engine.max_num_seqs"] == 8
    rows = tokenops_store.execute(
        "select name, old_value, new_value, actor, source from config_changes order by name").fetchall()
    assert rows == [("engine.max_num_seqs", "32", "8", "test-suite", "admin"),
                    ("engine.schedule_policy", '"fcfs"', '"priority"', "test-suite", "admin")]


async def test_plugin_owned_tunables_reach_the_plugin(register_plugin):
    from tokenops import hookimpl
    from tokenops.tunables import Tunable

    seen = []

    class Knob:
        @hookimpl
        def tokenops_register_tunables(self, register):
            register(Tunable("testknob.level", "int", 1, "a test knob", live=True, minimum=0, maximum=9))

        @hookimpl
        def tokenops_apply_tunables(self, values):
            seen.append(values.get("testknob.level"))

    register_plugin(Knob(), "test-knob")
    async with gateway_client([FakeBackend()]) as c:
        r = await c.patch("/admin/tunables", headers=ADMIN, json={"values": {"testknob.level": 7}})
        assert r.status_code == 200
    assert seen == [7]


async def test_recent_requests_newest_first_and_named_queries(tokenops_store):
    async with gateway_client([FakeBackend()], store=tokenops_store) as c:
        for text in ("first", "second"):
            await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": [{"role": "user", "content": text}]})
        reqs = (await c.get("/admin/requests?limit=5", headers=ADMIN)).json()["requests"]
        assert len(reqs) == 2 and reqs[0]["ts"] >= reqs[1]["ts"]
        assert reqs[0]["model_served"] == "fake-model" and reqs[0]["status"] == "ok" and reqs[0]["tokens_out"] > 0
        tokenops_store.writer().flush()
        r = await c.get("/admin/query/recent_requests", headers=ADMIN)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["name"] == "recent_requests" and body["columns"] and len(body["rows"]) == 2
        r = await c.get("/admin/query/drop_tables", headers=ADMIN)
        assert r.status_code == 404 and "usage_by_model_day" in r.json()["error"]["message"]
