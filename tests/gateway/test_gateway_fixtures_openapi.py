"""The plugin-author fixtures (``gateway``, ``fake_backend`` from tokenops.testing) and the served OpenAPI schema."""

from __future__ import annotations

from tokenops import hookimpl
from tokenops.types import Rejection


async def test_gateway_fixture_serves_the_fake_backend_and_sees_plugins(gateway, fake_backend, register_plugin):
    class NoShouting:
        @hookimpl
        def tokenops_admit(self, request):
            if request.prompt_text().isupper():
                return Rejection(status=400, message="please do not shout", code="shouting")

    register_plugin(NoShouting(), "test-no-shouting")
    r = await gateway.post("/v1/chat/completions", json={"model": "fake-model",
                                                         "messages": [{"role": "user", "content": "HELLO"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "shouting"
    r = await gateway.post("/v1/chat/completions", json={"model": "fake-model",
                                                         "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200 and len(fake_backend.requests) == 1
    assert gateway.gateway.recent[-1].tenant == "default"


async def test_openapi_schema_documents_the_openai_routes(gateway):
    schema = (await gateway.get("/openapi.json")).json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ChatCompletionRequest"
    components = schema["components"]["schemas"]
    assert {"messages", "max_tokens", "stream", "top_k"} <= set(components["ChatCompletionRequest"]["properties"])
    assert "ChatMessage" in components and "CompletionRequest" in components
    for path in ("/v1/completions", "/v1/models", "/health", "/ready", "/metrics", "/admin/stats", "/admin/tunables"):
        assert path in schema["paths"], path
    assert (await gateway.get("/docs")).status_code == 200


async def test_plugins_see_headers_but_not_credentials(gateway, fake_backend):
    r = await gateway.post("/v1/chat/completions", headers={"X-Session-Id": "s-42", "Authorization": "Bearer secret"},
                           json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    seen = fake_backend.requests[-1]
    assert seen.session_id == "s-42" and seen.headers["x-session-id"] == "s-42"
    assert "authorization" not in seen.headers
