"""Capability profiles on disk (``profiles/models/<model>.toml``) and their math.

A profile holds, per capability dimension, the share of suite tasks a model got right
with a Wilson 95% interval, plus latency and cost measured at a small load.

The file format is a contract between core and plugins: the gateway loads profiles at
start and reloads them (``tokenops/gateway/core/profile_source.py``), the multi-model plugins
write them (``tokenops profile run``) and route on them (the profile router).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def dump_profile(profile: dict[str, Any]) -> str:
    """TOML text for a profile dict (flat keys, then one table per section/dimension)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in profile.items() if not isinstance(v, dict)]
    for section in ("dimensions",):
        for dim, values in profile.get(section, {}).items():
            lines += ["", f"[{section}.{dim}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    for key, values in profile.items():
        if isinstance(values, dict) and key != "dimensions":
            lines += ["", f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def save_profile(profile: dict[str, Any], directory: str | Path = "profiles/models") -> Path:
    path = Path(directory) / f"{profile['model'].replace('/', '_')}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_profile(profile))
    return path


def load_profiles(directory: str | Path = "profiles/models") -> dict[str, dict[str, Any]]:
    """Model name -> profile, from every ``*.toml`` in ``directory`` (missing dir: empty)."""
    out: dict[str, dict[str, Any]] = {}
    d = Path(directory)
    if not d.is_dir():
        return out
    for path in sorted(d.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        if "model" in data:
            out[data["model"]] = data
    return out


def dimension_score(profile: dict[str, Any] | None, dimension: str, lower_bound: bool = False) -> float | None:
    dims = (profile or {}).get("dimensions", {})
    if dimension not in dims:
        return None
    return float(dims[dimension]["ci_low" if lower_bound else "score"])
