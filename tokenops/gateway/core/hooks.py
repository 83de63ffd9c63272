"""The only place the gateway calls plugin hooks: one small accessor per step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from tokenops.backends.registry import BackendFactory
from tokenops.blocking import blocking_mark
from tokenops.plugin_manager import hook
from tokenops.types import (
    BackendError,
    BackendOutcome,
    GatewayRequest,
    GatewayResponse,
    Rejection,
    RouteDecision,
    TelemetryEvent,
)


def is_blocking(hook_name: str, **kwargs: Any) -> bool:
    """Whether an implementation of ``hook_name`` is marked ``@may_block`` for these arguments:
    the caller then runs the hook in a worker thread (cheap hooks stay on the event loop).
    A few microseconds; a thread hop costs tens."""
    for impl in getattr(hook(), hook_name).get_hookimpls():
        mark = blocking_mark(impl.function)
        if mark is not None and mark.applies(kwargs, getattr(impl.function, "__self__", None)):
            return True
    return False


T = TypeVar("T")


async def call(hook_name: str, accessor: Callable[..., T], **kwargs: Any) -> T:
    """``accessor(**kwargs)`` on the event loop, or in a worker thread when an implementation
    of ``hook_name`` is marked ``@may_block`` for these arguments."""
    if is_blocking(hook_name, **kwargs):
        return await asyncio.to_thread(accessor, **kwargs)
    return accessor(**kwargs)


def get_backend_factories() -> dict[str, BackendFactory]:
    """Backend kind -> factory, contributed by plugins (``tokenops_register_backends``; the first
    plugin to register a kind keeps it)."""
    factories: dict[str, BackendFactory] = {}

    def register(kind: str, factory: BackendFactory) -> None:
        factories.setdefault(kind, factory)

    hook().tokenops_register_backends(register=register)
    return factories


def get_rejection(request: GatewayRequest) -> Rejection | None:
    return hook().tokenops_admit(request=request)


def get_cached_response(request: GatewayRequest) -> GatewayResponse | None:
    return hook().tokenops_cache_lookup(request=request)


def get_route(request: GatewayRequest, candidates: list[str], profiles: dict[str, Any]) -> RouteDecision | None:
    return hook().tokenops_route(request=request, candidates=candidates, profiles=profiles)


def get_replica(request: GatewayRequest, replicas: list[Any]) -> Any:
    return hook().tokenops_select_replica(request=request, replicas=replicas)


def get_validation_scores(request: GatewayRequest, response: GatewayResponse) -> list[float]:
    return [s for s in hook().tokenops_validate(request=request, response=response) if s is not None]


def report_outcome(backend: str, outcome: BackendOutcome) -> None:
    hook().tokenops_backend_outcome(backend=backend, outcome=outcome)


def get_replica_states() -> dict[str, str] | None:
    return hook().tokenops_replica_states()


def offer_to_cache(request: GatewayRequest, response: GatewayResponse) -> None:
    hook().tokenops_cache_store(request=request, response=response)


def wants_logprobs(request: GatewayRequest, model: str) -> bool:
    """Whether a plugin wants the answer's token logprobs (``tokenops_wants_logprobs``)."""
    return any(hook().tokenops_wants_logprobs(request=request, model=model))


def has_context_fitter() -> bool:
    return bool(hook().tokenops_fit_context.get_hookimpls())


def fit_context(request: GatewayRequest, window: Any) -> Any:
    return hook().tokenops_fit_context(request=request, window=window)


def get_fallback_model(request: GatewayRequest, error: BackendError) -> str | None:
    return hook().tokenops_fallback(request=request, error=error)


def request_finished(record: Any) -> None:
    hook().tokenops_request_finished(record=record)


def record(event: TelemetryEvent) -> None:
    hook().tokenops_record(event=event)


def apply_plugin_tunables(values: dict[str, Any]) -> None:
    hook().tokenops_apply_tunables(values=values)


def forget_tenant(tenant: str, store: Any) -> dict[str, int]:
    """Every plugin forgets the tenant; their counts merged (``{what: number deleted}``)."""
    merged: dict[str, int] = {}
    for result in hook().tokenops_tenant_deleted(tenant=tenant, store=store):
        for what, count in (result or {}).items():
            merged[what] = merged.get(what, 0) + int(count)
    return merged


def configure(settings: Any) -> None:
    hook().tokenops_configure.call_historic(kwargs={"settings": settings})


def get_ensemble(request: GatewayRequest, responses: list[GatewayResponse]) -> GatewayResponse | None:
    return hook().tokenops_ensemble(request=request, responses=responses)


def get_expert_plan(load: list[list[float]], num_devices: int, num_redundant: int, num_nodes: int = 1) -> Any:
    return hook().tokenops_expert_placement(
        load=load, num_devices=num_devices, num_redundant=num_redundant, num_nodes=num_nodes
    )
