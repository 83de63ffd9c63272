"""Many gateways, one service (issue 54): a real ``redis-server`` and PostgreSQL, three real
``tokenops serve`` processes (the demo model's bundled engine in each, plus a chat upstream) with
the same ``[shared]`` block, and a round-robin balancer in the test (tests/gateway/round_robin.py)
that sends each request to the next gateway and skips a dead one.

- session memory follows the session: a turn made on A is recalled into the prompt on B;
- the semantic cache: an entry written on A hits on B, and a repeated workload over three gateways
  hits within 5 points of one gateway's rate (printed);
- rate limits and a key's budget stay exact across the three;
- openai-agents runs whose model calls land on different gateways, chained by the SDK's
  ``previous_response_id``;
- a three-turn ``previous_response_id`` conversation goes on after the gateway that served its
  second turn is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.openai_upstream import Upstream
from tests.gateway.round_robin import AsyncRoundRobin, RoundRobin
from tokenops.testing_postgres import PostgresUnavailable, postgres_server
from tokenops.testing_serve import RedisUnavailable, ServeProcess, redis_server

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tokenops" / "demo_models" / "target"
PAIRS = ROOT / "tests" / "data" / "semantic_cache_pairs.jsonl"
KEYS = {"key-a": "team-a", "key-one": "cache-one", "key-three": "cache-three", "key-rl": "limited"}


def config(upstream_url: str, redis_url: str, postgres_url: str) -> str:
    keys = ", ".join(f'"{k}" = "{t}"' for k, t in KEYS.items())
    return f"""
[gateway]
api_keys = {{ {keys} }}

[[models]]
name = "up"
backend = "openai"
url = "{upstream_url}"
cost_input_per_1m = 1000.0
cost_output_per_1m = 2000.0

[[models]]
name = "demo"
path = "{DEMO}"

[shared]
redis_url = "{redis_url}"
postgres_url = "{postgres_url}"

[plugins.session_memory]
enabled = true
embedder = "lexical"
token_budget = 300

[plugins.semantic_cache]
enabled = true
embedder = "lexical"

[plugins.rate_limit]
redis_url = "{redis_url}"
burst_s = 120.0

