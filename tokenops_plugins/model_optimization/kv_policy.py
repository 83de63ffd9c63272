"""Sink + window KV eviction (StreamingLLM-style) for long sequences.

A decoding sequence keeps the KV of its first ``kv_sink_tokens`` tokens (the
"attention sinks") and of its last ``kv_window_tokens`` tokens; whole blocks that
fall entirely between the two are released to the pool, so a long generation holds
about ``(sink + window) / block_size + 2`` blocks however long it runs.

How positions are handled: tokens keep their ORIGINAL positions (RoPE is applied
with the true position when K is written and when Q is computed); nothing is moved
or re-rotated. An evicted block's table entry becomes -1 and the attention mask
hides its positions, so a query attends to the sink blocks and the recent blocks
only. Granularity is one block: the sink is rounded up and the window is kept to
whole blocks, so slightly more than ``sink + window`` tokens stay visible.

The sequence length is still capped by the model's ``max_model_len`` (positions
past the trained range would degrade the model); the gain is that many long
sequences fit in the cache together. Preempted sequences are recomputed in full
and evicted again on their next decode step. Not combined with the draft-model
proposer (its cache shares the block tables).

The policy is built into the engine (:class:`tokenops.engine.core.policies.SinkWindowPolicy`,
used whenever ``kv_window_tokens`` is set); this plugin maps ``[plugins.kv_policy]`` onto
those engine settings.

Enable: ``EngineConfig(kv_sink_tokens=4, kv_window_tokens=256)`` or in
``tokenops.toml``::

    [plugins.kv_policy]
    sink_tokens = 4
    window_tokens = 256
    cache_dtype = "int8"    # also: the int8 KV cache (tokenops/engine/kv/kv_quant.py)
                            # or "bfloat16": a float32 model's cache in half the bytes
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.engine.core.policies import SinkWindowPolicy
from tokenops.tunables import Tunable

__all__ = ["KvPolicy", "SinkWindowPolicy"]

TOKENOPS_LAYER = "model_optimization"
#: The [plugins.<section>] tables this plugin reads and their keys: serve and tune refuse any other.
TOKENOPS_SETTINGS = {"kv_policy": ("sink_tokens", "window_tokens", "cache_dtype")}


class KvPolicy:
    """One gateway's ``[plugins.kv_policy]`` (each gateway has its own instance)."""

    TOKENOPS_LAYER = TOKENOPS_LAYER
    TOKENOPS_SETTINGS = TOKENOPS_SETTINGS

    def __init__(self) -> None:
        self.conf: dict[str, Any] = {"sink_tokens": 0, "window_tokens": 0, "cache_dtype": "auto"}

    @hookimpl
    def tokenops_register_tunables(self, register):
        register(
            Tunable(
                "kv_policy.window_tokens",
                "int",
                0,
                "Sink + window KV eviction window, 0 = off (restart).",
                minimum=0,
                searchable=False,
            )
        )

    @hookimpl
    def tokenops_configure(self, settings):
        conf = settings.plugin_settings("kv_policy")
        for key in ("sink_tokens", "window_tokens"):
            if key in conf:
                value = conf[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"[plugins.kv_policy] {key} must be an integer >= 0")
                self.conf[key] = value
        if "cache_dtype" in conf:
            if conf["cache_dtype"] not in ("auto", "bfloat16", "int8"):
                raise ValueError("[plugins.kv_policy] cache_dtype must be 'auto', 'bfloat16' or 'int8'")
            self.conf["cache_dtype"] = conf["cache_dtype"]

    @hookimpl
    def tokenops_tunable_values(self, config):
        return {"kv_policy.window_tokens": config.kv_window_tokens}

    @hookimpl
    def tokenops_engine_config(self, config):
        conf = self.conf
        if conf["cache_dtype"] != "auto" and getattr(config, "kv_cache_dtype", "auto") == "auto":
            config.kv_cache_dtype = conf["cache_dtype"]
        if conf["window_tokens"] and not getattr(config, "kv_window_tokens", 0):
            config.kv_window_tokens = conf["window_tokens"]
            config.kv_sink_tokens = conf["sink_tokens"]
