"""Applying a validated tunables patch to every replica and plugin, all or nothing.

Each engine validates a patch before changing anything, but a server has several
replicas and plugins: when the k-th refuses, the ones before it already changed.
:func:`apply_everywhere` puts those back to their previous values, so replicas
never disagree after a failed patch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from tokenops.tunables import TunableError

log = logging.getLogger("tokenops.gateway")


def apply_everywhere(
    replicas: Iterable[Any],
    values: dict[str, Any],
    previous: dict[str, Any],
    apply_plugins: Callable[[dict[str, Any]], None],
) -> None:
    """Apply ``engine.*`` values to every replica's backend, then all values to the plugins.

    :param previous: the current value of every name in ``values`` (what a rollback restores).
    :raises TunableError: naming the replica that refused; nothing stays changed.
    """
    engine_values = {k: v for k, v in values.items() if k.startswith("engine.")}
    old_engine = {k: previous[k] for k in engine_values}
    done: list[Any] = []
    try:
        if engine_values:
            for replica in replicas:
                try:
                    replica.backend.apply_tunables(engine_values)
                except TunableError as e:
                    raise TunableError(f"{replica.name}: {e}") from None
                done.append(replica)
        batch_meter(replicas, {k: v for k, v in values.items() if k.startswith("batches.")})
        apply_plugins(values)
    except BaseException:
        for replica in done:
            try:
                replica.backend.apply_tunables(old_engine)
            except Exception as e:  # the previous values were accepted once; refusing them now is a bug to see
                log.error("rolling back tunables on %s failed: %s", replica.name, e)
        batch_meter(replicas, {k: previous[k] for k in values if k.startswith("batches.")})
        try:
            apply_plugins({k: previous[k] for k in values})
        except Exception as e:
            log.error("rolling back plugin tunables failed: %s", e)
        raise


def batch_meter(replicas: Iterable[Any], values: dict[str, Any]) -> None:
    """``batches.*`` values to the upstream backends' batch meters (validated already: they cannot refuse)."""
    if values:
        for replica in replicas:
            apply = getattr(replica.backend, "apply_batch_tunables", None)
            if apply is not None:
                apply(values)
