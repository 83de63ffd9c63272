"""A small real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` bodies are decoded as
``ExportTraceServiceRequest`` protobuf (opentelemetry-proto, the collector's own schema) and the
spans kept as plain dicts, span kinds and the resource included. The acceptance test reads its spans
from a real collector, Arize Phoenix (tests/gateway/phoenix_collector.py); this receiver serves what
Phoenix does not return (span kinds, the resource) and the overhead benchmarks, which need a receiver
that decodes every export without adding its own load to the measured box.
"""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[dict[str, Any]]:
    """The spans of one ``ExportTraceServiceRequest``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    spans = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append({"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                              "parent_span_id": s.parent_span_id.hex() or None, "name": s.name,
                              "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                              "status": s.status.code, "kind": s.kind, "resource": resource,
                              "attributes": {a.key: _value(a.value) for a in s.attributes}})
    return spans


class Receiver:
    """``with Receiver() as r: r.url, r.spans`` (``wait_for`` polls until a condition holds)."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[dict[str, Any]] = []
        self.num_posts = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode(body)
                with lock:
                    outer.spans.extend(spans)
                    outer.num_posts += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_for(self, condition, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while not condition(self.spans):
            assert time.monotonic() < deadline, f"collector: condition not met; spans: {[s['name'] for s in self.spans]}"
            time.sleep(0.1)
        return self.spans

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
