"""No function in ``tokenops/`` or ``tokenops_plugins/`` is over 80 lines and no file over 400 lines: a
longer one is asking to be split (docs/architecture.md). ``hookspecs.py`` is the one contract
file (as pytest's ``hookspec.py``); the C sources are in ``engine/csrc``, not Python.

``KNOWN_LONG`` lists the engine code that is still over, with its size when it was listed: the
lead shrinks it. A listed one that grows fails, one that gets under its limit must leave the
list, and nothing new may join it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 400
EXEMPT_FILES = {"tokenops/hookspecs.py"}

#: "path" (a file) or "path:function" -> its length in lines when it was listed.
KNOWN_LONG: dict[str, int] = {}


def too_long(root: Path = ROOT) -> dict[str, int]:
    out: dict[str, int] = {}
    for base in ("tokenops", "tokenops_plugins"):
        for path in sorted((root / base).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in EXEMPT_FILES:
                continue
            text = path.read_text()
            num_lines = len(text.splitlines())
            if num_lines > MAX_FILE_LINES:
                out[rel] = num_lines
            for node in ast.walk(ast.parse(text, rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        out[f"{rel}:{node.name}"] = length
    return out


def test_no_long_function_or_file_beyond_the_known_list():
    found = too_long()
    new = {k: v for k, v in found.items() if k not in KNOWN_LONG}
    assert not new, (f"over {MAX_FUNCTION_LINES} lines a function / {MAX_FILE_LINES} a file, split it: "
                     + ", ".join(f"{k} ({v})" for k, v in sorted(new.items())))
    grown = {k: v for k, v in found.items() if k in KNOWN_LONG and v > KNOWN_LONG[k]}
    assert not grown, "known long code grew: " + ", ".join(f"{k} ({KNOWN_LONG[k]} -> {v})" for k, v in grown.items())
    fixed = sorted(set(KNOWN_LONG) - set(found))
    assert not fixed, f"now within the limits, remove from KNOWN_LONG: {fixed}"


def test_the_checker_sees_a_long_function(tmp_path):
    (tmp_path / "tokenops").mkdir()
    (tmp_path / "tokenops_plugins").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "tokenops" / "long.py").write_text(f"def f():\n{body}\n")
    assert too_long(tmp_path) == {"tokenops/long.py:f": MAX_FUNCTION_LINES + 1}
