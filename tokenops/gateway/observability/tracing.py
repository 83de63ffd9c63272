"""OpenTelemetry traces: one trace per request, its spans opened and ended from the pipeline's steps.

Off unless ``[telemetry] otlp_endpoint`` or an ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` variable
names a collector (and ``OTEL_SDK_DISABLED`` is not true); while off every function here returns at
once, so the pipeline pays one attribute check per step. This is the only module that knows
OpenTelemetry (with :mod:`tokenops.gateway.observability.trace_spans`, its recorded spans and the thread that
exports them): the pipeline calls it, plugins never do.

Spans (children of the request's root span, ``{operation} {model}``): ``tokenops.admission``,
``tokenops.cache_lookup``, ``tokenops.route``, one ``{operation} {model}`` client span per backend
attempt (a retry on another replica, a fallback, a cascade step and each ensemble member are
attempts of their own) and, under an attempt of the bundled engine, ``engine.queue``,
``engine.prefill`` and ``engine.decode`` from the timings the engine reports (``queue_s``,
``prefill_s``). Attributes follow the GenAI semantic conventions (``gen_ai.*``) plus ``tokenops.*``.

A client's W3C ``traceparent`` becomes the root's parent, and each attempt's own ``traceparent`` is
sent to ``openai`` upstreams (:func:`inject`), so a vLLM behind tokenops joins the trace.

Why spans are recorded, not built, on the request path: the SDK's span objects cost tens of
microseconds each to create, validate and end (measured: most of tracing's added latency). A step
here only notes its name, ids, times and attributes (ids drawn as the SDK draws them); when the
request ends, the whole trace goes to one worker thread that builds the SDK spans with those ids
and times and hands them to a ``BatchSpanProcessor``, whose own thread exports them. A slow or dead
collector never blocks the event loop: it loses the spans that overflow the queues, nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from tokenops import trace_context
from tokenops.gateway.observability.trace_spans import (
    KIND_CLIENT,
    KIND_SERVER,
    RequestTrace,
    Span,
    SpanBuilder,
    clean,
    new_span_id,
)

log = logging.getLogger("tokenops.gateway")

#: perf_counter -> wall clock (ns), for spans whose times the pipeline measured with perf_counter.
_OFFSET_NS = time.time_ns() - int(time.perf_counter() * 1e9)
#: The span builder of the gateway serving the running request: each gateway makes its own
#: (:func:`configure`) and sets it around its requests (:func:`exporting`); None: tracing is off.
_in_use: ContextVar[SpanBuilder | None] = ContextVar("tokenops_span_builder", default=None)
#: The running attempt's ``traceparent`` while its backend call runs (sent upstream by ``trace_context.inject``).
_attempt_parent = trace_context.attempt_parent  # what the HTTP backends send upstream (tokenops.trace_context)


def _ns(perf_t: float) -> int:
    return _OFFSET_NS + int(perf_t * 1e9)


def endpoint_from(configured: str | None, environ: Any = os.environ) -> str | None:
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


def configure(otlp_endpoint: str | None, service_name: str = "tokenops") -> SpanBuilder | None:
    """A span builder exporting to the collector, if one is named (None: tracing stays off); the
    gateway that made it owns it, sets it around its requests (:func:`exporting`) and closes it
    (:func:`shutdown`).

    Raises ``RuntimeError`` naming the ``telemetry`` extra when a collector is named but the
    OpenTelemetry SDK is not installed (a silent no-op would hide the misconfiguration)."""
    url = endpoint_from(otlp_endpoint)
    if url is None:
        return None
    builder = SpanBuilder(url, os.environ.get("OTEL_SERVICE_NAME") or service_name)
    log.info("tracing: exporting spans to %s", url)
    return builder


@contextlib.contextmanager
def exporting(builder: SpanBuilder | None) -> Iterator[None]:
    """Spans of the requests run in this block go to ``builder`` (None: no spans)."""
    token = _in_use.set(builder)
    try:
        yield
    finally:
        _in_use.reset(token)


def shutdown(builder: SpanBuilder | None) -> None:
    """Build and export what ``builder`` has queued (bounded by the exporter's timeout) and stop it."""
    if builder is not None:
        builder.close()


def is_on() -> bool:
    return _in_use.get() is not None


def _parse_traceparent(value: str) -> tuple[int, int] | None:
    """(trace id, parent span id) of a W3C ``traceparent`` (version 00 layout), None when malformed."""
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (trace_id, span_id) if trace_id and span_id else None


def start_request(request: Any, rec: Any) -> None:
    """Open the request's root span, continuing the client's ``traceparent`` when it sent one."""
    if _in_use.get() is None:
        return
    header = request.headers.get("traceparent")
    remote = _parse_traceparent(header) if header else None
    operation = _operation(request.kind)
    attrs = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": request.model,
        "tokenops.request_id": request.id,
        "tokenops.tenant": request.tenant,
        "tokenops.stream": bool(request.stream),
        "gen_ai.request.max_tokens": request.max_tokens,
    }
    for name in ("temperature", "top_p", "seed"):
        value = getattr(request.sampling, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[f"gen_ai.request.{name}"] = value
    root = Span(
        f"{operation} {request.model}",
        new_span_id(),
        remote[1] if remote else None,
        _ns(rec.start),
        KIND_SERVER,
        clean(attrs),
    )
    rec.trace = RequestTrace(remote[0] if remote else (random.getrandbits(128) or 1), remote, root)


@contextlib.contextmanager
def step(rec: Any, name: str, **attrs: Any) -> Iterator[Span | None]:
    """A span around one pipeline step (admission, cache lookup, routing); yields it (None when off)."""
    state = rec.trace
    if state is None:
        yield None
        return
    span = state.child(name, attrs=attrs)
    try:
        yield span
    except BaseException as e:
        span.error = _error_of(e)
        raise
    finally:
        span.end_ns = time.time_ns()


def annotate(span: Span | None, **attrs: Any) -> None:
    if span is not None:
        span.attrs.update(clean(attrs))


@contextlib.contextmanager
def attempt(rec: Any, request: Any, replica: Any, why: str) -> Iterator[None]:
    """One backend call on ``replica``. A failed call ends its span here; a successful one stays open
    until :func:`end_attempt` (a stream's attempt until the record finishes). While the call runs,
    its ``traceparent`` is what :func:`inject` sends upstream."""
    state = rec.trace
    if state is None:
        yield
        return
    state.num_attempts += 1
    if why == "primary" and request.id in state.answered:
        why = "cascade_step"
    elif why == "primary" and request.id != rec.id:
        why = "follow_up" if request.id.endswith("-follow") else "ensemble_member"
    operation = _operation(request.kind)
    span = state.child(
        f"{operation} {replica.model}",
        KIND_CLIENT,
        attrs={
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": replica.model,
            "tokenops.replica": replica.name,
            "tokenops.backend": getattr(replica.backend, "kind", None),
            "tokenops.attempt": state.num_attempts,
            "tokenops.attempt.reason": why,
            "tokenops.request_id": request.id,
        },
    )
    token = _attempt_parent.set(f"00-{state.trace_id:032x}-{span.span_id:016x}-01")
    try:
        yield
    except BaseException as e:
        span.error = _error_of(e)
        span.end_ns = time.time_ns()
        raise
    finally:
        _attempt_parent.reset(token)
    state.attempts[request.id] = span
    state.answered.add(request.id)


def end_attempt(
    rec: Any,
    request_id: str,
    *,
    model: str | None = None,
    tokens_in: int | None = None,
    tokens_out: int | None = None,
    queue_s: float | None = None,
    prefill_s: float | None = None,
    score: float | None = None,
    finish_reason: str | None = None,
) -> None:
    """End an attempt with its usage and, for the bundled engine, its queue/prefill/decode spans."""
    state = rec.trace
    if state is None or (span := state.attempts.pop(request_id, None)) is None:
        return
    end = time.time_ns()
    span.attrs.update(
        clean(
            {
                "gen_ai.response.model": model,
                "gen_ai.usage.input_tokens": tokens_in,
                "gen_ai.usage.output_tokens": tokens_out,
                "tokenops.validation_score": score,
                "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else None,
            }
        )
    )
    if queue_s is not None:
        queue_end = span.start_ns + int(queue_s * 1e9)
        state.child("engine.queue", parent=span, start_ns=span.start_ns).end_ns = queue_end
        prefill_end = min(end, queue_end + int((prefill_s or 0.0) * 1e9))
        state.child(
            "engine.prefill", parent=span, start_ns=queue_end, attrs={"gen_ai.usage.input_tokens": tokens_in}
        ).end_ns = prefill_end
        state.child(
            "engine.decode", parent=span, start_ns=prefill_end, attrs={"gen_ai.usage.output_tokens": tokens_out}
        ).end_ns = end
    span.end_ns = end


def end_request(rec: Any) -> None:
    """End the root span (and any attempt still open: a stream's) with what the record learnt, and
    hand the trace to the builder thread."""
    state = rec.trace
    if state is None:
        return
    for request_id in list(state.attempts):
        end_attempt(
            rec,
            request_id,
            model=rec.model_served,
            tokens_in=rec.tokens_in,
            tokens_out=rec.tokens_out,
            queue_s=rec.queue_s,
            prefill_s=rec.prefill_s,
            finish_reason=rec.finish_reason,
        )
    rec.trace = None
    decisions = rec.decisions
    cache = decisions.get("cache")
    route = decisions.get("route") or {}
    ensemble = decisions.get("ensemble") or {}
    root = state.root
    root.attrs.update(
        clean(
            {
                "gen_ai.response.model": rec.model_served,
                "gen_ai.usage.input_tokens": rec.tokens_in,
                "gen_ai.usage.output_tokens": rec.tokens_out,
                "gen_ai.response.finish_reasons": [rec.finish_reason] if rec.finish_reason else None,
                "http.response.status_code": rec.status,
                "tokenops.replica": rec.backend,
                "tokenops.cache": cache if isinstance(cache, str) else None,
                "tokenops.router": route.get("router"),
                "tokenops.route_reason": rec.route_reason,
                "tokenops.cost_usd": rec.cost_usd,
                "tokenops.escalated": rec.is_escalated,
                "tokenops.ensemble.members": ensemble.get("members"),
                "tokenops.outcome": rec.outcome,
                "error.type": rec.error_kind if rec.status >= 400 else None,
            }
        )
    )
    if rec.outcome == "error":
        root.error = (rec.error_kind or "error", (rec.error or "")[:200])
    root.end_ns = _ns(rec.end) if rec.end is not None else time.time_ns()
    builder = _in_use.get()
    if builder is not None:
        builder.submit(state)


def _operation(kind: str) -> str:
    """``gen_ai.operation.name`` of a request kind."""
    return {"completion": "text_completion", "embedding": "embeddings"}.get(kind, kind)


def _error_of(e: BaseException) -> tuple[str, str]:
    return (str(getattr(e, "kind", None) or getattr(e, "code", None) or type(e).__name__), str(e)[:200])
