"""Engine configuration: one validated dataclass shared by the runner, scheduler and engine.

Defaults match the tunables declared in ``plugins/compute_model/engine_params.py``
and :class:`tokenops.config.EngineSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

_DTYPES = ("float32", "bfloat16", "float16")

#: Tunables that take effect on the next engine step.
LIVE_TUNABLES = ("max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching", "schedule_policy")
#: Tunables that need a new engine (the KV cache is preallocated from them).
RESTART_TUNABLES = ("block_size", "kv_cache_tokens", "torch_threads", "attention_backend")


@dataclass(slots=True)
class EngineConfig:
    """Everything the bundled engine needs to start.

    ``max_model_len`` of None means the model's ``max_position_embeddings``
    capped by ``kv_cache_tokens``; the runner resolves it.
    """

    model: str | None = None
    dtype: str = "float32"
    device: str = "auto"
    block_size: int = 16
    kv_cache_tokens: int = 16384
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    schedule_policy: str = "fcfs"
    torch_threads: int | None = None
    seed: int = 0
    model_name: str | None = None
    allow_download: bool = False
    #: Speculative decoding: None (off), "ngram" (prompt lookup) or "draft" (a draft model).
    speculative: str | None = None
    num_speculative_tokens: int = 4  # the most tokens proposed per decode (adaptive k stays in [1, this])
    draft_model: str | None = None  # local HF folder of the draft model (same tokenizer)
    #: KV-cache storage: "auto" (the model dtype) or "int8" (per-token-per-head scales).
    kv_cache_dtype: str = "auto"
    #: Sink + window eviction (0 = off): keep the first ``kv_sink_tokens`` and the
    #: last ``kv_window_tokens`` tokens of long sequences in the cache.
    kv_sink_tokens: int = 0
    kv_window_tokens: int = 0
    #: Decode attention: "auto" (the compiled paged kernel of tokenops.engine.native
    #: when it builds and the cache is float32/bfloat16 on CPU, else PyTorch),
    #: "native" (that kernel or an error) or "torch" (gather + SDPA).
    attention_backend: str = "auto"
    #: KV offload tier (all 0 = off): evicted prefix-cache blocks go to host memory
    #: (``*_blocks`` wins over ``*_mb``), overflowing to disk; see offload_index.py.
    kv_offload_host_mb: float = 0.0
    kv_offload_host_blocks: int = 0
    kv_offload_disk_mb: float = 0.0
    kv_offload_disk_blocks: int = 0
    kv_offload_disk_path: str | None = None  # None: a temporary folder

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"engine dtype must be one of {', '.join(_DTYPES)}, not {self.dtype!r}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError("engine device must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
        _check_int("block_size", self.block_size, 1)
        _check_int("kv_cache_tokens", self.kv_cache_tokens, self.block_size)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 2)
        if self.torch_threads is not None:
            _check_int("torch_threads", self.torch_threads, 0)
        if not isinstance(self.schedule_policy, str) or not self.schedule_policy:
            raise ValueError("engine schedule_policy must be a policy name such as 'fcfs' or 'priority'")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError("engine enable_prefix_caching must be true or false")
        _check_int("seed", self.seed, None)
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"engine speculative must be 'ngram', 'draft' or unset, not {self.speculative!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("engine speculative = 'draft' needs draft_model (a local model folder)")
        if self.kv_cache_dtype not in ("auto", "int8"):
            raise ValueError(f"engine kv_cache_dtype must be 'auto' or 'int8', not {self.kv_cache_dtype!r}")
        if self.attention_backend not in ("auto", "native", "torch"):
            raise ValueError(f"engine attention_backend must be 'auto', 'native' or 'torch', not {self.attention_backend!r}")
        _check_int("kv_sink_tokens", self.kv_sink_tokens, 0)
        _check_int("kv_window_tokens", self.kv_window_tokens, 0)
        if self.kv_window_tokens and self.kv_window_tokens < 2 * self.block_size:
            raise ValueError(f"engine kv_window_tokens must be 0 (off) or >= 2 blocks ({2 * self.block_size})")
        if self.kv_window_tokens and self.speculative == "draft":
            raise ValueError("engine kv_window_tokens (sink + window eviction) does not work with the draft proposer")
        _check_offload(self)

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @classmethod
    def from_settings(cls, engine_settings: Any, **overrides: Any) -> "EngineConfig":
        """Build from :class:`tokenops.config.EngineSettings` (any object with the same
        attribute names), then apply ``overrides`` (e.g. ``model=...``)."""
        names = {f.name for f in fields(cls)}
        values = {n: getattr(engine_settings, n) for n in names if hasattr(engine_settings, n)}
        unknown = set(overrides) - names
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        values.update(overrides)
        if values.get("torch_threads") == 0:
            values["torch_threads"] = None  # the tunable's 0 means "torch's default"
        return cls(**values)


def _check_offload(config: EngineConfig) -> None:
    for name in ("kv_offload_host_mb", "kv_offload_disk_mb"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"engine {name} must be a number of MB >= 0, not {value!r}")
    _check_int("kv_offload_host_blocks", config.kv_offload_host_blocks, 0)
    _check_int("kv_offload_disk_blocks", config.kv_offload_disk_blocks, 0)
    has_host = config.kv_offload_host_blocks or config.kv_offload_host_mb
    if (config.kv_offload_disk_blocks or config.kv_offload_disk_mb) and not has_host:
        raise ValueError("engine kv_offload disk tier needs a host tier (kv_offload_host_mb or _blocks) in front of it")
    if has_host and config.speculative == "draft":
        raise ValueError("engine kv_offload (KV offload tier) does not work with the draft proposer (its cache is not offloaded)")


def _check_int(name: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"engine {name} must be an integer, not {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"engine {name} must be >= {minimum}, got {value}")
