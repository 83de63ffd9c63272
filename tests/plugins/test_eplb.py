import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tokenops_plugins.model_optimization.eplb import PlacementError, pack, plan, replicate


def zipf_load(num_layers=4, num_experts=64, a=1.0, seed=0, tokens=1_000_000):
    """Skewed load as recorded from a real router: a Zipf popularity, shuffled per layer."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num_layers):
        p = 1.0 / np.arange(1, num_experts + 1) ** a
        p = rng.permutation(p / p.sum())
        out.append(rng.multinomial(tokens, p).astype(float).tolist())
    return out


def test_replicate_gives_extra_replicas_to_the_hottest():
    assert replicate([10, 1, 1, 1], 6) == [3, 1, 1, 1]
    assert sum(replicate([5, 4, 3, 2], 9)) == 9


def test_pack_equal_item_counts():
    bins = pack([9, 8, 1, 1, 1, 1], 2, 3)
    assert sorted(len(b) for b in bins) == [3, 3]
    assert sorted(i for b in bins for i in b) == list(range(6))


@pytest.mark.parametrize("nodes", [1, 2])
def test_skewed_load_balanced_to_within_ten_percent(nodes):
    load = zipf_load()
    result = plan(load, num_devices=8, num_redundant=16, num_nodes=nodes)
    assert max(result.balancedness_before) > 1.3  # the recorded load really is skewed
    assert max(result.balancedness_after) <= 1.1
    for layer, layer_load in zip(result.layers, load):
        # every expert is hosted, with exactly as many replicas as the plan says
        hosted = [e for d in layer.devices for e in d]
        assert sorted(set(hosted)) == list(range(64))
        assert all(hosted.count(e) == c for e, c in enumerate(layer.replicas))
        assert all(len(d) == 80 // 8 for d in layer.devices)
        assert sum(layer.device_load) == pytest.approx(sum(layer_load))


def test_without_redundancy_packing_still_helps_but_less():
    load = zipf_load(seed=3)
    none = plan(load, 8, 0)
    some = plan(load, 8, 16)
    assert max(some.balancedness_after) < max(none.balancedness_after) <= max(none.balancedness_before)


def test_bad_shapes_are_clear_errors():
    with pytest.raises(PlacementError, match="do not divide evenly"):
        plan([[1.0] * 10], num_devices=4, num_redundant=1)
    with pytest.raises(PlacementError, match="no expert load"):
        plan([], 2, 0)


def test_cli_from_load_file(tmp_path):
    from tokenops.cli import build_app

    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(zipf_load(num_layers=2, num_experts=8, seed=1)))
    result = CliRunner().invoke(build_app(), ["moe", "plan", "--devices", "4", "--redundant", "4", "--load", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"] == "mixtral" and len(data["layers"]) == 2
    assert all(a <= b + 1e-9 for a, b in zip(data["balancedness_after"], data["balancedness_before"]))


def test_cli_from_store(tmp_path):
    from tokenops.cli import build_app
    from tokenops.store import Store

    db = tmp_path / "t.duckdb"
    load = zipf_load(num_layers=2, num_experts=16, seed=2)
    with Store.open(db) as store:
        w = store.writer()
        w.write_many("expert_load", [{"ts": 0.0, "model": "moe", "replica": "moe#0", "layer": l, "expert": e, "tokens": int(t)}
                                     for l, layer in enumerate(load) for e, t in enumerate(layer)])
        w.close()
    result = CliRunner().invoke(build_app(), ["moe", "plan", "--devices", "4", "--redundant", "4", "--store", str(db), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"] == "moe" and max(data["balancedness_after"]) < max(data["balancedness_before"])
