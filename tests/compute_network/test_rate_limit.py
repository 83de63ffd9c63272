"""Token buckets, concurrency caps, fair share, queue mode and the plugin wiring."""

import random

import pytest

from tokenops.ratelimit.config import Limit, RateLimitConfig
from tokenops.ratelimit.fair_share import FairShare
from tokenops.ratelimit.limiter import RateLimiter
from tokenops.ratelimit.stores import Charge, LocalStore
from tokenops.ratelimit.token_bucket import TokenBucket

from .helpers import chat


def limiter(clock, mode="reject", burst_s=6.0, **tenant):
    cfg = RateLimitConfig(enabled=True, mode=mode, burst_s=burst_s, defaults={"tenant": Limit(**tenant)})
    return RateLimiter(cfg, clock=clock, sleep=clock.advance)


def test_bucket_refills_and_reports_wait():
    b = TokenBucket(rate_per_s=10, capacity=20, updated=0.0)
    assert b.wait_for(20, 0.0) == 0
    b.take(20, 0.0)
    assert b.wait_for(5, 0.0) == pytest.approx(0.5)
    assert b.wait_for(5, 0.5) == 0
    b.refill(100.0)
    assert b.level == 20  # capped
    # a charge larger than the capacity waits for a full bucket, then goes into debt
    assert b.wait_for(50, 100.0) == 0
    b.take(50, 100.0)
    assert b.level == -30 and b.wait_for(1, 100.0) == pytest.approx(3.1)
    b.adjust(+100, 100.0)
    assert b.level == 20


def test_store_charges_all_buckets_or_none(clock):
    store = LocalStore()
    a, b = Charge("a", 1.0, 5.0, 3.0), Charge("b", 1.0, 2.0, 3.0)
    v = store.acquire([a], [], clock())
    assert v.is_admitted
    v = store.acquire([a, b], [], clock())  # a has 2 left (needs 3), b needs a full bucket
    assert not v.is_admitted and v.key == "a" and v.wait_s == pytest.approx(1.0)
    assert store.level("a") == 2 and store.level("b") == 2  # nothing taken


def test_admitted_tokens_per_minute_within_5_percent_under_4x_load(clock):
    """20 req/s of ~200 estimated tokens against a 60k tokens/min limit (4x over),
    real usage shorter than max_tokens and corrected at completion, 10 minutes."""
    limit_tpm = 60_000
    rl = limiter(clock, tokens_per_min=limit_tpm)
    rng = random.Random(0)
    in_flight = []  # (finish time, id, actual tokens)
    admitted_actual, rejections = 0, []
    minutes = 10
    for i in range(20 * 60 * minutes):
        clock.t = 1000.0 + i * 0.05
        while in_flight and in_flight[0][0] <= clock.t:
            _, rid, actual = in_flight.pop(0)
            assert rl.complete(rid, actual)
        req = chat("x" * 400, max_tokens=100)  # estimate 100 + 100
        rej = rl.admit(req)
        if rej is None:
            actual = 100 + rng.randint(20, 100)
            admitted_actual += actual
            in_flight.append((clock.t + 1.0, req.id, actual))
        else:
            rejections.append(rej)
    per_min = admitted_actual / minutes
    assert abs(per_min - limit_tpm) / limit_tpm < 0.05, per_min
    assert len(rejections) > 20 * 60 * minutes * 0.6  # ~3/4 of the offered load is refused
    assert all(r.status == 429 and r.retry_after_s and r.retry_after_s > 0 for r in rejections)
    assert "tokens per minute" in rejections[0].message


def test_retry_after_is_honest(clock):
    rl = limiter(clock, requests_per_min=60, burst_s=1.0)  # 1 req/s, burst 1
    assert rl.admit(chat("a")) is None
    rej = rl.admit(chat("b"))
    assert rej.retry_after_s == pytest.approx(1.0, abs=0.02)
    clock.advance(rej.retry_after_s)
    assert rl.admit(chat("c")) is None


def test_concurrency_cap_and_release(clock):
    rl = limiter(clock, max_concurrency=2)
    a, b, c = chat("a"), chat("b"), chat("c")
    assert rl.admit(a) is None and rl.admit(b) is None
    rej = rl.admit(c)
    assert rej.status == 429 and rej.retry_after_s > 0 and "concurrent" in rej.message
    assert rl.complete(a.id, 10)
    assert not rl.complete(a.id, 10)  # once only
    assert rl.admit(c) is None


