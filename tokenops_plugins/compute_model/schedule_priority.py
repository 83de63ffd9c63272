"""Priority order: lower ``priority`` value first, then arrival (as in vLLM). Built into the
engine as ``priority``; registered here so `tokenops plugins` lists it."""

from tokenops import hookimpl
from tokenops.engine.core.policies import priority_order

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_register_schedule_orders(register):
    register("priority", priority_order)
