"""Layer-4 plugins through the real gateway pipeline with fake backends."""

import asyncio
import collections
import time

from tokenops.config import Settings
from tokenops.testing_gateway import FakeBackend, gateway_client
from tokenops.types import BackendError


class KillableBackend(FakeBackend):
    """A fake replica that can be killed: every call then fails like a refused connection."""

    is_dead = False

    async def stream(self, request):
        if self.is_dead:
            raise BackendError("connection refused", kind="unavailable", status=503, backend=self.name)
        async for delta in super().stream(request):
            yield delta


def _body(model="big", **kw):
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, **kw}


#: [plugins.circuit_breaker] of the gateways below: each configures its own breaker plugin from it
BREAKER = Settings(plugins={"circuit_breaker": {"consecutive_failures": 3, "cooldown_s": 30,
                                                "degrade_to": {"big": "small"}}})


async def _load(client, seconds, on_tick=None, concurrency=6, until=None):
    """Closed-loop load for `seconds`, and on past them (up to a minute) while `until(results)` is false, so that
    a stall of a loaded machine cannot leave a late window empty; returns [(start offset, status, model)]."""
    results = []
    t0 = time.monotonic()

    def going():
        elapsed = time.monotonic() - t0
        return elapsed < seconds or (until is not None and not until(results) and elapsed < 60.0)

    async def worker():
        while going():
            start = time.monotonic() - t0
            r = await client.post("/v1/chat/completions", json=_body())
            results.append((start, r.status_code, r.json().get("model") if r.status_code == 200 else None))

    async def ticker():
        while going():
            if on_tick:
                on_tick(time.monotonic() - t0)
            await asyncio.sleep(0.01)

    await asyncio.gather(ticker(), *(worker() for _ in range(concurrency)))
    return results


def _ok_after(results, t0: float) -> list[float]:
    """Start offsets of the answered requests that started after ``t0``."""
    return [t for t, status, _ in results if status == 200 and t > t0]


async def test_errors_stop_within_two_seconds_when_a_replica_dies():
    backends = [KillableBackend("big", f"big#{i}", reply="ok then", delay_s=0.002) for i in range(3)]
    kill_at = 0.5

    def tick(t):
        if t >= kill_at:
            backends[1].is_dead = True

    async with gateway_client(backends, BREAKER) as client:
        breaker = client.gateway.plugins.get_plugin("circuit_breaker")
        # keep every record: the retried requests come early and a fast machine makes more than `recent` holds
        client.gateway.recent = collections.deque()
        results = await _load(client, 3.0, tick, until=lambda rs: len(_ok_after(rs, kill_at + 2.0)) >= 6)
        retried = [r for r in client.gateway.recent if r.decisions.get("retries")]
    errors = [t for t, status, _ in results if status >= 500]
    ok_after = _ok_after(results, kill_at + 2.0)
    # issue 17: requests the dead replica failed before answering were retried on a healthy one
    assert not errors, errors
    assert retried and all(r.status == 200 for r in retried)
    assert {x["from"] for r in retried for x in r.decisions["retries"]} == {"big#1"}
    assert ok_after  # traffic kept flowing on the healthy replicas
    assert breaker.health.breaker("big#1").current_state() == "open"


async def test_traffic_degrades_to_the_smaller_model_when_all_replicas_die():
    big = [KillableBackend("big", f"big#{i}", reply="big answer", delay_s=0.002) for i in range(2)]
    small = FakeBackend("small", "small#0", reply="small answer", delay_s=0.002)
    kill_at = 0.5

    def tick(t):
        if t >= kill_at:
            for b in big:
                b.is_dead = True

    async with gateway_client([*big, small], BREAKER) as client:
        results = await _load(client, 2.5, tick, concurrency=4,
                              until=lambda rs: sum(1 for t, *_ in rs if t > kill_at + 1.0) >= 4)
    errors = [t for t, status, _ in results if status >= 400]
    late = [(status, model) for t, status, model in results if t > kill_at + 1.0]
    assert all(t - kill_at < 2.0 for t in errors), errors
    assert late and all(status == 200 and model == "small" for status, model in late)


