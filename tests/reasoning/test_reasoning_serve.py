"""Reasoning through a real ``tokenops serve`` with the openai SDK: reasoning_content
separated from content (streamed and not), usage reasoning_tokens, a thinking budget
enforced by budget forcing with the answer still produced, /metrics and the store."""

from pathlib import Path

import re

import duckdb
import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess
from tokenops_plugins.model_optimization._reasoning_tasks import make_reasoning_suite

MODEL_DIR = Path(__file__).resolve().parents[2] / "tokenops" / "demo_models" / "reasoning-small"
CONFIG = f"""
[[models]]
name = "reasoner"
backend = "local"
path = "{MODEL_DIR}"
reasoning_parser = "think"

[[models]]
name = "plain"
backend = "local"
path = "{MODEL_DIR}"
"""
REPO = Path(__file__).resolve().parents[2]
# the documented [plugins.reasoning_budget] block, with its table path made absolute (the server runs elsewhere)
DOCS_BLOCK = re.search(r"```toml\n(\[plugins\.reasoning_budget\].*?)```", (REPO / "docs" / "reasoning.md").read_text(),
                       re.S).group(1).replace('"profiles/', f'"{REPO}/profiles/')
CONFIG += "\n" + DOCS_BLOCK
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "config.json").is_file(), reason="reasoning-small not trained")
PROMPT = make_reasoning_suite("multistep", 1, seed=0, terms=(5, 5))[0].prompt  # held-out, 5 terms


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reasoning")
    with ServeProcess(workdir, config=CONFIG) as srv:
        yield srv, openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    with duckdb.connect(str(srv.store_path), read_only=True) as con:
        rows = con.execute("SELECT model_served, tokens_out, reasoning_tokens FROM requests "
                           "WHERE status = 'ok' AND model_served = 'reasoner'").fetchall()
    assert rows and all(r is not None and 0 < r <= out for _, out, r in rows), rows


def ask(client, prompt=PROMPT, **kw):
    return client.chat.completions.create(model="reasoner", messages=[{"role": "user", "content": prompt}],
                                          temperature=0, max_tokens=160, **kw)


def test_reasoning_content_is_separated_and_counted(served):
    srv, client = served
    r = ask(client)
    msg = r.choices[0].message
    assert msg.reasoning_content and "<think>" not in msg.reasoning_content and "</think>" not in msg.reasoning_content
    assert msg.content and "think>" not in msg.content
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < r.usage.completion_tokens

    stream = ask(client, stream=True, stream_options={"include_usage": True})
    reasoning, content, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            reasoning.append(getattr(c.delta, "reasoning_content", None) or "")
            content.append(c.delta.content or "")
    assert "".join(reasoning) == msg.reasoning_content and "".join(content) == msg.content
    assert usage.completion_tokens_details.reasoning_tokens == details.reasoning_tokens


# with no thinking line at all the demo model answers a chain with nothing (it copies its last
# worked line, docs/reasoning.md), so budget 0 is asked on a largest-of prompt, which it answers
MAXOF = make_reasoning_suite("maxof", 1, seed=0, terms=(5, 5))[0].prompt


@pytest.mark.parametrize("kw", [{"extra_body": {"max_thinking_tokens": 4}}, {"reasoning_effort": "minimal"}])
def test_a_budget_is_enforced_and_the_model_still_answers(served, kw):
    srv, client = served
    prompt = MAXOF if kw.get("reasoning_effort") == "minimal" else PROMPT
    unlimited = ask(client, prompt).usage.completion_tokens_details.reasoning_tokens
    r = ask(client, prompt, **kw)
    budget = kw.get("extra_body", {}).get("max_thinking_tokens", 0)
    # <think>, the budget, a forced line break, </think>
    assert r.usage.completion_tokens_details.reasoning_tokens <= 1 + budget + 2 < unlimited
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.strip()
    metrics = __import__("httpx").get(f"{srv.url}/metrics").text
    assert 'tokenops:reasoning_tokens_total{model_name="reasoner"}' in metrics


def test_budget_fields_need_a_reasoning_model(served):
    srv, client = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="plain", messages=[{"role": "user", "content": PROMPT}],
                                       reasoning_effort="low", max_tokens=8)
    assert "reasoning_parser" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, extra_body={"max_thinking_tokens": -1})
    assert "max_thinking_tokens" in str(e.value)
    plain = client.chat.completions.create(model="plain", messages=[{"role": "user", "content": PROMPT}],
                                           temperature=0, max_tokens=160)
    assert "<think>" in plain.choices[0].message.content  # no parser: the text is left as it is
    assert plain.usage.completion_tokens_details is None


def test_adaptive_policy_and_reflection_suppression_switched_on_live(served):
    srv, client = served
    maxof = make_reasoning_suite("maxof", 1, seed=0, terms=(5, 5))[0].prompt

    def think(prompt):
        r = client.chat.completions.create(model="reasoner", messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=160)
        return r.choices[0].message.reasoning_content, r.usage.completion_tokens_details.reasoning_tokens

    full_text, full = think(maxof)
    assert "Wait" in full_text  # the demo model re-checks its work
    patch = lambda values: httpx.patch(f"{srv.url}/admin/tunables", headers=srv.admin_headers,  # noqa: E731
                                       json={"values": values})
    assert patch({"reasoning.suppress_reflection": True, "reasoning.adaptive": True}).status_code == 200
    try:
        text, spent = think(maxof)
        assert "Wait" not in text and spent < full
    finally:
        assert patch({"reasoning.suppress_reflection": False, "reasoning.adaptive": False}).status_code == 200
    assert think(maxof) == (full_text, full)
