"""The size a JSON schema forces, measured without building it (issue 42)."""

from __future__ import annotations

import time

import pytest

from tokenops.engine.sampling.json_schema_size import INFINITE, SchemaSizeError, ShapeLimits, check_shape, min_json_chars
from tokenops.engine.sampling.json_shortest import shortest_json


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "minLength": 1_000_000_000}, "minLength"),
    ({"type": "array", "minItems": 3000, "items": {"type": "array", "minItems": 3000, "items": {}}}, "minItems"),
    ({"type": "object", "minProperties": 10**8}, "minProperties"),
    ({"type": "string", "pattern": "^x{10000000}$"}, "pattern"),
    ({"enum": list(range(5000))}, "enum"),
    ({"const": "c" * 300_000}, "const"),
])
def test_each_sizing_keyword_is_named(schema, keyword):
    with pytest.raises(SchemaSizeError) as e:
        check_shape(schema, ShapeLimits(), 65536)
        min_json_chars(schema, 65536)
    assert e.value.keyword == keyword


def test_nesting_and_node_count_are_bounded():
    deep: dict = {}
    for _ in range(100):
        deep = {"items": deep}
    with pytest.raises(SchemaSizeError, match="levels deep"):
        check_shape(deep, ShapeLimits(max_depth=64), 65536)
    wide = {"properties": {f"p{i}": {} for i in range(20_000)}}
    with pytest.raises(SchemaSizeError, match="subschemas"):
        check_shape(wide, ShapeLimits(max_nodes=10_000), 65536)


def test_multiplication_is_measured_not_built():
    schema = {"type": "array", "minItems": 60, "items": {"type": "array", "minItems": 60, "items": {"type": "integer"}}}
    size = min_json_chars(schema, 65536)
    assert len(shortest_json(schema)) <= size + 2 and size >= 60 * 60 * 2
    t0 = time.perf_counter()
    with pytest.raises(SchemaSizeError):
        min_json_chars({"type": "array", "minItems": 10**9, "items": {"type": "string", "minLength": 10**9}}, 65536)
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    "a" * 10_000_000  # building even a hundredth of one such string costs more than measuring it all
    assert took < time.perf_counter() - t0 + 0.001


def test_required_self_reference_has_no_finite_answer_but_optional_recursion_does():
    assert min_json_chars({"properties": {"x": {"$ref": "#"}}, "required": ["x"]}, 65536) == INFINITE
    defs = {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}},
            "anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}
    assert min_json_chars(defs, 65536) == 4  # the null branch ends it
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}
    assert min_json_chars(tree, 65536) == len('{"kids":[]}')
    assert shortest_json(tree) == '{"kids":[]}'
    with pytest.raises(SchemaSizeError, match="finite"):
        shortest_json({"properties": {"x": {"$ref": "#"}}, "required": ["x"]})


def test_shortest_json_never_builds_beyond_its_cap():
    with pytest.raises(SchemaSizeError):
        shortest_json({"type": "string", "minLength": 10**9})
    assert shortest_json({"type": "string", "minLength": 5}) == '"aaaaa"'