async def test_rate_limit_429_carries_retry_after():
    settings = Settings(plugins={"rate_limit": {"burst_s": 20.0, "tenant": {"requests_per_min": 6}}})
    async with gateway_client([FakeBackend("big", "big#0", reply="ok")], settings) as client:
        statuses = []
        for _ in range(6):
            r = await client.post("/v1/chat/completions", json=_body())
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert statuses[:2] == [200, 200] and 429 in statuses
        limiter = client.gateway.plugins.get_plugin("rate_limit").limiter  # this gateway's own instance
        assert limiter.num_pending == 0  # completions released and corrected


async def test_semantic_cache_through_the_gateway():
    backend = FakeBackend("big", "big#0", reply="forty two")
    settings = Settings(plugins={"semantic_cache": {"embedder": "lexical"}})  # the gateway's own cache
    async with gateway_client([backend], settings) as client:
        body = {"model": "big", "messages": [{"role": "user", "content": "What is the answer to everything?"}]}
        first = await client.post("/v1/chat/completions", json=body)
        again = await client.post("/v1/chat/completions", json={**body, "messages": [
            {"role": "user", "content": "what is the answer to everything"}]})
        body_opt_out = await client.post("/v1/chat/completions", json={**body, "cache": False})
        assert first.status_code == again.status_code == body_opt_out.status_code == 200
        assert again.json()["choices"][0]["message"]["content"].strip() == "forty two"
        assert len(backend.requests) == 2  # the first, and the opted-out one
        rows = (await client.get("/admin/requests", headers={"Authorization": "Bearer test-admin-key"})).json()
        hits = [r for r in rows["requests"] if r.get("cache_hit")]
        assert len(hits) == 1


async def test_prefix_aware_routing_through_the_gateway():
    backends = [FakeBackend("big", f"big#{i}", reply="ok") for i in range(3)]
    settings = Settings(plugins={"load_balance": {"policy": "prefix_aware"}})  # the gateway's own selector
    async with gateway_client(backends, settings) as client:
        load_balance = client.gateway.plugins.get_plugin("load_balance")
        served: dict[int, list[str]] = {s: [] for s in range(3)}
        for turn in range(3):
            for session in range(3):
                system = f"You are assistant number {session} of a large online shop. " * 8
                history = f"Conversation {session}: my order {session * 111} is late, please help. " * (turn + 1) * 3
                body = {"model": "big", "messages": [{"role": "system", "content": system},
                                                     {"role": "user", "content": history}]}
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200
                served[session].append(next(b.name for b in backends if b.requests and
                                             b.requests[-1].messages == body["messages"]))
        # equal conversations spread over the replicas and stay with the one holding their prefix
        assert len({names[0] for names in served.values()}) == 3, served
        assert all(len(set(names)) == 1 for names in served.values()), served
        assert all(v["in_flight"] == 0 for v in load_balance.selector.tracker.snapshot().values())


async def test_rate_limit_queue_mode_waits_in_the_gateway_instead_of_refusing():
    """Admission runs off the event loop, so queue mode really waits for a slot."""
    import asyncio

    settings = Settings(plugins={"rate_limit": {"mode": "queue", "queue_timeout_s": 5.0,
                                                "tenant": {"max_concurrency": 1}}})
    async with gateway_client([FakeBackend("big", "big#0", reply="ok", delay_s=0.3)], settings) as client:
        replies = await asyncio.gather(*(client.post("/v1/chat/completions", json=_body()) for _ in range(3)))
        assert [r.status_code for r in replies] == [200, 200, 200]
        assert client.gateway.plugins.get_plugin("rate_limit").limiter.num_pending == 0
