"""The vLLM series /metrics adds for operators: TPOT, queue/prefill/decode times, token
histograms and finished_reason on request_success_total."""

from __future__ import annotations

import re

import httpx
import openai

from tokenops.testing_gateway import FakeBackend, gateway_client
from tokenops.testing_serve import ServeProcess

NEW = ("time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens",
       "request_decode_time_seconds")
ENGINE_PHASES = ("request_queue_time_seconds", "request_prefill_time_seconds")


def _count(text: str, name: str, model: str) -> float:
    m = re.search(rf'^tokenops:{name}_count{{model_name="{model}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_series_and_finished_reason_on_a_fake_backend():
    async with gateway_client([FakeBackend(reply="a b c")]) as c:
        for _ in range(2):
            await c.post("/v1/chat/completions", json={"model": "fake-model",
                                                        "messages": [{"role": "user", "content": "hi"}]})
        text = (await c.get("/metrics")).text
    for name in NEW:
        assert f"# TYPE tokenops:{name} histogram" in text, name
        assert _count(text, name, "fake-model") == 2, name
    assert 'tokenops:request_generation_tokens_sum{model_name="fake-model"} 6' in text
    assert 'tokenops:request_success_total{model_name="fake-model",finished_reason="stop"} 2' in text
    # a fake backend reports no scheduling: those histograms stay empty instead of guessing
    for name in ENGINE_PHASES:
        assert f"# TYPE tokenops:{name} histogram" in text and _count(text, name, "fake-model") == 0


def test_bundled_engine_reports_queue_and_prefill_time(tmp_path):
    with ServeProcess(tmp_path, store=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        client.chat.completions.create(model="tokenops-demo", max_tokens=3,
                                       messages=[{"role": "user", "content": "hello"}])
        client.chat.completions.create(model="tokenops-demo", max_tokens=1,
                                       messages=[{"role": "user", "content": "again"}])
        text = httpx.get(f"{srv.url}/metrics").text
    for name in (*NEW, *ENGINE_PHASES):
        # one answer of one token has no time per output token (as in vLLM)
        assert _count(text, name, "tokenops-demo") == (1 if name == "time_per_output_token_seconds" else 2), name
    reasons = re.findall(r'^tokenops:request_success_total\{model_name="tokenops-demo",finished_reason="(\w+)"\} (\d+)',
                         text, re.M)
    assert sum(int(n) for _, n in reasons) == 2 and {r for r, _ in reasons} <= {"stop", "length"}
    queue_sum = float(re.search(r'^tokenops:request_queue_time_seconds_sum\{model_name="tokenops-demo"\} (\S+)',
                                text, re.M).group(1))
    assert 0 <= queue_sum < 60
