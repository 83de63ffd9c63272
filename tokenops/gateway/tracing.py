"""OpenTelemetry traces: one trace per request, its spans opened and ended from the pipeline's steps.

Off unless ``[telemetry] otlp_endpoint`` or an ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` variable
names a collector (and ``OTEL_SDK_DISABLED`` is not true); while off every function here returns at
once, so the pipeline pays one attribute check per step. This is the only module that knows
OpenTelemetry: the pipeline calls it, plugins never do.

Spans (children of the request's root span, ``{operation} {model}``): ``tokenops.admission``,
``tokenops.cache_lookup``, ``tokenops.route``, one ``tokenops.attempt`` per backend call (a retry
on another replica, a fallback, a cascade step and each ensemble member are attempts of their own)
and, under an attempt of the bundled engine, ``engine.queue``, ``engine.prefill`` and
``engine.decode`` built after the fact from the timings the engine reports (``queue_s``,
``prefill_s``). Attributes follow the GenAI semantic conventions (``gen_ai.*``) plus ``tokenops.*``.

A client's W3C ``traceparent`` becomes the root's parent, and the attempt's context is sent on to
``openai`` upstreams (:func:`inject`), so a vLLM behind tokenops joins the trace. Spans are
exported by a ``BatchSpanProcessor`` (a worker thread): a slow or dead collector never blocks the
event loop, it only loses the spans that overflow the queue.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

log = logging.getLogger("tokenops.gateway")

#: perf_counter -> wall clock (ns), for spans whose times the pipeline measured with perf_counter.
_OFFSET_NS = time.time_ns() - int(time.perf_counter() * 1e9)
_tracer: Any = None
_provider: Any = None
_propagator: Any = None
#: The attempt span's context while its backend call runs (read by :func:`inject`).
_attempt_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("tokenops_attempt_ctx", default=None)


def _ns(perf_t: float) -> int:
    return _OFFSET_NS + int(perf_t * 1e9)


def endpoint_from(configured: str | None, environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The OTLP/HTTP traces URL: the configured collector (base URL or full ``/v1/traces`` URL),
    else the standard variables; None when tracing stays off."""
    if str(environ.get("OTEL_SDK_DISABLED", "")).lower() == "true":
        return None
    if configured:
        base = configured.rstrip("/")
        return base if base.endswith("/v1/traces") else base + "/v1/traces"
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return None


def configure(otlp_endpoint: str | None, service_name: str = "tokenops") -> bool:
    """Start exporting to the collector, if one is named; returns whether tracing is on.

    Raises ``RuntimeError`` naming the ``telemetry`` extra when a collector is named but the
    OpenTelemetry SDK is not installed (a silent no-op would hide the misconfiguration)."""
    global _tracer, _provider, _propagator
    url = endpoint_from(otlp_endpoint)
    if url is None:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as e:
        raise RuntimeError(f"tracing to {url} needs the OpenTelemetry SDK: pip install 'tokenops[telemetry]' ({e})")
    class _Resource(Resource):
        """The exporter groups spans by resource, hashing it per span (a JSON dump each time, ~13% of
        export CPU); ours never changes, so its hash is computed once."""

        @functools.cached_property
        def _hash(self) -> int:
            return Resource.__hash__(self)

        def __hash__(self) -> int:
            return self._hash

    service = os.environ.get("OTEL_SERVICE_NAME") or service_name
    base = Resource.create({"service.name": service})
    provider = TracerProvider(resource=_Resource(base.attributes, base.schema_url))
    # a short export timeout: a dead collector costs the worker thread 2 s per batch, never a request
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=2)))
    _provider, _tracer, _propagator = provider, provider.get_tracer("tokenops"), TraceContextTextMapPropagator()
    log.info("tracing: exporting spans to %s", url)
    return True


def shutdown() -> None:
    """Export what is queued (bounded by the exporter's timeout) and stop."""
    global _tracer, _provider
    if _provider is not None:
        try:
            _provider.shutdown()
        except Exception as e:  # a collector gone at shutdown loses its last spans, nothing more
            log.warning("tracing shutdown: %s", e)
    _tracer = _provider = None


def is_on() -> bool:
    return _tracer is not None


@dataclass(slots=True)
class RequestTrace:
    """A request's root span and its backend attempts still open (keyed by the attempt's request id:
    ensemble members run concurrently under ids of their own)."""

    root: Any
    ctx: Any
    attempts: dict[str, Any] = field(default_factory=dict)
    num_attempts: int = 0
    answered: set[str] = field(default_factory=set)  # request ids with a successful attempt (cascade steps follow)


def start_request(request: Any, rec: Any) -> None:
    """Open the request's root span, continuing the client's ``traceparent`` when it sent one."""
    if _tracer is None:
        return
    from opentelemetry import trace

    parent = _propagator.extract(request.headers) if request.headers.get("traceparent") else None
    operation = _operation(request.kind)
    attrs = {"gen_ai.operation.name": operation, "gen_ai.request.model": request.model,
             "tokenops.request_id": request.id, "tokenops.tenant": request.tenant,
             "tokenops.stream": bool(request.stream), "gen_ai.request.max_tokens": request.max_tokens}
    for name in ("temperature", "top_p", "seed"):
        if isinstance(request.body.get(name), (int, float)):
            attrs[f"gen_ai.request.{name}"] = request.body[name]
    root = _tracer.start_span(f"{operation} {request.model}", context=parent, kind=trace.SpanKind.SERVER,
                              start_time=_ns(rec.start), attributes=attrs)
    rec.trace = RequestTrace(root, trace.set_span_in_context(root))


