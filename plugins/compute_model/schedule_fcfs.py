"""First come, first served: the default queue order."""

from tokenops import hookimpl

TOKENOPS_LAYER = "compute_model"


@hookimpl(trylast=True)
def tokenops_schedule_order(waiting, policy):
    if policy != "fcfs":
        return None
    return sorted(waiting, key=lambda s: s.arrival_time)
