"""What Anthropic's Messages API costs on top of chat completions, through a real ``tokenops serve``.

Two in-process test upstreams answer at once: a chat-completions-only one (tokenops
translates ``/v1/messages`` to chat for it) and one serving ``/v1/messages`` (tokenops
passes the request through). Sequential requests on one keep-alive connection, the
three kinds interleaved so a drift in machine speed hits them alike; p50/p90 of each:

- ``chat``: ``/v1/chat/completions`` to the chat-only upstream (the reference);
- ``messages translated``: ``/v1/messages`` to the same upstream (translation both ways);
- ``messages pass-through``: ``/v1/messages`` to the upstream serving it.

Run::

    .venv/bin/python tests/benchmarks/messages_overhead.py [--requests 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gateway.anthropic_upstream import AnthropicUpstream  # noqa: E402
from tests.gateway.openai_upstream import Upstream  # noqa: E402
from tokenops.testing_serve import ServeProcess  # noqa: E402

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests of each kind")
    args = parser.parse_args()
    with AnthropicUpstream() as native, Upstream() as chat_only, tempfile.TemporaryDirectory() as tmp:
        config = (f'[[models]]\nname = "chat-up"\nbackend = "openai"\nurl = "{chat_only.url}"\n'
                  f'[[models]]\nname = "claude-up"\nbackend = "openai"\nurl = "{native.url}"\n')
        with ServeProcess(tmp, config=config, store=False) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            kinds = {
                "chat": ("/v1/chat/completions", {"model": "chat-up", "max_tokens": 16, "messages": ASK}),
                "messages translated": ("/v1/messages", {"model": "chat-up", "max_tokens": 16, "messages": ASK}),
                "messages pass-through": ("/v1/messages", {"model": "claude-up", "max_tokens": 16, "messages": ASK}),
            }
            times: dict[str, list[float]] = {k: [] for k in kinds}
            order = list(kinds.items())
            for i in range(args.requests + 20):
                order = order[1:] + order[:1]  # each kind takes each place in turn (the first after a pause is slower)
                for kind, (path, body) in order:
                    t0 = time.perf_counter()
                    r = c.post(path, json=body)
                    elapsed = time.perf_counter() - t0
                    assert r.status_code == 200, r.text
                    if i >= 20:  # the first requests warm connections and caches
                        times[kind].append(elapsed)
    ref = statistics.median(times["chat"])
    print(f"{'path':<24}{'p50 ms':>10}{'p90 ms':>10}{'p50 - chat':>14}")
    for kind, ts in times.items():
        p50, p90 = statistics.median(ts), statistics.quantiles(ts, n=10)[-1]
        print(f"{kind:<24}{p50 * 1e3:>10.2f}{p90 * 1e3:>10.2f}{(p50 - ref) * 1e3:>+13.2f}")


if __name__ == "__main__":
    main()
