"""Issue 17: hostile input, admin mistakes and browsers on loopback, against the app in process.

(The same defects against a real ``tokenops serve`` are in test_hardening_serve.py.)
"""

from __future__ import annotations

import json

import pytest

from tokenops.config import Settings
from tokenops.testing_gateway import FakeBackend, gateway_client
from tokenops.tunables import TunableError

ADMIN = {"Authorization": "Bearer test-admin-key"}
CHAT = "/v1/chat/completions"


def _openai_error(r, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and isinstance(err["message"], str)
    for internal in ("Traceback", "TypeError", "RecursionError", "IndexError", "File \""):
        assert internal not in err["message"], err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def _body(**fields) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **fields}


# -- defect 2: client input gave 500s that leaked internals -------------------------------------------------------

@pytest.mark.parametrize("raw, code", [
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800x"}]}', "invalid_json"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "invalid_json"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "x": 1e999}', "invalid_json"),
    (b'{"model": "fake-model", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid_json"),
])
async def test_unparseable_bodies_are_400_with_a_reason(raw, code):
    async with gateway_client() as c:
        err = _openai_error(await c.post(CHAT, content=raw, headers={"content-type": "application/json"}), 400, code)
        assert "parse" in err["message"] or "number" in err["message"]
        assert (await c.post(CHAT, json=_body())).status_code == 200


async def test_content_part_with_non_string_text_is_400_naming_the_field():
    async with gateway_client() as c:
        r = await c.post(CHAT, json=_body(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]))
        err = _openai_error(r, 400, "invalid_value")
        assert err["param"].startswith("messages.0.content") and "string" in err["message"]


async def test_json_types_are_strict_stream_yes_is_not_true():
    async with gateway_client() as c:
        err = _openai_error(await c.post(CHAT, json=_body(stream="yes")), 400, "invalid_value")
        assert err["param"] == "stream"
        _openai_error(await c.post(CHAT, json=_body(max_tokens="5")), 400, "invalid_value")
        assert (await c.post(CHAT, json=_body(temperature=1))).status_code == 200  # an int is a fine float


async def test_too_many_messages_are_refused_before_validation():
    async with gateway_client() as c:
        many = [{"role": "user", "content": "w"}] * 10001
        err = _openai_error(await c.post(CHAT, json=_body(messages=many)), 400, "too_many_messages")
        assert err["param"] == "messages" and "max_messages" in err["message"]


async def test_an_unexpected_exception_is_a_500_without_internals():
    backend = FakeBackend()

    async def boom(request):
        raise TypeError("secret internal detail")

    backend.chat = boom
    async with gateway_client([backend]) as c:
        err = _openai_error(await c.post(CHAT, json=_body()), 500, "internal_error")
        assert "secret" not in err["message"] and "error id" in err["message"]


# -- defect 9: spec looseness --------------------------------------------------------------------------------------

async def test_405_names_the_allowed_methods():
    async with gateway_client() as c:
        r = await c.get(CHAT)
        _openai_error(r, 405)
        assert r.headers["allow"] == "POST"


