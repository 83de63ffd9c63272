"""Search space from the registry, budgets, and the search loop on a known objective."""

import pytest

from tokenops.plugin_manager import get_tunables
from tokenops.tunables import Tunable, TunableError
from tokenops.tune.goodput import GoodputResult
from tokenops.tune.search import Budget, Tuner
from tokenops.tune.space import SearchSpace, candidates


def test_candidates_follow_the_declaration():
    t = Tunable("engine.max_num_seqs", "int", 32, "x", live=True, minimum=1, maximum=1024, log=True)
    assert candidates(t, span=8) == [4, 8, 16, 32, 64, 128, 256]
    assert candidates(t, span=2) == [16, 32, 64]
    clipped = Tunable("a.b", "int", 32, "x", minimum=16, maximum=48, log=True)
    assert candidates(clipped) == [16, 32]
    assert candidates(Tunable("a.c", "str", "x", "h", choices=("x", "y"))) == ["x", "y"]
    assert candidates(Tunable("a.d", "bool", True, "h")) == [True, False]
    lin = candidates(Tunable("a.e", "float", 1.0, "h", minimum=0.5, maximum=2.0))
    assert lin[0] == 0.5 and lin[-1] == 2.0 and 1.0 in lin


def test_space_comes_from_the_registry():
    reg = list(get_tunables())
    live = SearchSpace.build(reg, include_restart=False)
    assert {"engine.max_num_seqs", "engine.max_num_batched_tokens"} <= set(live.names)
    assert all(d.tunable.live and d.tunable.searchable for d in live.dims)
    full = SearchSpace.build(reg, include_restart=True, only=["engine"])
    assert "engine.block_size" in full.names and "engine.torch_threads" not in full.names
    assert all(n.startswith("engine.") for n in full.names)
    small = SearchSpace.build(reg, False, overrides={"engine.max_num_seqs": [4, 8]}, only=["engine.max_num_seqs"])
    assert small.names == ["engine.max_num_seqs"] and small.dims[0].values == [4, 8, 32] and small.size == 3
    with pytest.raises(TunableError, match="restart"):
        SearchSpace.build(reg, False, overrides={"engine.block_size": [8, 16]})
    with pytest.raises(TunableError, match="unknown"):
        SearchSpace.build(reg, False, overrides={"nope.x": [1]})


def test_budget_parse():
    assert Budget.parse("20").max_trials == 20
    assert Budget.parse("10m").max_seconds == 600
    assert Budget.parse("90s").max_seconds == 90
    with pytest.raises(ValueError, match="budget"):
        Budget.parse("soon")


def _space():
    ts = [Tunable("engine.a", "int", 8, "h", live=True, minimum=1, maximum=512, log=True),
          Tunable("engine.b", "str", "x", "h", live=True, choices=("x", "y", "z"))]
    return SearchSpace.build(ts, include_restart=False)


def test_tuner_starts_from_default_never_repeats_and_finds_the_peak():
    space = _space()  # a in 1..64 (7 values) x b (3 values) = 21 configurations
    calls = []

    def evaluate(params, incumbent, deadline):
        calls.append((dict(params), incumbent))
        score = 10 - abs(space.dims[0].index_of(params["engine.a"]) - 5) * 2 + (3 if params["engine.b"] == "z" else 0)
        return GoodputResult(float(score), "complete")

    out = Tuner(space, evaluate, Budget(max_trials=12), seed=1).run()
    assert calls[0] == ({"engine.a": 8, "engine.b": "x"}, None)  # trial 0 = the default, no incumbent yet
    keys = [tuple(c[0].values()) for c in calls]
    assert len(keys) == len(set(keys)) == 12
    assert calls[1][1] == out.trials[0].goodput  # later trials know the incumbent
    assert out.best.goodput >= 11  # near the peak (13 at a=32, b=z)
    assert out.ratio == pytest.approx(out.best.goodput / out.trials[0].goodput)


def test_tuner_stops_when_the_space_is_exhausted():
    ts = [Tunable("engine.a", "bool", True, "h", live=True)]
    space = SearchSpace.build(ts, include_restart=False)
    out = Tuner(space, lambda p, i, d: GoodputResult(1.0 if p["engine.a"] else 2.0, "complete"),
                Budget(max_trials=10)).run()
    assert len(out.trials) == 2 and out.stopped_by == "space exhausted"
    assert out.best.params == {"engine.a": False} and out.ratio == 2.0
