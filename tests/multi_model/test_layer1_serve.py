"""Layer 1 on the task-trained ladder through a real ``tokenops serve`` driven by the openai SDK:
the README's profile router on ``auto`` (profiles from ``tokenops profile run`` through the
store channel, picked up while serving), a cascade escalating a low-confidence answer, a
vote ensemble with distinct samples and per-member costs, MoA within max_tokens."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest

from tokenops.testing_serve import ServeProcess
from tokenops_plugins.multi_model._suites import make_suite

REPO = Path(__file__).resolve().parents[2]
LADDER = REPO / "tokenops" / "demo_models"

pytestmark = pytest.mark.skipif(not (LADDER / "ladder-large" / "config.json").is_file(),
                                reason="the ladder weights are not in this checkout")


def readme_router_example() -> str:
    """The README's `[plugins.router] use = "profile"` example, as the README prints it."""
    text = (REPO / "README.md").read_text()
    m = re.search(r"^\[plugins\.router\][^\n]*\nuse = \"profile\"\n", text, re.M)
    assert m, "README lost its [plugins.router] use = \"profile\" example"
    return m.group(0)


def config() -> str:
    return f"""
[[models]]
name = "small"
backend = "local"
path = "{LADDER / 'ladder-small'}"
cost_input_per_1m = 0.1
cost_output_per_1m = 0.4

[[models]]
name = "large"
backend = "local"
path = "{LADDER / 'ladder-large'}"
cost_input_per_1m = 0.6
cost_output_per_1m = 2.4

[plugins.cascade]
models = ["small", "large"]
threshold = 0.999

[plugins.validators]
use = ["logprob"]

[plugins.ensemble]
members = ["small", "large"]
samples = 3
aggregator = "large"
judge = "large"

{readme_router_example()}"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("layer1"), config=config()) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)


def record(srv, response_id: str) -> dict:
    """The server's record of one request (GET /admin/requests), matched by id."""
    suffix = response_id.split("-", 1)[-1]
    rows = httpx.get(f"{srv.url}/admin/requests", params={"limit": 200}, headers=srv.admin_headers).json()["requests"]
    return next(r for r in rows if r["id"].split("-", 1)[-1] == suffix)


def stored(srv, response_id: str, timeout_s: float = 10.0) -> tuple:
    """(escalated, cost_usd, decisions) of a request from the store, read while the server holds it."""
    from tokenops.store import open_store

    suffix = response_id.split("-", 1)[-1]
    deadline = time.monotonic() + timeout_s
    while True:
        with open_store(str(srv.store_path), read_only=True) as db:
            rows = db.execute("SELECT escalated, cost_usd, decisions FROM requests WHERE id LIKE ?",
                              [f"%{suffix}"]).fetchall()
        if rows or time.monotonic() > deadline:
            assert rows, f"request {response_id} not in the store after {timeout_s}s"
            escalated, cost, decisions = rows[0]
            return escalated, cost, json.loads(decisions) if isinstance(decisions, str) else decisions
        time.sleep(0.3)


def test_profile_router_routes_auto_once_profiles_land(srv, client, tmp_path):
    from typer.testing import CliRunner

    from tokenops.cli import build_app

    math_prompt = make_suite("math", 1, seed=7)[0].prompt
    with pytest.raises(openai.NotFoundError):  # no profile yet: nothing to route on
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": math_prompt}], max_tokens=4)
    profiles = srv.workdir / "profiles" / "models"
    for model in ("small", "large"):  # the real CLI, against the running server, into its folder and store
        r = CliRunner().invoke(build_app(), ["profile", "run", model, "--url", srv.base_url, "--n", "3", "--suite", "math",
                                             "--suite", "classification", "--out", str(profiles),
                                             "--store", str(srv.store_path), "--json"])
        assert r.exit_code == 0, r.output
        assert set(json.loads(r.output)["dimensions"]) == {"math", "classification"}
    deadline = time.monotonic() + 15
    while True:  # the server polls profiles/models and the store every 2 s
        try:
            answer = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": math_prompt}],
                                                    max_tokens=4, temperature=0)
            break
        except openai.NotFoundError:
            assert time.monotonic() < deadline, "profiles written by `tokenops profile run` were not picked up"
            time.sleep(0.5)
    rec = record(srv, answer.id)
    assert rec["router"] == "profile" and rec["model_served"] in ("small", "large")
    assert rec["route_reason"].startswith("profile: math ->"), rec["route_reason"]


def test_cascade_escalates_low_confidence_answer(srv, client):
    prompt = make_suite("math", 1, seed=11)[0].prompt
    answer = client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=6, temperature=0)
    assert answer.choices[0].logprobs is None  # asked for the validator, stripped: the client did not ask
    escalated, cost, decisions = stored(srv, answer.id)
    steps = decisions["cascade"]["steps"]
    assert escalated and [s["model"] for s in steps] == ["small", "large"]
    assert steps[0]["score"] is not None and steps[0]["score"] < 0.999  # the small tier's real confidence
    assert cost > 0
    # a client that asks for logprobs keeps them
    asked = client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=6, temperature=0, logprobs=True)
    assert asked.choices[0].logprobs is not None and asked.choices[0].logprobs.content


def test_cascade_keeps_a_confident_answer(srv, client):
    r = httpx.patch(f"{srv.url}/admin/tunables", json={"values": {"cascade.threshold": 0.0}}, headers=srv.admin_headers)
    assert r.status_code == 200, r.text
    try:
        answer = client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, temperature=0)
        rec = record(srv, answer.id)
        assert not rec["escalated"] and rec["model_served"] == "small"
        assert rec["decisions"]["cascade"]["steps"][0]["score"] > 0
    finally:
        httpx.patch(f"{srv.url}/admin/tunables", json={"values": {"cascade.threshold": 0.999}}, headers=srv.admin_headers)


def test_vote_ensemble_uses_distinct_samples_and_adds_member_costs(srv, client):
    prompt = make_suite("classification", 1, seed=3)[0].prompt
    answer = client.chat.completions.create(model="ensemble:vote", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=3)
    assert answer.choices[0].message.content is not None
    _, cost, decisions = stored(srv, answer.id)
    members = decisions["ensemble"]["member_costs"]
    assert decisions["ensemble"]["failed"] is None
    assert len(members) == 3 and len({m["request_id"] for m in members}) == 3
    assert all(m["model"] == "small" and m["completion_tokens"] > 0 for m in members)
    assert cost == pytest.approx(sum(m["cost_usd"] for m in members), rel=1e-9)


def test_moa_honours_max_tokens(srv, client):
    answer = client.chat.completions.create(model="ensemble:moa", messages=[{"role": "user", "content": "Name a color."}],
                                            max_tokens=5, temperature=0)
    rec = record(srv, answer.id)
    follow = rec["decisions"]["ensemble"]["follow_up_cost"]
    assert follow["model"] == "large" and follow["completion_tokens"] <= 5
    members = rec["decisions"]["ensemble"]["member_costs"]
    assert all(m["completion_tokens"] <= 5 for m in members)
    assert rec["cost_usd"] == pytest.approx(sum(m["cost_usd"] for m in members) + follow["cost_usd"], rel=1e-9)
