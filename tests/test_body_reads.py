"""Backends and plugins read a request's sampling and output fields from its typed records
(``request.sampling``, ``request.output``), never from the body dict: the schema lifts them once,
with whether the client sent each, and the body is left for the schema and for upstreams that get
it forwarded unchanged.

Read with ``ast``, in ``tokenops/backends/``, ``tokenops/gateway/`` and the plugins: ``body["temperature"]``,
``body.get("logprobs")`` / ``.pop`` / ``.setdefault``, and ``"echo" in body``, where the dict is
``….body``, a name ``body``, or a name bound to ``….body`` in the same file. Writing a field
(``body["max_tokens"] = …`` in the upstream's copy) is no read.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tokenops.request_fields import OUTPUT_NAMES, SAMPLING_NAMES

ROOT = Path(__file__).resolve().parents[1]
FIELD_NAMES = frozenset(SAMPLING_NAMES + OUTPUT_NAMES)

#: (file, field) -> why that file may read the field from a body dict.
ALLOWED: dict[tuple[str, str], str] = {
    # the upstream's payload is the client's body forwarded; the gateway replaces these in that copy
    ("tokenops/backends/openai_http.py", "max_tokens"): "pass-through: the copy gets the limit after defaults",
    ("tokenops/backends/openai_http.py", "max_completion_tokens"): "pass-through: folded into max_tokens",
    ("tokenops/backends/openai_http.py", "stream_options"): "pass-through: set for streams (usage), dropped otherwise",
    # the schema: what is checked (or translated) before the request and its typed fields exist
    **{
        ("tokenops/gateway/openai/structured.py", name): "schema: checks the structured-output fields of the body"
        for name in ("response_format", "tools", "tool_choice", "parallel_tool_calls")
    },
    **{
        ("tokenops/gateway/edge/schema_budget.py", name): "schema: the output a schema forces, against max_tokens"
        for name in ("response_format", "tools", "tool_choice")
    },
    (
        "tokenops/gateway/anthropic/messages_schema.py",
        "tools",
    ): "schema: translating an Anthropic body into the chat body",
    # a cache keys on the body as the client sent it: the logprobs the gateway added come out for the lookup
    ("tokenops/gateway/core/confidence.py", "logprobs"): "cache key: the client's body without the gateway's logprobs",
}


def _plugin_dirs() -> list[Path]:
    return [p for p in (ROOT / "plugins", ROOT / "tokenops_plugins") if p.is_dir()]


def _aliases(tree: ast.AST) -> set[str]:
    """Names bound to ``….body`` (``body = request.body``) anywhere in the file, and ``body``."""
    names = {"body"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "body":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_body(node: ast.AST, aliases: set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "body") or (
        isinstance(node, ast.Name) and node.id in aliases
    )


def _field(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and node.value in FIELD_NAMES:
        return str(node.value)
    return None


def body_reads(source: str, where: str) -> list[tuple[str, int, str]]:
    """(where, line, field) of each read of a sampling/output field from a body dict."""
    tree = ast.parse(source, where)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Store) and _is_body(node.value, aliases):
            name = _field(node.slice)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and _is_body(node.func.value, aliases)
            and node.args
        ):
            name = _field(node.args[0])
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and _is_body(node.comparators[0], aliases)
        ):
            name = _field(node.left)
        if name is not None:
            found.append((where, node.lineno, name))
    return found


def test_backends_and_plugins_read_typed_fields_not_the_body():
    files = sorted((ROOT / "tokenops" / "backends").rglob("*.py")) + sorted(
        (ROOT / "tokenops" / "gateway").rglob("*.py")
    )
    files += [p for d in _plugin_dirs() for p in sorted(d.rglob("*.py"))]
    assert len(files) > 40  # the walk sees both trees
    found = [
        f"{where}:{line}: {name}"
        for path in files
        for where, line, name in body_reads(path.read_text(), str(path.relative_to(ROOT)))
        if (where, name) not in ALLOWED
    ]
    assert not found, "read these from request.sampling / request.output, not the body:\n" + "\n".join(found)
    stale = sorted(f"{where}: {name}" for where, name in ALLOWED if not (ROOT / where).is_file())
    assert not stale, f"allow-listed files that are gone: {stale}"


def test_the_checker_sees_subscripts_gets_aliases_and_membership():
    source = (
        "def f(request, body):\n"
        "    b = request.body\n"
        "    x = request.body['temperature']\n"
        "    y = b.get('logprobs')\n"
        "    z = 'echo' in body\n"
        "    body['max_tokens'] = 3\n"  # a write: the upstream's copy
        "    w = request.body.get('input')\n"  # not a sampling/output field
        "    v = response.get('logprobs')\n"  # not a body
    )
    assert [(line, name) for _, line, name in body_reads(source, "x.py")] == [
        (3, "temperature"),
        (4, "logprobs"),
        (5, "echo"),
    ]
