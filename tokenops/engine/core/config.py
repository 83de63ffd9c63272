"""Engine configuration: one validated dataclass shared by the runner, scheduler and engine.

Its fields are the one declaration of every engine setting. Field metadata says which
fields are ``[engine]`` settings of ``tokenops.toml`` (``setting``; the rest are per
model) and which are tunables (``tunable``: "live" applies on the next engine step,
"restart" needs a new engine because the KV cache is preallocated from it) with their
help, bounds and choices. :func:`engine_tunables` and
:class:`tokenops.config.EngineSettings` are generated from them; nothing repeats a default.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from tokenops.engine.kernels.switches import CPU_ISAS, env_flag, env_int, env_isa

_DTYPES = ("float32", "bfloat16", "float16")


def _knob(default: Any, *, setting: bool = False, tunable: str | None = None, help: str = "", **bounds: Any) -> Any:
    """A field with its metadata. ``bounds``: ``minimum``, ``maximum``, ``choices``, ``log``,
    ``searchable`` and ``tunable_none`` (the tunable's value standing for a None default)."""
    assert tunable in (None, "live", "restart"), tunable
    assert not tunable or help, "a tunable needs its help text"
    return field(
        default=default, metadata={"setting": setting or bool(tunable), "tunable": tunable, "help": help, **bounds}
    )


@dataclass(slots=True)
class EngineConfig:
    """Everything the bundled engine needs to start.

    ``max_model_len`` of None means the model's ``max_position_embeddings``
    capped by ``kv_cache_tokens``; the runner resolves it.
    """

    model: str | None = None
    dtype: str = _knob("float32", setting=True)
    device: str = _knob("auto", setting=True)
    block_size: int = _knob(
        16, tunable="restart", help="Tokens per KV-cache block.", minimum=1, maximum=256, choices=(8, 16, 32, 64)
    )
    kv_cache_tokens: int = _knob(
        16384,
        tunable="restart",
        help="KV-cache budget in tokens, preallocated.",
        minimum=256,
        maximum=4_194_304,
        log=True,
    )
    max_num_batched_tokens: int = _knob(
        512,
        tunable="live",
        help="Token budget of one engine step (prefill chunks + decodes).",
        minimum=16,
        maximum=65536,
        log=True,
    )
    max_num_seqs: int = _knob(
        32, tunable="live", help="Most sequences running in one batch.", minimum=1, maximum=1024, log=True
    )
    max_model_len: int | None = _knob(None, setting=True)
    enable_prefix_caching: bool = _knob(True, tunable="live", help="Reuse KV blocks of identical prompt prefixes.")
    schedule_policy: str = _knob(
        "fcfs", tunable="live", help="Order of the waiting queue.", choices=("fcfs", "priority")
    )
    #: Priority classes (tokenops/engine/core/scheduler.py): waiting interactive sequences go before batch
    #: ones, and running batch sequences are preempted when an interactive one finds no room.
    priority_classes: bool = _knob(
        True,
        tunable="live",
        searchable=False,
        help="Admit interactive requests before batch ones and preempt batch work to make room "
        "for them (false: one first-come queue).",
    )
    batch_max_share: float = _knob(
        1.0,
        tunable="live",
        searchable=False,
        minimum=0.0,
        maximum=1.0,
        help="Share (0..1) of the running slots and step tokens batch requests may hold while "
        "interactive ones are present (1: all the capacity they leave idle).",
    )
    #: Bounds the step an interactive request that arrives waits for: on a CPU a step's time grows
    #: with its tokens, and a batch running alone would otherwise fill every step with prompts.
    batch_step_tokens: int = _knob(
        0,
        tunable="live",
        searchable=False,
        minimum=0,
        maximum=65536,
        help="Most tokens batch requests compute in one engine step, also when nothing interactive "
        "runs (0: no bound but max_num_batched_tokens).",
    )
    #: Sizes the batch work beside interactive work from the engine's measured step-time curve
    #: (tokenops/engine/core/step_cost.py): batch decode rows past the allowance wait that step with
    #: their KV kept, taken in turn.
    batch_step_overhead: float = _knob(
        0.0,
        tunable="live",
        searchable=False,
        minimum=0.0,
        maximum=1.0,
        help="While interactive work is in a step, the most time (a share of that work's own, by the "
        "engine's measured step times) batch work may add to it (0: off; on a CPU 0.05 put interactive "
        "TPOT p95 at 1.07-1.19x, 0.1 at 1.19-1.29x: docs/batches.md).",
    )
    torch_threads: int | None = _knob(
        None,
        tunable="restart",
        help="torch intra-op threads; 0 keeps torch's default.",
        minimum=0,
        maximum=512,
        searchable=False,
        tunable_none=0,
    )
    seed: int = _knob(0, setting=True)
    model_name: str | None = None
    allow_download: bool = False
    #: Speculative decoding: None (off) or a proposer name: "ngram" (prompt lookup), "draft"
    #: (a draft model) or one a plugin registers; the engine checks the name against its proposers.
    speculative: str | None = None
    num_speculative_tokens: int = 4  # the most tokens proposed per decode (adaptive k stays in [1, this])
    draft_model: str | None = None  # local HF folder of the draft model (same tokenizer)
    #: No proposals while this many sequences or more are running (0: never): at larger batches the
    #: verify forward of k + 1 tokens per sequence costs more than the accepted tokens save
    #: (vLLM's speculative_disable_by_batch_size).
    speculative_disable_by_batch_size: int = 0
    #: KV-cache storage: "auto" (the model dtype), "bfloat16" (half a float32 model's KV bytes,
    #: values rounded; llama.cpp keeps float16 by default) or "int8" (per-token-per-head scales).
    kv_cache_dtype: str = "auto"
    #: Sink + window eviction (0 = off): keep the first ``kv_sink_tokens`` and the
    #: last ``kv_window_tokens`` tokens of long sequences in the cache.
    kv_sink_tokens: int = 0
    kv_window_tokens: int = 0
    #: Decode attention: "auto" (the compiled paged kernel of tokenops.engine.kernels.native
    #: when it builds and the cache is float32/bfloat16 on CPU, else PyTorch),
    #: "native" (that kernel or an error) or "torch" (gather + SDPA).
    attention_backend: str = _knob(
        "auto",
        tunable="restart",
        choices=("auto", "native", "torch"),
        searchable=False,
        help="Decode attention: compiled paged kernel (native), gather + SDPA (torch), "
        "or native when it builds (auto).",
    )
    #: Linear layers on CPU: "auto" (the fused decode step's packed weights when that step is on,
    #: else oneDNN with weights prepacked at load for float32 models; see
    #: tokenops/engine/kernels/weight_layout.py), "panels" or "onednn" (that or an error) or "plain" (F.linear).
    weight_layout: str = _knob(
        "auto",
        tunable="restart",
        choices=("auto", "panels", "onednn", "plain"),
        searchable=False,
        help="Linear layers on CPU: the fused decode step's packed weights (panels), oneDNN "
        "with prepacked weights (onednn), F.linear (plain), or the first of panels and "
        "onednn that applies (auto).",
    )
    #: Engine steps (decodes, prefill chunks, verify chunks; up to 2048 tokens): "auto" (one native call for the whole
    #: step on CPU for float32 dense models, see tokenops/engine/kernels/fused_decode.py; it packs its own copy of
    #: the linear weights, made only while that is <= 512 MiB, which weight_layout "auto" then uses for
    #: every linear layer), "native" (that or an error) or "torch".
    decode_kernel: str = _knob(
        "auto",
        tunable="restart",
        choices=("auto", "native", "torch"),
        searchable=False,
        help="Engine steps of up to 2048 tokens (decodes, prefill, verify chunks): one native call "
        "per step (native), the PyTorch forward (torch), or native for float32 models "
        "on CPU whose weights are <= 512 MiB (auto).",
    )
    #: The fused decode step's copy of the linear weights (and so, under weight_layout "auto", every
    #: linear layer's): "float32", or "bfloat16": half the bytes each decode step streams, the weights
    #: rounded to bfloat16 (the model's numbers change; greedy output can differ from HF's).
    panel_dtype: str = _knob(
        "float32",
        tunable="restart",
        choices=("float32", "bfloat16"),
        searchable=False,
        help="Weights of the fused decode step: float32, or bfloat16 (half the memory traffic, rounded weights).",
    )
    #: panel_dtype of a speculative draft model (speculative = "draft"): its proposals are verified by
    #: the target, so rounding its weights changes how many are accepted, never the output. bfloat16
    #: halves what each draft step reads (measured in docs/engine-optimizations.md).
    draft_panel_dtype: str = "bfloat16"
    #: KV offload tier (all 0 = off): evicted prefix-cache blocks go to host memory
    #: (``*_blocks`` wins over ``*_mb``), overflowing to disk; see offload_index.py.
    kv_offload_host_mb: float = 0.0
    kv_offload_host_blocks: int = 0
    kv_offload_disk_mb: float = 0.0
    kv_offload_disk_blocks: int = 0
    kv_offload_disk_path: str | None = None  # None: a temporary folder
    # The native kernels' switches (tokenops/engine/kernels/switches.py): defaults from the environment,
    # read here, when the config is made; the model runner hands them to the kernels.
    native_kernels: bool = field(default_factory=lambda: env_flag("TOKENOPS_NATIVE_ATTENTION", True))
    quant_exact: bool = field(default_factory=lambda: env_flag("TOKENOPS_QUANT_EXACT", False))
    quant_avx512: bool = field(default_factory=lambda: env_flag("TOKENOPS_QUANT_AVX512", True))
    quant_amx: bool = field(default_factory=lambda: env_flag("TOKENOPS_QUANT_AMX", True))
    quant_amx_min_rows: int = field(default_factory=lambda: env_int("TOKENOPS_QUANT_AMX_MIN_ROWS", 0))
    #: bytes per activation value in the quantized integer products: 2, or 1 as llama.cpp (kernels/switches.py)
    quant_act_bytes: int = field(default_factory=lambda: env_int("TOKENOPS_QUANT_ACT_BYTES", 1))
    #: the C libraries' target: "native" (this CPU) or "avx2" (a Haswell-class CPU: no AVX-512, VNNI or AMX)
    cpu_isa: str = field(default_factory=env_isa)

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
        if not isinstance(self.priority_classes, bool):
            raise ValueError("engine priority_classes must be true or false")
        share = self.batch_max_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ValueError(f"engine batch_max_share must be a number in [0, 1], not {share!r}")
        _check_int("batch_step_tokens", self.batch_step_tokens, 0)
        overhead = self.batch_step_overhead
        if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 <= overhead <= 1:
            raise ValueError(f"engine batch_step_overhead must be a number in [0, 1], not {overhead!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError("engine enable_prefix_caching must be true or false")
        _check_int("seed", self.seed, None)
        if self.speculative is not None and (not isinstance(self.speculative, str) or not self.speculative):
            raise ValueError(
                f"engine speculative must be a proposer name such as 'ngram' or 'draft', or unset, "
                f"not {self.speculative!r}"
            )
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        _check_int("speculative_disable_by_batch_size", self.speculative_disable_by_batch_size, 0)
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("engine speculative = 'draft' needs draft_model (a local model folder)")
        if self.kv_cache_dtype not in ("auto", "bfloat16", "int8"):
            raise ValueError(f"engine kv_cache_dtype must be 'auto', 'bfloat16' or 'int8', not {self.kv_cache_dtype!r}")
        if self.attention_backend not in ("auto", "native", "torch"):
            raise ValueError(
                f"engine attention_backend must be 'auto', 'native' or 'torch', not {self.attention_backend!r}"
            )
        if self.decode_kernel not in ("auto", "native", "torch"):
            raise ValueError(f"engine decode_kernel must be 'auto', 'native' or 'torch', not {self.decode_kernel!r}")
        for name in ("panel_dtype", "draft_panel_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                raise ValueError(f"engine {name} must be 'float32' or 'bfloat16', not {getattr(self, name)!r}")
        if self.weight_layout not in ("auto", "panels", "onednn", "plain"):
            raise ValueError(
                f"engine weight_layout must be 'auto', 'panels', 'onednn' or 'plain', not {self.weight_layout!r}"
            )
        _check_int("kv_sink_tokens", self.kv_sink_tokens, 0)
        _check_int("kv_window_tokens", self.kv_window_tokens, 0)
        if self.kv_window_tokens and self.kv_window_tokens < 2 * self.block_size:
            raise ValueError(f"engine kv_window_tokens must be 0 (off) or >= 2 blocks ({2 * self.block_size})")
        if self.kv_window_tokens and self.speculative == "draft":
            raise ValueError("engine kv_window_tokens (sink + window eviction) does not work with the draft proposer")
        for name in ("native_kernels", "quant_exact", "quant_avx512", "quant_amx"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"engine {name} must be true or false, not {getattr(self, name)!r}")
        _check_int("quant_amx_min_rows", self.quant_amx_min_rows, 0)
        if self.quant_act_bytes not in (1, 2):
            raise ValueError(
                f"engine quant_act_bytes (default from TOKENOPS_QUANT_ACT_BYTES) must be 1 or 2, not {self.quant_act_bytes!r}"
            )
        if self.cpu_isa not in CPU_ISAS:
            raise ValueError(
                f"engine cpu_isa (default from TOKENOPS_CPU) must be one of {', '.join(map(repr, CPU_ISAS))}, "
                f"not {self.cpu_isa!r}"
            )
        _check_offload(self)

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @classmethod
    def from_settings(cls, engine_settings: Any, **overrides: Any) -> EngineConfig:
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
        raise ValueError(
            "engine kv_offload (KV offload tier) does not work with the draft proposer (its cache is not offloaded)"
        )


def _check_int(name: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"engine {name} must be an integer, not {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"engine {name} must be >= {minimum}, got {value}")


def setting_fields() -> list[Field]:
    """The fields that are ``[engine]`` settings (the others are set per model)."""
    return [f for f in fields(EngineConfig) if f.metadata.get("setting")]


def tunable_names(kind: str | None = None) -> tuple[str, ...]:
    """Names (without ``engine.``) of the tunable fields; ``kind`` "live" or "restart" filters."""
    return tuple(
        f.name for f in fields(EngineConfig) if f.metadata.get("tunable") and kind in (None, f.metadata["tunable"])
    )


def engine_tunables(schedule_orders: Iterable[str] = ()) -> list[Any]:
    """The engine's :class:`tokenops.tunables.Tunable` s, generated from the field metadata;
    ``schedule_orders`` are queue-order names beyond the built-ins that ``engine.schedule_policy``
    also accepts (the ones plugins register)."""
    from tokenops.tunables import Tunable

    out = []
    for f in fields(EngineConfig):
        meta = f.metadata
        if not meta.get("tunable"):
            continue
        assert f.default is not MISSING
        default = meta.get("tunable_none") if f.default is None else f.default
        live = meta["tunable"] == "live"
        extra = {k: meta[k] for k in ("minimum", "maximum", "choices", "log", "searchable") if k in meta}
        if f.name == "schedule_policy":
            extra["choices"] = (*extra["choices"], *sorted(set(schedule_orders) - set(extra["choices"])))
        out.append(
            Tunable(
                f"engine.{f.name}",
                type(default).__name__,
                default,
                meta["help"] if live else meta["help"].rstrip(".") + " (restart).",
                live=live,
                **extra,
            )
        )
    return out
