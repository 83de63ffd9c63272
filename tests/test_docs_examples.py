"""The code blocks of docs/plugins.md and docs/hooks.md run (datasette's documentation tests).

Which blocks run: ``python`` and ``toml`` fenced blocks, unless the line before the fence is
``<!-- docs-test: skip (REASON) -->`` (hook signatures, abridged fragments). Blocks in other
languages (``bash``: shell sessions) are not run. A runnable ``python`` block is either a
plugin (it uses ``@hookimpl``: it is registered with the plugin manager and its hooks are
called) or a pytest module (it defines ``test_*``: it is run by pytest in a subprocess); a
``toml`` block whose first line names a file (``# path/to/file.toml``) must agree with that file.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests import docs_example_checks as engine_checks

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "docs" / "plugins.md", ROOT / "docs" / "hooks.md"]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b")
RUN_LANGUAGES = {"python", "toml"}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    is_skipped: bool

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str:
        if self.language == "toml":
            return "config"
        if re.search(r"^\s*(async\s+)?def test_", self.code, flags=re.M):
            return "pytest"
        if "@hookimpl" in self.code:
            return "plugin"
        return "unknown"


def blocks(path: Path) -> list[Block]:
    """Fenced blocks of a Markdown file, with the language of the fence and its skip marker."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(```+)\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        start, end = i, i + 1
        while end < len(lines) and not lines[end].startswith(fence.group(1)):
            end += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        out.append(
            Block(
                path.name,
                start + 1,
                fence.group(2).lower(),
                "\n".join(lines[start + 1 : end]) + "\n",
                bool(SKIP.search(previous)),
            )
        )
        i = end + 1
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]
RUNNABLE = [b for b in ALL if b.language in RUN_LANGUAGES and not b.is_skipped]


def _of_kind(kind: str) -> list:
    return [pytest.param(b, id=b.id) for b in RUNNABLE if b.kind == kind]


def test_the_extractor_sees_the_blocks():
    # hooks.md: one signature block per hook, all marked; plugins.md: a plugin, a test, a config
    assert sum(b.doc == "hooks.md" for b in ALL) >= 20
    assert all(b.is_skipped for b in ALL if b.doc == "hooks.md" and b.language == "python")
    assert {b.kind for b in RUNNABLE} == {"plugin", "pytest", "config"}


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in RUNNABLE])
def test_every_runnable_block_has_a_runner(block):
    assert block.kind != "unknown", (
        f"{block.id}: a {block.language} block that is neither a plugin, a pytest "
        "module nor a config file; mark it <!-- docs-test: skip (why) --> or make it run"
    )


def _load_plugin(block: Block) -> types.ModuleType:
    module = types.ModuleType(f"docs_plugin_{block.doc.replace('.', '_')}_{block.line}")
    exec(compile(block.code, block.id, "exec"), module.__dict__)
    return module


def _request(text: str, model: str = "m"):
    from tokenops.types import GatewayRequest

    return GatewayRequest(kind="chat", model=model, body={}, messages=[{"role": "user", "content": text}])


