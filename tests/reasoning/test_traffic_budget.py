"""Thinking budgets learned from recorded traffic: the engine's first-pass telemetry, the
learning function, and the loop through a real ``tokenops serve`` (openai SDK traffic ->
``tokenops reasoning learn`` on the store the server holds -> adaptive budgets served)."""

import json
from collections import Counter
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.engine.sampling.thinking import ThinkingControl
from tokenops.testing_serve import ServeProcess
from tokenops_plugins.model_optimization._adaptive_budget import BudgetTable, features
from tokenops_plugins.model_optimization._traffic_budget import (
    TrafficSample, group_budget, is_whole, learn_from_traffic, samples_from_decisions)
from tokenops_plugins.model_optimization._reasoning_tasks import make_reasoning_suite

OPEN, CLOSE, WAIT, X, NL = 1, 2, 9, 5, 7
CONTROL = dict(open_ids=(OPEN,), close_ids=(CLOSE,), newline_ids=(NL,), line_end_ids=frozenset({NL}),
               reflection_ids=frozenset({WAIT}))


def feed(control, tokens):
    state = control.new_state()
    for t in tokens:
        state.accept(t)
    return state


def test_the_engine_notes_the_first_pass_and_who_closed_the_block():
    natural = feed(ThinkingControl(**CONTROL), [OPEN, X, X, NL, WAIT, X, NL, CLOSE, X])
    assert (natural.closed_by, natural.num_first_pass, natural.num_reasoning_tokens) == ("model", 3, 8)
    no_recheck = feed(ThinkingControl(**CONTROL), [OPEN, X, X, X, NL, CLOSE])
    assert (no_recheck.closed_by, no_recheck.num_first_pass) == ("model", 4)
    state = feed(ThinkingControl(**CONTROL, budget=2), [OPEN, X, X])
    assert state.forced == [NL, CLOSE]
    for t in (NL, CLOSE):
        state.accept(t)
    assert (state.closed_by, state.num_first_pass) == ("budget", None)  # cut: its natural length is unknown
    assert feed(ThinkingControl(**CONTROL), [OPEN, X, X]).closed_by is None  # still open (max_tokens)


def decisions(dim, words, closed_by, first_pass, spent, budget=None):
    d = {"reasoning_features": {"dimension": dim, "words": words},
         "thinking": {"closed_by": closed_by, "first_pass": first_pass, "spent": spent}}
    if budget is not None:
        d["reasoning_budget"] = budget
    return d


def test_only_unlimited_naturally_closed_requests_are_learned_from():
    rows = [decisions("math", 9, ["model"], [14], [30]),
            decisions("math", 9, ["model", "budget"], [16, None], [33, 8]),  # n=2: the forced choice is left out
            decisions("math", 9, [None], [None], [200]),  # cut by max_tokens
            decisions("math", 9, ["model"], [30], [40], {"max_thinking_tokens": 40, "suppress": [], "reason": ""}),
            decisions("math", 9, ["model"], [12], [12], {"max_thinking_tokens": None, "suppress": ["Wait"], "reason": ""}),
            {"thinking": {"closed_by": ["model"], "first_pass": [3], "spent": [7]}}]  # no features recorded
    assert samples_from_decisions(rows) == [TrafficSample("math", 9, 14, 30), TrafficSample("math", 9, 16, 33),
                                            TrafficSample("math", 9, 12, 12)]


def test_a_group_gets_the_smallest_budget_that_leaves_enough_of_it_whole():
    same = [TrafficSample("math", 9, 14, 30)] * 9 + [TrafficSample("math", 9, 16, 34)]
    # all alike but one: stop the nine right after their first pass (the tenth would be cut mid-re-check)
    assert group_budget(same, 0.9) == 14 and group_budget(same, 1.0) == 34
    # two kinds of item in one group (short 15/30, long 24/50): 24 would cut every short one mid-re-check
    mixed = [TrafficSample("math", 13, 15, 30)] * 4 + [TrafficSample("math", 13, 24, 50)] * 6
    assert group_budget(mixed, 0.6) == 24 and group_budget(mixed, 0.95) == 50 and group_budget(mixed, 0.4) == 15
    assert is_whole(24, TrafficSample("m", 1, 24, 50)) and not is_whole(30, TrafficSample("m", 1, 24, 50))
    table = learn_from_traffic(same + mixed + [TrafficSample("retrieval", 12, 18, 40)] * 2, coverage=0.9, min_items=3)
    assert table.budgets == {"math": {9: 14, 13: 50}, "retrieval": {12: None}}
    assert table.meta["samples"] == 22 and table.meta["source"] == "traffic"
    with pytest.raises(ValueError):
        learn_from_traffic(same, coverage=0)


