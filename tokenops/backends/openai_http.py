"""The ``openai`` backend: any OpenAI-compatible server (vLLM, SGLang, llama.cpp
server, Ollama, TGI, another tokenops) through one pooled ``httpx.AsyncClient``
(on :class:`PooledTransport`, a lean keep-alive transport for ``http://`` upstreams).

Connect errors and 5xx answers are retried (``max_retries``, short backoff) as long
as nothing was sent to the client yet; streams are passed through token by token.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tokenops import trace_context
from tokenops.backends.anthropic_upstream import native_deltas, native_once, native_open, wants_native
from tokenops.backends.base import Delta, replica_name
from tokenops.backends.http_transport import PooledTransport
from tokenops.backends.native_upstream import upstream_error as _upstream_error
from tokenops.backends.openai_answers import answer_of, chunk_deltas, usage_delta
from tokenops.backends.openai_http_meter import BATCH, BatchMeter
from tokenops.backends.openai_responses import responses_once, responses_stream, wants_responses
from tokenops.backends.sse import sse_data as _sse_data
from tokenops.config import ModelConfig, Settings
from tokenops.types import BackendError, GatewayRequest, GatewayResponse

log = logging.getLogger("tokenops.backends")

_RETRY_STATUSES = {500, 502, 503, 504}
_client: httpx.AsyncClient | None = None
_client_users = 0


def shared_client() -> httpx.AsyncClient:
    """The process-wide pooled client (created on first use, closed with its last user)."""
    global _client, _client_users
    if _client is None or _client.is_closed:
        _client = httpx.AsyncClient(
            transport=PooledTransport(),
            timeout=httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=60.0),
            follow_redirects=False,
        )
        _client_users = 0
    _client_users += 1
    return _client


async def _release_client() -> None:
    global _client, _client_users
    _client_users -= 1
    if _client_users <= 0 and _client is not None:
        client, _client = _client, None
        await client.aclose()


def base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both mean ``http://host:8000/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class OpenAIBackend:
    """One upstream OpenAI-compatible server serving one model."""

    kind = "openai"

    def __init__(self, model: ModelConfig, settings: Settings) -> None:
        assert model.url, "an openai replica needs a URL"
        self.model = model.name
        self.name = replica_name(model)
        self.url = base_url(model.url)
        #: The id sent upstream: ``served_model`` when configured, else learned from the
        #: upstream's ``/v1/models`` at start (see :meth:`_learn_models`).
        self.upstream_model = model.served_model or model.name
        self._is_model_fixed = model.served_model is not None
        self._has_listed_models = False
        self.max_model_len: int | None = None
        self.num_retries = model.max_retries
        self.read_timeout_s = model.timeout_s
        self._headers = {"content-type": "application/json"}
        if model.api_key:
            self._headers["authorization"] = f"Bearer {model.api_key}"
        self._timeout = httpx.Timeout(connect=5.0, read=model.timeout_s, write=30.0, pool=60.0)
        self._client: httpx.AsyncClient | None = None
        self._is_ready = False
        #: Whether the upstream serves Anthropic's /v1/messages: None until a request finds out.
        self.serves_messages: bool | None = None
        #: Why the upstream cannot be reached (the last contact failed to connect), else None:
        #: ``/ready`` lists it and does not count this replica as serving until it answers again.
        self.unreachable: str | None = None
        self._probe: asyncio.Task | None = None
        #: Whether the upstream serves OpenAI's /v1/responses: None until a request finds out.
        self.serves_responses: bool | None = None
        #: Batch lines: sent with vLLM's ``priority`` = 1 when the upstream takes it, and held back
        #: while interactive requests are in flight (tokenops/backends/openai_http_meter.py).
        self.priority_field = model.priority_field
        self.meter = BatchMeter(model.batch_max_in_flight_upstream, settings.batches.upstream_ttft_slo_ms / 1000)
        if model.batch_upstream_queue:  # and on the upstream's own queue (its /metrics)
            self.meter.watch_queue(lambda: self.send("GET", "/metrics"))

    @property
    def ready(self) -> bool:
        return self._is_ready

    async def start(self) -> None:
        self._client = shared_client()
        self._is_ready = True
        await self._learn_models()

    async def _learn_models(self) -> None:
        """Ask the upstream's ``/v1/models`` which id to send and the context window.

        Without ``served_model``, the gateway's name is sent when the upstream lists it,
        else the upstream's only model (``--model vllm=http://host:8000`` in front of a
        vLLM serving ``Qwen/Qwen2.5-7B-Instruct`` sends ``Qwen/Qwen2.5-7B-Instruct``).
        An upstream still booting is fine: the first request asks again."""
        assert self._client is not None
        try:
            r = await self._client.get(self.url + "/models", headers=self._headers, timeout=2.0)
        except Exception as e:  # not reachable (yet)
            self._lost(e)
            return
        self.unreachable = None
        if r.status_code >= 500:  # still starting
            return
        self._has_listed_models = True  # any other answer, list or not, is not asked for again
        try:
            data = r.json().get("data", [])
            cards = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except Exception:  # a server without an OpenAI model list: send the configured name
            cards = []
        ids = [m["id"] for m in cards]
        if not self._is_model_fixed and self.model not in ids:
            if len(ids) == 1:
                self.upstream_model = ids[0]
                log.info(
                    "model %s: upstream %s serves %r; requests go there under that id", self.model, self.url, ids[0]
                )
            elif ids:
                log.warning(
                    "model %s: upstream %s serves %s, none named %r; set [[models]] served_model",
                    self.model,
                    self.url,
                    ", ".join(map(repr, ids[:8])),
                    self.model,
                )
        for m in cards:
            if m["id"] == self.upstream_model and isinstance(m.get("max_model_len"), int):
                self.max_model_len = m["max_model_len"]

    def _lost(self, error: Exception) -> None:
        """Note the upstream as unreachable and ask it again every 2 s until it answers."""
        self.unreachable = f"cannot reach {self.url}: {type(error).__name__}"
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._reprobe(), name=f"probe {self.name}")

    async def _reprobe(self) -> None:
        while self.unreachable is not None and self._client is not None:
            await asyncio.sleep(2.0)
            try:
                await self._client.get(self.url + "/models", headers=self._headers, timeout=2.0)
            except Exception:  # still down
                continue
            self.unreachable = None

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._client is not None:
            self._client = None
            self._is_ready = False
            await _release_client()

    async def send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        *,
        root: bool = True,
    ) -> httpx.Response:
        """One request to the upstream's ``path``, at its root (``/tokenize``) or under ``/v1``; a
        body is sent as the upstream's model. Raises ``RuntimeError`` before the backend started and
        httpx's errors when the upstream cannot be reached."""
        if self._client is None:
            raise RuntimeError(f"{self.name} is not started")
        url = (self.url[: -len("/v1")] if root else self.url) + path
        payload = None if body is None else {**body, "model": self.upstream_model}
        return await self._client.request(
            method, url, json=payload, headers={**self._headers, **(headers or {})}, timeout=self._timeout
        )

    def authorization(self) -> str:
        """The ``authorization`` header the upstream is sent ("" without a key)."""
        return self._headers.get("authorization", "")

    def stats(self) -> dict[str, Any] | None:
        return None

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        return {}

    def apply_batch_tunables(self, values: dict[str, Any]) -> None:
        """``batches.upstream_ttft_slo_ms`` (live): the meter's SLO, set on its own event loop."""
        if "batches.upstream_ttft_slo_ms" in values:
            self.meter.set_slo_from_thread(float(values["batches.upstream_ttft_slo_ms"]) / 1000)

    # -- requests ---------------------------------------------------------

    def _payload(self, request: GatewayRequest, stream: bool) -> dict[str, Any]:
        # ``cache`` is the gateway's own switch (semantic cache), not the upstream's
        body = {k: v for k, v in request.body.items() if v is not None and k != "cache"}
        body["model"] = self.upstream_model
        if self.priority_field and request.priority_class == BATCH:
            body["priority"] = max(1, body.get("priority") or 0)  # vLLM: lower runs first; 0 is the default
        if request.kind == "embedding":
            return body
        body["stream"] = stream
        if request.kind == "chat":
            body.pop("max_tokens", None)
            body["max_tokens"] = request.max_tokens
            body.pop("max_completion_tokens", None)
        else:
            body["max_tokens"] = request.max_tokens
        if stream:
            body["stream_options"] = {"include_usage": True}
        else:
            body.pop("stream_options", None)
        return body

    def _path(self, request: GatewayRequest) -> str:
        return self.url + {"chat": "/chat/completions", "embedding": "/embeddings"}.get(request.kind, "/completions")

    async def _send(
        self,
        request: GatewayRequest,
        stream: bool,
        *,
        path: str | None = None,
        payload: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """POST with retries on connect errors and 5xx. A streamed response is open
        (the caller closes it); a non-streamed one is already read. ``path``/``payload``/``headers``
        replace the chat-completions ones (Anthropic pass-through)."""
        if self._client is None:
            raise BackendError(f"backend {self.name} is not started", kind="unavailable", status=503, backend=self.name)
        if not self._has_listed_models:
            await self._learn_models()
        body = self._payload(request, stream) if payload is None else {**payload, "model": self.upstream_model}
        content = json.dumps(body, separators=(",", ":")).encode()
        url, send_headers = (
            self._path(request) if path is None else self.url + path,
            {**self._headers, **(headers or {})},
        )
        trace_context.inject(
            send_headers
        )  # the attempt's traceparent: a traced upstream (vLLM) joins the request's trace
        last: BackendError | None = None
        for attempt in range(self.num_retries + 1):
            if attempt:
                await asyncio.sleep(min(0.05 * 2 ** (attempt - 1), 1.0))
            try:
                req = self._client.build_request(
                    "POST", url, content=content, headers=send_headers, timeout=self._timeout
                )
                response = await self._client.send(req, stream=stream)
            except httpx.ConnectError as e:
                # refused or unresolvable: the same URL will not answer 50 ms later; the gateway
                # retries another replica of the model at once (tokenops.routing.retry)
                self._lost(e)
                raise BackendError(
                    f"{self.name}: cannot reach {self.url}: {type(e).__name__}", "unavailable", 503, self.name
                ) from None
            except (httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
                last = BackendError(
                    f"{self.name}: cannot reach {self.url}: {type(e).__name__}", "unavailable", 503, self.name
                )
                continue
            except httpx.TimeoutException:
                raise BackendError(f"{self.name}: upstream timed out", "timeout", 504, self.name) from None
            except httpx.TransportError as e:  # the connection broke while the answer was read (a killed upstream)
                raise BackendError(
                    f"{self.name}: connection to {self.url} broke: {type(e).__name__}", "error", 502, self.name
                ) from None
            self.unreachable = None
            if response.status_code >= 400:
                error_body = await response.aread()
                await response.aclose()
                last = _upstream_error(self.name, response.status_code, error_body)
                if response.status_code in _RETRY_STATUSES:
                    continue
                raise last
            return response
        assert last is not None
        raise last

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        async with self.meter.hold(request.priority_class):
            return await self._chat(request)

    async def _chat(self, request: GatewayRequest) -> GatewayResponse:
        if wants_native(self, request):
            answer = await native_once(self, request)
            if answer is not None:
                return answer
        elif wants_responses(self, request):
            answer = await responses_once(self, request)
            if answer is not None:
                return answer
        elif request.native is not None:  # known not to serve it: what the translation lost is a 400
            request.native.check_translatable(self.name)
        return await self._one(request)

    async def embed(self, request: GatewayRequest) -> dict[str, Any]:
        """Pass an embeddings request through; returns the upstream's answer as it came
        (the gateway puts its own model name in)."""
        async with self.meter.hold(request.priority_class):
            response = await self._send(request, stream=False)
        try:
            data = json.loads(response.content)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BackendError(f"{self.name}: bad upstream answer: {e}", "error", 502, self.name) from None
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise BackendError(f"{self.name}: upstream embeddings answer has no data list", "error", 502, self.name)
        return data

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        async with self.meter.hold(request.priority_class):
            return await self._one(request)

    async def _one(self, request: GatewayRequest) -> GatewayResponse:
        response = await self._send(request, stream=False)
        try:
            data = json.loads(response.content)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BackendError(f"{self.name}: bad upstream answer: {e}", "error", 502, self.name) from None
        return answer_of(data, request.kind, self.model, self.name)

    async def stream(self, request: GatewayRequest) -> AsyncIterator[Delta]:
        async with self.meter.hold(request.priority_class) as slot:
            async for delta in self._stream(request):
                slot.first_token()  # the meter's SLO is on the time to first token
                yield delta

    async def _stream(self, request: GatewayRequest) -> AsyncIterator[Delta]:
        if wants_native(self, request):
            response = await native_open(self, request)
            if response is not None:
                async for delta in native_deltas(self, response):
                    yield delta
                return
        elif wants_responses(self, request):
            events = await responses_stream(self, request)
            if events is not None:
                async for delta in events:
                    yield delta
                return
        elif request.native is not None:
            request.native.check_translatable(self.name)
        async for delta in self._stream_chat(request):
            yield delta

    async def _stream_chat(self, request: GatewayRequest) -> AsyncIterator[Delta]:
        response = await self._send(request, stream=True)
        num_tokens = 0
        usage: dict[str, Any] | None = None
        try:
            async for line in _sse_data(response):
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                    raise BackendError(f"{self.name}: {err.get('message', 'upstream error')}", "error", 502, self.name)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                deltas, n = chunk_deltas(chunk, request.kind)
                num_tokens += n
                for delta in deltas:
                    yield delta
        except httpx.TimeoutException:
            raise BackendError(f"{self.name}: upstream timed out mid-stream", "timeout", 504, self.name) from None
        except httpx.HTTPError as e:
            raise BackendError(f"{self.name}: stream broke: {type(e).__name__}", "error", 502, self.name) from None
        finally:
            await response.aclose()
        yield usage_delta(usage or {}, num_tokens)
