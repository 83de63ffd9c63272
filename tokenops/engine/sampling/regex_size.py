"""What a JSON-schema ``pattern`` forces and how far its repetitions reach, read from its parse tree.

A quantifier alone says little: ``(a{1000}){1000}`` has no number over 1,000 and still asks
for a million characters, and ``((a+){300}){300}`` asks for 90,000. :func:`pattern_size`
parses the pattern with Python's own regex parser (``re._parser``; no matching, no
compilation) and walks the tree once, multiplying nested repetition counts with saturating
arithmetic (nothing larger than ``cap + 1`` is ever kept):

- ``min_chars``: the length of the shortest match (a sequence adds, an alternation takes its
  shortest branch, ``{n,m}`` multiplies by ``n``; ``+``, ``*`` and ``{n,}`` count their minimum);
- ``span``: the product of nested upper bounds, summed over the pattern (an alternation adds
  its branches; an unbounded repeat counts its minimum, at least once). It bounds how many
  positions a regex engine may have to tell apart, i.e. what compiling it may cost.

A pattern Python's parser does not read (ECMA-only syntax such as ``\\p{L}``) is measured by
its quantifiers alone: ``min_chars`` is the largest lower bound of one of them (a lower bound
still), ``span`` multiplies them all as if each were nested in the one before (an over-estimate).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# the standard library's own regex parser (``sre_parse`` before 3.11, deprecated since)
_c: Any = importlib.import_module("re._constants")
_parser: Any = importlib.import_module("re._parser")

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", _c.MAX_REPEAT)}
_ONE_CHAR = {_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN, _c.CATEGORY, _c.RANGE}
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}|[+*]")


class PatternTooDeep(ValueError):
    """The pattern nests groups deeper than the parser (or this walk) goes."""


@dataclass(slots=True, frozen=True)
class PatternSize:
    """``min_chars`` and ``span`` of a pattern (see the module docstring), each at most ``cap + 1``."""

    min_chars: int
    span: int


@lru_cache(maxsize=256)
def pattern_size(pattern: str, cap: int) -> PatternSize:
    """The size of ``pattern``, saturating at ``cap + 1``.

    :raises PatternTooDeep: when its groups nest deeper than Python's parser recurses.
    """
    try:
        tree = _parser.parse(pattern)
    except RecursionError:
        raise PatternTooDeep("nests groups too deeply") from None
    except (re.error, OverflowError, ValueError):
        return _by_quantifiers(pattern, cap)
    try:
        low, high = _walk(list(tree), cap + 1)
    except RecursionError:
        raise PatternTooDeep("nests groups too deeply") from None
    return PatternSize(low, high)


def _walk(items: list[tuple[Any, Any]], top: int) -> tuple[int, int]:
    """(shortest match, span) of a sequence of parsed items, each at most ``top``."""
    low = high = 0
    for op, av in items:
        if op in _REPEATS:
            least, most, sub = av
            sub_low, sub_high = _walk(list(sub), top)
            times = most if most != _c.MAXREPEAT else max(least, 1)
            low += least * sub_low
            high += times * sub_high
        elif op is _c.SUBPATTERN:
            sub_low, sub_high = _walk(list(av[-1]), top)
            low, high = low + sub_low, high + sub_high
        elif op is getattr(_c, "ATOMIC_GROUP", None):
            sub_low, sub_high = _walk(list(av), top)
            low, high = low + sub_low, high + sub_high
        elif op is _c.BRANCH:
            sizes = [_walk(list(branch), top) for branch in av[1]]
            low += min((s[0] for s in sizes), default=0)
            high += sum(s[1] for s in sizes)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):  # look-arounds match no text of their own
            high += _walk(list(av[1]), top)[1]
        elif op is _c.GROUPREF_EXISTS:
            yes = _walk(list(av[1]), top)
            no = _walk(list(av[2]), top) if av[2] is not None else (0, 0)
            low, high = low + min(yes[0], no[0]), high + yes[1] + no[1]
        elif op in _ONE_CHAR:
            low, high = low + 1, high + 1
        elif op is not _c.AT:  # a back-reference: at least nothing, at most what its group spans
            high += 1
        low, high = min(low, top), min(high, top)
    return low, high


def _by_quantifiers(pattern: str, cap: int) -> PatternSize:
    """For patterns Python cannot parse: the largest lower bound of one quantifier (still a
    lower bound), and every quantifier's upper bound as if nested in the one before (never less
    than the span)."""
    top = cap + 1
    low, high = 0, 1
    for m in _QUANTIFIER.finditer(pattern):
        if m.group(0) in "+*":
            least = most = 1
        else:
            least = int(m.group(1)[:12])
            most = int(m.group(2)[:12]) if m.group(2) else least
        low = min(max(low, least), top)
        high = min(high * max(most, least, 1), top)
    return PatternSize(low, high)
