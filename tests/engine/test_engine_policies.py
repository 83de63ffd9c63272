"""The engine stands alone: it takes its policies as constructor arguments (built-ins by
default), never consults the plugin manager, and selects queue orders and proposers by name.
``tokenops serve`` collects plugin-provided policies once, at build time, and a server with
``TOKENOPS_LOAD_PLUGINS=""`` still answers through the openai SDK."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tokenops.engine.core.config import EngineConfig
from tokenops.engine.core.engine import LLMEngine
from tokenops.engine.core.policies import BUILTIN_SCHEDULE_ORDERS, EnginePolicies
from tokenops.engine.core.protocols import KVPolicy, Proposal, Proposer, ScheduleOrder
from tokenops.engine.sampling.sampling import SamplingParams

ENGINE_DIR = Path(__file__).resolve().parents[2] / "tokenops" / "engine"


def _config(model_dir, **overrides) -> EngineConfig:
    values = dict(model=str(model_dir), device="cpu", block_size=4, kv_cache_tokens=512,
                  max_num_batched_tokens=32, max_num_seqs=8, torch_threads=1)
    return EngineConfig(**{**values, **overrides})


def _greedy(engine, prompts, max_tokens=16):
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [o.outputs[0].token_ids for o in outs]


PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [3, 4]]


def test_no_engine_module_imports_the_plugin_machinery():
    for path in sorted(ENGINE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad = [n for n in names if n.split(".")[:2] == ["tokenops", "plugins"] or n.startswith("tokenops_plugins")]
            assert not bad, f"{path.name} imports {bad}"


def test_engine_with_every_builtin_runs_with_the_plugin_manager_unimportable(tiny_llama_dir, monkeypatch):
    """nano-vllm style: LLMEngine + Scheduler + BlockManager, no plugin manager at all."""
    monkeypatch.setitem(sys.modules, "tokenops.plugin_manager", None)  # any import of it raises ImportError
    monkeypatch.setitem(sys.modules, "tokenops_plugins", None)
    with pytest.raises(ImportError):
        import tokenops.plugin_manager  # noqa: F401
    plain = _greedy(LLMEngine(_config(tiny_llama_dir)), PROMPTS)
    engine = LLMEngine(_config(tiny_llama_dir, schedule_policy="priority", speculative="ngram",
                               kv_sink_tokens=4, kv_window_tokens=32, max_model_len=128))
    assert isinstance(engine.kv_policy, KVPolicy) and isinstance(engine.spec_decoder.proposer, Proposer)
    assert _greedy(engine, PROMPTS) == plain  # window 32 > prompt + 16 tokens: nothing evicted yet
    assert engine.stats()["spec_decode"]["num_drafts"] > 0
    engine.apply_tunables({"schedule_policy": "fcfs"})
    assert engine.config.schedule_policy == "fcfs"


class EchoLast:
    """A proposer of the test's own: the last token, repeated (declares every Proposer member)."""

    vocab_size = None

    def __init__(self):
        self.calls = {"propose": 0, "on_verified": 0, "retain": 0}

    def propose(self, seqs, num_tokens):
        self.calls["propose"] += 1
        return [Proposal([s.token_ids[-1]] * k) for s, k in zip(seqs, num_tokens)]

    def on_verified(self, seq, num_proposed, num_accepted):
        self.calls["on_verified"] += 1

    def release(self, seq):
        pass

    def retain(self, seq_ids):
        self.calls["retain"] += 1


def shortest_first(waiting):
    return sorted(waiting, key=lambda s: (len(s.token_ids), s.arrival_time))


def test_policies_given_to_the_constructor_are_the_ones_used(tiny_llama_dir):
    echo = EchoLast()
    assert isinstance(echo, Proposer) and isinstance(shortest_first, ScheduleOrder)
    policies = EnginePolicies(schedule_orders={**BUILTIN_SCHEDULE_ORDERS, "sjf": shortest_first},
                              proposers={"echo": lambda config: echo})
    plain = _greedy(LLMEngine(_config(tiny_llama_dir)), PROMPTS)
    engine = LLMEngine(_config(tiny_llama_dir, schedule_policy="sjf", speculative="echo", max_num_seqs=1,
                               max_num_batched_tokens=64), policies=policies)
    assert engine.spec_decoder.proposer is echo
    # one sequence at a time: sjf admits the shortest prompt first
    ids = [f"r{i}" for i in range(3)]
    for rid, prompt in zip(ids, PROMPTS):
        engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=16))
    finished = []
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished.append(out.request_id)
                outs[out.request_id] = out.outputs[0].token_ids
    assert finished == ["r2", "r0", "r1"]  # prompt lengths 2, 7, 10
    assert [outs[i] for i in ids] == plain  # speculation never changes greedy output
    assert echo.calls["propose"] > 0 and echo.calls["on_verified"] > 0


