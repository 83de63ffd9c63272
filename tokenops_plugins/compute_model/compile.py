"""Opt-in ``torch.compile`` of the model forward.

```toml
[plugins.compile]
enabled = true
scope = "mlp"           # mlp: each layer's feed-forward and norms; model: the whole forward
mode = "default"        # default | reduce-overhead | max-autotune
dynamic = true          # batches change shape every step: compile for dynamic shapes
```

``scope = "model"`` compiles the whole forward, but its attention metadata (chunk
layout, prefills vs decodes) changes from step to step and Dynamo recompiles on every
change: measured at 0.3 tok/s against 85 eager. ``mlp`` (the default) compiles only the
shape-stable parts — feed-forward blocks and RMS norms, whose only varying dimension is
the token count — so one dynamic graph serves every step. Compilation happens on the
first forward, so the first requests after start are slow; measure with
``tests/benchmarks/compile_speed.py``.
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "compute_model"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"compile": ("enabled", "mode", "dynamic", "scope")}
MODES = ("default", "reduce-overhead", "max-autotune")

SCOPES = ("mlp", "model")
#: Module class names compiled with ``scope = "mlp"``.
STABLE_MODULES = ("GatedMLP", "SparseMoeBlock", "RMSNorm")


class CompileModel:
    """One gateway's ``[plugins.compile]`` (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {"enabled": False, "mode": "default", "dynamic": True, "scope": "mlp"}

    @hookimpl
    def tokenops_register_tunables(self, register):
        register(
            Tunable("compile.enabled", "bool", False, "torch.compile the model forward (restart).", searchable=False)
        )

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("compile")
        if "mode" in conf and conf["mode"] not in MODES:
            raise ValueError(f"[plugins.compile] mode must be one of {MODES}")
        if "scope" in conf and conf["scope"] not in SCOPES:
            raise ValueError(f"[plugins.compile] scope must be one of {SCOPES}")
        self.conf.update({k: conf[k] for k in ("enabled", "mode", "dynamic", "scope") if k in conf})

    @hookimpl
    def tokenops_tunable_values(self, config):
        return {"compile.enabled": bool(self.conf["enabled"])}

    @hookimpl
    def tokenops_compile_model(self, model):
        if not self.conf["enabled"]:
            return None
        import torch

        # Compile forwards in place so modules keep their attributes (kv caches, counters).
        if self.conf["scope"] == "model":
            targets = [model]
        else:
            targets = [m for m in model.modules() if type(m).__name__ in STABLE_MODULES]
        for module in targets:
            module.forward = torch.compile(module.forward, mode=self.conf["mode"], dynamic=self.conf["dynamic"])
        return model