@contextlib.contextmanager
def step(rec: Any, name: str, **attrs: Any) -> Iterator[Any]:
    """A span around one pipeline step (admission, cache lookup, routing); yields it (None when off)."""
    state = rec.trace
    if state is None:
        yield None
        return
    span = _tracer.start_span(name, context=state.ctx, attributes=_clean(attrs))
    try:
        yield span
    except BaseException as e:
        _error(span, e)
        raise
    finally:
        span.end()


def annotate(span: Any, **attrs: Any) -> None:
    if span is not None:
        span.set_attributes(_clean(attrs))


@contextlib.contextmanager
def attempt(rec: Any, request: Any, replica: Any, why: str) -> Iterator[None]:
    """One backend call on ``replica``. A failed call ends its span here; a successful one stays open
    until :func:`end_attempt` (a stream's attempt until the record finishes). While the call runs,
    its context is what :func:`inject` sends upstream."""
    state = rec.trace
    if state is None:
        yield
        return
    from opentelemetry import trace

    state.num_attempts += 1
    if why == "primary" and request.id in state.answered:
        why = "cascade_step"
    elif why == "primary" and request.id != rec.id:
        why = "follow_up" if request.id.endswith("-follow") else "ensemble_member"
    span = _tracer.start_span(
        f"{_operation(request.kind)} {replica.model}", context=state.ctx,
        kind=trace.SpanKind.CLIENT,
        attributes=_clean({"gen_ai.operation.name": _operation(request.kind), "gen_ai.request.model": replica.model,
                           "tokenops.replica": replica.name, "tokenops.backend": getattr(replica.backend, "kind", None),
                           "tokenops.attempt": state.num_attempts, "tokenops.attempt.reason": why,
                           "tokenops.request_id": request.id}))
    token = _attempt_ctx.set(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as e:
        _error(span, e)
        span.end()
        raise
    finally:
        _attempt_ctx.reset(token)
    state.attempts[request.id] = span
    state.answered.add(request.id)


def end_attempt(rec: Any, request_id: str, *, model: str | None = None, tokens_in: int | None = None,
                tokens_out: int | None = None, queue_s: float | None = None, prefill_s: float | None = None,
                score: float | None = None, finish_reason: str | None = None) -> None:
    """End an attempt with its usage and, for the bundled engine, its queue/prefill/decode spans."""
    state = rec.trace
    if state is None or (span := state.attempts.pop(request_id, None)) is None:
        return
    end = time.time_ns()
    span.set_attributes(_clean({"gen_ai.response.model": model, "gen_ai.usage.input_tokens": tokens_in,
                                "gen_ai.usage.output_tokens": tokens_out, "tokenops.validation_score": score,
                                "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else None}))
    if queue_s is not None:
        ctx = _span_ctx(span)
        t = span.start_time
        queue_end = t + int(queue_s * 1e9)
        _tracer.start_span("engine.queue", context=ctx, start_time=t).end(end_time=queue_end)
        prefill_end = min(end, queue_end + int((prefill_s or 0.0) * 1e9))
        _tracer.start_span("engine.prefill", context=ctx, start_time=queue_end,
                           attributes=_clean({"gen_ai.usage.input_tokens": tokens_in})).end(end_time=prefill_end)
        _tracer.start_span("engine.decode", context=ctx, start_time=prefill_end,
                           attributes=_clean({"gen_ai.usage.output_tokens": tokens_out})).end(end_time=end)
    span.end(end_time=end)


def end_request(rec: Any) -> None:
    """End the root span (and any attempt still open: a stream's) with what the record learnt."""
    state = rec.trace
    if state is None:
        return
    for request_id in list(state.attempts):
        end_attempt(rec, request_id, model=rec.model_served, tokens_in=rec.tokens_in, tokens_out=rec.tokens_out,
                    queue_s=rec.queue_s, prefill_s=rec.prefill_s, finish_reason=rec.finish_reason)
    root = state.root
    decisions = rec.decisions
    cache = decisions.get("cache")
    route = decisions.get("route") or {}
    ensemble = decisions.get("ensemble") or {}
    root.set_attributes(_clean({
        "gen_ai.response.model": rec.model_served, "gen_ai.usage.input_tokens": rec.tokens_in,
        "gen_ai.usage.output_tokens": rec.tokens_out,
        "gen_ai.response.finish_reasons": [rec.finish_reason] if rec.finish_reason else None,
        "http.response.status_code": rec.status, "tokenops.replica": rec.backend,
        "tokenops.cache": cache if isinstance(cache, str) else None, "tokenops.router": route.get("router"),
        "tokenops.route_reason": rec.route_reason, "tokenops.cost_usd": rec.cost_usd,
        "tokenops.escalated": rec.is_escalated, "tokenops.ensemble.members": ensemble.get("members"),
        "tokenops.outcome": rec.outcome, "error.type": rec.error_kind if rec.status >= 400 else None}))
    if rec.outcome == "error":
        from opentelemetry.trace import Status, StatusCode

        root.set_status(Status(StatusCode.ERROR, (rec.error or "")[:200]))
    root.end(end_time=_ns(rec.end) if rec.end is not None else None)
    rec.trace = None


def inject(headers: dict[str, str]) -> None:
    """Add the running attempt's ``traceparent`` to an upstream request's headers."""
    ctx = _attempt_ctx.get()
    if ctx is not None and _propagator is not None:
        _propagator.inject(headers, context=ctx)


def _operation(kind: str) -> str:
    """``gen_ai.operation.name`` of a request kind."""
    return {"completion": "text_completion", "embedding": "embeddings"}.get(kind, kind)


def _span_ctx(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _error(span: Any, e: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", getattr(e, "kind", None) or getattr(e, "code", None) or type(e).__name__)
    span.set_status(Status(StatusCode.ERROR, str(e)[:200]))


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes take scalars and lists of them, never None."""
    return {k: v for k, v in attrs.items() if v is not None}