def test_unknown_names_are_refused_with_the_available_ones(tiny_llama_dir):
    from tokenops.tunables import TunableError

    with pytest.raises(ValueError, match=r"schedule_policy 'sjf' is unknown; available: fcfs, priority"):
        LLMEngine(_config(tiny_llama_dir, schedule_policy="sjf"))
    engine = LLMEngine(_config(tiny_llama_dir))
    with pytest.raises(TunableError, match="available: fcfs, priority"):
        engine.apply_tunables({"schedule_policy": "sjf"})
    assert engine.config.schedule_policy == "fcfs"


def test_a_proposer_missing_a_member_is_refused_by_name(tiny_llama_dir):
    class Incomplete:
        vocab_size = None

        def propose(self, seqs, num_tokens):
            return []

    with pytest.raises(TypeError, match="lacks on_verified, release, retain"):
        LLMEngine(_config(tiny_llama_dir, speculative="x"), policies=EnginePolicies(proposers={"x": lambda c: Incomplete()}))


def test_serve_collects_plugin_policies_once(tiny_llama_dir, register_plugin):
    """The plugin side: orders and proposers registered through the hooks become selectable by
    name; the hooks run when the engine is built, not per step."""
    from tokenops import hookimpl
    from tokenops.policy_hooks import build_engine, configure_engine

    calls = []
    echo = EchoLast()

    class Provider:
        @hookimpl
        def tokenops_register_schedule_orders(self, register):
            calls.append("orders")
            register("sjf", shortest_first)

        @hookimpl
        def tokenops_register_proposers(self, register):
            calls.append("proposers")
            register("echo", lambda config: echo)

    register_plugin(Provider(), "test-engine-policies")
    with pytest.raises(ValueError, match=r"'nope' is not a known proposer; available: draft, echo, ngram"):
        configure_engine(_config(tiny_llama_dir, speculative="nope"))
    calls.clear()
    engine = build_engine(_config(tiny_llama_dir, schedule_policy="sjf", speculative="echo"))
    assert engine.spec_decoder.proposer is echo and engine.scheduler.schedule_orders["sjf"] is shortest_first
    num_calls = len(calls)
    _greedy(engine, PROMPTS, max_tokens=4)
    assert len(calls) == num_calls  # nothing per step
    engine.apply_tunables({"schedule_policy": "priority"})
    engine.apply_tunables({"schedule_policy": "sjf"})

    class Twice:
        @hookimpl
        def tokenops_register_schedule_orders(self, register):
            register("sjf", shortest_first)

    register_plugin(Twice(), "test-engine-policies-twice")
    with pytest.raises(Exception, match="'sjf' is registered twice"):
        configure_engine(_config(tiny_llama_dir, schedule_policy="sjf"))


def test_serve_without_plugins_answers_with_builtin_engine_policies(tmp_path):
    """TOKENOPS_LOAD_PLUGINS="" loads no technique plugin: the default plugins (backends, routing
    by name, round robin) still load and the engine runs priority order and n-gram speculation
    from its built-ins."""
    import httpx
    import openai

    from tokenops.testing_serve import ServeProcess

    config = ('[engine]\nschedule_policy = "priority"\n\n'
              '[[models]]\nname = "tokenops-demo"\nbackend = "local"\nengine = { speculative = "ngram" }\n')
    with ServeProcess(tmp_path, config=config, env={"TOKENOPS_LOAD_PLUGINS": ""}) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        r = client.chat.completions.create(model="tokenops-demo", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Say hello."}])
        assert r.choices[0].message.content and r.usage.completion_tokens > 0
        stats = httpx.get(f"{srv.url}/admin/stats", headers=srv.admin_headers, timeout=10).json()
        tunables = httpx.get(f"{srv.url}/admin/tunables", headers=srv.admin_headers, timeout=10).json()
    engine = stats["engines"]["tokenops-demo#0"]
    assert "spec_decode" in engine and engine["total_generation_tokens"] == r.usage.completion_tokens
    assert "engine.schedule_policy" in {t["name"] for t in tunables["tunables"]}  # the engine declares its own tunables
