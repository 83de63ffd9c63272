"""Managed keys and budgets through a running `tokenops serve`, driven by the openai SDK."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import openai
import pytest

# small: 1000 $/1M in, 2000 $/1M out; "hi there" -> 2 words + 3 = 5 prompt tokens, 4 completion tokens
COST_SMALL = (5 * 1000.0 + 4 * 2000.0) / 1e6  # 0.013 USD


def _tenant(admin: httpx.Client, **budget) -> str:
    name = "t-" + uuid.uuid4().hex[:8]
    assert admin.put(f"/admin/tenants/{name}", json=budget).status_code == 201
    return name


def _key(admin: httpx.Client, **fields) -> dict:
    fields.setdefault("tenant", _tenant(admin))
    r = admin.post("/admin/keys", json=fields)
    assert r.status_code == 201, r.text
    return r.json()


def _client(server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=secret, max_retries=0)


def _ask(client: openai.OpenAI, model: str = "small"):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi there"}], max_tokens=4)


def test_created_key_works_at_once_and_revoked_key_stops_at_once(server, admin):
    key = _key(admin, name="ci")
    assert key["key"].startswith("tok-") and key["state"] == "active"
    client = _client(server, key["key"])
    assert _ask(client).choices[0].message.content.startswith("alpha")
    listed = admin.get("/admin/keys").json()["keys"]
    assert key["id"] in [k["id"] for k in listed] and all("key" not in k and "key_hash" not in k for k in listed)
    assert admin.delete(f"/admin/keys/{key['id']}").json()["state"] == "revoked"
    with pytest.raises(openai.AuthenticationError) as e:
        _ask(client)
    assert e.value.body["code"] == "revoked_api_key" and "revoked" in e.value.body["message"]
    # once a managed key exists the server wants a key from everyone
    with pytest.raises(openai.AuthenticationError):
        _ask(_client(server, "tok-not-a-key"))


def test_key_limited_to_a_model_gets_403_on_another(server, admin):
    key = _key(admin, models=["small"])
    client = _client(server, key["key"])
    _ask(client, "small")
    with pytest.raises(openai.PermissionDeniedError) as e:
        _ask(client, "large")
    assert e.value.body["code"] == "model_not_allowed"
    alias = _key(admin, models=["auto"])  # an alias (the cascade) is a model name a key may be limited to
    assert _ask(_client(server, alias["key"]), "auto").choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError):
        _ask(_client(server, alias["key"]), "small")


def test_budget_refuses_within_one_request_and_resets_with_the_period(server, admin):
    key = _key(admin, budget_usd=0.05, budget_period="daily", soft_budget_usd=0.02)
    client = _client(server, key["key"])
    served, warnings = 0, []
    for _ in range(10):
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="small", messages=[{"role": "user", "content": "hi there"}], max_tokens=4)
        except openai.RateLimitError as e:
            assert e.body["code"] == "budget_exceeded"
            assert "resets at" in e.body["message"] and int(e.response.headers["retry-after"]) > 0
            break
        served += 1
        warnings.append(raw.headers.get("x-tokenops-budget-warning"))
    spent = served * COST_SMALL
    assert 0.05 <= spent < 0.05 + COST_SMALL  # stopped at the budget, never more than one request over
    assert warnings[0] is None and warnings[-1] and "soft budget" in warnings[-1]
    usage = admin.get(f"/admin/keys/{key['id']}").json()["usage"]
    assert usage["spent_usd"] == pytest.approx(spent) and usage["remaining_usd"] == 0.0
    with pytest.raises(openai.RateLimitError):
        _ask(client)
    assert admin.post("/admin/budget-clock", json={"offset_s": 86400}).status_code == 200  # the next day
    assert _ask(client).usage.completion_tokens == 4
    assert admin.get(f"/admin/keys/{key['id']}").json()["usage"]["spent_usd"] == pytest.approx(COST_SMALL)


def test_tenant_budget_covers_all_its_keys_and_cascade_members(server, admin):
    tenant = _tenant(admin, budget_usd=0.03, budget_period="24h")
    a, b = _key(admin, tenant=tenant), _key(admin, tenant=tenant)
    _ask(_client(server, a["key"]), "auto")  # the cascade may call both tiers: all of it counts
    _ask(_client(server, b["key"]), "small")
    spent = next(t for t in admin.get("/admin/keys", params={"tenant": tenant}).json()["tenants"])["usage"]["spent_usd"]
    recorded = sum(r["cost_usd"] for r in admin.get("/admin/requests", params={"limit": 50}).json()["requests"]
                   if r["tenant"] == tenant)
    assert spent == pytest.approx(recorded) and spent >= 2 * COST_SMALL
    with pytest.raises(openai.RateLimitError) as e:
        for _ in range(5):
            _ask(_client(server, b["key"]))
    assert "tenant" in e.value.body["message"]


def test_expired_key_gets_401_saying_so(server, admin):
    key = _key(admin, expires_at=time.time() + 3600)
    client = _client(server, key["key"])
    _ask(client)
    admin.post("/admin/budget-clock", json={"offset_s": 7200})
    with pytest.raises(openai.AuthenticationError) as e:
        _ask(client)
    assert e.value.body["code"] == "expired_api_key" and "expired" in e.value.body["message"]


@pytest.mark.parametrize("body, param", [
    ({"budget_usd": -1}, "budget_usd"),
    ({"rpm": 0}, "rpm"),
    ({"tpm": "many"}, "tpm"),
    ({"budget_period": "weekly"}, "budget_period"),
    ({"budget_usd": 1.0, "soft_budget_usd": 2.0}, "soft_budget_usd"),
    ({"expires_at": "tomorrow"}, "expires_at"),
    ({"colour": "red"}, "colour"),
])
def test_bad_key_fields_get_400(admin, body, param):
    if "tenant" not in body:
        body = {"tenant": _tenant(admin), **body}
    r = admin.post("/admin/keys", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("body, param, code", [
    ({"tenant": "nobody-knows-me"}, "tenant", "tenant_not_found"),
    ({"models": ["no-such-model"]}, "models", "model_not_found"),
])
def test_key_fields_naming_what_does_not_exist_get_404(admin, body, param, code):
    # the body is well formed (as the OpenAPI document says); what it names is not there
    if "tenant" not in body:
        body = {"tenant": _tenant(admin), **body}
    r = admin.post("/admin/keys", json=body)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == code


def test_non_finite_numbers_and_bad_updates_get_400(admin):
    tenant = _tenant(admin)
    for raw in ('{"tenant": "%s", "budget_usd": NaN}', '{"tenant": "%s", "tpm": 1e999}'):
        r = admin.post("/admin/keys", content=raw % tenant, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "finite" in r.json()["error"]["message"]
    key = _key(admin, tenant=tenant)
    assert admin.patch(f"/admin/keys/{key['id']}", json={"tenant": "other"}).status_code == 400
    r = admin.patch(f"/admin/keys/{key['id']}", content='{"budget_usd": Infinity}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "budget_usd"
    assert admin.patch("/admin/keys/key_nope", json={}).status_code == 404
    assert admin.put("/admin/tenants/" + tenant, json={"budget_usd": -0.5}).status_code == 400
    updated = admin.patch(f"/admin/keys/{key['id']}", json={"rpm": 60, "models": ["small"]}).json()
    assert updated["rpm"] == 60 and updated["models"] == ["small"]


def test_metrics_show_spend_and_budget_remaining(server, admin):
    key = _key(admin, budget_usd=1.0)
    _ask(_client(server, key["key"]))
    assert httpx.get(server.url + "/metrics").status_code == 401  # tenant names and spend: behind the admin key
    assert httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {key['key']}"}).status_code == 401
    text = admin.get("/metrics").text
    spend = [l for l in text.splitlines() if l.startswith("tokenops:spend_usd_total{") and key["id"] in l]
    assert spend and float(spend[0].rsplit(" ", 1)[1]) == pytest.approx(COST_SMALL)
    remaining = [l for l in text.splitlines() if l.startswith("tokenops:budget_remaining_usd{") and key["id"] in l]
    assert float(remaining[0].rsplit(" ", 1)[1]) == pytest.approx(1.0 - COST_SMALL)


def test_key_rpm_limit_is_enforced_per_key(server, admin):
    limited = _key(admin, rpm=1)  # a bucket of one request, refilled once a minute
    other = _key(admin, tenant=limited["tenant"])
    client = _client(server, limited["key"])
    _ask(client)
    with pytest.raises(openai.RateLimitError) as e:
        _ask(client)
    assert e.value.body["code"] == "rate_limit_exceeded" and limited["id"] in e.value.body["message"]
    _ask(_client(server, other["key"]))  # the same tenant's other key is not limited
    admin.patch(f"/admin/keys/{limited['id']}", json={"rpm": None})  # lifting the limit acts at once
    _ask(client)


@pytest.mark.slow
def test_keys_and_period_spend_survive_a_restart(tmp_path):
    from tests.keys.conftest import serve

    with serve(tmp_path) as srv:
        admin = httpx.Client(base_url=srv.url, headers=srv.admin_headers)
        tenant = _tenant(admin)
        key = _key(admin, tenant=tenant, budget_usd=1.0, budget_period="24h")  # a rolling window
        for _ in range(3):
            _ask(_client(srv, key["key"]))
    with serve(tmp_path) as again:  # the same store: keys and this period's spend are loaded from it
        admin = httpx.Client(base_url=again.url, headers=again.admin_headers)
        assert admin.get(f"/admin/keys/{key['id']}").json()["usage"]["spent_usd"] == pytest.approx(3 * COST_SMALL)
        assert _ask(_client(again, key["key"])).usage.completion_tokens == 4


def test_streamed_requests_are_budgeted_and_warned_like_others(server, admin):
    key = _key(admin, budget_usd=0.03, soft_budget_usd=0.01, budget_period="daily")
    client = _client(server, key["key"])
    headers = []
    for _ in range(3):
        with client.chat.completions.with_streaming_response.create(
                model="small", messages=[{"role": "user", "content": "hi there"}], max_tokens=4, stream=True,
                stream_options={"include_usage": True}) as response:
            headers.append(response.headers.get("x-tokenops-budget-warning"))
            chunks = list(response.iter_lines())
        assert any('"completion_tokens":4' in c for c in chunks)
    assert headers[0] is None and headers[1] and headers[2]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       stream=True)
    assert admin.get(f"/admin/keys/{key['id']}").json()["usage"]["spent_usd"] == pytest.approx(3 * COST_SMALL)
