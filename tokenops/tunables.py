"""The one tunables registry: declared by plugins, read by the tuner, admin API and TUI."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


class TunableError(ValueError):
    """A tunable name or value was rejected; the message says why and what is allowed."""


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


@dataclass(slots=True, frozen=True)
class Tunable:
    """One knob: ``name`` is dotted by component (``engine.max_num_seqs``)."""

    name: str
    type: str
    default: Any
    help: str
    live: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    #: Whether the tuner should search it (a knob like thread count may be excluded).
    searchable: bool = True
    #: Log-scale search for wide integer ranges (batch budgets).
    log: bool = False
    plugin: str | None = field(default=None, compare=False)
    #: ``relevant(deployment)`` -> False when this knob cannot change the deployment (no cascade to
    #: tune, one replica to balance); the tuner then leaves it out and says why (``needs``).
    #: ``deployment`` is a :class:`tokenops.tune.deployment.Deployment`. None: always relevant.
    relevant: Any = field(default=None, compare=False, repr=False)
    #: What the knob needs to matter, for the tuner's "dropped" line ("2+ replicas of a model").
    needs: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise TunableError(f"tunable {self.name}: type must be one of {sorted(_TYPES)}, not {self.type!r}")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        self.validate(self.default)

    def validate(self, value: Any) -> Any:
        """Return ``value`` coerced to this tunable's type, or raise :class:`TunableError`."""
        py = _TYPES[self.type]
        coerced: Any  # bool, int, float or str, as self.type says
        try:
            if py is bool:
                if isinstance(value, str):
                    low = value.strip().lower()
                    if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                        raise ValueError(value)
                    value = low in ("true", "1", "yes", "on")
                elif not isinstance(value, (bool, int)):
                    raise ValueError(value)
                coerced = bool(value)
            elif py is int:
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError(value)
                coerced = int(value)
            elif py is float:
                if isinstance(value, bool):
                    raise ValueError(value)
                coerced = float(value)
                if not math.isfinite(coerced):  # NaN passes every min/max comparison
                    raise ValueError(value)
            else:
                coerced = str(value)
        except (TypeError, ValueError, OverflowError):
            finite = " (a finite number)" if py in (int, float) else ""
            raise TunableError(f"{self.name}: expected {self.type}{finite}, got {value!r}") from None
        if self.choices is not None and coerced not in self.choices:
            raise TunableError(f"{self.name}: {coerced!r} is not one of {list(self.choices)}")
        if self.minimum is not None and coerced < self.minimum:
            raise TunableError(f"{self.name}: {coerced} is below the minimum {self.minimum}")
        if self.maximum is not None and coerced > self.maximum:
            raise TunableError(f"{self.name}: {coerced} is above the maximum {self.maximum}")
        return coerced

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["choices"] = list(self.choices) if self.choices is not None else None
        d.pop("relevant", None)  # code, not data
        return d


class TunableRegistry:
    """Tunables by name, filled from ``tokenops_register_tunables``."""

    def __init__(self) -> None:
        self._tunables: dict[str, Tunable] = {}

    def register(self, tunable: Tunable, plugin: str | None = None) -> None:
        if tunable.name in self._tunables:
            owner = self._tunables[tunable.name].plugin
            raise TunableError(f"tunable {tunable.name} is declared twice ({owner} and {plugin})")
        if plugin is not None and tunable.plugin is None:
            object.__setattr__(tunable, "plugin", plugin)
        self._tunables[tunable.name] = tunable

    def __getitem__(self, name: str) -> Tunable:
        try:
            return self._tunables[name]
        except KeyError:
            raise TunableError(f"unknown tunable {name!r}; `tokenops plugins` lists them") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tunables

    def get(self, name: str) -> Tunable | None:
        """The tunable called ``name``, or None when no plugin declares it."""
        return self._tunables.get(name)

    def __iter__(self):
        return iter(sorted(self._tunables.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._tunables)

    def validate(self, values: dict[str, Any]) -> dict[str, Any]:
        """Validate a ``{name: value}`` patch as a whole; nothing is partially accepted."""
        return {name: self[name].validate(value) for name, value in values.items()}

    def defaults(self, prefix: str = "") -> dict[str, Any]:
        return {t.name: t.default for t in self if t.name.startswith(prefix)}


def gateway_tunables(d: Any) -> list[Tunable]:
    """The ``[gateway]`` settings that are live tunables (``gateway.<name>``, shown in ``/admin/tunables``);
    ``d`` is a default ``GatewaySettings`` (declared once there, on a floor above this one); and
    ``[batches] upstream_ttft_slo_ms`` (``batches.upstream_ttft_slo_ms``: the upstream batch meter's SLO)."""
    return [
        Tunable("gateway.max_queued_requests", "int", d.max_queued_requests,
                "Requests that may wait for a model's slots; past it a 429 with Retry-After.",
                live=True, minimum=0, maximum=1_000_000, searchable=False),
        Tunable("gateway.max_queued_tokens", "int", d.max_queued_tokens,
                "Prompt tokens (estimated) that may wait for a model's slots; past it a 429.",
                live=True, minimum=0, maximum=1_000_000_000, searchable=False),
        Tunable("gateway.upstream_max_running", "int", d.upstream_max_running,
                "Requests one upstream replica runs at once (a bundled engine's slots: max_num_seqs).",
                live=True, minimum=1, maximum=1_000_000, searchable=False),
        Tunable("gateway.drain_timeout_s", "float", d.drain_timeout_s,
                "On SIGTERM: how long requests in flight may finish before they are cancelled.",
                live=True, minimum=0.0, maximum=3600.0, searchable=False),
        Tunable("batches.upstream_ttft_slo_ms", "float", 0.0,
                "Upstream engines: interactive time to first token (ms) batch lines are metered to keep under (0: off).",
                live=True, minimum=0.0, maximum=3_600_000.0, searchable=False),
    ]  # fmt: skip
