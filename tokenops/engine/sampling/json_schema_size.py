"""How much output a JSON schema forces, measured without building anything.

A schema can ask for far more text than any request may generate: ``"minLength":
1000000000``, ``minItems`` nested inside ``minItems``, a ``pattern`` with ``a{10000000}`` or ``(a{1000}){1000}``,
a property that is required inside itself through ``$ref``. Building a sample of such
a schema (what the budget-aware close measures) or compiling it into a grammar takes
the memory and time of that text. :func:`min_json_chars` computes a lower bound on the
length of the shortest compact JSON instance with saturating arithmetic (it stops
counting at ``cap``), so the question "does this fit in the request's tokens?" costs a
walk of the schema, never the text itself.

:func:`check_shape` bounds what the walk itself and the grammar compiler pay for: the
number of schema nodes, their nesting, and the size of ``enum``/``const`` values.
Both raise :class:`SchemaSizeError` naming the keyword and where it sits, so a caller
can answer a 400 that says what to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeGuard

from tokenops.engine.sampling.regex_size import PatternTooDeep, pattern_size

#: Returned for a schema with no finite instance (a property required inside itself).
INFINITE = float("inf")
#: Keywords whose value is a count of characters, items or properties the output must have.
SIZING_KEYWORDS = ("minLength", "minItems", "minProperties", "minContains")
_SUB_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SUB_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUB_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)


class SchemaSizeError(ValueError):
    """The schema asks for more than allowed. ``keyword`` is the schema keyword to change,
    ``where`` its JSON-pointer-like location inside the schema ("" for the root)."""

    def __init__(self, message: str, keyword: str, where: str = "") -> None:
        super().__init__(message)
        self.keyword = keyword
        self.where = where


@dataclass(slots=True, frozen=True)
class ShapeLimits:
    """Ceilings on a schema's own size (not on the output it asks for)."""

    max_nodes: int = 10_000
    max_depth: int = 64
    max_enum_values: int = 2_000
    max_enum_chars: int = 256 * 1024
    max_pattern_chars: int = 16 * 1024  # all ``pattern`` strings of one schema (parsing costs 2-10 us a character)