@pytest.mark.parametrize("block", _of_kind("plugin"))
def test_plugin_block_registers_and_its_hooks_act(block, register_plugin):
    from tokenops.gateway.core import hooks
    from tokenops.tunables import Tunable
    from tokenops.types import Rejection

    module = _load_plugin(block)
    register_plugin(module)  # refused if a hook name or argument does not exist
    implemented = {n for n in vars(module) if n.startswith("tokenops_")}
    assert implemented, block.id

    if "tokenops_register_tunables" in implemented:
        declared: list = []
        module.tokenops_register_tunables(register=declared.append)
        assert declared and all(isinstance(t, Tunable) for t in declared)
    if "tokenops_admit" in implemented:
        rejection = hooks.get_rejection(_request("please say something forbidden"))
        assert isinstance(rejection, Rejection) and 400 <= rejection.status < 500, rejection
        assert hooks.get_rejection(_request("please say hello")) is None
    if "tokenops_route" in implemented:  # the "Blocking work" router: off the loop for its alias only
        from tokenops.types import RouteDecision

        def route_kwargs(model: str, text: str) -> dict:
            return {"request": _request(text, model), "candidates": ["big", "small"], "profiles": {}}

        assert hooks.is_blocking("tokenops_route", **route_kwargs("topic", "x"))
        assert not hooks.is_blocking("tokenops_route", **route_kwargs("m", "x"))
        decision = hooks.get_route(**route_kwargs("topic", "please prove this theorem"))
        assert isinstance(decision, RouteDecision) and decision.model == "big", decision
        assert hooks.get_route(**route_kwargs("topic", "translate good night to French")).model == "small"
    if "tokenops_register_proposers" in implemented:  # the "Engine policies" plugin: selectable by name
        from tokenops.engine.core.config import EngineConfig
        from tokenops.engine.core.protocols import Proposer
        from tokenops.engine.core.sequence import Sequence
        from tokenops.engine.sampling.sampling import SamplingParams
        from tokenops.policy_hooks import configure_engine, proposers, schedule_orders

        config = configure_engine(EngineConfig(speculative="repeat-last", schedule_policy="sjf"))
        proposer = proposers()["repeat-last"](config)
        assert isinstance(proposer, Proposer)
        long, short = Sequence("a", [1, 2, 3], SamplingParams()), Sequence("b", [4, 5], SamplingParams())
        assert [p.token_ids for p in proposer.propose([long, short], [2, 3])] == [[3, 3], [5, 5, 5]]
        assert schedule_orders()["sjf"]([long, short]) == [short, long]
    if "tokenops_apply_tunables" in implemented:
        module.tokenops_apply_tunables(values={"blocklist.words": "Zebra, okapi"})
        assert isinstance(hooks.get_rejection(_request("a ZEBRA crossing")), Rejection)
        assert hooks.get_rejection(_request("please say something forbidden")) is None


@pytest.mark.parametrize("block", _of_kind("plugin"))
def test_abridged_plugin_block_matches_the_example_it_names(block):
    first = block.code.splitlines()[0]
    named = re.match(r"#\s*(\S+\.py)", first)
    if named is None:
        pytest.skip("the block names no source file")
    source = ROOT / named.group(1)
    assert source.is_file(), f"{block.id} names {source}, which does not exist"

    def hooks_of(code: str) -> set[str]:
        return {
            n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name.startswith("tokenops_")
        }

    assert hooks_of(block.code) <= hooks_of(source.read_text()), f"{block.id} shows hooks the example lacks"


@pytest.mark.parametrize("block", _of_kind("pytest"))
def test_pytest_block_passes_and_fails_when_broken(block, tmp_path):
    """The snippet passes under pytest; the same snippet returning a bare string from
    ``tokenops_admit`` (the mistake the docs once made) fails, so the snippet tests something."""
    assert "Rejection(" in block.code, block.id
    broken = re.sub(r"return Rejection\(.*\)", 'return "refused"', block.code)
    assert broken != block.code
    (tmp_path / "test_doc_snippet.py").write_text(block.code)
    (tmp_path / "test_doc_snippet_broken.py").write_text(broken)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "test_doc_snippet.py",
            "test_doc_snippet_broken.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = out.stdout + out.stderr
    assert re.search(r"^PASSED test_doc_snippet\.py::", report, flags=re.M), report[-3000:]
    assert re.search(r"^FAILED test_doc_snippet_broken\.py::", report, flags=re.M), report[-3000:]


@pytest.mark.parametrize("block", _of_kind("config"))
def test_config_block_agrees_with_the_file_it_names(block):
    doc = tomllib.loads(block.code)
    named = re.match(r"#\s*(\S+\.toml)", block.code.splitlines()[0])
    assert named, f"{block.id}: a toml block must name the file it shows on its first line"
    real = tomllib.loads((ROOT / named.group(1)).read_text())

    def contained(part: object, whole: object, where: str) -> None:
        if isinstance(part, dict):
            assert isinstance(whole, dict), where
            for key, value in part.items():
                assert key in whole, f"{block.id}: {where}{key} is not in {named.group(1)}"
                contained(value, whole[key], f"{where}{key}.")
        else:
            assert part == whole, f"{block.id}: {where.rstrip('.')} is {part!r} in the docs, {whole!r} in the file"

    contained(doc, real, "")


# -- docs/configuration.md: every plugin block acts through a real `tokenops serve` ----------------

CONFIG_DOC = ROOT / "docs" / "configuration.md"
GROUP = re.compile(r"<!--\s*docs-test:\s*(serve|patch)\s+(\w+)\s*-->")


