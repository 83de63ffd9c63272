"""The search space, built from the tunables registry (nothing is listed by hand).

Each searchable tunable becomes an ordered list of candidate values: its
choices; True/False for booleans; for integers a geometric ladder (powers of
two times the default for ``log`` tunables, else evenly spaced) kept within the
tunable's bounds and within ``span`` times the default, so a registry range
like 1..1024 does not send the search to absurd corners. ``--param
NAME=v1,v2`` replaces a tunable's candidates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenops.tunables import Tunable, TunableError


@dataclass(slots=True)
class Dimension:
    """One searched tunable and its ordered candidates."""

    tunable: Tunable
    values: list[Any]

    @property
    def name(self) -> str:
        return self.tunable.name

    @property
    def is_ordered(self) -> bool:
        return self.tunable.type in ("int", "float")

    def index_of(self, value: Any) -> int:
        return self.values.index(value)


def _ladder(t: Tunable, span: float, num_linear: int = 5) -> list[Any]:
    lo = t.minimum if t.minimum is not None else -math.inf
    hi = t.maximum if t.maximum is not None else math.inf
    d = t.default
    if t.type == "int" and t.log and d and d > 0:
        vals = {d}
        k = 1
        while d * 2**k <= min(hi, d * span) or d / 2**k >= max(lo, d / span):
            for v in (d * 2**k, d // 2**k):
                if max(lo, d / span) <= v <= min(hi, d * span) and v >= 1:
                    vals.add(int(v))
            k += 1
            assert k < 64
        return sorted(vals)
    # linear: num_linear evenly spaced points across [max(lo, d/span), min(hi, d*span)]
    a = max(lo, d / span if d > 0 else d - span)
    b = min(hi, d * span if d > 0 else d + span)
    pts = [a + (b - a) * i / (num_linear - 1) for i in range(num_linear)] + [d]
    pts = [int(round(p)) for p in pts] if t.type == "int" else [float(f"{p:.3g}") for p in pts]
    return sorted(set(pts))


def candidates(t: Tunable, span: float = 8.0) -> list[Any]:
    """Ordered candidate values of one tunable (the default is always among them)."""
    if t.choices is not None:
        return list(t.choices)
    if t.type == "bool":
        return [True, False] if t.default else [False, True]
    if t.type == "str":
        return [t.default]
    return [t.validate(v) for v in _ladder(t, span)]


@dataclass(slots=True)
class SearchSpace:
    dims: list[Dimension] = field(default_factory=list)
    #: (tunable name, why it is not searched) for the tunables ``--only`` named or that were
    #: left out for a reason a user may want to know (restart-only, one candidate).
    dropped: list[tuple[str, str]] = field(default_factory=list)
    #: ``--only`` patterns that matched no tunable.
    unmatched: list[str] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        tunables: Iterable[Tunable],
        include_restart: bool,
        only: list[str] | None = None,
        exclude: list[str] | None = None,
        overrides: dict[str, list[Any]] | None = None,
        span: float = 8.0,
    ) -> SearchSpace:
        """Searchable tunables (restart-only ones only with ``include_restart``), filtered by
        name or dotted prefix (``only``/``exclude``), with candidate overrides."""
        overrides = dict(overrides or {})
        by_name = {t.name: t for t in tunables}
        for name in overrides:
            if name not in by_name:
                raise TunableError(f"--param {name}: unknown tunable; `tokenops plugins` lists them")

        def matches(name: str, pats: list[str]) -> bool:
            return any(name == p or name.startswith(p.rstrip(".") + ".") for p in pats)

        dims, dropped = [], []
        for t in by_name.values():
            named = matches(t.name, only) if only else False
            if t.name not in overrides:
                if only and not named:
                    continue
                if not t.searchable:
                    if named:
                        dropped.append((t.name, f"not searched by default; give candidates: --param {t.name}=v1,v2"))
                    continue
            if exclude and matches(t.name, exclude):
                continue
            if not t.live and not include_restart:
                if t.name in overrides:
                    raise TunableError(
                        f"--param {t.name}: needs a restart; use --launch so tokenops can relaunch the engine"
                    )
                dropped.append(
                    (
                        t.name,
                        "needs a restart: a running server cannot try it (tune --launch relaunches "
                        "the engine per configuration)",
                    )
                )
                continue
            vals = [t.validate(v) for v in overrides[t.name]] if t.name in overrides else candidates(t, span)
            if t.default not in vals:  # trial 0 is always the default configuration
                vals = sorted(vals + [t.default]) if t.type in ("int", "float") else [t.default, *vals]
            if len(vals) > 1:
                dims.append(Dimension(t, vals))
            elif named:
                dropped.append((t.name, f"has one candidate ({vals[0]!r}); give more: --param {t.name}=v1,v2"))
        unmatched = [p for p in (only or []) if not any(matches(n, [p]) for n in by_name)]
        return cls(sorted(dims, key=lambda d: d.name), dropped, unmatched)

    def why_empty(self) -> str:
        """One line on why nothing is searched (for an empty space)."""
        parts = [f"{name} {why}" for name, why in self.dropped]
        parts += [
            f"--only {p} matches no tunable of this target (`tokenops plugins` lists them)" for p in self.unmatched
        ]
        return "; ".join(parts) or "no searchable tunable with more than one candidate"

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    def default(self) -> dict[str, Any]:
        return {d.name: d.tunable.default for d in self.dims}

    @property
    def size(self) -> int:
        return math.prod(len(d.values) for d in self.dims) if self.dims else 0

    def key(self, params: dict[str, Any]) -> tuple:
        return tuple(params[d.name] for d in self.dims)

    def grid(self) -> list[dict[str, Any]]:
        """Every configuration (for exhaustive baselines on small spaces)."""
        out: list[dict[str, Any]] = [{}]
        for d in self.dims:
            out = [{**p, d.name: v} for p in out for v in d.values]
        return out
