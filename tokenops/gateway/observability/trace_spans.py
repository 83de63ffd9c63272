"""A request's trace as the request path records it, and the thread that exports it.

:mod:`tokenops.gateway.observability.tracing` notes each step's name, ids, times and attributes in a
:class:`RequestTrace` (cheap: no SDK object on the request path); when the request ends the trace
goes to :class:`SpanBuilder`, whose thread makes the OpenTelemetry SDK spans with those ids and
times. Kept apart from ``tracing.py`` so the SDK (and its import) is in one place, and what the
pipeline calls reads without the exporter's machinery.
"""

from __future__ import annotations

import functools
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tokenops.gateway")

#: Finished traces waiting for the builder thread; beyond this many, traces are dropped (and counted).
MAX_QUEUED_TRACES = 4096
KIND_SERVER, KIND_CLIENT, KIND_INTERNAL = "server", "client", "internal"


def new_span_id() -> int:
    return random.getrandbits(64) or 1  # the SDK's RandomIdGenerator draws ids the same way


@dataclass(slots=True)
class Span:
    """A span as the request path records it; the builder thread makes the SDK span from it."""

    name: str
    span_id: int
    parent_id: int | None
    start_ns: int
    kind: str = KIND_INTERNAL
    attrs: dict[str, Any] = field(default_factory=dict)
    end_ns: int | None = None
    error: tuple[str, str] | None = None  # (error.type, message)


@dataclass(slots=True)
class RequestTrace:
    """A request's spans; attempts still open are keyed by the attempt's request id (ensemble members
    run concurrently under ids of their own)."""

    trace_id: int
    remote_parent: tuple[int, int] | None  # the client's (trace id, span id)
    root: Span
    spans: list[Span] = field(default_factory=list)
    attempts: dict[str, Span] = field(default_factory=dict)
    num_attempts: int = 0
    answered: set[str] = field(default_factory=set)  # request ids with a successful attempt (cascade steps follow)

    def child(
        self,
        name: str,
        kind: str = KIND_INTERNAL,
        parent: Span | None = None,
        start_ns: int | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Span:
        span = Span(
            name,
            new_span_id(),
            (parent or self.root).span_id,
            time.time_ns() if start_ns is None else start_ns,
            kind,
            clean(attrs or {}),
        )
        self.spans.append(span)
        return span


class SpanBuilder:
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

        kinds = {KIND_SERVER: SpanKind.SERVER, KIND_CLIENT: SpanKind.CLIENT, KIND_INTERNAL: SpanKind.INTERNAL}
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


def clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes take scalars and lists of them, never None."""
    return {k: v for k, v in attrs.items() if v is not None}
