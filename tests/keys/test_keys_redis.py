"""Two `tokenops serve` processes sharing one Redis: one key registry, one budget."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.keys.conftest import CONFIG, serve

BUDGET_USD = 1.0
DOCS_REDIS_URL = "redis://127.0.0.1:6379/0"


def docs_redis_config() -> str:
    """The ``[plugins.keys]`` example of docs/keys.md, as documented."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "keys.md").read_text()
    block = text.split("## Several gateway replicas", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    assert DOCS_REDIS_URL in block
    return block
COST_SMALL = (5 * 1000.0 + 4 * 2000.0) / 1e6  # one request of the test (see test_keys_serve)


@contextlib.contextmanager
def _two_gateways(tmp_path, redis_url):
    config = CONFIG + "\n" + docs_redis_config().replace(DOCS_REDIS_URL, redis_url)
    a, b = serve(tmp_path / "a", config), serve(tmp_path / "b", config)
    with ThreadPoolExecutor(2) as pool:  # start both at once (each waits for /ready)
        starts = [pool.submit(a.start), pool.submit(b.start)]
    try:
        for f in starts:
            f.result()
        with httpx.Client(base_url=a.url, headers=a.admin_headers, timeout=10) as admin_a, \
                httpx.Client(base_url=b.url, headers=b.admin_headers, timeout=10) as admin_b:
            yield (a, admin_a), (b, admin_b)
    finally:
        a.stop()
        b.stop()


def _ask(client: openai.OpenAI, text: str = "hi there"):
    return client.chat.completions.create(model="small", messages=[{"role": "user", "content": text}], max_tokens=4)


def test_key_created_on_one_gateway_works_on_the_other_and_revoke_stops_it_everywhere(tmp_path, redis_url):
    with _two_gateways(tmp_path, redis_url) as ((a, admin_a), (b, admin_b)):
        assert admin_a.put("/admin/tenants/shared", json={}).status_code == 201
        key = admin_a.post("/admin/keys", json={"tenant": "shared", "models": ["small"]}).json()
        on_a, on_b = (openai.OpenAI(base_url=s.base_url, api_key=key["key"], max_retries=0, timeout=20) for s in (a, b))
        assert _ask(on_b).usage.completion_tokens == 4  # created on A: works on B at once
        with pytest.raises(openai.PermissionDeniedError):
            on_b.chat.completions.create(model="large", messages=[{"role": "user", "content": "x"}], max_tokens=4)
        assert admin_b.delete(f"/admin/keys/{key['id']}").status_code == 200
        for client in (on_a, on_b):  # revoked on B: refused on both at the next request
            with pytest.raises(openai.AuthenticationError) as e:
                _ask(client)
            assert e.value.body["code"] == "revoked_api_key"
        # a tenant deleted on B is gone on A too (its record is shared through Redis)
        assert "shared" in {t["name"] for t in admin_a.get("/admin/tenants").json()["tenants"]}
        assert admin_b.delete("/admin/tenants/shared").json()["deleted"] is True
        assert "shared" not in {t["name"] for t in admin_a.get("/admin/tenants").json()["tenants"]}
        assert admin_a.post("/admin/keys", json={"tenant": "shared"}).json()["error"]["param"] == "tenant"


@pytest.mark.slow
def test_two_gateways_enforce_one_budget_under_concurrent_load(tmp_path, redis_url):
    with _two_gateways(tmp_path, redis_url) as ((a, admin_a), (b, admin_b)):
        assert admin_a.put("/admin/tenants/shared", json={}).status_code == 201
        key = admin_a.post("/admin/keys", json={"tenant": "shared", "budget_usd": BUDGET_USD,
                                                "budget_period": "daily"}).json()
        clients = [openai.OpenAI(base_url=s.base_url, api_key=key["key"], max_retries=0, timeout=20) for s in (a, b)]
        served = [0, 0]
        lock = threading.Lock()

        def hammer(i: int) -> None:
            client, refusals = clients[i % 2], 0
            for _ in range(100):  # bounded: a gateway that never refuses fails the test, not hangs it
                if refusals >= 8:  # keep coming back a while: reservations of running requests settle
                    break
                try:
                    _ask(client)
                    refusals = 0
                    with lock:
                        served[i % 2] += 1
                except openai.RateLimitError as e:
                    assert e.body["code"] == "budget_exceeded"
                    refusals += 1

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        spent = sum(served) * COST_SMALL
        assert served[0] > 5 and served[1] > 5, served  # both gateways took a share of the load
        print(f"two gateways, one budget ${BUDGET_USD:.2f}: spent ${spent:.3f}, served {served}")
        assert abs(spent - BUDGET_USD) <= 0.05 * BUDGET_USD, (spent, served)
        for admin in (admin_a, admin_b):  # one ledger: each gateway sees the other's spend
            assert admin.get(f"/admin/keys/{key['id']}").json()["usage"]["spent_usd"] == pytest.approx(spent)
