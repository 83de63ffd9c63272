"""A short JSON instance of a schema: what the budget-aware close of
:mod:`tokenops.engine.sampling.grammar` measures (in tokens) to know when to start closing.

Only an estimate of the shortest answer, not a validator: required properties only,
empty strings (or ``minLength`` letters), the smallest allowed number, ``minItems``
items, the shortest ``enum``/``anyOf``/``oneOf`` choice, local ``$ref`` followed a
few levels deep.

Never larger than ``max_chars`` (:data:`MAX_SAMPLE_CHARS` unless told): the size the
schema forces is measured first (:mod:`tokenops.engine.sampling.json_schema_size`, no text
built), and a schema whose shortest answer is longer is a
:class:`~tokenops.engine.sampling.json_schema_size.SchemaSizeError` before any string or list
is made.
"""

from __future__ import annotations

import json
from typing import Any

from tokenops.engine.sampling.json_schema_size import SchemaSizeError, ShapeLimits, check_shape, min_json_chars

_MAX_DEPTH = 8
#: The longest sample built (characters of compact JSON).
MAX_SAMPLE_CHARS = 64 * 1024


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
        num_items = int(min(schema.get("minItems") or 0, MAX_SAMPLE_CHARS))
        if num_items * (len(json.dumps(item)) + 1) > MAX_SAMPLE_CHARS:
            raise SchemaSizeError(
                f"minItems {num_items} makes the sample longer than {MAX_SAMPLE_CHARS} characters", "minItems"
            )
        return [item] * num_items
    if kind == "string":
        return "a" * int(min(schema.get("minLength") or 0, MAX_SAMPLE_CHARS))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return low if isinstance(low, (int, float)) and low > 0 else 0
    if kind == "boolean":
        return False
    return None


def shortest_json(schema: Any, max_chars: int = MAX_SAMPLE_CHARS) -> str:
    """Compact JSON text of :func:`shortest_instance`.

    :raises SchemaSizeError: when the shortest answer is longer than ``max_chars`` (or
        has no finite length) or the schema itself is too big to walk.
    """
    check_shape(schema, ShapeLimits(), max_chars)
    if min_json_chars(schema, max_chars) > max_chars:
        raise SchemaSizeError("has no finite instance: a $ref is required inside itself", "$ref")
    text = json.dumps(shortest_instance(schema), separators=(",", ":"))
    if len(text) > max_chars:
        raise SchemaSizeError(f"its shortest answer is longer than {max_chars} characters", "minLength")
    return text
