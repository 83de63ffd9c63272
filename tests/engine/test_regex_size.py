"""The pattern walk of tokenops/engine/sampling/regex_size.py and its use by the schema budget."""

from __future__ import annotations

import time

import pytest
from tokenops.engine.sampling.json_schema_size import SchemaSizeError, ShapeLimits, check_shape, min_json_chars
from tokenops.engine.sampling.regex_size import PatternSize, PatternTooDeep, pattern_size

CAP = 65_536


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("a{10}", PatternSize(10, 10)),
        ("^\\d{3}-\\d{4}$", PatternSize(8, 8)),
        ("(a|bb){3}", PatternSize(3, 9)),  # shortest branch for the match, every branch for the span
        ("a*", PatternSize(0, 1)),
        ("(?:ab)+c?", PatternSize(2, 3)),
        ("[a-z]{1,60000}", PatternSize(1, 60_000)),
        ("(((a{10}){10}){10}){10}", PatternSize(10_000, 10_000)),  # nested repetitions multiply
        ("((a+){50}){50}", PatternSize(2500, 2500)),  # + counts its minimum
        ("(a{1000}){1000}", PatternSize(CAP + 1, CAP + 1)),  # saturates
        ("x(?=y{1000})", PatternSize(1, 1001)),  # a look-ahead matches no text of its own
    ],
)
def test_shortest_match_and_span(pattern, expected):
    assert pattern_size(pattern, CAP) == expected


def test_unparsable_patterns_fall_back_to_quantifiers_and_deep_nesting_is_refused():
    size = pattern_size("\\p{L}{3}(x{100}){100}", CAP)  # ECMA-only: Python's parser refuses \p
    assert size.min_chars == 100 and size.span >= 10_000
    with pytest.raises(PatternTooDeep):
        pattern_size("(" * 2000 + "a" + ")" * 2000, CAP)


def test_the_budget_refuses_nested_patterns_naming_pattern():
    for pattern in ("(a{1000}){1000}", "((a+){300}){300}", "(a{1,1000}){1,1000}"):
        schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
        with pytest.raises(SchemaSizeError) as e:
            check_shape(schema, ShapeLimits(), CAP)
        assert e.value.keyword == "pattern" and e.value.where == "/properties/a"
    # the shortest match counts toward the answer, so max_tokens bounds it too
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "((ab){50}){50}"}}, "required": ["a"]}
    assert min_json_chars(schema, CAP) >= 5000
    with pytest.raises(SchemaSizeError):
        min_json_chars(schema, 16 * 100)  # what max_tokens=100 holds


def test_total_pattern_characters_are_bounded_and_measuring_is_cheap():
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "(ab{1,3}|cd)*" * 100}
                                             for i in range(60)}}
    with pytest.raises(SchemaSizeError) as e:
        check_shape(many, ShapeLimits(), CAP)
    assert e.value.keyword == "pattern" and "in all" in str(e.value)
    t = time.perf_counter()
    pattern_size("(ab{1,3}|cd)*x" * 1170, CAP)  # ~16 KB, the most one schema may hold
    assert time.perf_counter() - t < 10  # 0.03-0.2 s (quiet and loaded box)
