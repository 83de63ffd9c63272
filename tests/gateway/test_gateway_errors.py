"""Bad input gets the right status and an OpenAI-style error; the server keeps serving."""

from __future__ import annotations

import pytest

from tokenops.config import GatewaySettings, Settings
from tokenops.gateway.auth import hash_key
from tokenops.testing_gateway import FakeBackend, gateway_client
from tokenops.types import BackendError, Rejection

MSG = [{"role": "user", "content": "hello"}]


def _is_openai_error(r, status, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


async def _still_serves(c):
    r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


async def test_bad_inputs_each_get_their_status_and_server_keeps_serving():
    settings = Settings(gateway=GatewaySettings(max_body_bytes=2000))
    async with gateway_client([FakeBackend(max_model_len=50)], settings=settings) as c:
        r = await c.post("/v1/chat/completions", content=b'{"model": "fake-model", "messages": [', 
                         headers={"content-type": "application/json"})
        _is_openai_error(r, 400, "invalid_json")
        await _still_serves(c)
        r = await c.post("/v1/chat/completions", json={"model": "nope", "messages": MSG})
        err = _is_openai_error(r, 404, "model_not_found")
        assert "fake-model" in err["message"] and err["param"] == "model"
        await _still_serves(c)
        r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG, "max_tokens": -1})
        assert _is_openai_error(r, 400)["param"] == "max_tokens"
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "word " * 60})
        err = _is_openai_error(r, 400, "context_length_exceeded")
        assert "maximum context length" in err["message"]
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "word " * 60, "stream": True})
        _is_openai_error(r, 400, "context_length_exceeded")  # streamed requests fail before the first byte
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x" * 5000})
        _is_openai_error(r, 413, "request_too_large")
        await _still_serves(c)


async def test_oversized_body_without_content_length_is_refused_while_streaming_in():
    settings = Settings(gateway=GatewaySettings(max_body_bytes=1000))

    async def chunks():
        for _ in range(10):
            yield b" " * 500

    async with gateway_client([FakeBackend()], settings=settings) as c:
        r = await c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        _is_openai_error(r, 413)
        await _still_serves(c)


@pytest.mark.parametrize("body,param", [
    ({"model": "fake-model"}, "messages"),
    ({"model": "fake-model", "messages": []}, "messages"),
    ({"model": "fake-model", "messages": MSG, "temperature": 5}, "temperature"),
    ({"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": MSG}, "model"),
])
async def test_validation_errors_are_400_not_422(body, param):
    async with gateway_client([FakeBackend()]) as c:
        r = await c.post("/v1/chat/completions", json=body)
    assert _is_openai_error(r, 400)["param"] == param


async def test_json_that_is_not_an_object_and_unknown_paths():
    async with gateway_client([FakeBackend()]) as c:
        _is_openai_error(await c.post("/v1/chat/completions", json=[1, 2]), 400, "invalid_json")
        _is_openai_error(await c.get("/v1/nothing"), 404)
        _is_openai_error(await c.get("/v1/chat/completions"), 405)


async def test_api_keys_map_to_tenants_and_wrong_keys_get_401():
    settings = Settings(gateway=GatewaySettings(api_keys={"sk-alpha": "alpha", f"sha256:{hash_key('sk-beta')}": "beta"}))
    backend = FakeBackend()
    async with gateway_client([backend], settings=settings) as c:
        _is_openai_error(await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG}), 401)
        r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG},
                         headers={"Authorization": "Bearer sk-wrong"})
        _is_openai_error(r, 401, "invalid_api_key")
        for key, tenant in (("sk-alpha", "alpha"), ("sk-beta", "beta")):
            r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG, "user": "u1"},
                             headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
            assert backend.requests[-1].tenant == tenant  # the key decides, not the body's user
        _is_openai_error(await c.get("/v1/models"), 401)


async def test_open_server_serves_loopback_only(register_plugin):
    from tokenops.gateway.app import create_app
    import httpx

    app = create_app(Settings(), [FakeBackend()], admin_key_hash=hash_key("k"))
    async with app.router.lifespan_context(app):
        await app.state.gateway.wait_started()
        for host, status in (("10.1.2.3", 401), ("127.0.0.1", 200), ("::1", 200)):
            transport = httpx.ASGITransport(app=app, client=(host, 1234))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG})
                assert r.status_code == status, host


async def test_admission_rejection_is_429_with_retry_after(register_plugin):
    class Limiter:
        from tokenops import hookimpl

        @hookimpl
        def tokenops_admit(self, request):
            if request.prompt_text() == "too much":
                return Rejection(status=429, message="slow down", retry_after_s=2.0)
            return None

    register_plugin(Limiter(), "test-limiter")
    async with gateway_client([FakeBackend()]) as c:
        r = await c.post("/v1/chat/completions", json={"model": "fake-model",
                                                        "messages": [{"role": "user", "content": "too much"}]})
        _is_openai_error(r, 429, "rate_limit_exceeded")
        assert r.headers["retry-after"] == "2"
        await _still_serves(c)


async def test_backend_failure_is_5xx_then_fallback_plugin_rescues(register_plugin):
    primary, spare = FakeBackend("primary"), FakeBackend("spare", reply="from spare")
    async with gateway_client({"primary": [primary], "spare": [spare]}) as c:
        primary.fail_next.append(BackendError("engine exploded", kind="error", status=500))
        r = await c.post("/v1/chat/completions", json={"model": "primary", "messages": MSG})
        _is_openai_error(r, 500)

        class Fallback:
            from tokenops import hookimpl

            @hookimpl
            def tokenops_fallback(self, request, error):
                return "spare" if request.model == "primary" else None

        register_plugin(Fallback(), "test-fallback")
        primary.fail_next.append(BackendError("engine exploded", kind="overload", status=503))
        r = await c.post("/v1/chat/completions", json={"model": "primary", "messages": MSG})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "from spare "
        rec = c.gateway.recent[-1]
        assert rec.model_served == "spare" and rec.route_reason == "fallback:overload"
        assert rec.decisions["fallbacks"] == [{"from": "primary", "to": "spare", "error": "overload"}]


async def test_health_answers_while_models_load_and_ready_says_when_they_are():
    from tokenops.gateway.app import create_app
    import httpx

    app = create_app(Settings(), [FakeBackend(start_delay_s=0.5)], admin_key_hash=hash_key("k"))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            assert (await c.get("/health")).status_code == 200
            r = await c.get("/ready")
            assert r.status_code == 503 and r.json() == {"ready": False, "replicas": {"fake-model#0": False},
                                                  "loading": ["fake-model"]}  # named: not in /v1/models yet
            r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSG})
            _is_openai_error(r, 503, "model_not_ready")
            await app.state.gateway.wait_started()
            assert (await c.get("/ready")).status_code == 200
            await _still_serves(c)