[plugins.rate_limit.tenants.limited]
requests_per_min = 6
"""


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as up:
        yield up


@pytest.fixture(scope="module")
def gateways(tmp_path_factory, upstream):
    with contextlib.ExitStack() as stack:
        try:
            redis_url = stack.enter_context(redis_server(tmp_path_factory.mktemp("redis")))
            postgres_url = stack.enter_context(postgres_server())
        except (RedisUnavailable, PostgresUnavailable) as e:
            pytest.skip(str(e))
        text = config(upstream.url, redis_url, postgres_url)
        servers = [ServeProcess(tmp_path_factory.mktemp(f"gateway_{n}"), config=text) for n in "abc"]
        for srv in servers:
            stack.callback(srv.stop)
        with ThreadPoolExecutor(3) as pool:  # start the three at once (each waits for /ready)
            for f in [pool.submit(s.start) for s in servers]:
                f.result()
        yield servers


def _client(srv: ServeProcess, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def _balanced(servers, key: str = "key-a") -> tuple[openai.OpenAI, RoundRobin]:
    balancer = RoundRobin(servers)
    http = httpx.Client(transport=balancer, timeout=120)
    return openai.OpenAI(base_url=servers[0].base_url, api_key=key, max_retries=0, http_client=http), balancer


def _harbour(num_turns: int) -> list[dict]:
    msgs = []
    for i in range(num_turns):
        msgs += [{"role": "user", "content": f"Describe the harbour on day {i}: the boats, the gulls and the tide."},
                 {"role": "assistant", "content": f"On day {i} the tide was low, six boats were moored and gulls circled."}]
    return msgs


def test_session_memory_follows_the_session(gateways, upstream):
    a, b, _ = (_client(s) for s in gateways)
    session = {"x-session-id": "locker"}
    fact = [{"role": "user", "content": "Please remember: my locker code is 4417."}]
    a.chat.completions.create(model="up", messages=fact, max_tokens=8, extra_headers=session)
    # on B, a conversation too long for the budget that no longer holds the fact
    asked = _harbour(20) + [{"role": "user", "content": "What is my locker code?"}]
    assert "4417" not in json.dumps(asked)
    b.chat.completions.create(model="up", messages=asked, max_tokens=8, extra_headers=session)
    sent = json.dumps(upstream.bodies[-1]["messages"])
    assert "4417" in sent  # recalled from the turn made on A
    admin_c = httpx.get(f"{gateways[2].url}/admin/memory/sessions/team-a/locker", headers=gateways[2].admin_headers)
    assert "4417" in json.dumps(admin_c.json()["entries"])


def _cache_header(client: openai.OpenAI, text: str) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model="up", max_tokens=8, temperature=0, messages=[{"role": "user", "content": text}])
    assert raw.parse().choices[0].message.content
    return raw.headers["x-tokenops-cache"]


def test_a_cache_entry_written_on_one_gateway_hits_on_another(gateways):
    a, b, c = (_client(s) for s in gateways)
    assert _cache_header(a, "How do I reset my password on this laptop?") == "miss"
    assert _cache_header(b, "How do I reset my password on this laptop?") == "hit; match=exact"
    assert _cache_header(c, "How can I reset my password on this laptop?").startswith("hit")


def _hit_rate(clients: list[openai.OpenAI], prompts: list[str]) -> float:
    hits = sum(_cache_header(clients[i % len(clients)], p).startswith("hit") for i, p in enumerate(prompts))
    return hits / len(prompts)


def test_hit_rate_across_three_gateways_is_within_5_points_of_one(gateways):
    pairs = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    questions = [q for p in pairs if p["should_hit"] for q in (p["a"], p["b"])][:40]
    workload = questions * 3
    random.Random(54).shuffle(workload)
    one = _hit_rate([_client(gateways[0], "key-one")], workload)
    three = _hit_rate([_client(s, "key-three") for s in gateways], workload)
    print(f"semantic cache, {len(workload)} requests ({len(questions)} prompts x 3): "
          f"hit rate one gateway {one:.1%}, three gateways round-robin {three:.1%}")
    assert one > 0.5 and abs(one - three) <= 0.05


def test_rate_limits_stay_exact_across_three(gateways):
    client, balancer = _balanced(gateways, "key-rl")
    outcomes = []
    for i in range(20):
        try:
            client.chat.completions.create(model="up", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4)
            outcomes.append("ok")
        except openai.RateLimitError:
            outcomes.append("429")
    # 6 per minute with 120 s of burst: a bucket of 12, refilled by under one in the test's seconds
    assert outcomes.count("ok") == 12 and outcomes[:12] == ["ok"] * 12, outcomes
    assert len(set(balancer.ports)) == 3


#: The upstream answers every chat request with 11 prompt and 17 completion tokens.
COST_PER_REQUEST = (11 * 1000.0 + 17 * 2000.0) / 1e6


def test_a_budget_stays_exact_across_three(gateways):
    """Keys and budgets share Redis (``[plugins.rate_limit] redis_url`` serves ``[plugins.keys]`` too):
    a key with a budget of ten requests gets exactly ten, spread over the three gateways."""
    a = gateways[0]
    admin = httpx.Client(base_url=a.url, headers=a.admin_headers, timeout=30)
    assert admin.put("/admin/tenants/budgeted", json={}).status_code in (200, 201)
    key = admin.post("/admin/keys", json={"tenant": "budgeted", "budget_usd": 10 * COST_PER_REQUEST,
                                           "budget_period": "daily"}).json()
    client, balancer = _balanced(gateways, key["key"])
    outcomes = []
    for i in range(15):
        try:
            client.chat.completions.create(model="up", messages=[{"role": "user", "content": f"spend {i}"}],
                                           max_tokens=4, extra_headers={"x-tokenops-cache": "off"})
            outcomes.append("ok")
        except openai.RateLimitError as e:
            outcomes.append(e.body["code"])
    assert outcomes == ["ok"] * 10 + ["budget_exceeded"] * 5, outcomes
    assert len(set(balancer.ports)) == 3
    for srv in gateways:  # one ledger: every gateway sees the same spend
        usage = httpx.get(f"{srv.url}/admin/keys/{key['id']}", headers=srv.admin_headers, timeout=30).json()["usage"]
        assert usage["spent_usd"] == pytest.approx(10 * COST_PER_REQUEST)


def test_agent_runs_whose_turns_land_on_different_gateways(gateways):
    """openai-agents (its default, the Responses API) through the balancer: three runs chained by
    the SDK's ``previous_response_id``, each model call on the next gateway."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)

    async def run():
        balancer = AsyncRoundRobin(gateways)
        http = httpx.AsyncClient(transport=balancer, timeout=120)
        client = openai.AsyncOpenAI(base_url=gateways[0].base_url, api_key="key-a", max_retries=0, http_client=http)
        agent = Agent(name="echo", model=OpenAIResponsesModel("up", client), instructions="Answer briefly.",
                      model_settings=ModelSettings(max_tokens=32, temperature=0))
        results, previous = [], None
        for text in ("The parcel number is 77.", "Where is it now?", "Thank you."):
            result = await Runner.run(agent, text, previous_response_id=previous, auto_previous_response_id=True)
            previous = result.last_response_id
            results.append(result)
        await http.aclose()
        return results, balancer.ports

    results, ports = asyncio.run(run())
    assert [r.final_output for r in results] == ["echo: The parcel number is 77.", "echo: Where is it now?",
                                                 "echo: Thank you."]
    assert ports == [s.port for s in gateways]  # each run's model call on the next gateway
    items = _client(gateways[1]).responses.input_items.list(results[-1].last_response_id, order="asc", limit=100).data
    users = [i.content[0].text for i in items if i.type == "message" and i.role == "user"]
    assert users == ["The parcel number is 77.", "Where is it now?", "Thank you."]


