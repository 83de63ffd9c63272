"""``/metrics`` behind a key once API keys exist, and per-tenant series that can be
turned off (issue 42), in process."""

from __future__ import annotations

from tokenops.config import ModelConfig, Settings
from tokenops.testing_gateway import FakeBackend, gateway_client

ADMIN = {"authorization": "Bearer test-admin-key"}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def _settings(**gateway) -> Settings:
    settings = Settings()
    settings.gateway.api_keys = {"tenant-key-1": "acme"}
    for name, value in gateway.items():
        setattr(settings.gateway, name, value)
    return settings


async def test_metrics_need_the_admin_key_or_the_metrics_key():
    async with gateway_client(settings=_settings(metrics_key="sha256:" + "ab" * 32)) as c:
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/metrics", headers={"authorization": "Bearer tenant-key-1"})).status_code == 401
        assert (await c.get("/metrics", headers=ADMIN)).status_code == 200
    async with gateway_client(settings=_settings(metrics_key="scrape-key")) as c:
        r = await c.get("/metrics", headers={"authorization": "Bearer scrape-key"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert (await c.get("/admin/stats", headers={"authorization": "Bearer scrape-key"})).status_code == 401


async def test_keyless_loopback_server_keeps_metrics_open():
    async with gateway_client() as c:
        assert (await c.get("/metrics")).status_code == 200


async def test_per_tenant_series_can_be_turned_off():
    for per_tenant in (True, False):
        settings = _settings(metrics_per_tenant=per_tenant)
        settings.models = [ModelConfig(name="fake-model", backend="fake", cost_input_per_1m=1000.0,
                                       cost_output_per_1m=1000.0)]  # a price, so spend is counted
        async with gateway_client([FakeBackend()], settings=settings) as c:
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer tenant-key-1"})
            assert r.status_code == 200
            text = (await c.get("/metrics", headers=ADMIN)).text
            spend = [line for line in text.splitlines() if line.startswith("tokenops:spend_usd_total")]
            assert spend
            assert any('tenant="acme"' in line for line in spend) is per_tenant
            assert 'tenant="' not in text if not per_tenant else True