def _marked(kind: str) -> dict[str, list[Block]]:
    """Blocks of docs/configuration.md by group, for the ``<!-- docs-test: KIND GROUP -->`` above each."""
    lines = CONFIG_DOC.read_text().splitlines()
    out: dict[str, list[Block]] = {}
    for b in blocks(CONFIG_DOC):
        previous = next((lines[j] for j in range(b.line - 2, -1, -1) if lines[j].strip()), "")
        m = GROUP.search(previous)
        if m and m.group(1) == kind:
            out.setdefault(m.group(2), []).append(b)
    return out


def _sections(code: str) -> set[str]:
    return set(tomllib.loads(code).get("plugins", {}))


def test_every_block_of_the_reference_runs_or_says_why():
    served = {b.line for bs in _marked("serve").values() for b in bs}
    for b in blocks(CONFIG_DOC):
        if b.language == "toml":
            assert b.line in served or b.is_skipped, f"{b.id}: mark it docs-test: serve GROUP, or skip (why)"
    documented = set().union(*(_sections(b.code) for b in blocks(CONFIG_DOC) if b.language == "toml"))
    from tokenops.plugin_sections import known_sections

    assert set(known_sections()) - {"blocklist", "history_proposer"} <= documented  # every built-in section
    checked = set().union(*(_sections(b.code) for bs in _marked("serve").values() for b in bs))
    assert checked <= set(CHECKS), f"no check for {checked - set(CHECKS)}"


def _chat(client, model: str, text: str, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=kw.pop("max_tokens", 4),
        temperature=0,
        **kw,
    )


def _rows(srv) -> list[dict]:
    import httpx

    return httpx.get(f"{srv.url}/admin/requests?limit=500", headers=srv.admin_headers).json()["requests"]


def _stats(srv) -> dict:
    import httpx

    return httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers).json()


def _check_router(srv, client) -> None:
    _chat(client, "auto", "prove the theorem about prime numbers")
    _chat(client, "auto", "say hello to my friend")
    hard, easy = _rows(srv)[1], _rows(srv)[0]
    assert hard["router"] == easy["router"] == "threshold", (hard, easy)
    assert (hard["model_served"], easy["model_served"]) == ("tokenops-ladder-large", "tokenops-ladder-small")


def _check_cascade(srv, client) -> None:
    _chat(client, "cascade", "What is 2 + 2?")
    row = _rows(srv)[0]
    steps = row["decisions"]["cascade"]["steps"]
    assert steps and steps[0]["model"] == "tokenops-ladder-small", row


def _check_ensemble(srv, client) -> None:
    _chat(client, "ensemble:best_of_n", "Name a colour.")
    assert _rows(srv)[0]["ensemble_members"] == ["tokenops-ladder-small", "tokenops-ladder-large"]


def _check_cache(srv, client) -> None:
    for _ in range(2):
        _chat(client, "tokenops-demo", "a question asked twice")
    assert [r["cache_hit"] for r in _rows(srv)[:2]] == [True, False]


def _check_replicas(srv, client) -> None:
    for _ in range(2):  # remote fails: the chain answers, and the breaker counts
        assert _chat(client, "remote", "hello").choices[0].message.content is not None
    assert [r["model_served"] for r in _rows(srv)[:2]] == ["chat", "chat"]
    assert _stats(srv)["breakers"]["remote#0"] == "open"
    for _ in range(3):
        _chat(client, "chat", "hi", user="alice")
    assert len({r["replica"] for r in _rows(srv)[:3]}) == 1  # sticky: one session, one replica
    for i in range(10):
        _chat(client, "chat", "hi", user=f"user-{i}")
    assert {r["replica"] for r in _rows(srv)[:10]} == {"chat#0", "chat#1"}


