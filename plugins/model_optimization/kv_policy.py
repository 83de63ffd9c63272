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

Enable: ``EngineConfig(kv_sink_tokens=4, kv_window_tokens=256)`` or in
``tokenops.toml``::

    [plugins.kv_policy]
    sink_tokens = 4
    window_tokens = 256
    cache_dtype = "int8"    # also: the int8 KV cache (tokenops/engine/kv_quant.py)
"""

from __future__ import annotations

from typing import Any

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "model_optimization"

_conf: dict[str, Any] = {"sink_tokens": 0, "window_tokens": 0, "cache_dtype": "auto"}


class SinkWindowPolicy:
    """Which blocks of a sequence to release (see the module doc)."""

    def __init__(self, num_sink_tokens: int, window: int) -> None:
        if num_sink_tokens < 0 or window < 1:
            raise ValueError(f"sink + window policy needs sink >= 0 and window >= 1, got {num_sink_tokens}, {window}")
        self.num_sink_tokens = num_sink_tokens
        self.window = window

    def blocks_to_evict(self, num_tokens: int, block_size: int, block_table: list[int]) -> list[int]:
        """Indices of live blocks wholly after the sink blocks and before the window
        of the next query (which sees positions ``< num_tokens``)."""
        first = -(-self.num_sink_tokens // block_size)  # sink blocks, rounded up
        end = max(0, num_tokens - self.window) // block_size  # blocks ending at or before the window start
        end = min(end, len(block_table) - 1)  # the last block is never evicted
        return [i for i in range(first, end) if block_table[i] >= 0]

    def max_blocks(self, block_size: int) -> int:
        """Most live blocks a decoding sequence holds after eviction."""
        return -(-self.num_sink_tokens // block_size) + -(-self.window // block_size) + 1


@hookimpl
def tokenops_register_tunables(register):
    register(Tunable("kv_policy.window_tokens", "int", 0, "Sink + window KV eviction window, 0 = off (restart).",
                     minimum=0, searchable=False))


@hookimpl
def tokenops_configure(settings):
    conf = settings.plugin_settings("kv_policy")
    for key in ("sink_tokens", "window_tokens"):
        if key in conf:
            value = conf[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"[plugins.kv_policy] {key} must be an integer >= 0")
            _conf[key] = value
    if "cache_dtype" in conf:
        if conf["cache_dtype"] not in ("auto", "int8"):
            raise ValueError("[plugins.kv_policy] cache_dtype must be 'auto' or 'int8'")
        _conf["cache_dtype"] = conf["cache_dtype"]


@hookimpl
def tokenops_engine_config(config):
    if _conf["cache_dtype"] != "auto" and getattr(config, "kv_cache_dtype", "auto") == "auto":
        config.kv_cache_dtype = _conf["cache_dtype"]
    if _conf["window_tokens"] and not getattr(config, "kv_window_tokens", 0):
        config.kv_window_tokens = _conf["window_tokens"]
        config.kv_sink_tokens = _conf["sink_tokens"]


@hookimpl
def tokenops_kv_policy(config: Any):
    window = getattr(config, "kv_window_tokens", 0)
    if not window:
        return None
    return SinkWindowPolicy(getattr(config, "kv_sink_tokens", 0), window)
