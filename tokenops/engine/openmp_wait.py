"""An opt-in bound on how long the native step's OpenMP threads spin at a barrier before they sleep.

The fused step (``fused_decode.py``) passes ~425 barriers per decoded token of SmolLM2-135M (every
``omp for`` of 30 layers and of the quantized products ends with one). libgomp lets a thread that waits
at a barrier spin ``GOMP_SPINCOUNT`` times (default 300,000 ``pause`` instructions, ~15 ms on this
project's Xeon) and then sleep on a futex, but only while the process has no more OpenMP threads than
CPUs. ``tokenops serve`` has more (the main thread's pool, made while the model loaded, plus the engine
thread's own), so libgomp "throttles" the spin to 100 iterations (~5 us): every barrier where one thread
arrives a little late costs a futex sleep and a wake-up. Measured with
``tests/benchmarks/decode_overhead.py``: 425 voluntary context switches per token when the engine
thread runs the step, ~85 when the main thread does (unthrottled), and on a quiet box (load 0.6) the
main thread's in-process decode ran at 142 tok/s against 89 tok/s through :class:`AsyncLLMEngine`
(load 1.4-2.7) — but spinning is what collapses on a busy box (0.5 tok/s at load 15 from the main
thread), and a bounded spin of 1,000 (~50 us, libgomp's cap for throttled threads) lost on the shared
box at load 4-6: batch-1 55-57 tok/s against 79-80 with libgomp's default (docs/engine-optimizations.md).

So it is off by default: ``TOKENOPS_OMP_SPIN=N`` makes the ``tokenops`` command (``serve`` and the rest) set ``OMP_WAIT_POLICY=active``
and ``GOMP_SPINCOUNT=N`` (``GOMP_SPINCOUNT`` alone does not lift the throttled count: libgomp caps it at
100 unless the wait policy is active, then at 1,000). libgomp reads them once, when it is loaded (torch
loads it), so the CLI applies this before any command imports torch. A user's own ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` wins.
"""

from __future__ import annotations

import os
import sys

#: The environment variable that asks for the bounded spin (spins, ~50 ns each on the project's Xeon).
SPIN_ENV = "TOKENOPS_OMP_SPIN"


def apply_spin_setting(environ: dict[str, str] | None = None) -> bool:
    """When ``TOKENOPS_OMP_SPIN`` is a positive integer N, set ``OMP_WAIT_POLICY=active`` and
    ``GOMP_SPINCOUNT=N`` in ``environ`` (the process's environment by default; another dict: a child
    process's) unless the user set either, or, for this process, torch (and with it libgomp) is loaded
    already. Returns whether it set them; raises ValueError on a value that is not an integer >= 0."""
    env = os.environ if environ is None else environ
    raw = env.get(SPIN_ENV, "").strip()
    if not raw:
        return False
    if not raw.isdigit():
        raise ValueError(f"{SPIN_ENV} must be a whole number of spins (0: libgomp's default), not {raw!r}")
    spins = int(raw)
    if spins == 0 or (environ is None and "torch" in sys.modules):
        return False
    if env.get("OMP_WAIT_POLICY") or env.get("GOMP_SPINCOUNT"):
        return False
    env["OMP_WAIT_POLICY"] = "active"
    env["GOMP_SPINCOUNT"] = str(spins)
    return True