def check_shape(schema: Any, limits: ShapeLimits, output_cap: int) -> None:
    """Count nodes, nesting, ``enum``/``const`` sizes, and every sizing keyword and
    ``pattern`` repetition against ``output_cap`` characters (iteratively: the depth is
    what is being checked). Raises :class:`SchemaSizeError`."""
    stack: list[tuple[Any, int, str]] = [(schema, 0, "")]
    num_nodes = num_enum = enum_chars = pattern_chars = 0
    while stack:
        node, depth, where = stack.pop()
        if depth > limits.max_depth:
            raise SchemaSizeError(f"nests schemas {depth} levels deep, more than {limits.max_depth}", "nesting", where)
        if isinstance(node, list):
            stack.extend((v, depth + 1, f"{where}/{i}") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        num_nodes += 1
        if num_nodes > limits.max_nodes:
            raise SchemaSizeError(f"has more than {limits.max_nodes} subschemas", "nesting", where)
        for key in SIZING_KEYWORDS:
            value = node.get(key)
            if _is_number(value) and value > output_cap:
                raise SchemaSizeError(f"{key} {value} asks for more than {output_cap} characters", key, where)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            pattern_chars += len(pattern)
            if pattern_chars > limits.max_pattern_chars:
                raise SchemaSizeError(
                    f"has patterns of more than {limits.max_pattern_chars} characters in all", "pattern", where
                )
            _check_pattern(pattern, output_cap, where)
        if isinstance(node.get("enum"), list):
            num_enum += len(node["enum"])
            enum_chars += _json_len(node["enum"], limits.max_enum_chars)
            if num_enum > limits.max_enum_values:
                raise SchemaSizeError(f"has more than {limits.max_enum_values} enum values in all", "enum", where)
        if "const" in node:
            enum_chars += _json_len(node["const"], limits.max_enum_chars)
        if enum_chars > limits.max_enum_chars:
            keyword = "const" if "const" in node else "enum"
            raise SchemaSizeError(
                f"has enum and const values of more than {limits.max_enum_chars} characters in all", keyword, where
            )
        for key in _SUB_MAPS:
            sub = node.get(key)
            if isinstance(sub, dict):
                stack.extend((v, depth + 1, f"{where}/{key}/{k}") for k, v in sub.items())
        for key in _SUB_LISTS:
            sub = node.get(key)
            if isinstance(sub, list):
                stack.extend((v, depth + 1, f"{where}/{key}/{i}") for i, v in enumerate(sub))
        for key in _SUB_ONE:
            if isinstance(node.get(key), (dict, list)):
                stack.append((node[key], depth + 1, f"{where}/{key}"))


def _check_pattern(pattern: str, output_cap: int, where: str) -> None:
    """A ``pattern`` whose shortest match, or whose nested repetitions (upper bounds multiplied),
    exceed ``output_cap`` characters (:mod:`tokenops.engine.sampling.regex_size`)."""
    try:
        size = pattern_size(pattern, output_cap)
    except PatternTooDeep as e:
        raise SchemaSizeError(f"pattern {e}", "pattern", where) from None
    shown = pattern if len(pattern) <= 40 else pattern[:37] + "..."
    if size.min_chars > output_cap:
        raise SchemaSizeError(
            f"pattern {shown} asks for more than {output_cap} characters (nested repetitions multiply)",
            "pattern",
            where,
        )
    if size.span > output_cap:
        raise SchemaSizeError(
            f"pattern {shown} repeats more than {output_cap} characters (nested upper bounds multiply)",
            "pattern",
            where,
        )


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_len(value: Any, cap: int) -> int:
    """Length of ``value`` as compact JSON, or ``cap + 1`` when it cannot be written (an
    integer beyond Python's 4,300-digit conversion limit) or is known to exceed ``cap``."""
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (ValueError, TypeError, RecursionError):
        return cap + 1


def min_json_chars(schema: Any, cap: int, max_steps: int = 100_000) -> float:
    """A lower bound on the length of the shortest compact JSON instance of ``schema``;
    ``cap + 1`` as soon as it exceeds ``cap`` (with a :class:`SchemaSizeError` naming the
    keyword that took it over), :data:`INFINITE` when none is finite. Call
    :func:`check_shape` first: the walk recurses as deep as the schema nests."""
    return _Sizer(schema, cap, max_steps).size(schema, "", ())


class _Sizer:
    def __init__(self, root: Any, cap: int, max_steps: int) -> None:
        self.root = root
        self.cap = cap
        self.steps = max_steps
        self.memo: dict[str, float] = {}

    def over(self, total: float, keyword: str, where: str) -> float:
        if total > self.cap and total != INFINITE:
            raise SchemaSizeError(
                f"{keyword} makes the shortest answer longer than {self.cap} characters", keyword, where
            )
        return total

    def resolve(self, ref: str) -> Any:
        target: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict):
                target = target.get(part)
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        return target

    def size(self, schema: Any, where: str, active: tuple[str, ...]) -> float:
        self.steps -= 1
        if self.steps < 0:
            raise SchemaSizeError("is too complex to measure ($ref and anyOf combinations)", "$ref", where)
        if schema is False:
            return INFINITE
        if not isinstance(schema, dict):
            return 1
        ref = schema.get("$ref")
        total: float = 0
        if isinstance(ref, str) and ref.startswith("#"):
            if ref in active:  # required inside itself: every instance would be infinite
                return INFINITE
            if ref not in self.memo:
                self.memo[ref] = self.size(self.resolve(ref), f"{where}/$ref", active + (ref,))
            total = self.memo[ref]
        if "const" in schema:
            return max(total, self.over(_json_len(schema["const"], self.cap), "const", where))
        if isinstance(schema.get("enum"), list):
            if not schema["enum"]:
                return INFINITE
            return max(total, min(_json_len(v, self.cap) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                total = max(total, min(self.size(s, f"{where}/{key}/{i}", active) for i, s in enumerate(options)))
        if isinstance(schema.get("allOf"), list):
            for i, part in enumerate(schema["allOf"]):
                total = max(total, self.size(part, f"{where}/allOf/{i}", active))
        return self.over(max(total, self.own(schema, where, active)), self.keyword(schema), where)

    def own(self, schema: dict[str, Any], where: str, active: tuple[str, ...]) -> float:
        kind = schema.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if None in kinds or not kinds:
            inferred = (
                "object"
                if "properties" in schema or "required" in schema
                else "array"
                if "items" in schema or "prefixItems" in schema
                else "string"
                if "minLength" in schema or "pattern" in schema
                else None
            )
            kinds = [inferred]
        return min(self.of_kind(k, schema, where, active) for k in kinds)

    def of_kind(self, kind: Any, schema: dict[str, Any], where: str, active: tuple[str, ...]) -> float:
        if kind == "object":
            props = found if isinstance(found := schema.get("properties"), dict) else {}
            required = [r for r in schema.get("required") or [] if isinstance(r, str)]
            total: float = 1  # {} less the comma the first member does not need
            for name in dict.fromkeys(required):  # "name":value,
                total += (
                    len(json.dumps(name)) + 2 + self.size(props.get(name, {}), f"{where}/properties/{name}", active)
                )
                if total > self.cap:
                    return self.over(total, "required", where)
            extra = max(0, int(min(schema.get("minProperties") or 0, self.cap)) - len(required))
            return max(2, total + extra * 5)  # "":0,
        if kind == "array":
            total = 1  # [] less the comma the first item does not need
            prefix = found if isinstance(found := schema.get("prefixItems"), list) else []
            for i, item in enumerate(prefix):
                total += 1 + self.size(item, f"{where}/prefixItems/{i}", active)
            num_rest = max(0, int(min(schema.get("minItems") or 0, self.cap)) - len(prefix))
            if num_rest:
                total += num_rest * (1 + self.size(schema.get("items", {}), f"{where}/items", active))
            return max(2, total)
        if kind == "string":
            return 2 + min(schema.get("minLength") or 0, self.cap + 1) + self.pattern_chars(schema)
        if kind in ("boolean", "null"):
            return 4
        return 1

    def pattern_chars(self, schema: dict[str, Any]) -> int:
        pattern = schema.get("pattern")
        if not isinstance(pattern, str):
            return 0
        try:
            return pattern_size(pattern, self.cap).min_chars
        except PatternTooDeep:
            return self.cap + 1

    @staticmethod
    def keyword(schema: dict[str, Any]) -> str:
        for key in ("minItems", "minProperties", "minLength", "prefixItems", "required", "pattern", "allOf", "$ref"):
            if key in schema:
                return key
        return "type"
