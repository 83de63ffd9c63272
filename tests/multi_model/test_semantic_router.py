import pytest

from tokenops.config import Settings
from tokenops.types import GatewayRequest
from tokenops_plugins.multi_model.semantic_router import SemanticRouter

ROUTES = [
    {"model": "big", "examples": ["Prove that there are infinitely many prime numbers.",
                                   "Write a Python function that merges two sorted lists.",
                                   "Derive the closed form of the geometric series sum."]},
    {"model": "small", "examples": ["Translate good morning into French.",
                                     "Is this restaurant review positive or negative?",
                                     "Summarise this paragraph in one sentence."]},
]


def req(text):
    return GatewayRequest(kind="chat", model="auto", body={}, messages=[{"role": "user", "content": text}])


@pytest.fixture(params=["lexical", pytest.param("auto", marks=pytest.mark.slow)])
def configured(request):
    s = Settings()
    s.plugins["router"] = {"use": "semantic", "default": "small", "semantic": {"routes": ROUTES, "embedder": request.param, "min_similarity": 0.2}}
    semantic_router.tokenops_configure(s)
    return request.param


semantic_router = SemanticRouter()  # an instance, as a gateway holds one


def test_routes_to_nearest_examples(configured):
    cands = ["small", "big"]
    d = semantic_router.tokenops_route(req("Prove that infinitely many primes exist."), cands, {})
    assert d.model == "big" and d.router == "semantic" and d.score > 0.2
    d = semantic_router.tokenops_route(req("Translate good night into French."), cands, {})
    assert d.model == "small"


def test_far_from_every_example_uses_default(configured):
    s = Settings()
    s.plugins["router"] = {"use": "semantic", "default": "small", "semantic": {"routes": ROUTES, "embedder": configured, "min_similarity": 0.99}}
    semantic_router.tokenops_configure(s)
    d = semantic_router.tokenops_route(req("zzqx vvv"), ["small", "big"], {})
    assert d.model == "small" and "default" in d.reason
