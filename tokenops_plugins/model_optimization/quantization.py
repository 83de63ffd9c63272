"""Weight-only quantization of linear layers at load time (``tokenops_transform_model``).

- ``int8``: symmetric per-output-channel scales, int8 weights (4x smaller than fp32).
- ``int4``: asymmetric group-wise (``group_size`` input columns share a scale and a
  minimum), two 4-bit values packed per byte (8x smaller than fp32, plus scales).

Weights stay quantized in memory. For one or two rows (decode at batch 1-2) int8 layers
multiply with the engine's native int8 kernel (``tokenops.engine.kernels.native``, reading the int8
weights directly, about 2x faster than float32 there); otherwise weights are dequantized per
matmul into the activation dtype. torch's packed int8/int4 CPU kernels were measured slower
than both on the development machine (docs/engine-optimizations.md).

The layers live in ``_quant_layers`` and are imported only when a model is quantized.

Enable with ``[plugins.quantization] weights = "int8"`` (or ``"int4"``, ``group_size``)
in tokenops.toml; the lm_head (often tied to the embeddings) stays in full precision.
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"quantization": ("weights", "group_size")}
MODES = ("none", "int8", "int4")

_settings: dict[str, Any] = {"weights": "none", "group_size": 128}


@hookimpl
def tokenops_register_tunables(register):
    register(
        Tunable(
            "quantization.weights", "str", "none", "Weight-only quantization of linear layers (restart).", choices=MODES
        )
    )
    register(
        Tunable(
            "quantization.group_size",
            "int",
            128,
            "Input columns per int4 scale group (restart).",
            choices=(32, 64, 128, 256),
            searchable=False,
        )
    )


@hookimpl
def tokenops_configure(settings):
    conf = settings.plugin_settings("quantization")
    if "weights" in conf:
        if conf["weights"] not in MODES:
            raise ValueError(f"[plugins.quantization] weights must be one of {MODES}")
        _settings["weights"] = conf["weights"]
    if "group_size" in conf:
        _settings["group_size"] = int(conf["group_size"])


def _mode(config) -> str:
    return getattr(config, "quantization", None) or _settings["weights"]


@hookimpl
def tokenops_tunable_values(config):
    return {"quantization.weights": _mode(config), "quantization.group_size": _settings["group_size"]}


@hookimpl
def tokenops_transform_model(model, config):
    mode = _mode(config)
    if mode == "none":
        return None
    from ._quant_layers import quantize_model

    quantize_model(model, mode, _settings["group_size"])
    # what the engine's stats call the weights (the model runner reads this attribute)
    model.weight_encoding = f"{mode} weight-only" + (
        f" (groups of {_settings['group_size']})" if mode == "int4" else ""
    )
    return model
