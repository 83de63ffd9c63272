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
        out.append(Block(path.name, start + 1, fence.group(2).lower(), "\n".join(lines[start + 1:end]) + "\n",
                         bool(SKIP.search(previous))))
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
    assert block.kind != "unknown", (f"{block.id}: a {block.language} block that is neither a plugin, a pytest "
                                     "module nor a config file; mark it <!-- docs-test: skip (why) --> or make it run")


def _load_plugin(block: Block) -> types.ModuleType:
    module = types.ModuleType(f"docs_plugin_{block.doc.replace('.', '_')}_{block.line}")
    exec(compile(block.code, block.id, "exec"), module.__dict__)
    return module


def _request(text: str, model: str = "m"):
    from tokenops.types import GatewayRequest

    return GatewayRequest(kind="chat", model=model, body={}, messages=[{"role": "user", "content": text}])


@pytest.mark.parametrize("block", _of_kind("plugin"))
def test_plugin_block_registers_and_its_hooks_act(block, register_plugin):
    from tokenops.gateway import hooks
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
        from tokenops.engine.config import EngineConfig
        from tokenops.engine.protocols import Proposer
        from tokenops.engine.sampling import SamplingParams
        from tokenops.engine.sequence import Sequence
        from tokenops.engine_policies import configure_engine, proposers, schedule_orders

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
        return {n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name.startswith("tokenops_")}

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
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                          "-o", "asyncio_mode=auto", "test_doc_snippet.py", "test_doc_snippet_broken.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
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
