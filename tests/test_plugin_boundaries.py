"""Plugins use the core through its public interface: no module under ``tokenops_plugins/`` reads or
writes an underscore attribute of an object it did not make (``health._breakers``,
``cache._evict()``, another plugin's ``_config``). What a plugin needs is a public method
(``ReplicaHealth.set_breaker_config``, ``SemanticCache.set_config``,
``rate_limit.set_key_overrides``) or a hook (``tokenops_request_finished``).

Read with ``ast``: ``X._name`` (one leading underscore) where ``X`` is not ``self``/``cls``, and
``getattr``/``setattr`` with such a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[1] / "tokenops_plugins"


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def private_reaches(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and _private(node.args[1].value)):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_plugin_touches_a_private_attribute_of_another_object():
    found = [hit for path in sorted(PLUGINS.rglob("*.py"))
             for hit in private_reaches(path.read_text(), str(path.relative_to(PLUGINS.parent)))]
    assert not found, "plugins reaching into private state:\n" + "\n".join(found)


def test_the_checker_sees_reads_calls_and_getattr():
    source = ("def f(health, cache):\n    health._breakers.clear()\n    cache._evict()\n"
              "    getattr(cache, '_lock')\n    self_ok = cache.__class__\n")
    assert {h.split(": ", 1)[1] for h in private_reaches(source, "x.py")} == {
        "health._breakers", "cache._evict", "getattr(cache, '_lock')"}
