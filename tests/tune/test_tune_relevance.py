"""Tunables declare when they matter; the tuner leaves the others out and says why."""

from __future__ import annotations

from tokenops.plugin_manager import get_tunables
from tokenops.tune.deployment import Deployment, filter_relevant
from tokenops.tune.space import SearchSpace


def _dropped(deployment: Deployment) -> set[str]:
    return {name for name, _ in filter_relevant(list(get_tunables()), deployment).dropped}


def test_one_model_one_replica_drops_cascade_router_replica_and_diffusion_knobs():
    dropped = _dropped(Deployment({"demo": 1}, {}, {"demo": "local"}))
    assert {"cascade.threshold", "router.threshold", "routing.replica_policy", "diffusion.steps"} <= dropped
    assert not any(n.startswith("engine.") for n in dropped)


def test_each_knob_comes_back_when_its_deployment_needs_it():
    dropped = _dropped(Deployment({"small": 2, "big": 1, "img": 1},
                                  {"cascade": {"models": ["small", "big"]}, "router": {"use": "threshold"}},
                                  {"small": "local", "big": "openai", "img": "diffusion"}))
    assert not {"cascade.threshold", "router.threshold", "routing.replica_policy", "diffusion.steps"} & dropped
    assert "router.threshold" in _dropped(Deployment({"a": 1}, {"router": {"use": "rules"}}, {"a": "local"}))


def test_unknown_facts_keep_everything():
    assert _dropped(Deployment()) == set()


def test_reasons_and_kept_names():
    rel = filter_relevant(list(get_tunables()), Deployment({"a": 1}, {}, {"a": "local"}),
                          keep=["routing.replica_policy"])
    reasons = dict(rel.dropped)
    assert reasons["cascade.threshold"].startswith("needs a cascade")
    assert "routing.replica_policy" in {t.name for t in rel.kept}  # asked for with --param


def test_empty_space_explains_itself():
    tunables = list(get_tunables())
    space = SearchSpace.build(tunables, include_restart=False, only=["quantization.weights", "no.such"])
    assert space.dims == []
    why = space.why_empty()
    assert "quantization.weights needs a restart" in why and "--only no.such matches no tunable" in why
    space = SearchSpace.build(tunables, include_restart=False, only=["routing.prefix_block_chars"])
    assert "not searched by default" in space.why_empty()


def test_tunable_json_carries_no_code():
    import json

    for t in get_tunables():
        d = t.to_dict()
        assert "relevant" not in d
        json.dumps(d)


def test_images_knobs_need_images_in_the_workload():
    served = ({"chat": 1, "img": 1}, {}, {"chat": "local", "img": "diffusion"})
    assert "diffusion.steps" in _dropped(Deployment(*served, work={"text"}))
    assert "diffusion.steps" not in _dropped(Deployment(*served, work={"images"}))
