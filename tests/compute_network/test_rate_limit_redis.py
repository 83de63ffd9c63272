"""Two gateway processes share one limit through a real Redis server."""

import json
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("redis", reason="the redis client is not installed (pip install 'tokenops[redis]')")

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="no redis-server binary (apt-get install -y redis-server)")

WORKER = r"""
import json, sys, time
from tokenops.ratelimit.config import Limit, RateLimitConfig
from tokenops.ratelimit.limiter import RateLimiter
from tokenops.types import GatewayRequest
url, start_at, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
cfg = RateLimitConfig(enabled=True, burst_s=1.0, redis_url=url,
                      defaults={"tenant": Limit(requests_per_min=600, max_concurrency=1000)})
rl = RateLimiter(cfg)
while time.time() < start_at:
    time.sleep(0.005)
admitted = rejected = 0
retry_ok = True
first = time.time()
while time.time() < start_at + seconds:
    req = GatewayRequest(kind="completion", model="m", body={}, prompt="hi", tenant="shared", max_tokens=4)
    rej = rl.admit(req)
    if rej is None:
        admitted += 1
        rl.complete(req.id, 6)
    else:
        rejected += 1
        retry_ok = retry_ok and bool(rej.retry_after_s and rej.retry_after_s > 0)
    time.sleep(0.002)
print(json.dumps({"admitted": admitted, "rejected": rejected, "retry_ok": retry_ok, "first": first,
                  "last": time.time()}))
"""


@pytest.fixture
def redis_url(tmp_path):
    from tokenops.testing_serve import redis_server

    with redis_server(tmp_path) as url:
        yield url


def test_two_processes_share_one_limit(redis_url):
    """600 requests/min (10/s, burst 1 s = 10) shared by two processes hammering for
    2 s: together they get ~10 + 20 (burst + rate x time), not twice that."""
    start_at = time.time() + 4.0
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, redis_url, str(start_at), "2.0"],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    total = sum(r["admitted"] for r in results)
    assert all(r["admitted"] > 0 and r["rejected"] > 0 and r["retry_ok"] for r in results), results
    # the allowance over the time both were actually running (a slow start shortens it)
    window = max(r["last"] for r in results) - min(r["first"] for r in results)
    allowance = 10 + 10 * window
    assert 0.75 * allowance <= total <= allowance + 2, (allowance, results)
    assert total < 0.75 * 2 * allowance  # separate limits would have allowed twice as much


def test_redis_concurrency_and_correction(redis_url):
    from tokenops.ratelimit.config import Limit, RateLimitConfig
    from tokenops.ratelimit.limiter import RateLimiter

    from .helpers import chat

    cfg = RateLimitConfig(enabled=True, redis_url=redis_url, key_prefix="t2:",
                          defaults={"tenant": Limit(tokens_per_min=6000, max_concurrency=1)})
    a, b = RateLimiter(cfg), RateLimiter(cfg)  # two gateways
    first = chat("x" * 400, max_tokens=100)
    assert a.admit(first) is None
    rej = b.admit(chat("y"))
    assert rej is not None and "concurrent" in rej.message
    level = a.store.level("t2:tenant:default:tpm")
    assert a.complete(first.id, 120)  # 200 estimated, 120 used: 80 back
    assert a.store.level("t2:tenant:default:tpm") == pytest.approx(level + 80, abs=15)  # plus refill meanwhile
    assert b.admit(chat("y")) is None
