import pytest

from tokenops.config import Settings
from tokenops.types import EnsembleFollowUp, GatewayRequest, GatewayResponse
from tokenops_plugins.multi_model.ensemble import Ensemble


def req(model):
    return GatewayRequest(kind="chat", model=model, body={}, messages=[{"role": "user", "content": "What is 6*7?"}])


@pytest.fixture
def ensemble():
    """An instance of its own, configured: its members and judge are its own."""
    s = Settings()
    s.plugins["ensemble"] = {"members": ["small", "big"], "samples": 3, "judge": "big", "aggregator": "big"}
    plugin = Ensemble()
    plugin.tokenops_configure(s)
    return plugin


def resp(text, model="small"):
    return GatewayResponse(text=text, model=model, prompt_tokens=5, completion_tokens=2)


def test_route_aliases(ensemble):
    d = ensemble.tokenops_route(req("ensemble:vote"), ["small", "big"], {})
    assert d.members == ("small", "small", "small") and d.method == "vote"
    d = ensemble.tokenops_route(req("ensemble:moa"), ["small", "big"], {})
    assert d.members == ("small", "big")
    assert ensemble.tokenops_route(req("small"), ["small", "big"], {}) is None
    with pytest.raises(ValueError, match="unknown ensemble"):
        ensemble.tokenops_route(req("ensemble:magic"), ["small"], {})


def test_vote_takes_majority_by_value(ensemble):
    out = ensemble.tokenops_ensemble(req("ensemble:vote"), [resp("42"), resp("It is 42."), resp("41")])
    assert out.text in ("42", "It is 42.") and out.extra["votes"] == {"winner": 2, "of": 3}


def test_best_of_n_asks_judge_then_picks(ensemble):
    rs = [resp("41"), resp("42", "big")]
    follow = ensemble.tokenops_ensemble(req("ensemble:best_of_n"), rs)
    assert isinstance(follow, EnsembleFollowUp) and follow.model == "big"
    assert "[2] 42" in follow.messages[0]["content"]
    final = follow.finish(resp("2", "big"))
    assert final.text == "42" and final.extra["judge"]["picked"] == 2
    assert (final.prompt_tokens, final.completion_tokens) == (15, 6)  # both members plus the judge call


def test_moa_aggregates(ensemble):
    follow = ensemble.tokenops_ensemble(req("ensemble:moa"), [resp("42"), resp("42", "big")])
    assert follow.model == "big" and "Proposal 2: 42" in follow.messages[0]["content"]
    assert follow.finish(resp("The answer is 42.", "big")).completion_tokens == 6  # 2 + 2 members, 2 aggregator
