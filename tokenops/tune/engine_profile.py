"""Starting a server with a tuned profile: ``tokenops serve --engine-profile NAME`` or
``[engine] profile = "NAME"`` loads ``profiles/engines/NAME.toml`` (written by
``tokenops tune``).

The profile's ``[tunables]`` become start-up settings: ``engine.*`` set ``[engine]``,
``gateway.*`` set ``[gateway]``; other live tunables are applied once the server has
started (like ``PATCH /admin/tunables``). The ``[tune]`` table records the machine,
model and SLO the profile was tuned for; :func:`mismatches` lists what differs here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenops.config import ConfigError

PROFILE_DIR = Path("profiles/engines")


@dataclass(slots=True)
class EngineProfile:
    name: str
    path: Path
    tunables: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def find_profile(name: str, directory: Path = PROFILE_DIR) -> Path:
    """``NAME`` (a file in ``profiles/engines``, with or without ``.toml``) or a path to a profile."""
    candidates = [Path(name), directory / name, directory / f"{name}.toml"]
    for path in candidates:
        if path.is_file():
            return path
    known = sorted(p.stem for p in directory.glob("*.toml")) if directory.is_dir() else []
    hint = f"; profiles here: {', '.join(known)}" if known else "; run `tokenops tune --slo p95=200ms` to make one"
    raise ConfigError(f"no engine profile {name!r} (looked for {directory / (name + '.toml')}){hint}")


def load_profile(name: str, directory: Path = PROFILE_DIR) -> EngineProfile:
    path = find_profile(name, directory)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"engine profile {path}: {e}") from None
    tunables = data.get("tunables")
    if not isinstance(tunables, dict) or not tunables:
        raise ConfigError(f"engine profile {path} has no [tunables] table")
    from tokenops.plugin_manager import get_tunables
    from tokenops.tunables import TunableError

    try:
        checked = get_tunables().validate(tunables)
    except TunableError as e:
        raise ConfigError(f"engine profile {path}: {e}") from None
    return EngineProfile(path.stem, path, checked, dict(data.get("tune") or {}))


def apply_to_settings(profile: EngineProfile, settings: Any) -> dict[str, Any]:
    """Set the profile's ``engine.*``/``gateway.*`` values on ``settings``; returns the other
    tunables (to apply once the server runs)."""
    rest = {}
    for name, value in profile.tunables.items():
        section, _, key = name.partition(".")
        target = getattr(settings, section, None) if section in ("engine", "gateway") else None
        if target is not None and hasattr(target, key):
            setattr(target, key, value)
        else:
            rest[name] = value
    settings.engine.profile = profile.name
    return rest


def mismatches(profile: EngineProfile, settings: Any, served_models: list[str]) -> list[str]:
    """What differs between where the profile was tuned and this server."""
    from tokenops.tune.profile import hardware_name

    out = []
    hardware = profile.meta.get("hardware")
    here = hardware_name()
    if hardware and hardware != here:
        out.append(f"tuned on {hardware}, this machine is {here}")
    model = profile.meta.get("model")
    if model and model not in served_models:
        out.append(f"tuned for model {model}, this server serves {', '.join(served_models) or 'no model'}")
    slo = profile.meta.get("slo")
    if slo and settings.slo:
        from tokenops.slo import parse_slos

        tuned = sorted(s.label for s in parse_slos(list(slo)))
        configured = sorted(s.label for s in settings.slos)
        if tuned != configured:
            out.append(f"tuned for SLO {', '.join(tuned)}, [slo] here is {', '.join(configured)}")
    return out
