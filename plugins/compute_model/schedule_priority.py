"""Priority order: lower ``priority`` value first, then arrival (as in vLLM)."""

from tokenops import hookimpl

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_schedule_order(waiting, policy):
    if policy != "priority":
        return None
    return sorted(waiting, key=lambda s: (s.priority, s.arrival_time))
