"""Rate limits while Redis is down (tokenops/ratelimit/redis_fallback.py, docs/deploy.md "When a piece
dies"): each gateway applies the limits alone (a 429 past its own bucket, never a 500, never
unlimited), slots taken meanwhile are freed locally, and the shared buckets count again once Redis
answers; through a real ``tokenops serve`` with the openai SDK too."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="the redis client is not installed (pip install 'tokenops[redis]')")
pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary")

from tokenops.ratelimit.config import Limit, RateLimitConfig  # noqa: E402
from tokenops.ratelimit.limiter import RateLimiter  # noqa: E402
from tokenops.ratelimit.redis_fallback import FallbackStore  # noqa: E402
from tokenops.testing_serve import redis_server  # noqa: E402
from tokenops.types import GatewayRequest  # noqa: E402


def _request() -> GatewayRequest:
    return GatewayRequest(kind="completion", model="m", body={}, prompt="hi", tenant="acme", max_tokens=4)


def _stop(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url).shutdown(nosave=True)
    except redis.ConnectionError:  # the server closes the connection as it goes: expected
        pass


def _start_again(url: str, workdir: Path) -> subprocess.Popen:
    import redis

    port = url.rsplit(":", 1)[1].split("/")[0]
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", port, "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return proc
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not come back"
            time.sleep(0.05)


def test_limits_hold_per_gateway_while_redis_is_down_and_are_shared_again_after(tmp_path):
    # 60 requests/min with a 5 s burst: a bucket of 5 requests, refilled at one a second
    cfg = RateLimitConfig(enabled=True, burst_s=5.0, defaults={"tenant": Limit(requests_per_min=60, max_concurrency=50)})
    with redis_server(tmp_path) as url:
        cfg.redis_url = url
        limiter = RateLimiter(cfg)
        store = limiter.store
        assert isinstance(store, FallbackStore)
        store.retry_s = 0.5
        admitted = [limiter.admit(r := _request()) is None and limiter.complete(r.id, 4) for _ in range(7)]
        assert admitted[:5] == [True] * 5 and admitted[5:] == [False, False]  # the shared bucket
        assert store.num_fallback == 0 and store.redis.level("tokenops:rl:tenant:acme:rpm") is not None

        _stop(url)
        held = _request()
        assert limiter.admit(held) is None  # not a 500: this gateway's own (fresh) bucket
        assert store.is_degraded and store.num_fallback == 1
        verdicts = [limiter.admit(_request()) for _ in range(6)]
        rejected = [v for v in verdicts if v is not None]
        assert len(rejected) >= 2 and all(v.status == 429 and v.code == "rate_limit_exceeded" for v in rejected)
        assert store.local._slots["tokenops:rl:tenant:acme:conc"] >= 1
        assert limiter.complete(held.id, 4)  # freed where it was taken, not in the Redis that is away
        assert store.local._slots["tokenops:rl:tenant:acme:conc"] == len(verdicts) - len(rejected)

        proc = _start_again(url, tmp_path)
        try:
            time.sleep(store.retry_s + 0.1)
            assert limiter.admit(r := _request()) is None and not store.is_degraded
            limiter.complete(r.id, 4)
            assert store.redis.level("tokenops:rl:tenant:acme:rpm") is not None  # counted in Redis again
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_serve_answers_and_limits_while_redis_is_down(tmp_path):
    import openai

    from tests.gateway.openai_upstream import Upstream
    from tokenops.testing_serve import ServeProcess

    with redis_server(tmp_path) as url, Upstream() as up:
        config = (f'[[models]]\nname = "up"\nbackend = "openai"\nurl = "{up.url}"\n\n'
                  f'[plugins.rate_limit]\nenabled = true\nburst_s = 5.0\nredis_url = "{url}"\n'
                  '[plugins.rate_limit.tenant]\nrequests_per_min = 60\n')
        with ServeProcess(tmp_path / "gw", config=config) as gw:
            client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=60)

            def ask() -> str:
                try:
                    client.chat.completions.create(model="up", max_tokens=4,
                                                   messages=[{"role": "user", "content": "hi"}])
                    return "ok"
                except openai.RateLimitError as e:
                    assert e.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
                    return "429"

            assert ask() == "ok"
            _stop(url)
            answers = [ask() for _ in range(8)]  # never a 500: this gateway's own bucket of 5
            assert answers[0] == "ok" and "429" in answers and answers.count("ok") <= 6, answers
