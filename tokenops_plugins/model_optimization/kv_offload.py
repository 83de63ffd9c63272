"""KV offload tier policy: when it is on and how big it is (the mechanism is in the engine:
``tokenops/engine/kv/offload_index.py`` and ``offload_store.py``).

Prefix-cache blocks the engine's KV pool evicts are copied to host memory (and, when
the host tier overflows, to disk) under their chained block hash; a returning prefix
that misses in the pool but hits in the tier is copied back instead of recomputed.
Off by default. Enable in ``tokenops.toml``::

    [plugins.kv_offload]
    enabled = true
    host_mb = 512          # host-memory tier (or host_blocks = N)
    disk_mb = 0            # optional disk tier behind it (or disk_blocks = N)
    disk_path = "/var/tmp/tokenops-kv"   # default: a temporary folder

Per model, the same knobs are ``[[models]] engine = { kv_offload_host_mb = 512, ... }``.
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"

DEFAULT_HOST_MB = 256.0

_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "host_mb": DEFAULT_HOST_MB,
    "host_blocks": 0,
    "disk_mb": 0.0,
    "disk_blocks": 0,
    "disk_path": None,
}
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"kv_offload": tuple(_DEFAULTS)}


class KvOffload:
    """One gateway's ``[plugins.kv_offload]`` tiers (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = dict(_DEFAULTS)

    @hookimpl
    def tokenops_register_tunables(self, register):
        register(
            Tunable(
                "kv_offload.host_mb",
                "float",
                0.0,
                "KV offload tier in host memory, MB; 0 = off (restart; [plugins.kv_offload]).",
                minimum=0.0,
                maximum=1_048_576.0,
                searchable=False,
            )
        )
        register(
            Tunable(
                "kv_offload.disk_mb",
                "float",
                0.0,
                "KV offload disk tier behind the host tier, MB; 0 = none (restart).",
                minimum=0.0,
                maximum=1_048_576.0,
                searchable=False,
            )
        )

    @hookimpl
    def tokenops_configure(self, settings):
        values = settings.plugin_settings("kv_offload", _DEFAULTS)
        if not isinstance(values["enabled"], bool):
            raise ValueError("[plugins.kv_offload] enabled must be true or false")
        for key in ("host_mb", "disk_mb"):
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"[plugins.kv_offload] {key} must be a number of MB >= 0")
            values[key] = float(value)
        for key in ("host_blocks", "disk_blocks"):
            if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < 0:
                raise ValueError(f"[plugins.kv_offload] {key} must be an integer >= 0")
        if values["disk_path"] is not None and not isinstance(values["disk_path"], str):
            raise ValueError("[plugins.kv_offload] disk_path must be a folder path")
        if values["enabled"] and not (values["host_mb"] or values["host_blocks"]):
            raise ValueError("[plugins.kv_offload] enabled needs host_mb or host_blocks > 0")
        self.conf.update(values)

    @hookimpl
    def tokenops_tunable_values(self, config):
        """The tiers the engine runs with (tiers sized in blocks instead of MB show as 0 MB here and as
        blocks in the engine's ``kv_offload`` stats)."""
        return {
            "kv_offload.host_mb": float(config.kv_offload_host_mb),
            "kv_offload.disk_mb": float(config.kv_offload_disk_mb),
        }

    @hookimpl
    def tokenops_engine_config(self, config):
        conf = self.conf
        if not conf["enabled"] or config.kv_offload_host_blocks or config.kv_offload_host_mb:
            return  # off, or set per model ([[models]] engine = {...}), which wins
        config.kv_offload_host_mb = conf["host_mb"]
        config.kv_offload_host_blocks = conf["host_blocks"]
        config.kv_offload_disk_mb = conf["disk_mb"]
        config.kv_offload_disk_blocks = conf["disk_blocks"]
        config.kv_offload_disk_path = conf["disk_path"]
