"""Opt-in ``torch.compile`` of the model forward.

```toml
[plugins.compile]
enabled = true
mode = "default"        # default | reduce-overhead | max-autotune
dynamic = true          # batches change shape every step: compile for dynamic shapes
```

Compilation happens lazily on the first forward of each new shape family, so the first
requests after start are slow; measure with ``tests/benchmarks/compile_speed.py``.
"""

from __future__ import annotations

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "compute_model"
MODES = ("default", "reduce-overhead", "max-autotune")

_conf = {"enabled": False, "mode": "default", "dynamic": True}


@hookimpl
def tokenops_register_tunables(register):
    register(Tunable("compile.enabled", "bool", False, "torch.compile the model forward (restart).", searchable=False))


@hookimpl
def tokenops_configure(settings):
    conf = settings.plugin_settings("compile")
    if "mode" in conf and conf["mode"] not in MODES:
        raise ValueError(f"[plugins.compile] mode must be one of {MODES}")
    _conf.update({k: conf[k] for k in ("enabled", "mode", "dynamic") if k in conf})


@hookimpl
def tokenops_compile_model(model):
    if not _conf["enabled"]:
        return None
    import torch

    # Compile the forward in place so the module keeps its attributes (kv caches, counters).
    model.forward = torch.compile(model.forward, mode=_conf["mode"], dynamic=_conf["dynamic"])
    return model