def _check_rate_limit(srv, client) -> None:
    import httpx

    body = {"model": "tokenops-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    statuses = [httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60) for _ in range(3)]
    assert statuses[0].status_code == 200 and [r.status_code for r in statuses[1:]] == [429, 429]
    assert float(statuses[1].headers["retry-after"]) > 0


def _check_engine(srv, client) -> None:
    _chat(client, "tokenops-demo", "word " * 150, max_tokens=8)
    engine = _stats(srv)["engines"]["tokenops-demo#0"]
    assert len(engine["spec_decode"]["accepted_per_position"]) == 3  # num_tokens (default 4)
    assert engine["kv_policy_evicted_blocks"] > 0  # the window dropped the long prompt's middle


def _check_reasoning(srv, client) -> None:
    r = _chat(client, "tokenops-reasoning-small", "What is 17 + 25?", max_tokens=300, reasoning_effort="low")
    # the block's low budget (6; the default 16 gave 18 here), plus the tokens that close the thinking block
    assert r.usage.completion_tokens_details.reasoning_tokens <= 6 + 3


def _check_images(srv, client) -> None:
    image = client.images.generate(model="digits-diffusion", prompt="3", response_format="b64_json")
    plan = image.model_extra["tokenops"]
    assert (plan["sampler"], plan["steps"]) == ("ddim", 20), plan  # the block's, not the model's defaults
    assert plan["cache_threshold"] == 0.1, plan


CHECKS = {
    "quantization": engine_checks.check_quantization,
    "kv_offload": engine_checks.check_kv_offload,
    "compile": engine_checks.check_compile,
    "session_memory": engine_checks.check_session_memory,
    "eplb": engine_checks.check_eplb,
    "distill_capture": engine_checks.check_distill_capture,
    "keys": engine_checks.check_keys,
    "router": _check_router,
    "cascade": _check_cascade,
    "validators": _check_cascade,
    "ensemble": _check_ensemble,
    "semantic_cache": _check_cache,
    "fallback": _check_replicas,
    "load_balance": _check_replicas,
    "circuit_breaker": _check_replicas,
    "rate_limit": _check_rate_limit,
    "speculative": _check_engine,
    "kv_policy": _check_engine,
    "reasoning_budget": _check_reasoning,
    "diffusion_sampler": _check_images,
    "step_cache": _check_images,
}


#: What a block needs besides the folder: ``[plugins.keys]`` a Redis (its URL rewritten to a throwaway one).
SETUPS = {"keys": engine_checks.block_redis}
#: Groups whose serve must be slow: torch.compile of the first request's model takes minutes on CPU.
SLOW_GROUPS = {"compile"}


def _prepare(workdir: Path) -> None:
    """What the blocks expect of the folder they run in: the repository's models, and a win
    predictor (`tokenops route train` writes one from recorded traffic; a tiny one here)."""
    from tokenops_plugins.multi_model._text_model import Logistic

    (workdir / "tokenops").symlink_to(ROOT / "tokenops")
    (workdir / "profiles" / "routers").mkdir(parents=True)
    Logistic().fit(
        ["prove the theorem", "prove this lemma about primes", "say hello", "hello my friend"], [1.0, 1.0, 0.0, 0.0]
    ).save(workdir / "profiles" / "routers" / "win_predictor.json")


@pytest.mark.parametrize(
    "group", [pytest.param(g, marks=[pytest.mark.slow] if g in SLOW_GROUPS else []) for g in sorted(_marked("serve"))]
)
def test_reference_blocks_act_through_serve(group, tmp_path):
    import contextlib

    import httpx
    import openai
    from tokenops.testing_serve import ServeProcess

    found = _marked("serve")[group]
    _prepare(tmp_path)
    config = "\n".join(b.code for b in found)
    # keys last: once a managed key exists, every request needs one
    sections = sorted(set().union(*(_sections(b.code) for b in found)), key=lambda s: (s == "keys", s))
    missing: dict[str, str] = {}  # section -> why its block could not be served here
    with contextlib.ExitStack() as stack:
        for section in [s for s in sections if s in SETUPS]:
            try:
                config = stack.enter_context(SETUPS[section](config, tmp_path))
            except engine_checks.Unavailable as e:  # serve the group without that block
                missing[section] = str(e)
                config = "\n".join(b.code for b in found if section not in _sections(b.code))
        srv = stack.enter_context(ServeProcess(tmp_path, config=config))
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        done = set()
        for section in [s for s in sections if s not in missing]:
            if CHECKS[section] not in done:
                CHECKS[section](srv, client)
                done.add(CHECKS[section])
        for patch in _marked("patch").get(group, []):
            import json

            body = json.loads(patch.code)
            r = httpx.patch(f"{srv.url}/admin/tunables", json=body, headers=srv.admin_headers)
            assert r.status_code == 200, r.text
            live = {
                t["name"]: t["value"]
                for t in httpx.get(f"{srv.url}/admin/tunables", headers=srv.admin_headers).json()["tunables"]
            }
            assert {k: live[k] for k in body["values"]} == body["values"]
    if missing:
        pytest.skip(f"checked all but {', '.join(missing)}: {'; '.join(missing.values())}")
