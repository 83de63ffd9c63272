"""Where tracing's CPU goes: the request path (recording five spans of a request: admission, cache
lookup, routing, one backend attempt and the root) against the builder thread (making the SDK spans
and queueing them for export), per request, in this process. A bare 1M-iteration loop is timed
first as the machine's yardstick. Run::

    .venv/bin/python tests/benchmarks/tracing_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gateway.otlp_receiver import Receiver  # noqa: E402
from tokenops.gateway import tracing  # noqa: E402
from tokenops.gateway.observability.records import RequestRecord  # noqa: E402
from tokenops.types import GatewayRequest  # noqa: E402

N = 3000


class _Replica:
    name, model, backend = "m#0", "m", None


def one_request() -> None:
    req = GatewayRequest(kind="chat", model="m", body={"temperature": 0.5}, headers={})
    rec = RequestRecord(
        id=req.id,
        kind="chat",
        tenant="t",
        model_requested="m",
        arrival=time.time(),
        start=time.perf_counter(),
        decisions=req.decisions,
    )
    tracing.start_request(req, rec)
    with tracing.step(rec, "tokenops.admission"):
        pass
    with tracing.step(rec, "tokenops.cache_lookup") as span:
        tracing.annotate(span, **{"tokenops.cache": "miss"})
    with tracing.step(rec, "tokenops.route") as span:
        tracing.annotate(span, **{"tokenops.router": "requested"})
    with tracing.attempt(rec, req, _Replica(), "primary"):
        pass
    tracing.end_attempt(rec, req.id, model="m", tokens_in=3, tokens_out=4)
    rec.finish(200)
    tracing.end_request(rec)


def main() -> None:
    t = time.perf_counter()
    for _ in range(10**6):
        pass
    print(f"yardstick: 1M-iteration loop {(time.perf_counter() - t) * 1e3:.0f} ms")
    with Receiver() as receiver:
        builder = tracing.configure(receiver.url)  # what a gateway makes and owns
        assert builder is not None
        kept: list = []
        builder.submit = kept.append  # measure the two sides apart
        with tracing.exporting(builder):
            t = time.perf_counter()
            for _ in range(N):
                one_request()
        print(f"request path: {(time.perf_counter() - t) / N * 1e6:.0f} us per request (5 spans recorded)")
        t = time.process_time()
        for state in kept:
            builder._build(state)
        print(f"builder thread: {(time.process_time() - t) / N * 1e6:.0f} us CPU per request (SDK spans made, queued)")
        tracing.shutdown(builder)

if __name__ == "__main__":
    main()
