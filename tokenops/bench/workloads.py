"""The workload registry.

A workload is a factory registered through ``tokenops_register_workloads``:
``factory(num_requests=..., seed=..., **options)`` returns a list of
:class:`BenchRequest`. Factories ignore options that are not theirs, so one
option set (the CLI's) can be passed to any workload. The plugin manager's registrations are
passed in by the callers above it (the CLI, the tuner); without them the built-ins serve.
"""

from __future__ import annotations

from typing import Any

from tokenops.bench.request import BenchRequest, WorkloadError, WorkloadFactory

__all__ = ["BenchRequest", "WorkloadError", "WorkloadFactory", "build_workload", "builtin_workloads", "get_workloads"]


def builtin_workloads() -> dict[str, WorkloadFactory]:
    """The workloads tokenops ships, with no plugin behind them (the ``workloads`` plugin
    registers these same ones through the hook)."""
    from tokenops.bench import filedata, replay, sharegpt, synthetic

    return {
        "synthetic": synthetic.synthetic,
        "shared-prefix": synthetic.shared_prefix,
        "sharegpt": sharegpt.sharegpt,
        "sharegpt-multiturn": sharegpt.sharegpt_multiturn,
        "replay": replay.replay,
        "file": filedata.file_workload,
    }


def get_workloads(registered: dict[str, WorkloadFactory] | None = None) -> dict[str, WorkloadFactory]:
    """Every workload by name: ``registered`` (what the plugins register, passed in by the CLI and
    the tuner from ``tokenops.plugin_manager.get_workloads``), else :func:`builtin_workloads`."""
    return dict(registered) if registered is not None else builtin_workloads()


def build_workload(
    name: str, num_requests: int, seed: int = 0, *, registered: dict[str, WorkloadFactory] | None = None, **options: Any
) -> list[BenchRequest]:
    """Build ``num_requests`` requests of workload ``name`` (from ``registered``, see :func:`get_workloads`)."""
    if num_requests < 1:
        raise WorkloadError(f"--num-requests must be >= 1, got {num_requests}")
    workloads = get_workloads(registered)
    if name not in workloads:
        raise WorkloadError(f"unknown workload {name!r}; available: {', '.join(sorted(workloads)) or 'none'}")
    requests = workloads[name](num_requests=num_requests, seed=seed, **options)
    if not requests:
        raise WorkloadError(f"workload {name!r} produced no requests")
    return list(requests)
