"""Breaker state per replica (from ``tokenops_replica_states``) for ``/admin/stats`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from tokenops.gateway.core import hooks

STATES = ("closed", "open", "half_open", "ejected")


def replica_states(replicas: dict[str, list[Any]]) -> dict[str, str]:
    """Replica name -> breaker state for every replica; empty when no breaker is active."""
    states = hooks.get_replica_states()
    if states is None:
        return {}
    return {r.name: states.get(r.name, "closed") for rs in replicas.values() for r in rs}


def prometheus_text(states: dict[str, str]) -> str:
    """``tokenops:replica_breaker_state{replica,state}``: 1 for the replica's current state, 0 for the others."""
    if not states:
        return ""
    lines = [
        "# HELP tokenops:replica_breaker_state Circuit-breaker state of each replica (1 = current state).",
        "# TYPE tokenops:replica_breaker_state gauge",
    ]
    for name, current in sorted(states.items()):
        label = name.replace("\\", "\\\\").replace('"', '\\"')
        for state in STATES:
            lines.append(
                f'tokenops:replica_breaker_state{{replica="{label}",state="{state}"}} {1 if state == current else 0}'
            )
    return "\n".join(lines) + "\n"