def test_limits_per_tenant_model_and_key_are_separate(clock):
    cfg = RateLimitConfig(enabled=True, burst_s=1.0,
                          defaults={"tenant": Limit(requests_per_min=60)},
                          overrides={"tenant": {"big": Limit(requests_per_min=600)},
                                     "key": {"k1": Limit(requests_per_min=60)}})
    rl = RateLimiter(cfg, clock=clock)
    assert rl.admit(chat("q", tenant="a")) is None
    assert rl.admit(chat("q", tenant="a")) is not None
    assert rl.admit(chat("q", tenant="b")) is None  # another tenant's bucket
    assert all(rl.admit(chat("q", tenant="big")) is None for _ in range(10))
    assert rl.admit(chat("q", tenant="c", api_key_id="k1")) is None
    rej = rl.admit(chat("q", tenant="d", api_key_id="k1"))  # tenant d is fine, key k1 is not
    assert rej is not None and "key 'k1'" in rej.message


def test_queue_mode_waits_then_admits_or_times_out(clock):
    rl = limiter(clock, mode="queue", requests_per_min=60, burst_s=1.0)
    rl.config.queue_timeout_s = 1.5
    start = clock.t
    assert rl.admit(chat("a")) is None
    r = chat("b")
    assert rl.admit(r) is None  # waited ~1 s (fake sleep advances the clock)
    assert clock.t - start == pytest.approx(1.0, abs=0.01) and r.decisions["rate_limit"].startswith("queued")
    rl.config.queue_timeout_s = 0.5
    rej = rl.admit(chat("c"))
    assert rej is not None and rej.retry_after_s > 0


async def test_queue_mode_never_blocks_an_event_loop(clock):
    rl = limiter(clock, mode="queue", requests_per_min=60, burst_s=1.0)
    assert rl.admit(chat("a")) is None
    t = clock.t
    assert rl.admit(chat("b")) is not None
    assert clock.t == t


def test_fair_share_protects_the_light_tenant():
    clock_t = [0.0]
    fs = FairShare(tokens_per_min=60_000, burst_s=6.0)  # 1000 tokens/s
    got = {"heavy": 0, "light": 0}
    offered = {"heavy": 4000, "light": 300}  # tokens/s: 4x capacity vs 0.3x
    step = 0.01
    for i in range(int(120 / step)):
        now = i * step
        for tenant, rate in offered.items():
            tokens = rate * step
            if fs.wait_for(tenant, tokens, now) == 0:
                fs.take(tenant, tokens, now)
                if now >= 60:  # after warm-up
                    got[tenant] += tokens
    light, heavy = got["light"] / 60, got["heavy"] / 60
    assert light == pytest.approx(300, rel=0.05)  # the light tenant gets all it asks for
    assert light + heavy == pytest.approx(1000, rel=0.05)  # capacity is fully used
    del clock_t


def test_fair_share_weights_split_contended_capacity():
    fs = FairShare(tokens_per_min=60_000, weights={"gold": 3.0}, burst_s=6.0, window_s=10.0)
    got = {"gold": 0.0, "free": 0.0}
    step = 0.01
    for i in range(int(120 / step)):
        now = i * step
        for tenant in ("gold", "free"):
            tokens = 2000 * step
            if fs.wait_for(tenant, tokens, now) == 0:
                fs.take(tenant, tokens, now)
                if now >= 60:
                    got[tenant] += tokens
    assert got["gold"] / got["free"] == pytest.approx(3.0, rel=0.15)


def test_config_parsing_and_errors():
    cfg = RateLimitConfig.from_settings({"enabled": True, "tenant": {"tokens_per_min": 1000},
                                         "tenants": {"acme": {"requests_per_min": 5}},
                                         "fair_share": {"tokens_per_min": 9000, "weights": {"acme": 2}}})
    assert cfg.limit_for("tenant", "acme").requests_per_min == 5
    assert cfg.limit_for("tenant", "x").tokens_per_min == 1000
    assert cfg.limit_for("model", "m") is None and cfg.fair_share_weights == {"acme": 2.0}
    with pytest.raises(ValueError, match="unknown key"):
        RateLimitConfig.from_settings({"tokens_per_min": 5})
    with pytest.raises(ValueError, match="must be > 0"):
        RateLimitConfig.from_settings({"tenant": {"tokens_per_min": -1}})
    with pytest.raises(ValueError, match="mode"):
        RateLimitConfig(mode="drop")
