"""How long the native step's OpenMP threads spin at a barrier before they sleep.

The fused step (``fused_decode.py``) passes ~425 barriers per decoded token of SmolLM2-135M (every
``omp for`` of 30 layers and of the quantized products ends with one). libgomp lets a thread that waits
at a barrier spin ``GOMP_SPINCOUNT`` times (default 300,000 ``pause`` instructions, ~15 ms on this
project's Xeon) and then sleep on a futex, but only while the process has no more OpenMP threads than
CPUs. ``tokenops serve`` has more: the main thread's pool (torch ran parallel operators there while the
model loaded) plus the engine thread's own, so libgomp "throttles" the spin to 100 iterations (~5 us)
and every barrier where one thread arrives a little late costs a futex sleep and a wake-up. At batch 1
that was ~4 ms of a 11 ms token: 425 voluntary context switches per token on the engine thread against
~85 for the same step run from the main thread (``tests/benchmarks/decode_overhead.py``).

``GOMP_SPINCOUNT`` alone does not lift the throttled count (libgomp caps it at 100 unless
``OMP_WAIT_POLICY=active``, then at 1000). :func:`prefer_short_spin` sets both, to a bounded spin of
:data:`SPIN_COUNT` (~50 us): long enough to cover the imbalance of a barrier on a quiet box, short
enough that a thread whose partner lost its core (a loaded box) soon sleeps instead of burning its
time slice (libgomp's default 300,000 collapses there: 0.5 tok/s at load 15 on 2 cores). libgomp
reads them once, when it is loaded (torch loads it), so this must run before torch is imported;
``tokenops serve`` calls it first thing. A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` wins.
"""

from __future__ import annotations

import os
import sys

#: Spins (``pause`` instructions, ~50 ns each on the project's Xeon) before a waiting thread sleeps.
SPIN_COUNT = 1000


def prefer_short_spin(environ: dict[str, str] | None = None) -> bool:
    """Set ``OMP_WAIT_POLICY=active`` and ``GOMP_SPINCOUNT=SPIN_COUNT`` in ``environ`` (the process's
    environment by default; another dict: a child process's) unless the user set either, or, for this
    process, torch (and with it libgomp) is loaded already; returns whether it set them."""
    env = os.environ if environ is None else environ
    if (environ is None and "torch" in sys.modules) or env.get("OMP_WAIT_POLICY") or env.get("GOMP_SPINCOUNT"):
        return False
    env["OMP_WAIT_POLICY"] = "active"
    env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True
