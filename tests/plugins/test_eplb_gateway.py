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
