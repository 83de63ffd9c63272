"""One file name, one meaning: a module basename used twice in ``tokenops/`` and ``tokenops_plugins/``
must be on :data:`SHARED_NAMES` with the reason the folders keep the two apart (issue 41 item 5).

A newcomer who reads ``lora.py`` in one folder and ``lora.py`` in another assumes the two are one
thing seen twice; when they are not (the LoRA weights in the engine, the LoRA backend), one of them
gets a name that says what it holds. Names are shared on purpose in four cases: a conventional
per-package module (``config``, ``errors``, ``registry``, ``runner``, ``app``, ``base``), a CLI
command module named after its command (``tokenops/cli/<command>.py``), a dashboard screen named
after what it shows (``tokenops/tui/screens/<what>.py``), and a built-in plugin named after its
entry point whose mechanism lives in the core under the same name (``step_cache``, ``workloads``).

The list is exact in both directions, as ``tests/test_code_size.py``'s: a new file with a listed
name fails as surely as a new name does, and a listed name no longer shared must leave the list.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_TREES = ("tokenops", "tokenops_plugins")

_CLI = "the CLI command module, named after its command (tokenops/cli/<command>.py)"
_SCREEN = "a dashboard screen, named after what it shows (tokenops/tui/screens/<what>.py)"
_PLUGIN = "a built-in plugin named after its entry point; the mechanism it drives lives in the core"

#: basename -> (every path that carries it, why the folders keep them apart).
SHARED_NAMES: dict[str, tuple[frozenset[str], str]] = {
    "app.py": (
        frozenset({"tokenops/gateway/app.py", "tokenops/tui/app.py"}),
        "each surface's application object: the FastAPI app, the Textual app",
    ),
    "base.py": (
        frozenset({"tokenops/backends/base.py", "tokenops/tui/screens/base.py"}),
        "the base class of its folder: the Backend protocol, the dashboard's base screen",
    ),
    "config.py": (
        frozenset({"tokenops/config.py", "tokenops/engine/core/config.py", "tokenops/ratelimit/config.py"}),
        "the settings of its package: tokenops.toml, the EngineConfig, [plugins.rate_limit]",
    ),
    "engine.py": (
        frozenset({"tokenops/engine/core/engine.py", "tokenops/tui/screens/engine.py"}),
        "the LLMEngine in its package; " + _SCREEN,
    ),
    "engine_profile.py": (
        frozenset({"tokenops/tune/engine_profile.py", "tokenops/cli/engine_profile.py"}),
        "one concept, tuned engine profiles: loading one at serve start (tune/); " + _CLI,
    ),
    "errors.py": (
        frozenset(
            {"tokenops/errors.py", "tokenops/gateway/errors.py", "tokenops/store/errors.py", "tokenops/tune/errors.py"}
        ),
        "each package's error types (the shared API errors at the bottom, the gateway's names for them)",
    ),
    "lora.py": (
        frozenset({"tokenops/backends/lora.py", "tokenops/cli/lora.py"}),
        "the LoRA backend (backends/<kind>.py is the <kind> backend); " + _CLI,
    ),
    "models.py": (
        frozenset({"tokenops/cli/models.py", "tokenops/keys/models.py", "tokenops/tui/screens/models.py"}),
        "served models in each: " + _CLI + "; the model names a key may use; " + _SCREEN,
    ),
    "moe.py": (
        frozenset({"tokenops/engine/models/moe.py", "tokenops/cli/moe.py"}),
        "the mixture-of-experts layer among the engine's model architectures; " + _CLI,
    ),
    "records.py": (
        frozenset({"tokenops/gateway/observability/records.py", "tokenops/keys/records.py"}),
        "the records of its package: a finished request's (gateway), a key's and a tenant's (keys)",
    ),
    "registry.py": (
        frozenset({"tokenops/backends/registry.py", "tokenops/keys/registry.py"}),
        "the registry of its package's things: backend kinds and replicas, managed keys and tenants",
    ),
    "report.py": (
        frozenset({"tokenops/bench/report.py", "tokenops/cli/report.py"}),
        "a benchmark's printed result (bench/); " + _CLI + " (tokenops report: store queries)",
    ),
    "runner.py": (
        frozenset({"tokenops/bench/runner.py", "tokenops/tune/runner.py"}),
        "one run of its package: a benchmark sweep, a tuning session",
    ),
    "step_cache.py": (
        frozenset({"tokenops/diffusion/step_cache.py", "tokenops_plugins/model_optimization/step_cache.py"}),
        _PLUGIN + " (the UNet step cache in tokenops/diffusion/)",
    ),
    "workloads.py": (
        frozenset({"tokenops/bench/workloads.py", "tokenops_plugins/compute_model/workloads.py"}),
        _PLUGIN + " (the workload registry in tokenops/bench/)",
    ),
}


def shared_basenames(root: Path = ROOT) -> dict[str, set[str]]:
    """basename -> paths, for every module basename (``__init__.py`` aside) used more than once."""
    found: dict[str, set[str]] = defaultdict(set)
    for tree in SOURCE_TREES:
        for path in (root / tree).rglob("*.py"):
            if path.name != "__init__.py":
                found[path.name].add(path.relative_to(root).as_posix())
    return {name: paths for name, paths in found.items() if len(paths) > 1}


def unexplained(found: dict[str, set[str]]) -> list[str]:
    """One line per shared name whose paths differ from :data:`SHARED_NAMES` (new, grown or gone)."""
    problems = []
    for name in sorted(set(found) | set(SHARED_NAMES)):
        listed = set(SHARED_NAMES[name][0]) if name in SHARED_NAMES else set()
        paths = found.get(name, set())
        if paths == listed:
            continue
        if not listed:
            problems.append(f"{name} is used by {sorted(paths)}: give one a name that says what it holds")
        elif len(paths) < 2:
            problems.append(f"{name} is no longer shared ({sorted(paths)}): remove it from SHARED_NAMES")
        else:
            problems.append(
                f"{name}: listed {sorted(listed)}, found {sorted(paths)}: rename the new one "
                "or, if the folder makes its meaning plain, list it with the reason"
            )
    return problems


def test_every_shared_module_name_is_listed_with_its_reason():
    problems = unexplained(shared_basenames())
    assert not problems, "\n".join(problems)


def test_every_listed_reason_is_written_out():
    for name, (paths, reason) in SHARED_NAMES.items():
        assert len(paths) >= 2 and all(p.endswith("/" + name) for p in paths), name
        assert len(reason) > 20, name


def test_the_check_sees_a_new_duplicate_and_a_stale_entry(tmp_path):
    for rel in (
        "tokenops/gateway/app.py",
        "tokenops/tui/app.py",
        "tokenops/engine/lora.py",
        "tokenops/backends/lora.py",
        "tokenops/cli/lora.py",
        "tokenops_plugins/x/local.py",
        "tokenops/backends/local.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    problems = unexplained(shared_basenames(tmp_path))
    text = "\n".join(problems)
    assert "local.py is used by" in text  # a name nobody listed
    assert "lora.py: listed" in text and "tokenops/engine/lora.py" in text  # a third file with a listed name
    assert "config.py is no longer shared" in text  # listed here, absent from the tree
    assert not any(p.startswith("app.py") for p in problems)  # exactly as listed