def test_a_conversation_goes_on_after_a_gateway_is_killed(gateways):
    client, balancer = _balanced(gateways)
    a, b, c = gateways
    first = client.responses.create(model="demo", input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = client.responses.create(model="demo", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    assert balancer.ports[-2:] == [a.port, b.port]
    b.proc.kill()  # SIGKILL: the gateway that served the second turn dies without a goodbye
    b.proc.wait(timeout=30)
    third = client.responses.create(model="demo", input="Say it again.", previous_response_id=second.id,
                                    max_output_tokens=8, temperature=0)
    assert balancer.ports[-1] == c.port
    assert client.responses.retrieve(third.id).id == third.id and balancer.ports[-1] == a.port
    fourth = client.responses.create(model="demo", input="Done.", previous_response_id=third.id,
                                     max_output_tokens=4)
    assert balancer.ports[-1] == c.port  # aimed at the dead B: the balancer went on to C
    items = client.responses.input_items.list(fourth.id, order="asc", limit=100).data
    users = [i.content[0].text for i in items if i.type == "message" and i.role == "user"]
    assert users == ["My name is Ada.", "What is my name?", "Say it again.", "Done."]
    # the dashboard's list (GET /admin/gateways on any replica): B goes quiet, so it reads as down
    deadline = time.monotonic() + 30
    while True:
        listed = httpx.get(f"{a.url}/admin/gateways", headers=a.admin_headers, timeout=10).json()["gateways"]
        health = {g["url"].rsplit(":", 1)[1]: g["health"] for g in listed}
        if health.get(str(b.port)) == "down":
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
    assert health == {str(a.port): "up", str(b.port): "down", str(c.port): "up"}
    assert listed[0]["is_self"] and listed[0]["url"].endswith(str(a.port))


def test_one_report_reads_every_gateway_store(gateways):
    """``tokenops report`` with each gateway's store: the two still running are read through their
    store channel, the killed one's file directly."""
    from typer.testing import CliRunner

    from tokenops.cli import build_app

    args = ["report", "--since", "all", "--json"]
    for srv in gateways:
        args += ["--store", str(srv.store_path)]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    per_store = [s["requests"] for s in data["stores"]]
    assert len(per_store) == 3 and all(n > 0 for n in per_store) and data["requests"] == sum(per_store)
