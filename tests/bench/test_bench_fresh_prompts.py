"""Honest bench: fresh prompts per level and run, the prefix-cache hit rate per level
from the server's /metrics, output checks before the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tokenops.bench import plot as plots
from tokenops.bench.runner import BenchPlan, level_requests
from tokenops.bench.server_metrics import PrefixCounters, hit_rate, parse_prefix_counters


def _texts(requests):
    return [json.dumps(r.messages) for r in requests]


@pytest.mark.parametrize("workload", ["synthetic", "shared-prefix"])
def test_levels_and_runs_get_fresh_prompts(workload):
    plan = BenchPlan(url="http://x", workload=workload, num_requests=5, rates=[1, 2])
    a0, a1 = _texts(level_requests(plan, 0, 1)), _texts(level_requests(plan, 1, 1))
    b0 = _texts(level_requests(plan, 0, 2))
    assert not set(a0) & set(a1) and not set(a0) & set(b0)
    assert a0 == _texts(level_requests(plan, 0, 1))  # reproducible from (seed, nonce, level)
    if workload == "shared-prefix":  # the shared system prompts stay shared within a level
        systems = {r.messages[0]["content"] for r in level_requests(plan, 0, 1)}
        assert len(systems) < 5


def test_reuse_prompts_keeps_the_old_behaviour():
    plan = BenchPlan(url="http://x", num_requests=4, rates=[1, 2], reuse_prompts=True)
    assert _texts(level_requests(plan, 0, 1)) == _texts(level_requests(plan, 1, 2))


def test_prefix_counters_from_tokenops_and_vllm_metrics():
    text = """# HELP tokenops:prefix_cache_hits_total x
tokenops:prefix_cache_queries_total{model_name="a"} 100
tokenops:prefix_cache_hits_total{model_name="a"} 40
tokenops:prefix_cache_queries_total{model_name="b"} 7
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 2
"""
    assert parse_prefix_counters(text, "a") == PrefixCounters(100, 42)
    assert parse_prefix_counters(text, None) == PrefixCounters(107, 42)
    assert parse_prefix_counters("tokenops:other 1\n", "a") is None
    assert hit_rate(PrefixCounters(100, 40), PrefixCounters(300, 90)) == 0.25
    assert hit_rate(PrefixCounters(100, 40), PrefixCounters(100, 40)) is None  # nothing queried
    assert hit_rate(None, PrefixCounters(1, 1)) is None


def test_plot_target_checked_before_the_run(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="does not exist"):
        plots.check_target(tmp_path / "missing" / "x.html")
    with pytest.raises(ValueError, match=".html or .png"):
        plots.check_target(tmp_path / "x.svg")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ValueError, match="needs matplotlib"):
        plots.check_target(tmp_path / "x.png")
    plots.check_target(tmp_path / "x.html")


def test_bench_cli_refuses_a_bad_plot_before_sending_anything(tmp_path):
    # the URL is never contacted: the check comes first
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-m", "tokenops", "bench", "--url", "http://127.0.0.1:9", "--plot",
                             str(tmp_path / "no" / "x.png")], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_two_equal_levels_on_tokenops_serve(tmp_path):
    """The acceptance shape, small: two identical levels measure a cold prefix cache each,
    while --reuse-prompts shows the second level hitting the first one's blocks."""
    from tokenops.testing_serve import ServeProcess

    with ServeProcess(tmp_path) as srv:
        def bench(*extra):
            cmd = [sys.executable, "-m", "tokenops", "bench", "--url", srv.url, "--rate", "inf,inf", "-n", "4",
                   "--input-len", "48", "--output-len", "2", "--no-store", "--json", *extra]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            return [lv["summary"]["prefix_cache_hit_rate"] for lv in json.loads(out.stdout)["levels"]]

        fresh = bench()
        reused = bench("--reuse-prompts")
    assert all(r is not None for r in fresh + reused)
    assert fresh[1] < 0.2 and reused[1] > 0.5
