"""The bundled engine's tunables: generated from :class:`tokenops.engine.config.EngineConfig`'s
field metadata, where each one is declared (default, bounds, live or restart, help).
``engine.schedule_policy`` also accepts the queue orders plugins register."""

import dataclasses

from tokenops import hookimpl
from tokenops.engine.config import engine_tunables

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_register_tunables(register):
    for tunable in engine_tunables():
        if tunable.name == "engine.schedule_policy":
            from tokenops.policy_hooks import schedule_orders

            extra = sorted(set(schedule_orders()) - set(tunable.choices))
            tunable = dataclasses.replace(tunable, choices=(*tunable.choices, *extra))
        register(tunable)
