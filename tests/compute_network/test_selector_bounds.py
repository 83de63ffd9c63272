"""Issue 17: replica selection runs on the event loop, so its work per request is bounded
by the first MAX_AFFINITY_CHARS of the prompt, however large the prompt is."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tokenops.routing.selector import MAX_AFFINITY_CHARS, ReplicaSelector, SelectorConfig
from tokenops.types import GatewayRequest

DEMO = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "target"


class _Engine:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer


class _Replica:
    def __init__(self, name: str, engine=None) -> None:
        self.name = name
        self.backend = engine


def _chat(text: str) -> GatewayRequest:
    return GatewayRequest(kind="chat", model="m", body={}, messages=[{"role": "user", "content": text}], max_tokens=4)


@pytest.mark.parametrize("policy", ["prefix_aware", "kv_aware"])
def test_a_huge_prompt_is_selected_in_milliseconds_and_keeps_its_affinity(policy):
    from tokenops.engine.core.tokenizer import Tokenizer

    engine = _Engine(Tokenizer.from_dir(DEMO))
    replicas = [_Replica("a", engine), _Replica("b", engine)]
    selector = ReplicaSelector(SelectorConfig(policy=policy, seed=0))
    shared = "the same long system prompt " * (MAX_AFFINITY_CHARS // 20)
    first = selector.select(_chat(shared + "x" * 3_900_000), replicas)
    selector.finished(first.name)
    prompt = shared + "y" * 3_900_000
    t0 = time.perf_counter()
    second = selector.select(_chat(prompt), replicas)
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.tokenizer.encode(prompt[: len(prompt) // 4])  # a quarter of what selecting once cost (0.3 s / 1.4 s)
    assert took < time.perf_counter() - t0  # relative: a loaded machine slows both alike
    assert second.name == first.name  # the shared head decides
