"""The History screen and tune's replayed traffic over two gateway replicas' stores, one of them
held by a running ``tokenops serve`` that the openai SDK sends requests to (read through its store
channel), the other a stopped replica's file: one picture of both (docs/deploy.md "One picture")."""

from __future__ import annotations

import time

import openai
import pytest

from tests.gateway.openai_upstream import Upstream
from tokenops.bench.workloads import build_workload
from tokenops.testing_serve import ServeProcess
from tokenops.tui.merged_history import MergedHistory

CONFIG = '[[models]]\nname = "up"\nbackend = "openai"\nurl = "{url}"\ncost_input_per_1m = 1000.0\n'


def _ask(srv: ServeProcess, n: int) -> None:
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=60)
    for i in range(n):
        client.chat.completions.create(model="up", max_tokens=4,
                                       messages=[{"role": "user", "content": f"Question {i} of {srv.port}"}])


def _requests(history: MergedHistory) -> int:
    result = history.queries(["usage_by_model_day"])["usage_by_model_day"]
    assert not isinstance(result, str), result
    column = result["columns"].index("requests")
    return sum(row[column] for row in result["rows"])


@pytest.mark.slow
def test_history_and_replay_read_a_running_and_a_stopped_replica_as_one(tmp_path):
    with Upstream() as up:
        stopped = ServeProcess(tmp_path / "gw-a", config=CONFIG.format(url=up.url))
        with stopped:
            _ask(stopped, 3)
        with ServeProcess(tmp_path / "gw-b", config=CONFIG.format(url=up.url)) as running:
            _ask(running, 4)
            history = MergedHistory([str(stopped.store_path), str(running.store_path)])
            deadline = time.monotonic() + 60
            while _requests(history) < 7:  # the running replica's writer flushes every few seconds
                assert time.monotonic() < deadline, "the running replica's rows never showed"
                time.sleep(0.5)
            assert _requests(history) == 7
            replayed = build_workload("replay", 50, store=[str(stopped.store_path), str(running.store_path)])
            assert len(replayed) == 7 and all(r.num_prompt_tokens > 0 for r in replayed)
