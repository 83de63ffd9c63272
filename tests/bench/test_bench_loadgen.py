"""The load generator against the fake SSE server: timings match its configured delays."""

import asyncio
import statistics
import sys

import pytest
from fake_server import FakeEngine, FakeServer, free_port

from tokenops.bench.arrivals import ArrivalSpec
from tokenops.bench.loadgen import BenchError, LoadSpec, fetch_model, run_load
from tokenops.bench.synthetic import synthetic
from tokenops.bench.workloads import BenchRequest


@pytest.fixture(scope="module")
def server():
    with FakeServer(FakeEngine(base_s=0.02, per_token_s=0.0005)) as s:
        yield s


def test_ttft_itl_tokens_match_server_delays(server):
    reqs = synthetic(4, input_len=40, output_len=8)
    spec = LoadSpec(url=server.url + "/v1", model="fake-model", concurrency=1)
    results, duration = asyncio.run(run_load(reqs, spec))
    assert len(results) == 4 and all(r.is_ok for r in results)
    # alone on the server: one step of 20 ms + 40 prefill tokens * 0.5 ms = 40 ms to the first token,
    # then 20.5 ms per decode step
    ttft = statistics.median(r.ttft_s for r in results)
    itl = statistics.median(g for r in results for g in r.itls_s)
    assert 0.035 <= ttft <= 0.2, ttft
    assert 0.018 <= itl <= 0.1, itl
    assert all(r.num_output_tokens == 8 and r.num_input_tokens == 40 and r.is_usage_reported for r in results)
    assert all(len(r.itls_s) == 7 for r in results)
    assert all(r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 7) for r in results)
    assert duration >= sum(r.e2e_s for r in results) * 0.95  # closed loop of one: sequential


def test_open_loop_rate_schedule_and_fallback_token_count():
    with FakeServer(FakeEngine(base_s=0.002), send_usage=False) as s:
        reqs = synthetic(6, input_len=5, output_len=3)
        spec = LoadSpec(url=s.url, model="m", endpoint="completions",
                        arrival=ArrivalSpec(rate=20, kind="constant"))
        results, duration = asyncio.run(run_load(reqs, spec))
    starts = sorted(r.start_s for r in results)
    assert starts[-1] == pytest.approx(0.25, abs=0.08)  # 6 sends 50 ms apart
    assert all(r.is_ok and r.num_output_tokens == 3 and not r.is_usage_reported for r in results)
    assert duration >= 0.25


def test_multiturn_sends_turns_in_order(server):
    req = BenchRequest([{"role": "user", "content": "hello there"}], max_tokens=2,
                       followups=["and then", "finally"], followup_max_tokens=[3, 2])
    results, _ = asyncio.run(run_load([req], LoadSpec(url=server.url, model="m", concurrency=1)))
    assert [r.turn for r in results] == [0, 1, 2]
    assert [r.num_output_tokens for r in results] == [2, 3, 2]
    # the history grows: turn 1 carries the first prompt, the answer and the new question
    assert results[1].num_input_tokens == 2 + 2 + 2
    assert results[2].num_input_tokens > results[1].num_input_tokens


def test_unreachable_server_counts_errors():
    url = f"http://127.0.0.1:{free_port()}"
    results, _ = asyncio.run(run_load(synthetic(2, input_len=2, output_len=2),
                                      LoadSpec(url=url, model="m", concurrency=2)))
    assert [r.is_ok for r in results] == [False, False]
    assert all(r.error == "ConnectError" for r in results)
    with pytest.raises(BenchError, match="cannot reach"):
        asyncio.run(fetch_model(url))


def test_fetch_model_and_spec_validation(server):
    assert asyncio.run(fetch_model(server.url)) == "fake-model"
    with pytest.raises(BenchError, match="exactly one"):
        LoadSpec(url="http://x", model="m")


def test_closed_loop_think_time_spaces_each_workers_requests(server):
    reqs = synthetic(6, input_len=4, output_len=2)
    plain, _ = asyncio.run(run_load(reqs, LoadSpec(url=server.url, model="m", concurrency=2)))
    spec = LoadSpec(url=server.url, model="m", concurrency=2, think_time_s=0.15)
    results, duration = asyncio.run(run_load(reqs, spec))
    assert len(results) == 6 and all(r.is_ok for r in results)

    def gaps(rs):  # per worker-equivalent: the next start after each answer ends, 2 in flight
        ends = sorted(r.start_s + r.e2e_s for r in rs)
        starts = sorted(r.start_s for r in rs)[2:]
        return [s - e for s, e in zip(starts, ends)]

    assert min(gaps(results)) >= 0.14  # nobody sends before thinking
    assert max(gaps(plain)) < min(gaps(results))  # without think time the next request follows sooner
    assert duration >= 2 * 0.15  # three requests per worker, two pauses each
    with pytest.raises(BenchError, match="think-time"):
        LoadSpec(url="http://x", model="m", concurrency=1, think_time_s=-1)


def test_closed_loop_ramp_up_staggers_worker_starts(server, monkeypatch):
    # what the workers ask the clock for, not how late a loaded machine wakes them
    # (a busy CI box once woke two of them 0.06 s apart against a 0.075 s schedule)
    import tokenops.bench.loadgen as loadgen

    real_sleep = asyncio.sleep
    delays: list[float] = []

    async def recording_sleep(delay, *args, **kwargs):
        if sys._getframe(1).f_code.co_name == "worker":  # the load generator's workers, not the fake server
            delays.append(delay)
        await real_sleep(delay, *args, **kwargs)

    monkeypatch.setattr(loadgen.asyncio, "sleep", recording_sleep)
    reqs = synthetic(4, input_len=4, output_len=24)  # each lasts longer than the ramp: one per worker
    results, _ = asyncio.run(run_load(reqs, LoadSpec(url=server.url, model="m", concurrency=4, ramp_up_s=0.3)))
    assert sorted(d for d in delays if d > 0) == pytest.approx([0.075, 0.15, 0.225])  # one step per worker
    starts = sorted(r.start_s for r in results)
    assert starts[-1] - starts[0] >= 0.225 - 0.01, starts  # a sleep never ends early (clock resolution aside)
    delays.clear()
    lockstep, _ = asyncio.run(run_load(reqs, LoadSpec(url=server.url, model="m", concurrency=4)))
    assert not [d for d in delays if d > 0]  # no ramp: every worker starts at once
    assert len(lockstep) == 4
    with pytest.raises(BenchError, match="ramp-up"):
        LoadSpec(url="http://x", model="m", concurrency=1, ramp_up_s=float("inf"))


def test_temperature_is_sent_or_left_to_the_server():
    from tokenops.bench.loadgen import _body
    from tokenops.bench.runner import BenchPlan

    msgs = [{"role": "user", "content": "hi"}]
    greedy = LoadSpec(url="http://x", model="m", concurrency=1)
    assert _body(greedy, msgs, 4)["temperature"] == 0.0  # the default: greedy, reproducible
    server_default = LoadSpec(url="http://x", model="m", concurrency=1, temperature=None)
    assert "temperature" not in _body(server_default, msgs, 4)
    assert BenchPlan(url="http://x", concurrencies=[1], temperature=None).temperature is None
    with pytest.raises(BenchError, match="--temperature must be between 0 and 2"):
        LoadSpec(url="http://x", model="m", concurrency=1, temperature=3.0)


def test_cli_temperature_option(capsys):
    from tokenops.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--url", "http://127.0.0.1:9", "--temperature", "hot", "--no-store"])
    assert e.value.code == 2 and "--temperature must be a number or 'server'" in capsys.readouterr().err
