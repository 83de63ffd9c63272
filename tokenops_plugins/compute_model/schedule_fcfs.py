"""First come, first served: the default queue order (built into the engine as ``fcfs``;
registered here so `tokenops plugins` lists it with the other queue orders)."""

from tokenops import hookimpl
from tokenops.engine.core.policies import fcfs_order

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_register_schedule_orders(register):
    register("fcfs", fcfs_order)
