"""The request pipeline: hook order, decisions in telemetry, replicas, cascades, ensembles, aborts."""

from __future__ import annotations

import asyncio
import json

from tokenops import hookimpl
from tokenops.testing_gateway import FakeBackend, gateway_client
from tokenops.types import GatewayResponse, RouteDecision

MSG = [{"role": "user", "content": "hello"}]


async def test_hooks_run_in_pipeline_order(register_plugin):
    calls = []

    class Spy:
        @hookimpl
        def tokenops_admit(self, request):
            calls.append("admit")

        @hookimpl
        def tokenops_cache_lookup(self, request):
            calls.append("cache_lookup")

        @hookimpl
        def tokenops_route(self, request, candidates, profiles):
            calls.append("route")

        @hookimpl
        def tokenops_select_replica(self, request, replicas):
            calls.append("select_replica")

        @hookimpl
        def tokenops_validate(self, request, response):
            calls.append("validate")

        @hookimpl
        def tokenops_backend_outcome(self, backend, outcome):
            calls.append(f"outcome:{outcome.ok}")

        @hookimpl
        def tokenops_cache_store(self, request, response):
            calls.append("cache_store")

        @hookimpl
        def tokenops_record(self, event):
            calls.append(f"record:{event.kind}")

    register_plugin(Spy(), "test-spy")
    async with gateway_client([FakeBackend()]) as c:
        for stream in (False, True):
            calls.clear()
            r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG, "stream": stream})
            assert r.status_code == 200
            request_calls = [x for x in calls if x != "record:engine_stats"]
            assert request_calls == ["admit", "cache_lookup", "route", "select_replica", "validate", "outcome:True",
                                     "cache_store", "record:requests"], stream


async def test_cache_hit_skips_the_backend_and_is_recorded(register_plugin):
    backend = FakeBackend()

    class Cache:
        @hookimpl
        def tokenops_cache_lookup(self, request):
            if request.prompt_text() == "cached?":
                return GatewayResponse(text="from cache", model="fake-model", prompt_tokens=2, completion_tokens=2)

    register_plugin(Cache(), "test-cache")
    async with gateway_client([backend]) as c:
        for stream in (False, True):
            r = await c.post("/v1/chat/completions", json={"model": "fake-model", "stream": stream,
                                                            "messages": [{"role": "user", "content": "cached?"}]})
            assert r.status_code == 200 and "from cache" in r.text
            rec = c.gateway.recent[-1]
            assert rec.is_cache_hit and rec.route_reason == "cache" and rec.tokens_out == 2
    assert backend.requests == []


async def test_telemetry_row_lands_in_the_store_with_decisions(tokenops_store):
    from tokenops.config import ModelConfig, Settings

    settings = Settings(models=[ModelConfig(name="fake-model", backend="fake", cost_input_per_1m=1.0,
                                            cost_output_per_1m=2.0)])
    async with gateway_client([FakeBackend(reply="a b c d")], settings=settings, store=tokenops_store) as c:
        r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG, "user": "alice"})
        assert r.status_code == 200
        await c.post("/v1/chat/completions", json={"model": "missing", "messages": MSG})
    tokenops_store.writer().flush()
    rows = tokenops_store.execute(
        "select tenant, model_requested, model_served, backend, replica, route_reason, router, tokens_in, tokens_out,"
        " status, http_status, cache_hit, cost_usd, decisions, ttft_s, e2e_s from requests order by ts").fetchall()
    assert len(rows) == 2
    ok, missing = rows
    assert ok[:11] == ("alice", "fake-model", "fake-model", "fake", "fake-model#0", "requested", "route_by_name", 4, 4,
                       "ok", 200)
    assert ok[11] is False and abs(ok[12] - (4 * 1.0 + 4 * 2.0) / 1e6) < 1e-12
    decisions = json.loads(ok[13])
    assert decisions["route"]["reason"] == "requested" and decisions["replica"] == "fake-model#0"
    assert decisions["cache"] == "miss"
    assert 0 < ok[14] <= ok[15]
    assert missing[9:11] == ("rejected", 404)
    stats = tokenops_store.execute("select count(*), max(gen_tokens_total) from engine_stats").fetchone()
    assert stats[0] >= 1 and stats[1] == 4  # the shutdown sample at least


async def test_round_robin_spreads_over_replicas():
    a, b, c3 = FakeBackend(name="m#0"), FakeBackend(name="m#1"), FakeBackend(name="m#2")
    async with gateway_client({"fake-model": [a, b, c3]}) as c:
        for _ in range(6):
            assert (await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})).status_code == 200
    assert [len(x.requests) for x in (a, b, c3)] == [2, 2, 2]