async def test_openapi_documents_error_responses():
    async with gateway_client() as c:
        spec = (await c.get("/openapi.json")).json()
        responses = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
        assert {"400", "401", "404", "413", "415", "429", "500", "503"} <= set(responses)
        schema = responses["400"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ErrorResponse")
        assert "ErrorResponse" in spec["components"]["schemas"]


# -- defect 5: browsers on loopback --------------------------------------------------------------------------------

async def test_keyless_server_refuses_foreign_host_names_and_non_json_bodies():
    async with gateway_client() as c:
        _openai_error(await c.post(CHAT, json=_body(), headers={"host": "evil.example"}), 421, "host_not_allowed")
        _openai_error(await c.get("/v1/models", headers={"host": "rebound.example:8000"}), 421, "host_not_allowed")
        for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "127.0.0.2"):
            assert (await c.get("/v1/models", headers={"host": host})).status_code == 200, host
        form = await c.post(CHAT, content=json.dumps(_body()), headers={"content-type": "text/plain"})
        _openai_error(form, 415, "unsupported_media_type")
        r = await c.post(CHAT, content=json.dumps(_body()), headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 200


async def test_allowed_hosts_is_configurable_and_api_keys_lift_the_guard():
    settings = Settings()
    settings.gateway.allowed_hosts = ["my-box.lan"]
    async with gateway_client(settings=settings, backends=[FakeBackend()]) as c:
        assert (await c.get("/v1/models", headers={"host": "my-box.lan:8000"})).status_code == 200
        _openai_error(await c.get("/v1/models", headers={"host": "localhost"}), 421)
    keyed = Settings()
    keyed.gateway.api_keys = {"sk-1": "team"}
    async with gateway_client(settings=keyed, backends=[FakeBackend()]) as c:
        auth = {"Authorization": "Bearer sk-1", "host": "api.example.com"}
        assert (await c.post(CHAT, json=_body(), headers=auth)).status_code == 200


# -- defect 3: NaN and friends through the admin API ---------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b'{"values": {"breaker.cooldown_s": NaN}}',
    b'{"values": {"ratelimit.tenant_requests_per_min": NaN}}',
    b'{"values": {"breaker.failure_rate": Infinity}}',
    b'{"values": {"breaker.cooldown_s": 1e999}}',
    b'{"values": {"breaker.cooldown_s": "nan"}}',
    b'{"values": {"breaker.consecutive_failures": 1e300}}',
    b'{"values": {"breaker.cooldown_s": [1]}}',
])
async def test_tunables_reject_non_finite_and_out_of_type_values(raw):
    async with gateway_client() as c:
        r = await c.patch("/admin/tunables", content=raw, headers={**ADMIN, "content-type": "application/json"})
        _openai_error(r, 400)
        values = {t["name"]: t["value"] for t in (await c.get("/admin/tunables", headers=ADMIN)).json()["tunables"]}
        assert values["breaker.cooldown_s"] == 5.0 and values["breaker.failure_rate"] == 0.5
        assert values["ratelimit.tenant_requests_per_min"] == 0
        assert (await c.post(CHAT, json=_body())).status_code == 200  # completions unaffected


def test_tunable_validate_refuses_nan_for_every_float_tunable():
    from tokenops.plugin_manager import get_tunables

    floats = [t for t in get_tunables() if t.type == "float"]
    assert floats
    for t in floats:
        for bad in (float("nan"), float("inf"), "-inf"):
            with pytest.raises(TunableError, match="finite"):
                t.validate(bad)


async def test_a_patch_one_replica_refuses_changes_no_replica():
    class Picky(FakeBackend):
        def apply_tunables(self, values):
            if values.get("engine.max_num_seqs") == 7:
                raise TunableError("engine.max_num_seqs: 7 is not allowed here")
            return super().apply_tunables(values)

    first, second = FakeBackend("m", "m#0"), Picky("m", "m#1")
    async with gateway_client({"m": [first, second]}) as c:
        r = await c.patch("/admin/tunables", json={"values": {"engine.max_num_seqs": 7}}, headers=ADMIN)
        err = _openai_error(r, 400, "invalid_tunable")
        assert "m#1" in err["message"]
        assert first.applied["engine.max_num_seqs"] != 7  # rolled back to the previous value
        values = {t["name"]: t["value"] for t in (await c.get("/admin/tunables", headers=ADMIN)).json()["tunables"]}
        assert values["engine.max_num_seqs"] != 7
        r = await c.patch("/admin/tunables", json={"values": {"engine.max_num_seqs": 9}}, headers=ADMIN)
        assert r.status_code == 200 and first.applied["engine.max_num_seqs"] == second.applied["engine.max_num_seqs"] == 9


# -- defect 1: routing a huge prompt ------------------------------------------------------------------------------

async def test_a_router_that_reads_a_huge_prompt_runs_off_the_event_loop(register_plugin):
    import asyncio
    import time

    from tokenops import hookimpl
    from tokenops.types import RouteDecision

    class SlowClassifier:  # like the profile router's classifier: seconds of work on a 4 MB text
        @hookimpl(tryfirst=True)
        def tokenops_route(self, request, candidates, profiles):
            if len(request.prompt_text()) > 100_000:
                time.sleep(0.5)
            if "refuse me" in request.prompt_text()[:20]:
                raise ValueError("no route for that")
            return RouteDecision("fake-model", "slow classifier", router="slow")

    register_plugin(SlowClassifier(), "slow-classifier")
    async with gateway_client() as c:
        gaps: list[float] = []

        async def heartbeat():
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        beat = asyncio.create_task(heartbeat())
        try:
            big = _body(messages=[{"role": "user", "content": "w" * 200_000}])
            r = await c.post(CHAT, json=big)
            assert r.status_code == 200, r.text
        finally:
            beat.cancel()
        assert max(gaps) < 0.5, max(gaps)  # the 0.5 s of routing did not block the loop (it would show whole)
        refused = _body(messages=[{"role": "user", "content": "refuse me " + "w" * 200_000}])
        _openai_error(await c.post(CHAT, json=refused), 400, "invalid_model")
