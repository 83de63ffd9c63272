"""Named SLO presets: ``profiles/slo/<name>.toml`` with ``slo = ["p95=200ms", ...]``.

Looked up in ``./profiles/slo`` first (a project's own presets), then in the
presets shipped beside the tokenops source tree.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tokenops.slo import SLOError, parse_slos


def preset_dirs() -> list[Path]:
    here = Path("profiles") / "slo"
    shipped = Path(__file__).resolve().parents[2] / "profiles" / "slo"
    return [here] if here.resolve() == shipped else [here, shipped]


def list_presets() -> dict[str, str]:
    """name -> description of every preset found."""
    out: dict[str, str] = {}
    for d in reversed(preset_dirs()):
        for p in sorted(d.glob("*.toml")) if d.is_dir() else []:
            try:
                out[p.stem] = tomllib.loads(p.read_text()).get("description", "")
            except tomllib.TOMLDecodeError:
                continue
    return out


def load_preset(name: str) -> list[str]:
    """The SLO clauses of preset ``name`` (validated)."""
    for d in preset_dirs():
        p = d / f"{name}.toml"
        if p.is_file():
            try:
                data = tomllib.loads(p.read_text())
            except tomllib.TOMLDecodeError as e:
                raise SLOError(f"SLO preset {p}: invalid TOML: {e}") from None
            clauses = data.get("slo")
            if not isinstance(clauses, list) or not clauses:
                raise SLOError(f'SLO preset {p}: needs slo = ["p95=200ms", ...]')
            parse_slos(clauses)
            return [str(c) for c in clauses]
    names = ", ".join(sorted(list_presets())) or "none"
    raise SLOError(f"unknown SLO preset {name!r}; available: {names}")


def resolve(slos: list[str] | None, preset: str | None) -> list[str]:
    """``--slo-preset`` clauses, overridden or extended by explicit ``--slo`` ones."""
    clauses = load_preset(preset) if preset else []
    explicit = parse_slos(slos or [])
    keep = [
        c
        for c in clauses
        if (p := parse_slos([c])[0]) and not any((e.metric, e.percentile) == (p.metric, p.percentile) for e in explicit)
    ]
    return keep + list(slos or [])
