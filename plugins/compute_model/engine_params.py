"""The bundled engine's tunables: generated from :class:`tokenops.engine.config.EngineConfig`'s
field metadata, where each one is declared (default, bounds, live or restart, help)."""

from tokenops import hookimpl
from tokenops.engine.config import engine_tunables

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_register_tunables(register):
    for tunable in engine_tunables():
        register(tunable)