MODEL_DIR = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "reasoning-small"
CONFIG = f"""
[[models]]
name = "reasoner"
backend = "local"
path = "{MODEL_DIR}"
reasoning_parser = "think"
"""


@pytest.mark.skipif(not (MODEL_DIR / "config.json").is_file(), reason="reasoning-small not trained")
def test_budgets_learned_from_the_servers_own_traffic_are_served(tmp_path):
    # traffic: items of other seeds than the held-out 0, per group (suite, terms) 3 of them
    groups = [("multistep", 3), ("multistep", 5), ("maxof", 4)]
    traffic = [t for d, k in groups for t in make_reasoning_suite(d, 3, seed=11, terms=(k, k))]
    probes = [make_reasoning_suite(d, 1, seed=0, terms=(k, k))[0] for d, k in groups]
    with ServeProcess(tmp_path, config=CONFIG) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)

        def ask(prompt):
            r = client.chat.completions.create(model="reasoner", messages=[{"role": "user", "content": prompt}],
                                               temperature=0, max_tokens=200)
            return r.usage.completion_tokens_details.reasoning_tokens, r.choices[0].message.content

        unlimited = [ask(t.prompt)[0] for t in traffic]
        learn = [sys.executable, "-m", "tokenops", "reasoning", "learn", "--model", "reasoner", "--min-items", "3",
                 "--store", str(srv.store_path), "--json"]
        for _ in range(40):  # the store writer batches rows: wait until all nine are there
            done = subprocess.run(learn, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 or "no learnable requests" in done.stderr + done.stdout, done.stderr
            if done.returncode == 0 and json.loads(done.stdout)["samples"] == len(traffic):
                break
            time.sleep(0.5)
        learned = json.loads(done.stdout)
        assert learned["samples"] == len(traffic) and Path(learned["out"]) == Path("profiles/reasoning/reasoner.json")
        table = BudgetTable.from_json(json.loads((tmp_path / learned["out"]).read_text()))
        # the groups are the classifier's (it may call a maxof prompt "math"): >= 3 requests get a budget
        sizes = Counter(features(t.prompt) for t in traffic)
        assert {(d, w): b for d, row in table.budgets.items() for w, b in row.items()} == \
            {g: table.budgets[g[0]][g[1]] if n >= 3 else None for g, n in sizes.items()}
        budgets = [table.budget_for(p.prompt)[0] for p in probes]
        assert budgets[:2] == [table.budgets[features(p.prompt)[0]][features(p.prompt)[1]] for p in probes[:2]]
        assert all(isinstance(b, int) and b > 0 for b in budgets[:2])  # the multistep groups: all "math"

        r = httpx.patch(f"{srv.url}/admin/tunables", headers=srv.admin_headers, json={"values": {"reasoning.adaptive": True}})
        assert r.status_code == 200
        asked = 0
        for probe, (_, k), budget in zip(probes, groups, budgets):
            if budget is None:
                continue
            asked += 1
            spent, answer = ask(probe.prompt)
            full = max(unlimited[i] for i, t in enumerate(traffic) if t.dimension == probe.dimension
                       and t.difficulty == k)
            assert spent <= 1 + budget + 2 < full  # <think>, the budget, a forced line break, </think>
            assert answer.strip().lstrip("-").isdigit()
        recent = httpx.get(f"{srv.url}/admin/requests", headers=srv.admin_headers).json()
        reasons = [(e["decisions"].get("reasoning_budget") or {}).get("reason", "") for e in recent["requests"][:asked]]
        assert asked >= 2 and all(r.startswith("adaptive") for r in reasons), reasons

        # learned again with a stricter --min-items: every group now stays unlimited, and the
        # running server picks the rewritten table up on the next request (no restart)
        relearn = subprocess.run([a if a != "3" else "4" for a in learn],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert relearn.returncode == 0, relearn.stderr
        assert all(b is None for row in json.loads(relearn.stdout)["budgets"].values() for b in row.values())
        again, _ = ask(probes[0].prompt)
        assert again > 1 + budgets[0] + 2  # thinks past the old budget: re-checks, unlimited again
