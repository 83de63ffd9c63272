"""Two gateways in one process share nothing: each ``create_app`` is its own composition root
(tokenops/gateway/state.py) with its own plugin instances and their config, schema budget,
counters and lifecycle. In-process (httpx's ASGI transport): both apps run at once."""

from __future__ import annotations

import asyncio

import pytest
from tokenops.config import Settings
from tokenops.gateway.lifecycle import Lifecycle, LifecycleError, Phase
from tokenops.plugin_manager import get_plugin_manager
from tokenops.testing_gateway import FakeBackend, gateway_client

ADMIN = {"Authorization": "Bearer test-admin-key"}


def _chat(**extra: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}


def _deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}


def _strict() -> Settings:
    settings = Settings(plugins={"rate_limit": {"burst_s": 20.0, "tenant": {"requests_per_min": 6}}})
    settings.gateway.schema_max_depth = 3
    return settings


async def test_two_apps_in_one_process_keep_their_own_plugin_config_budgets_and_counters():
    strict_backend, open_backend = FakeBackend("m", "strict#0", reply="ok"), FakeBackend("m", "open#0", reply="ok")
    async with (
        gateway_client([strict_backend], _strict()) as strict,
        gateway_client([open_backend], Settings()) as open_,
    ):
        # plugin instances carrying their config: one per gateway, neither the process-wide one
        strict_rl = strict.gateway.plugins.get_plugin("rate_limit")
        open_rl = open_.gateway.plugins.get_plugin("rate_limit")
        process_rl = get_plugin_manager().get_plugin("rate_limit")
        assert len({id(strict_rl), id(open_rl), id(process_rl)}) == 3
        assert strict_rl.limiter is not None and strict_rl.config.burst_s == 20.0
        assert open_rl.limiter is None and process_rl.limiter is None

        # interleaved: the strict gateway's limit (2 in the burst) never touches the other one
        strict_codes, open_codes = [], []
        for _ in range(4):
            strict_codes.append((await strict.post("/v1/chat/completions", json=_chat())).status_code)
            open_codes.append((await open_.post("/v1/chat/completions", json=_chat())).status_code)
        assert strict_codes[:2] == [200, 200] and strict_codes[2:] == [429, 429]
        assert open_codes == [200, 200, 200, 200]

        # the schema budget is each gateway's: depth 5 is over the strict one's 3, within the default 64
        deep = _chat(response_format=_deep_schema(5))
        strict_rl.configure(strict_rl.config.__class__())  # lift the rate limit: only the budget speaks
        refused = await strict.post("/v1/chat/completions", json=deep)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "schema_too_large"
        assert (await open_.post("/v1/chat/completions", json=deep)).status_code == 200

        # typed counters, per gateway
        strict_stats = (await strict.get("/admin/stats", headers=ADMIN)).json()
        open_stats = (await open_.get("/admin/stats", headers=ADMIN)).json()
        assert open_stats["models"]["m"]["requests"] == 5 and open_stats["models"]["m"]["rejected"] == 0
        assert strict_stats["models"]["m"]["rejected"] >= 2
        assert strict.gateway.counters is not open_.gateway.counters
        assert strict_stats["phase"] == open_stats["phase"] == "serving"
        assert len(open_backend.requests) == 5 and len(strict_backend.requests) == 2

        # a live tunable patched on one gateway reaches only its own plugin instance
        r = await open_.patch("/admin/tunables", json={"values": {"ratelimit.burst_s": 7.0}}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert open_rl.config.burst_s == 7.0 and strict_rl.config.burst_s != 7.0
    for client in (strict, open_):
        assert client.gateway.phase is Phase.STOPPED
        assert client.gateway.lifecycle.history == [
            Phase.BUILT,
            Phase.STARTING,
            Phase.SERVING,
            Phase.DRAINING,
            Phase.STOPPED,
        ]


async def test_requests_of_two_gateways_at_once_see_their_own_plugins():
    """Concurrent requests (tasks of one event loop) each run with their own gateway's plugin set."""
    async with (
        gateway_client([FakeBackend("m", "a#0", reply="ok", delay_s=0.05)], _strict()) as a,
        gateway_client([FakeBackend("m", "b#0", reply="ok", delay_s=0.05)], Settings()) as b,
    ):
        replies = await asyncio.gather(*(c.post("/v1/chat/completions", json=_chat()) for c in (a, b) * 4))
        codes_a = sorted(r.status_code for r in replies[0::2])
        codes_b = [r.status_code for r in replies[1::2]]
        assert codes_a == [200, 200, 429, 429] and codes_b == [200] * 4
        assert a.gateway.plugins.get_plugin("rate_limit").limiter.stats.rejected == 2
        assert b.gateway.plugins.get_plugin("rate_limit").limiter is None


async def test_router_and_cascade_config_stay_with_their_gateway():
    """[plugins.router] and [plugins.cascade] of one gateway do not route the other's requests."""
    routed = Settings(
        plugins={
            "router": {
                "use": "rules",
                "alias": "auto",
                "default": "small",
                "rules": {"rules": [{"keywords": ["prove"], "model": "big"}]},
            },
            "cascade": {"models": ["small", "big"], "threshold": 0.0},
        }
    )

    def backends() -> dict:
        return {"small": [FakeBackend("small", reply="small says")], "big": [FakeBackend("big", reply="big says")]}

    async with gateway_client(backends(), routed) as a, gateway_client(backends(), Settings()) as b:
        for model, text, served in (
            ("auto", "prove it", "big"),
            ("auto", "hello", "small"),
            ("cascade", "hi", "small"),
        ):
            body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
            r = await a.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.headers["x-tokenops-model"] == served, (model, text, r.text)
            assert (await b.post("/v1/chat/completions", json=body)).status_code == 404  # no such model there
        assert a.gateway.plugins.get_plugin("rules_router").rc.section().get("use") == "rules"
        assert b.gateway.plugins.get_plugin("rules_router").rc.section() == {}


def test_the_lifecycle_moves_one_way():
    """built -> starting -> serving -> draining -> stopped; a drain begun while models load keeps draining."""
    lifecycle = Lifecycle()
    lifecycle.move(Phase.STARTING)
    assert lifecycle.move_if_allowed(Phase.DRAINING) and lifecycle.is_draining
    assert not lifecycle.move_if_allowed(Phase.SERVING)  # the start finishing late does not reopen it
    with pytest.raises(LifecycleError, match="from draining to serving"):
        lifecycle.move(Phase.SERVING)
    lifecycle.move(Phase.STOPPED)
    lifecycle.move(Phase.STOPPED)  # stopping twice is one stop
    assert lifecycle.history == [Phase.BUILT, Phase.STARTING, Phase.DRAINING, Phase.STOPPED]
