"""The gateway puts an EPLB plan for each MoE replica into /admin/stats (the dashboard's
Experts screen shows it)."""

from tokenops.config import Settings
from tokenops.testing_gateway import FakeBackend, gateway_client

ADMIN = {"Authorization": "Bearer test-admin-key"}


async def test_stats_carry_a_plan_for_moe_replicas_only():
    moe, dense = FakeBackend("moe", expert_load=True), FakeBackend("dense")
    moe._expert_load[0][:] = [900, 50, 30, 20]  # layer 0 is very skewed
    moe._expert_load[1][:] = [100, 100, 100, 100]
    settings = Settings()
    settings.plugins["eplb"] = {"devices": 2, "redundant": 2}
    async with gateway_client({"moe": [moe], "dense": [dense]}, settings) as c:
        engines = (await c.get("/admin/stats", headers=ADMIN)).json()["engines"]
    plan = engines["moe#0"]["eplb"]
    assert (plan["devices"], plan["redundant"], plan["strategy"]) == (2, 2, "global")
    assert plan["max_imbalance_before"] > 1.5
    assert plan["max_imbalance_after"] < plan["max_imbalance_before"]
    assert "L0: e0x3" in plan["replicated"]  # both spare slots go to the hot expert
    assert "eplb" not in engines["dense#0"]


async def test_scrapes_and_polls_reuse_the_plan_until_the_load_changes(monkeypatch):
    from tokenops.gateway.observability import expert_plans

    calls = []
    real = expert_plans.hooks.get_expert_plan
    monkeypatch.setattr(expert_plans.hooks, "get_expert_plan", lambda *a, **k: calls.append(a) or real(*a, **k))
    moe = FakeBackend("moe", expert_load=True)
    moe._expert_load[0][:] = [900, 50, 30, 20]
    settings = Settings()
    settings.plugins["eplb"] = {"devices": 2, "redundant": 2}
    async with gateway_client({"moe": [moe]}, settings) as c:
        plans = c.gateway.expert_plans
        for _ in range(2):
            assert (await c.get("/metrics")).status_code == 200
            first = (await c.get("/admin/stats", headers=ADMIN)).json()["engines"]["moe#0"]["eplb"]
        assert len(calls) == 1 and plans.num_computed == 1  # two scrapes + two polls: one plan
        moe._expert_load[0][:] = [50, 900, 30, 20]  # the load moves; within min_interval_s: the cached plan
        assert (await c.get("/admin/stats", headers=ADMIN)).json()["engines"]["moe#0"]["eplb"] == first
        assert len(calls) == 1
        plans.min_interval_s = 0.0  # past the interval: the new load gets its own plan
        second = (await c.get("/admin/stats", headers=ADMIN)).json()["engines"]["moe#0"]["eplb"]
        assert len(calls) == 2 and "L0: e1x3" in second["replicated"] and "L0: e0x3" in first["replicated"]
        assert (await c.get("/metrics")).status_code == 200 and len(calls) == 2
