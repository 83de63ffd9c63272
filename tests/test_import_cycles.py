"""No import cycles among tokenops modules (the core and the built-in plugins).

The graph is read with ``ast`` from the source files, so a cycle is found even when Python
would tolerate it at run time. Module-level imports, including those under ``if TYPE_CHECKING``,
must form no cycle at all: a type a module needs from a module that imports it is declared
as a ``Protocol`` where it is used (``engine.sampling.SamplingRow``,
``gateway.multi_model.ModelCaller``). Imports deferred into a function body are tolerated
only in the cycles listed in ``DEFERRED_CYCLES``, each with its reason; a new one fails.
``tokenops.hookspecs`` names the types of the plugin contract under ``TYPE_CHECKING`` (as
pytest's hookspec.py does); many of those modules call hooks through ``tokenops.plugin_manager`` in
function bodies, so those edges are left out of the deferred graph only (``TYPE_ONLY_CONTRACT``):
they never run, and the module-level check still counts them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"tokenops": ROOT / "tokenops", "tokenops_plugins": ROOT / "tokenops_plugins"}

#: Cycles closed only by function-local imports, which run after both modules are loaded.
DEFERRED_CYCLES = {
    # admin_key hashes with auth's helpers; auth.resolve_admin_key is a shim that defers to admin_key
    frozenset({"tokenops.gateway.admin.admin_key", "tokenops.gateway.auth"}),
    # capture registers the distill CLI in tokenops_register_commands; the CLI parses capture's config
    frozenset({"tokenops_plugins.distill.capture", "tokenops_plugins.distill._cli"}),
}

#: Modules whose ``if TYPE_CHECKING`` imports are left out of the deferred graph (see above).
TYPE_ONLY_CONTRACT = {"tokenops.hookspecs"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, base in PACKAGES.items():
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


def imported_modules(node: ast.AST, package: str, known: set[str]) -> list[str]:
    """The modules of ``known`` that one import statement ``node`` (in ``package``) loads; [] for any
    other node. ``from a import b`` counts ``a.b`` when that is a module, else ``a``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = []
    for alias in node.names:
        full = f"{target}.{alias.name}"
        if full in known:
            out.append(full)
        elif target in known:
            out.append(target)
    return out


def _imports(module: str, path: Path, known: set[str], deferred: bool) -> set[str]:
    """Modules of ``known`` that ``module`` imports: module level (TYPE_CHECKING blocks included)
    and, with ``deferred``, inside functions too."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not deferred:
                continue
            if deferred and module in TYPE_ONLY_CONTRACT and isinstance(child, ast.If) and _is_type_checking(child):
                continue
            found.update(imported_modules(child, package, known))
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    # importing one's own package (or a parent) is loading order, not a cycle
    return {m for m in found if m != module and not module.startswith(m + ".")}


def _cycles(deferred: bool) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    modules = _modules()
    graph = {m: _imports(m, p, set(modules), deferred) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(frozenset(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_module_level_imports_have_no_cycle():
    cycles = _cycles(deferred=False)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_deferred_import_cycles_are_only_the_listed_ones():
    cycles = _cycles(deferred=True)
    new = cycles - DEFERRED_CYCLES
    assert not new, "new import cycles (through function-local imports): " + "; ".join(
        " <-> ".join(sorted(c)) for c in new
    )
    gone = DEFERRED_CYCLES - cycles
    assert not gone, "listed cycles no longer exist; remove them from DEFERRED_CYCLES: " + str(
        [sorted(c) for c in gone]
    )


def test_the_checker_finds_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("from pkg import a\n")
    monkeypatch.setitem(PACKAGES, "pkg", pkg)
    for name in ("tokenops", "tokenops_plugins"):
        monkeypatch.delitem(PACKAGES, name)
    assert _cycles(deferred=False) == {frozenset({"pkg.a", "pkg.b"})}


@pytest.mark.parametrize(
    "module",
    [
        "tokenops.engine.sampling.sampling",
        "tokenops.engine.core.sequence",
        "tokenops.gateway.core.pipeline",
        "tokenops.gateway.core.multi_model",
    ],
)
def test_formerly_cyclic_modules_import_alone(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
