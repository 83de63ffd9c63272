"""The C sources' headers read from Python: ctypes signatures generated from the prototypes, ctypes
structures checked against the ``typedef struct`` they mirror.

Each native library has one header in ``tokenops/engine/csrc`` (``paged_decode.h``, ``quant.h``,
``fused_decode.h``). The C compiler holds every definition to its prototype (each ``.c`` includes its
header), and :func:`bind` gives ctypes the same prototypes, so a parameter changed in C changes the
Python call or fails the build: never a silent mismatch of argument types. :func:`struct_mismatch`
compares a :class:`ctypes.Structure` with the header's struct, field by field (name and type).

The parser reads the subset the headers use: comments, preprocessor lines (skipped: every variant's
typedefs are read, and pointers are all ``c_void_p``), ``typedef struct { ... } name;`` with one or
more declarators per field, ``#define NAME <integer>``, and prototypes ``type name(params);``.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

CSRC = Path(__file__).resolve().parents[1] / "csrc"

#: C scalar types -> ctypes (anything behind a pointer is ``c_void_p``)
SCALARS: dict[str, Any] = {
    "void": None,
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "size_t": ctypes.c_size_t,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRUCT = re.compile(r"typedef\s+struct\s*\w*\s*\{(?P<body>[^}]*)\}\s*(?P<name>\w+)\s*;")
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)\s+(-?\d+)\b", re.M)
_PROTO = re.compile(r"(?P<ret>[\w\s\*]+?)\b(?P<name>\w+)\s*\((?P<params>[^()]*)\)\s*;")


class HeaderError(ValueError):
    """A declaration outside the subset the parser reads."""


@dataclass
class Header:
    functions: dict[str, tuple[Any, list[Any]]] = field(default_factory=dict)  # name -> (restype, argtypes)
    structs: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)  # name -> [(field, ctype)]
    defines: dict[str, int] = field(default_factory=dict)


def _ctype(decl: str) -> Any:
    """``decl``: a type without its name (``const float *``, ``int64_t``) -> its ctypes type."""
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in decl.split() if w not in ("const", "volatile", "restrict", "unsigned", "signed")]
    if len(words) != 1 or words[0] not in SCALARS:
        raise HeaderError(f"type {decl.strip()!r} is not in the parser's subset")
    return SCALARS[words[0]]


def _param(text: str) -> Any:
    text = text.strip()
    match = re.fullmatch(r"(.*?[\s\*])(\w+)", text)
    if match is None:
        raise HeaderError(f"parameter {text!r} has no name")
    return _ctype(match.group(1))


def parse(text: str) -> Header:
    """The declarations of a header's text."""
    header = Header()
    header.defines = {name: int(value) for name, value in _DEFINE.findall(text)}
    code = "\n".join(line for line in _COMMENT.sub(" ", text).splitlines() if not line.lstrip().startswith("#"))
    for m in _STRUCT.finditer(code):
        fields: list[tuple[str, Any]] = []
        for decl in filter(None, (d.strip() for d in m.group("body").split(";"))):
            base, _, rest = decl.partition(",")
            first = re.fullmatch(r"(.*?[\s\*])(\w+)", base.strip())
            if first is None:
                raise HeaderError(f"field {decl!r} of {m.group('name')} has no name")
            type_words = first.group(1).replace("*", " ")
            names = [(first.group(1), first.group(2))]
            for more in filter(None, (r.strip() for r in rest.split(","))):
                names.append((type_words + " *" * more.count("*"), more.lstrip("* ")))
            fields.extend((name, _ctype(decl_type)) for decl_type, name in names)
        header.structs[m.group("name")] = fields
    code = _STRUCT.sub(" ", code)
    code = re.sub(r"typedef[^;]*;", " ", code)
    for m in _PROTO.finditer(code):
        params = m.group("params").strip()
        args = [] if params in ("", "void") else [_param(p) for p in params.split(",")]
        header.functions[m.group("name")] = (_ctype(m.group("ret")), args)
    return header


@cache
def read(name: str, folder: Path = CSRC) -> Header:
    """The parsed header ``name`` of ``folder`` (the package's csrc by default)."""
    return parse((folder / name).read_text())


def bind(lib: ctypes.CDLL, header: Header) -> ctypes.CDLL:
    """Set ``argtypes`` and ``restype`` of every function ``header`` declares (a symbol the library
    lacks raises AttributeError: the build and the header disagree)."""
    for name, (restype, argtypes) in header.functions.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def struct_mismatch(cls: type[ctypes.Structure], header: Header, name: str) -> str | None:
    """How ``cls`` differs from the header's ``name`` (field names, order and types), or None."""
    want = header.structs.get(name)
    if want is None:
        return f"the header declares no struct {name}"
    have = [(f[0], f[1]) for f in cls._fields_]
    if [n for n, _ in have] != [n for n, _ in want]:
        return f"{cls.__name__} fields {[n for n, _ in have]} != {name} fields {[n for n, _ in want]}"
    for (fname, ctype), (_, cwant) in zip(have, want, strict=True):
        if ctype is not cwant and ctypes.sizeof(ctype) != ctypes.sizeof(cwant):
            return f"{cls.__name__}.{fname} is {ctype.__name__}, {name}.{fname} is {cwant.__name__}"
        if ctype is not cwant and not (_is_int(ctype) and _is_int(cwant)):
            return f"{cls.__name__}.{fname} is {ctype.__name__}, {name}.{fname} is {cwant.__name__}"
    return None


def _is_int(ctype: Any) -> bool:
    return ctype not in (ctypes.c_void_p, ctypes.c_float, ctypes.c_double)


def check_struct(cls: type[ctypes.Structure], name: str, header: str) -> None:
    """Raise RuntimeError when ``cls`` does not mirror struct ``name`` of ``header`` (at library load)."""
    why = struct_mismatch(cls, read(header), name)
    if why is not None:
        raise RuntimeError(f"ctypes structure and {header} disagree: {why}")


def sources(main: str, folder: Path = CSRC) -> list[Path]:
    """``main`` and every file it includes with ``#include "..."``, transitively (the build's inputs:
    their text is part of the compiled library's cache key)."""
    seen: list[Path] = []
    todo = [folder / main]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        todo.extend(path.parent / inc for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M))
    return seen