async def test_a_better_replica_selector_overrides_round_robin(register_plugin):
    a, b = FakeBackend(name="m#0"), FakeBackend(name="m#1")

    class Sticky:
        @hookimpl
        def tokenops_select_replica(self, request, replicas):
            return replicas[-1]

    register_plugin(Sticky(), "test-sticky")
    async with gateway_client({"fake-model": [a, b]}) as c:
        for _ in range(3):
            await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
    assert (len(a.requests), len(b.requests)) == (0, 3)


async def test_cascade_escalates_when_validators_score_low(register_plugin):
    small, big = FakeBackend("small", reply="meh"), FakeBackend("big", reply="great answer")

    class Cascade:
        @hookimpl
        def tokenops_route(self, request, candidates, profiles):
            if request.model == "auto":
                return RouteDecision("small", "cascade", router="test", escalate_to=("big",), min_score=0.5)

        @hookimpl
        def tokenops_validate(self, request, response):
            return 0.9 if "great" in response.text else 0.1

    register_plugin(Cascade(), "test-cascade")
    async with gateway_client({"small": [small], "big": [big]}) as c:
        for stream in (False, True):
            r = await c.post("/v1/chat/completions", json={"model": "auto", "messages": MSG, "stream": stream})
            assert r.status_code == 200 and "great answer" in r.text
            rec = c.gateway.recent[-1]
            assert rec.is_escalated and rec.model_served == "big"
            assert [s["model"] for s in rec.decisions["cascade"]["steps"]] == ["small", "big"]
            assert rec.tokens_out == 1 + 2  # both answers were paid for
    assert len(small.requests) == len(big.requests) == 2


async def test_ensemble_asks_every_member_and_combines(register_plugin):
    a, b = FakeBackend("a", reply="alpha"), FakeBackend("b", reply="beta")

    class Ensemble:
        @hookimpl
        def tokenops_route(self, request, candidates, profiles):
            if request.model == "combo:join":
                return RouteDecision("combo:join", "ensemble", members=("a", "b"), method="join")

        @hookimpl
        def tokenops_ensemble(self, request, responses):
            return GatewayResponse(text="+".join(sorted(r.text.strip() for r in responses)), model="combo:join")

    register_plugin(Ensemble(), "test-ensemble")
    async with gateway_client({"a": [a], "b": [b]}) as c:
        r = await c.post("/v1/chat/completions", json={"model": "combo:join", "messages": MSG})
        assert r.json()["choices"][0]["message"]["content"] == "alpha+beta"
        assert r.json()["model"] == "combo:join"
        assert c.gateway.recent[-1].decisions["ensemble"]["members"] == ["a", "b"]


async def test_client_disconnect_mid_stream_aborts_the_backend_request(thread_server):
    from tokenops.gateway.app import create_app
    from tokenops.gateway.auth import hash_key
    import httpx

    backend = FakeBackend(reply=" ".join(["tok"] * 400), delay_s=0.01)
    app = create_app(None, [backend], admin_key_hash=hash_key("k"))
    with thread_server(app) as server:
        async with httpx.AsyncClient(timeout=10) as client:
            async with client.stream("POST", server.url + "/v1/completions",
                                     json={"model": "fake-model", "prompt": "x", "stream": True, "max_tokens": 400}) as r:
                n = 0
                async for line in r.aiter_lines():
                    n += line.startswith("data:")
                    if n >= 3:
                        break
        for _ in range(100):
            if backend.aborted:
                break
            await asyncio.sleep(0.02)
        assert len(backend.aborted) == 1
        assert backend.num_generated < 100
        for _ in range(50):
            if app.state.gateway.recent:
                break
            await asyncio.sleep(0.02)
        assert app.state.gateway.recent[-1].status == 499
        assert app.state.gateway.pipeline.num_in_flight == 0


async def test_a_stream_closed_before_anyone_iterates_still_aborts_and_records():
    from tokenops.types import GatewayRequest

    backend = FakeBackend(reply=" ".join(["tok"] * 50), delay_s=0.01)
    async with gateway_client([backend]) as c:
        pipeline = c.gateway.pipeline
        request = GatewayRequest(kind="completion", model="fake-model", body={"model": "fake-model"}, prompt="x",
                                 stream=True, max_tokens=50)
        deltas, rec = await pipeline.open_stream(request)
        assert pipeline.num_in_flight == 1
        await deltas.aclose()  # as when the client is gone before the first byte
        assert pipeline.num_in_flight == 0 and backend.aborted == [request.id]
        assert c.gateway.recent[-1] is rec and rec.status == 499
