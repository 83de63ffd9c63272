"""Default replica selection: round robin over the model's healthy replicas."""

import itertools
import threading

from tokenops import hookimpl

TOKENOPS_LAYER = "compute_network"

_counters: dict[str, itertools.count] = {}
_lock = threading.Lock()


@hookimpl(trylast=True)
def tokenops_select_replica(request, replicas):
    if not replicas:
        return None
    key = replicas[0].model
    with _lock:
        n = next(_counters.setdefault(key, itertools.count()))
    return replicas[n % len(replicas)]
