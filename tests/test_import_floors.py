"""No arrow back up: a module imports only from its own floor or the floors below it.

The floors, bottom to top (docs/architecture.md draws them):

0. ``contract`` — the vocabulary every part shares: ``tokenops.types``, ``errors``, ``hookspecs``,
   ``tunables``, ``slo``, ``blocking``, Prometheus text helpers.
1. ``engine`` — the bundled engine and the other model code (diffusion, training).
2. ``config`` — ``tokenops.toml`` and ``Settings``.
3. ``services`` — mechanisms the gateway and plugins share: store, routing, rate limits,
   resilience, semantic cache, session memory, managed keys.
4. ``backends`` — the Backend protocol and its kinds.
5. ``bench`` — the load generator.
6. ``plugin manager`` — ``tokenops.plugin_manager`` and the modules that collect hooks for a lower floor
   (``policy_hooks``, ``plugin_sections``). Nothing below calls it: hooks a lower floor needs
   are passed in by the caller.
7. ``tune`` — the tuner (calls the plugin manager for tunables and launchers).
8. ``plugins`` — the built-in technique plugins (``tokenops_plugins``).
9. ``gateway`` — the FastAPI app, request pipeline, admin API.
10. ``surfaces`` — the CLI, the dashboard and the test kits.

Both module-level and function-level imports count (a deferred import is still an arrow),
read from the source with ``ast``. ``if TYPE_CHECKING`` imports in ``tokenops.hookspecs`` are
left out: the contract names the types its hooks carry without importing them at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import PACKAGES, _is_type_checking, _modules, imported_modules

FLOORS = ("contract", "engine", "config", "services", "backends", "bench", "plugin manager", "tune", "plugins",
          "gateway", "surfaces")

#: Module prefix -> floor; the longest matching prefix wins.
FLOOR_OF = {
    "tokenops": "contract",  # the package itself: ``hookimpl`` and the version
    "tokenops.types": "contract",
    "tokenops.type_reference": "contract",
    "tokenops.json_types": "contract",  # JSON Schema's integers for pydantic fields (request schemas, the sampling registry)
    "tokenops.sampling_fields": "contract",  # the sampling-field registry: schema, typed field, table row, cache key
    "tokenops.decision_keys": "contract",  # the declared decision keys: the core's and the plugins'
    "tokenops.errors": "contract",
    "tokenops.hookspecs": "contract",
    "tokenops.tunables": "contract",
    "tokenops.slo": "contract",
    "tokenops.blocking": "contract",
    "tokenops.prometheus_text": "contract",
    "tokenops.trace_context": "contract",
    # typer option aliases only: the CLI vocabulary plugin commands share with the core commands
    "tokenops.cli.options": "contract",
    "tokenops.engine": "engine",
    "tokenops.diffusion": "engine",
    "tokenops.training": "engine",
    "tokenops.demo_models": "engine",
    "tokenops.config": "config",
    "tokenops.store": "services",
    "tokenops.routing": "services",
    "tokenops.ratelimit": "services",
    "tokenops.resilience": "services",
    "tokenops.semcache": "services",
    "tokenops.memory": "services",
    "tokenops.keys": "services",
    "tokenops.shared_state": "services",  # the shared-state seam (stored responses in PostgreSQL)
    "tokenops.backends": "backends",
    "tokenops.bench": "bench",
    "tokenops.plugin_manager": "plugin manager",
    "tokenops.plugin_sets": "plugin manager",  # one gateway's own plugin instances
    "tokenops.plugin_sections": "plugin manager",
    "tokenops.policy_hooks": "plugin manager",
    "tokenops.diffusion.plan": "plugin manager",  # the diffusion plan's hook, as policy_hooks is the engine's
    "tokenops.tune": "tune",
    "tokenops_plugins": "plugins",
    "tokenops.gateway": "gateway",
    "tokenops.cli": "surfaces",
    "tokenops.tui": "surfaces",
    "tokenops.testing": "surfaces",
    "tokenops.testing_gateway": "surfaces",
    "tokenops.testing_serve": "surfaces",
    "tokenops.testing_postgres": "surfaces",
    "tokenops.__main__": "surfaces",
}

#: Modules whose ``if TYPE_CHECKING`` imports do not count (see the module docstring).
TYPE_ONLY_CONTRACT = {"tokenops.hookspecs"}


def floor_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        floor = FLOOR_OF.get(".".join(parts[:n]))
        if floor is not None:
            return FLOORS.index(floor)
    raise AssertionError(f"{module} has no floor: add its package to FLOOR_OF")


def _targets(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import of ``known`` in ``module``, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module in TYPE_ONLY_CONTRACT and isinstance(child, ast.If) and _is_type_checking(child):
                continue
            out.extend((m, getattr(child, "lineno", 0)) for m in imported_modules(child, package, known))
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def arrows_up() -> list[str]:
    modules = _modules()
    known = set(modules)
    found = []
    for module, path in sorted(modules.items()):
        low = floor_of(module)
        for target, line in _targets(module, path, known):
            high = floor_of(target)
            if high > low:
                found.append(f"{path.relative_to(path.parents[len(module.split('.')) - 1])}:{line} "
                             f"({FLOORS[low]}) imports {target} ({FLOORS[high]})")
    return found


def test_every_module_has_a_floor():
    for module in _modules():
        floor_of(module)


def test_no_import_of_a_higher_floor():
    found = arrows_up()
    assert not found, f"{len(found)} arrows back up:\n" + "\n".join(found)


def test_the_checker_finds_a_deferred_arrow_up(tmp_path, monkeypatch):
    pkg = tmp_path / "tokenops"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "gateway").mkdir()
    for init in (pkg / "__init__.py", pkg / "engine" / "__init__.py", pkg / "gateway" / "__init__.py"):
        init.write_text("")
    (pkg / "gateway" / "app.py").write_text("from tokenops.engine import step\n")
    (pkg / "engine" / "step.py").write_text("def run():\n    from tokenops.gateway import app\n")
    monkeypatch.setitem(PACKAGES, "tokenops", pkg)
    monkeypatch.delitem(PACKAGES, "tokenops_plugins")
    found = arrows_up()
    assert len(found) == 1 and "imports tokenops.gateway.app (gateway)" in found[0], found
