"""OpenTelemetry traces: one trace per request, its spans opened and ended from the pipeline's steps.

Off unless ``[telemetry] otlp_endpoint`` or an ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` variable
names a collector (and ``OTEL_SDK_DISABLED`` is not true); while off every function here returns at
once, so the pipeline pays one attribute check per step. This is the only module that knows
OpenTelemetry: the pipeline calls it, plugins never do.

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
import functools
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tokenops import trace_context

log = logging.getLogger("tokenops.gateway")

#: perf_counter -> wall clock (ns), for spans whose times the pipeline measured with perf_counter.
_OFFSET_NS = time.time_ns() - int(time.perf_counter() * 1e9)
#: Finished traces waiting for the builder thread; beyond this many, traces are dropped (and counted).
MAX_QUEUED_TRACES = 4096
_builder: _Builder | None = None
#: The running attempt's ``traceparent`` while its backend call runs (sent upstream by ``trace_context.inject``).
_attempt_parent = trace_context.attempt_parent  # what the HTTP backends send upstream (tokenops.trace_context)
_KIND_SERVER, _KIND_CLIENT, _KIND_INTERNAL = "server", "client", "internal"


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


def configure(otlp_endpoint: str | None, service_name: str = "tokenops") -> bool:
    """Start exporting to the collector, if one is named; returns whether tracing is on.

    Raises ``RuntimeError`` naming the ``telemetry`` extra when a collector is named but the
    OpenTelemetry SDK is not installed (a silent no-op would hide the misconfiguration)."""
    global _builder
    url = endpoint_from(otlp_endpoint)
    if url is None or _builder is not None:
        return _builder is not None
    _builder = _Builder(url, os.environ.get("OTEL_SERVICE_NAME") or service_name)
    log.info("tracing: exporting spans to %s", url)
    return True


def shutdown() -> None:
    """Build and export what is queued (bounded by the exporter's timeout) and stop."""
    global _builder
    builder, _builder = _builder, None
    if builder is not None:
        builder.close()


def is_on() -> bool:
    return _builder is not None


@dataclass(slots=True)
class _Span:
    """A span as the request path records it; the builder thread makes the SDK span from it."""

    name: str
    span_id: int
    parent_id: int | None
    start_ns: int
    kind: str = _KIND_INTERNAL
    attrs: dict[str, Any] = field(default_factory=dict)
    end_ns: int | None = None
    error: tuple[str, str] | None = None  # (error.type, message)


@dataclass(slots=True)
class RequestTrace:
    """A request's spans; attempts still open are keyed by the attempt's request id (ensemble members
    run concurrently under ids of their own)."""

    trace_id: int
    remote_parent: tuple[int, int] | None  # the client's (trace id, span id)
    root: _Span
    spans: list[_Span] = field(default_factory=list)
    attempts: dict[str, _Span] = field(default_factory=dict)
    num_attempts: int = 0
    answered: set[str] = field(default_factory=set)  # request ids with a successful attempt (cascade steps follow)

    def child(
        self,
        name: str,
        kind: str = _KIND_INTERNAL,
        parent: _Span | None = None,
        start_ns: int | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> _Span:
        span = _Span(
            name,
            _span_id(),
            (parent or self.root).span_id,
            time.time_ns() if start_ns is None else start_ns,
            kind,
            _clean(attrs or {}),
        )
        self.spans.append(span)
        return span


def _span_id() -> int:
    return random.getrandbits(64) or 1  # the SDK's RandomIdGenerator draws ids the same way


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
    if _builder is None:
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
    root = _Span(
        f"{operation} {request.model}",
        _span_id(),
        remote[1] if remote else None,
        _ns(rec.start),
        _KIND_SERVER,
        _clean(attrs),
    )
    rec.trace = RequestTrace(remote[0] if remote else (random.getrandbits(128) or 1), remote, root)


@contextlib.contextmanager
def step(rec: Any, name: str, **attrs: Any) -> Iterator[_Span | None]:
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


def annotate(span: _Span | None, **attrs: Any) -> None:
    if span is not None:
        span.attrs.update(_clean(attrs))


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
        _KIND_CLIENT,
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
        _clean(
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
        _clean(
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
    builder = _builder
    if builder is not None:
        builder.submit(state)


class _Builder:
    """The thread that turns recorded traces into SDK spans (with the recorded ids and times)."""

    def __init__(self, url: str, service: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import IdGenerator
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        except ImportError as e:
            raise RuntimeError(
                f"tracing to {url} needs the OpenTelemetry SDK: pip install 'tokenops[telemetry]' ({e})"
            ) from e

        class Recorded(IdGenerator):
            """Hands the SDK the ids the request path drew (only the builder thread creates spans)."""

            span_id = trace_id = 1

            def generate_span_id(self) -> int:
                return self.span_id

            def generate_trace_id(self) -> int:
                return self.trace_id

        class FixedResource(Resource):
            """The exporter groups spans by resource, hashing it per span (a JSON dump each time);
            ours never changes, so its hash is computed once."""

            @functools.cached_property
            def _hash(self) -> int:
                return Resource.__hash__(self)

            def __hash__(self) -> int:
                return self._hash

        base = Resource.create({"service.name": service})
        self.ids = Recorded()
        # every request is traced (the sampling decision is the collector's): ALWAYS_ON skips the parent lookup
        self.provider = TracerProvider(
            resource=FixedResource(base.attributes, base.schema_url), id_generator=self.ids, sampler=ALWAYS_ON
        )
        # a short export timeout: a dead collector costs the export thread 2 s per batch, never a request
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=2)))
        self.tracer = self.provider.get_tracer("tokenops")
        self.queue: queue.SimpleQueue[RequestTrace | None] = queue.SimpleQueue()
        self.num_dropped = 0
        self.thread = threading.Thread(target=self._run, name="tokenops-trace-builder", daemon=True)
        self.thread.start()

    def submit(self, state: RequestTrace) -> None:
        if self.queue.qsize() >= MAX_QUEUED_TRACES:
            self.num_dropped += 1
            if self.num_dropped in (1, 100, 10000):
                log.warning("tracing: %d traces dropped (the span builder is behind)", self.num_dropped)
            return
        self.queue.put(state)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)
        try:
            self.provider.shutdown()
        except Exception as e:  # a collector gone at shutdown loses its last spans, nothing more
            log.warning("tracing shutdown: %s", e)

    def _run(self) -> None:
        while (state := self.queue.get()) is not None:
            try:
                self._build(state)
            except Exception as e:  # a bad trace must not stop the others
                log.warning("tracing: a trace could not be built: %s", e)

    def _build(self, state: RequestTrace) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        kinds = {_KIND_SERVER: SpanKind.SERVER, _KIND_CLIENT: SpanKind.CLIENT, _KIND_INTERNAL: SpanKind.INTERNAL}
        sampled = TraceFlags(TraceFlags.SAMPLED)
        self.ids.trace_id = state.trace_id
        for span in (state.root, *state.spans):
            if span.parent_id is None:
                ctx = Context()
            else:
                is_remote = span is state.root
                ctx = trace.set_span_in_context(
                    NonRecordingSpan(SpanContext(state.trace_id, span.parent_id, is_remote, sampled)), Context()
                )
            self.ids.span_id = span.span_id
            made = self.tracer.start_span(
                span.name, context=ctx, kind=kinds[span.kind], attributes=span.attrs, start_time=span.start_ns
            )
            if span.error is not None:
                made.set_attribute("error.type", span.error[0])
                made.set_status(Status(StatusCode.ERROR, span.error[1]))
            made.end(end_time=span.end_ns if span.end_ns is not None else state.root.end_ns)


def _operation(kind: str) -> str:
    """``gen_ai.operation.name`` of a request kind."""
    return {"completion": "text_completion", "embedding": "embeddings"}.get(kind, kind)


def _error_of(e: BaseException) -> tuple[str, str]:
    return (str(getattr(e, "kind", None) or getattr(e, "code", None) or type(e).__name__), str(e)[:200])


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes take scalars and lists of them, never None."""
    return {k: v for k, v in attrs.items() if v is not None}
