"""Default replica selection: round robin over the model's healthy replicas (each gateway counts its own)."""

import itertools
import threading

from tokenops import hookimpl

TOKENOPS_LAYER = "compute_network"


class RoundRobin:
    """One gateway's position in each model's replica list."""

    TOKENOPS_LAYER = TOKENOPS_LAYER

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    @hookimpl(trylast=True)
    def tokenops_select_replica(self, request, replicas):
        if not replicas:
            return None
        key = replicas[0].model
        with self._lock:
            n = next(self._counters.setdefault(key, itertools.count()))
        return replicas[n % len(replicas)]
