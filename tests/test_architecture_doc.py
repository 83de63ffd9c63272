"""docs/architecture.md matches the code: the floors table is ``tests/test_import_floors.py``'s
map, and every name in the request-path drawing exists (issue 41: the drawing named
``_cache_lookup`` and ``_select_replica``, which no method was called).

The drawing's names are read by their shape: ``Class.member`` (a method or a field of a class
with that name), ``module.function`` (a top-level name of a module file with that name),
``tokenops_*`` (a hook in ``hookspecs.py``), ``path/file.py`` (a file), a bare CamelCase name (a
class) and any other bare snake_case name (a function, method or module somewhere). Plain words
are prose and are not checked.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from test_import_floors import FLOOR_OF, FLOORS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
SOURCE_TREES = ("tokenops", "tokenops_plugins")

_PATH = re.compile(r"[\w/]+\.py\b")
_HOOK = re.compile(r"\btokenops_\w+")
_MEMBER = re.compile(r"\b([A-Z]\w*)\.(\w+)")
_MODULE_NAME = re.compile(r"\b([a-z_]\w*)\.(\w+)")
_CLASS = re.compile(r"\b[A-Z]\w*\b")
_SNAKE = re.compile(r"\b_?[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b_[a-z][a-z0-9]*\b")


@dataclass
class CodeNames:
    """What the source trees define, by the shapes the drawing uses."""

    members: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # class -> members
    bases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # class -> base class names
    module_names: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # module -> top-level
    functions: set[str] = field(default_factory=set)  # every def, at any depth
    files: set[str] = field(default_factory=set)  # paths relative to the repository root
    hooks: set[str] = field(default_factory=set)


def _assigned(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


@cache
def code_names(root: Path = ROOT) -> CodeNames:
    names = CodeNames()
    for tree in SOURCE_TREES:
        for path in (root / tree).rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            names.files.add(rel)
            module = ast.parse(path.read_text(), rel)
            top = names.module_names[path.stem]
            for node in module.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    top.add(node.name)
                top.update(_assigned(node))
            for node in ast.walk(module):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.functions.add(node.name)
                elif isinstance(node, ast.ClassDef):
                    names.bases[node.name].update(b.id for b in node.bases if isinstance(b, ast.Name))
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                            names.members[node.name].add(item.name)
                        names.members[node.name].update(_assigned(item))
            if rel == "tokenops/hookspecs.py":
                names.hooks = {n.name for n in module.body if isinstance(n, ast.FunctionDef)}
    return names


def has_member(cls: str, member: str, names: CodeNames) -> bool:
    """``cls`` defines ``member`` or inherits it from a base class of the tree (a step a subclass runs)."""
    seen: set[str] = set()
    todo = [cls]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if member in names.members.get(current, set()):
            return True
        todo.extend(names.bases.get(current, ()))
    return False


def _file_exists(path: str, names: CodeNames) -> bool:
    return (
        path in names.files
        or f"tokenops/{path}" in names.files
        or any(f.endswith("/" + path) for f in names.files)
        or (ROOT / path).is_file()
    )


def missing_names(text: str, names: CodeNames) -> list[str]:
    """The names in ``text`` that the code does not define, one line each."""
    missing: list[str] = []
    for path in _PATH.findall(text):
        if not _file_exists(path, names):
            missing.append(f"file {path}")
    text = _PATH.sub(" ", text)
    for hook in _HOOK.findall(text):
        if hook not in names.hooks:
            missing.append(f"hook {hook}")
    text = _HOOK.sub(" ", text)
    for cls, member in _MEMBER.findall(text):
        if not has_member(cls, member, names):
            missing.append(f"member {cls}.{member}")
    text = _MEMBER.sub(" ", text)
    for module, name in _MODULE_NAME.findall(text):
        if name not in names.module_names.get(module, set()):
            missing.append(f"name {module}.{name}")
    text = _MODULE_NAME.sub(" ", text)
    for word in _CLASS.findall(text):
        is_camel = any(c.islower() for c in word) and sum(c.isupper() for c in word) >= 2
        if is_camel and word not in names.members and not any(word in top for top in names.module_names.values()):
            missing.append(f"class {word}")
    for word in _SNAKE.findall(text):
        if word not in names.functions and word not in names.module_names:
            missing.append(f"function or module {word}")
    return missing


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def request_path_drawing() -> str:
    section = _section("Request path (gateway)")
    return section.split("```text", 1)[1].split("```", 1)[0]


def test_every_name_in_the_request_path_drawing_exists():
    drawing = request_path_drawing()
    assert "Pipeline.respond" in drawing and "tokenops_route" in drawing  # the drawing was found
    missing = missing_names(drawing, code_names())
    assert not missing, "docs/architecture.md names what the code does not define:\n" + "\n".join(missing)


def test_the_check_finds_the_old_labels():
    names = code_names()
    old = "client -> Pipeline._cache_lookup -> Pipeline._select_replica -> _cache_lookup -> gateway/nowhere.py"
    assert missing_names(old, names) == [
        "file gateway/nowhere.py",
        "member Pipeline._cache_lookup",
        "member Pipeline._select_replica",
        "function or module _cache_lookup",
    ]
    assert missing_names("Pipeline.respond -> hooks.get_route  tokenops_route  RouteDecision", names) == []
    assert missing_names("hooks.get_router tokenops_routes RouteDecisions", names) == [
        "hook tokenops_routes",
        "name hooks.get_router",
        "class RouteDecisions",
    ]


def _module_of(token: str) -> str:
    """A path in the floors table -> the module prefix ``FLOOR_OF`` uses for it."""
    if token.startswith("tokenops_plugins/"):
        return token.rstrip("/").replace("/", ".")
    if token == "__init__.py":
        return "tokenops"
    return "tokenops." + token.rstrip("/").removesuffix(".py").replace("/", ".")


def floors_table() -> list[tuple[int, str, list[str]]]:
    rows = []
    for line in _section("Floors: no arrow back up").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1], re.findall(r"`([^`]+)`", cells[2])))
    return rows


def test_the_floors_table_is_the_import_floor_map():
    rows = floors_table()
    assert [(number, name) for number, name, _ in rows] == [(FLOORS.index(n), n) for n in reversed(FLOORS)]
    drawn = {_module_of(token): name for _, name, tokens in rows for token in tokens}
    assert drawn == FLOOR_OF, (
        f"in the table, not in FLOOR_OF: {sorted(set(drawn.items()) - set(FLOOR_OF.items()))}; "
        f"in FLOOR_OF, not in the table: {sorted(set(FLOOR_OF.items()) - set(drawn.items()))}"
    )
    for _, _, tokens in rows:
        for token in tokens:
            base = ROOT if token.startswith("tokenops_plugins/") else ROOT / "tokenops"
            assert (base / token).exists(), token


def test_a_member_may_be_inherited():
    names = CodeNames()
    names.members["PipelineSteps"] = {"_route"}
    names.bases["Pipeline"] = {"PipelineSteps"}
    assert has_member("Pipeline", "_route", names)
    assert not has_member("Pipeline", "_select_replica", names)
    assert missing_names("Pipeline._route", names) == []
