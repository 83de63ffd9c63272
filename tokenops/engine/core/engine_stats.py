"""What an engine reports and how it takes live tunables: the bodies of ``LLMEngine.stats`` and
``LLMEngine.apply_tunables``, kept apart from the step loop of :mod:`tokenops.engine.core.engine`."""

from __future__ import annotations

from typing import Any, Protocol

from tokenops.engine.core.config import EngineConfig, engine_tunables
from tokenops.engine.core.policies import EnginePolicies
from tokenops.engine.core.scheduler import Scheduler


class LLMEngine(Protocol):
    """What these functions read of :class:`tokenops.engine.core.engine.LLMEngine`, which imports this module
    (so it is named by its shape, not imported): a renamed counter fails the type check here instead of
    turning into an ``AttributeError`` on ``/admin/stats``. Read-only, as the functions only read it
    (tunables change ``config``'s fields, never the engine's attributes)."""

    @property
    def config(self) -> EngineConfig: ...
    @property
    def runner(self) -> Any: ...  # a ModelRunner, or a test's stand-in: read through getattr where optional
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def policies(self) -> EnginePolicies: ...
    @property
    def model_name(self) -> str: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def last_step_time_s(self) -> float: ...
    @property
    def last_batch_tokens(self) -> int: ...
    @property
    def total_prompt_tokens(self) -> int: ...
    @property
    def total_generation_tokens(self) -> int: ...
    @property
    def spec_decoder(self) -> Any: ...  # a SpecDecoder or None
    @property
    def kv_policy(self) -> Any: ...  # a KV policy or None


def run_settings(engine: LLMEngine) -> dict[str, Any]:
    """How this engine runs its model, as configured and loaded (not the registry's defaults)."""
    runner, config = engine.runner, engine.config
    kv = config.kv_cache_dtype
    return {
        "weight_encoding": getattr(runner, "weight_encoding", None),
        "kv_dtype": str(getattr(runner, "dtype", config.dtype)).removeprefix("torch.") if kv == "auto" else kv,
        "speculative": config.speculative or "off",
        "compiled": bool(getattr(runner, "is_compiled", False)),
        "cpu_isa": getattr(config, "cpu_isa", "native"),  # the C kernels' target (TOKENOPS_CPU)
    }


def engine_stats(engine: LLMEngine) -> dict[str, Any]:
    """The engine's counters and how it runs its model (``LLMEngine.stats``)."""
    from tokenops.engine.kernels.quant_kernels import loaded_isa

    bm = engine.scheduler.block_manager
    expert_load = getattr(engine.runner, "expert_load", None)
    return {
        "model": engine.model_name,
        "num_running": engine.scheduler.num_running,
        "num_waiting": engine.scheduler.num_waiting,
        "kv_blocks_used": bm.num_used_blocks,
        "kv_blocks_total": bm.num_blocks,
        "kv_cache_usage": bm.num_used_blocks / bm.num_blocks,
        "prefix_cache_queries": bm.num_prefix_queries,
        "prefix_cache_hits": bm.num_prefix_hits,
        "num_preemptions": engine.scheduler.num_preemptions,
        # priority classes: of the counts above, the batch sequences (Batch API lines)
        "num_running_batch": engine.scheduler.num_running_batch,
        "num_waiting_batch": engine.scheduler.num_waiting_batch,
        "num_batch_preemptions": engine.scheduler.num_batch_preemptions,
        "last_step_time_s": engine.last_step_time_s,
        "last_batch_tokens": engine.last_batch_tokens,
        "total_prompt_tokens": engine.total_prompt_tokens,
        "total_generation_tokens": engine.total_generation_tokens,
        "num_steps": engine.num_steps,
        # seconds in steps, in all and with interactive work in them, and the step-time fit (seconds:
        # fixed, per decode row, per prompt token) that sizes batch work beside interactive work
        "busy_s": engine.scheduler.step_cost.busy_s,
        "interactive_busy_s": engine.scheduler.step_cost.interactive_busy_s,
        "step_cost": list(engine.scheduler.step_cost.coefficients()),
        "decode_steps": engine.scheduler.step_cost.decode_steps(),  # measured: "k+b" rows -> seconds
        "expert_load": expert_load() if callable(expert_load) else None,
        **({"spec_decode": _spec_decode_stats(engine.spec_decoder)} if engine.spec_decoder is not None else {}),
        **(
            {"fused_decode_steps": engine.runner.num_fused_steps, "panel_dtype": engine.runner.fused_decode.panel_dtype}
            if getattr(engine.runner, "fused_decode", None) is not None
            else {}
        ),
        **run_settings(engine),
        # GGUF weights kept quantized: the fused step runs them through the quantized kernels when it
        # can (panel_dtype "gguf"), else the PyTorch forward
        **(
            {
                "weight_format": engine.runner.weight_format,
                "forward": "fused" if getattr(engine.runner, "fused_decode", None) is not None else "torch",
                "quant_kernels": loaded_isa(),  # the instruction set the quantized products run on
            }
            if getattr(engine.runner, "weight_format", None)
            else {}
        ),
        **(
            {"lora": engine.runner.lora.stats()}
            if getattr(engine.runner, "lora", None) is not None and engine.runner.lora.adapters
            else {}
        ),
        **({"kv_policy_evicted_blocks": bm.num_policy_evictions} if engine.kv_policy is not None else {}),
        **({"kv_offload": {**bm.offload.stats(), "hit_tokens": bm.num_offload_hits}} if bm.offload is not None else {}),
    }


def apply_engine_tunables(engine: LLMEngine, values: dict[str, Any]) -> dict[str, Any]:
    """Apply live engine tunables (names with or without ``engine.``); returns them
    as ``{"engine.<name>": value}``. Nothing is applied if any name or value is bad."""
    from tokenops.tunables import TunableError

    tunables = {t.name: t for t in engine_tunables()}  # the EngineConfig field metadata
    live = [name.removeprefix("engine.") for name, t in tunables.items() if t.live]
    applied: dict[str, Any] = {}
    for name, value in values.items():
        tunable = tunables.get(f"engine.{name.removeprefix('engine.')}")
        if tunable is None:
            raise TunableError(f"unknown engine tunable {name!r}; live ones: {', '.join(live)}")
        if not tunable.live:
            raise TunableError(f"{tunable.name} needs an engine restart; set it in tokenops.toml [engine]")
        if tunable.name == "engine.schedule_policy":  # any order this engine has, not only the built-in choices
            engine.policies.schedule_order(str(value), TunableError)
            applied[tunable.name] = str(value)
            continue
        applied[tunable.name] = tunable.validate(value)
    for name, value in applied.items():
        setattr(engine.config, name.removeprefix("engine."), value)
    return applied


def _spec_decode_stats(decoder: Any) -> dict[str, Any]:
    """The speculative counters, with the proposer's own under ``proposer`` when it keeps some
    (an optional ``stats()`` method, e.g. the suffix proposer's proposals per source)."""
    stats = decoder.stats.as_dict()
    proposer_stats = getattr(decoder.proposer, "stats", None)
    if callable(proposer_stats):
        stats["proposer"] = proposer_stats()
    return stats
