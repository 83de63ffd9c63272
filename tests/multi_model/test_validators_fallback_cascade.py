import math

import pytest

from tokenops.config import Settings
from tokenops.types import BackendError, GatewayRequest, GatewayResponse
from tokenops_plugins.multi_model import validators
from tokenops_plugins.multi_model.validators import Validators
from tokenops_plugins.multi_model.cascade import Cascade
from tokenops_plugins.multi_model.fallback import Fallback
from tokenops_plugins.multi_model._profiles import dump_profile, load_profiles, save_profile, wilson


def req(body=None, model="m"):
    return GatewayRequest(kind="chat", model=model, body=body or {}, messages=[{"role": "user", "content": "q"}])


@pytest.fixture
def settings():
    return Settings()


def test_logprob_confidence_is_geometric_mean_probability():
    assert validators.logprob_confidence([math.log(0.5), math.log(0.5)]) == pytest.approx(0.5)
    assert validators.logprob_confidence([]) is None


def test_json_validator_with_schema():
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "required": ["age"], "properties": {"age": {"type": "integer"}}}}}
    assert validators.json_validity('{"age": 3}', schema) == 1.0
    assert validators.json_validity('{"age": "3"}', schema) == 0.0
    assert validators.json_validity("not json", {"type": "json_object"}) == 0.0
    assert validators.json_validity("anything", None) is None


def test_validate_hook_takes_the_lowest_applicable_score(settings):
    validators = Validators()  # an instance of its own: its choice of validators is its own
    settings.plugins["validators"] = {"regex": r"^\d+$"}
    validators.tokenops_configure(settings)
    resp = GatewayResponse(text="42", model="m", token_logprobs=[math.log(0.9)] * 3)
    assert validators.tokenops_validate(req(), resp) == pytest.approx(0.9)
    resp = GatewayResponse(text="forty-two", model="m", token_logprobs=[math.log(0.9)] * 3)
    assert validators.tokenops_validate(req(), resp) == 0.0
    settings.plugins["validators"] = {"use": ["consistency"]}
    validators.tokenops_configure(settings)
    resp = GatewayResponse(text="x", model="m", extra={"samples": ["it is 7", "7", "answer: 7", "8"]})
    assert validators.tokenops_validate(req(), resp) == 0.75
    assert validators.tokenops_validate(req(), GatewayResponse(text="x", model="m")) is None


def test_fallback_follows_chain_and_skips_tried(settings):
    fallback = Fallback()  # an instance of its own: its chains are its own
    settings.plugins["fallback"] = {"chains": {"big": ["medium", "small"]}}
    fallback.tokenops_configure(settings)
    r = req(model="big")
    r.attempts = ["big"]
    assert fallback.tokenops_fallback(r, BackendError("x", kind="timeout")) == "medium"
    r.attempts = ["big", "medium"]
    assert fallback.tokenops_fallback(r, BackendError("x", kind="context_length")) == "small"
    r.attempts = ["big"]
    assert fallback.tokenops_fallback(r, BackendError("x", kind="bad_request")) is None


def test_cascade_route_decision(settings):
    cascade = Cascade()
    settings.plugins["cascade"] = {"models": ["small", "big"], "threshold": 0.7}
    cascade.tokenops_configure(settings)
    d = cascade.tokenops_route(req(model="cascade"), ["small", "big"], {})
    assert (d.model, d.escalate_to, d.min_score) == ("small", ("big",), 0.7)
    assert cascade.tokenops_route(req(model="small"), ["small", "big"], {}) is None
    cascade.tokenops_apply_tunables({"cascade.threshold": 0.2})
    assert cascade.tokenops_route(req(model="cascade"), ["small", "big"], {}).min_score == 0.2
    assert Cascade().tokenops_route(req(model="cascade"), ["small", "big"], {}) is None  # another one: unconfigured
    settings.plugins["cascade"] = {"models": ["small"]}
    with pytest.raises(ValueError, match="at least two"):
        cascade.tokenops_configure(settings)


def test_wilson_interval():
    lo, hi = wilson(90, 100)
    assert 0.82 < lo < 0.83 and 0.94 < hi < 0.95
    assert wilson(0, 0) == (0.0, 1.0)


def test_profile_toml_roundtrip(tmp_path):
    prof = {"model": "org/small", "updated_at": "2026-11-21T00:00:00", "dimensions": {"math": {"score": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 50}},
            "latency": {"ttft_p50_s": 0.1}}
    path = save_profile(prof, tmp_path)
    assert path.name == "org_small.toml"
    assert load_profiles(tmp_path)["org/small"] == prof
    assert "[dimensions.math]" in dump_profile(prof)
