"""Gateway test helpers for plugin authors: a deterministic ``FakeBackend`` and an
in-process gateway client (re-exported by :mod:`tokenops.testing`).

``FakeBackend`` answers with whitespace-separated words, one token each
(``reply`` or ``"fake answer from <model>: <prompt words>"``), streams them with
``delay_s`` between tokens, honours ``max_tokens``/``stop``, checks its context
window (``max_model_len``), can fail on purpose (``fail_next``) and reports
engine-like ``stats()``. ``gateway_client(...)`` runs a real app (lifespan
included) behind an ``httpx.AsyncClient`` on the ASGI transport.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tokenops.backends.base import Delta, collect
from tokenops.types import BackendError, GatewayRequest, GatewayResponse


class FakeBackend:
    """A backend with no model: deterministic words, configurable speed and failures."""

    kind = "fake"

    def __init__(
        self,
        model: str = "fake-model",
        name: str | None = None,
        *,
        reply: str | None = None,
        delay_s: float = 0.0,
        max_model_len: int | None = 2048,
        expert_load: bool = False,
        start_delay_s: float = 0.0,
    ) -> None:
        self.model = model
        self.name = name or f"{model}#0"
        self.reply = reply
        self.delay_s = delay_s
        self.max_model_len = max_model_len
        self.start_delay_s = start_delay_s
        self.requests: list[GatewayRequest] = []
        self.aborted: list[str] = []
        self.applied: dict[str, Any] = {}
        self.fail_next: list[BackendError] = []
        self.num_prompt_tokens = 0
        self.num_generated = 0
        self.num_running = 0
        self.is_started = False
        self.is_closed = False
        self._expert_load = [[0] * 4 for _ in range(2)] if expert_load else None

    @property
    def ready(self) -> bool:
        return self.is_started and not self.is_closed

    async def start(self) -> None:
        if self.start_delay_s:
            await asyncio.sleep(self.start_delay_s)
        self.is_started = True

    async def close(self) -> None:
        self.is_closed = True

    def stats(self) -> dict[str, Any]:
        return {
            "num_running": self.num_running,
            "num_waiting": 0,
            "kv_blocks_used": self.num_running,
            "kv_blocks_total": 64,
            "kv_cache_usage": self.num_running / 64,
            "prefix_cache_queries": self.num_prompt_tokens,
            "prefix_cache_hits": 0,
            "num_preemptions": 0,
            "last_step_time_s": 0.0,
            "last_batch_tokens": 0,
            "total_prompt_tokens": self.num_prompt_tokens,
            "total_generation_tokens": self.num_generated,
            "num_steps": self.num_generated,
            "expert_load": [list(x) for x in self._expert_load] if self._expert_load else None,
            "model": self.model,
        }

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        self.applied.update(values)
        return dict(values)

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        return await collect(self.stream(request), self.model, self.name)

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        return await collect(self.stream(request), self.model, self.name)

    def words(self, request: GatewayRequest) -> list[str]:
        text = self.reply if self.reply is not None else f"fake answer from {self.model}: {request.prompt_text()}"
        return [w + " " for w in text.split()]

    async def stream(self, request: GatewayRequest) -> AsyncIterator[Delta]:
        self.requests.append(request)
        if self.fail_next:
            raise self.fail_next.pop(0)
        num_prompt = len(request.prompt_text().split()) + 3
        if self.max_model_len is not None and num_prompt >= self.max_model_len:
            raise BackendError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt has {num_prompt} tokens.",
                kind="context_length",
                status=400,
                backend=self.name,
            )
        stops = request.body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        words = self.words(request)
        self.num_running += 1
        self.num_prompt_tokens += num_prompt
        num_out, finish, text = 0, "stop", ""
        try:
            for w in words:
                if num_out >= request.max_tokens:
                    finish = "length"
                    break
                if any(s in text + w for s in stops):
                    break
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                num_out += 1
                self.num_generated += 1
                text += w
                if self._expert_load:
                    self._expert_load[num_out % 2][num_out % 4] += 1
                yield Delta(text=w, num_tokens=1)
            else:
                finish = "stop"
            yield Delta(finish_reason=finish)
            yield Delta(prompt_tokens=num_prompt, completion_tokens=num_out, cached_tokens=0)
        except (GeneratorExit, asyncio.CancelledError):
            self.aborted.append(request.id)
            raise
        finally:
            self.num_running -= 1


@contextlib.asynccontextmanager
async def gateway_client(backends: Any = None, settings: Any = None, **app_kwargs: Any) -> AsyncIterator[Any]:
    """An ``httpx.AsyncClient`` talking to a started gateway app (lifespan run).

    ``backends`` defaults to one :class:`FakeBackend` named ``fake-model``, unless
    ``settings`` has ``[[models]]``: then they are built from it; the
    admin key is ``test-admin-key`` unless ``admin_key_hash`` is given. The client
    has ``.app`` (the FastAPI app) and ``.gateway`` (its state) attached.
    """
    import httpx

    from tokenops.gateway.app import create_app
    from tokenops.gateway.auth import hash_key

    app_kwargs.setdefault("admin_key_hash", hash_key("test-admin-key"))
    if backends is None and not (settings is not None and settings.models):
        backends = [FakeBackend()]
    app = create_app(settings, backends, **app_kwargs)
    async with app.router.lifespan_context(app):
        await app.state.gateway.wait_started()
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30) as client:
            client.app = app  # type: ignore[attr-defined]
            client.gateway = app.state.gateway  # type: ignore[attr-defined]
            yield client
