"""A short JSON instance of a schema: what the budget-aware close of
:mod:`tokenops.engine.grammar` measures (in tokens) to know when to start closing.

Only an estimate of the shortest answer, not a validator: required properties only,
empty strings (or ``minLength`` letters), the smallest allowed number, ``minItems``
items, the shortest ``enum``/``anyOf``/``oneOf`` choice, local ``$ref`` followed a
few levels deep.
"""

from __future__ import annotations

import json
from typing import Any

_MAX_DEPTH = 8


def shortest_instance(schema: Any, root: Any = None, depth: int = 0) -> Any:
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/"):
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return shortest_instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return min(schema["enum"], key=lambda v: len(json.dumps(v)))
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            options = [shortest_instance(s, root, depth + 1) for s in schema[key]]
            return min(options, key=lambda v: len(json.dumps(v)))
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = shortest_instance(part, root, depth + 1)
            if isinstance(value, dict):
                merged.update(value)
        return merged
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: shortest_instance(props.get(name, {}), root, depth + 1) for name in schema.get("required") or []}
    if kind == "array":
        item = shortest_instance(schema.get("items", {}), root, depth + 1)
        return [item] * int(schema.get("minItems") or 0)
    if kind == "string":
        return "a" * int(schema.get("minLength") or 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return low if isinstance(low, (int, float)) and low > 0 else 0
    if kind == "boolean":
        return False
    return None


def shortest_json(schema: Any) -> str:
    """Compact JSON text of :func:`shortest_instance`."""
    return json.dumps(shortest_instance(schema), separators=(",", ":"))
