"""How long the native step's OpenMP threads spin at a barrier before they sleep, set for the ``tokenops``
command before torch (and with it libgomp) loads.

The fused step (``fused_decode.py``) passes ~425 barriers per decoded token of SmolLM2-135M (every
``omp for`` of 30 layers and of the quantized products ends with one). libgomp lets a thread that waits
at a barrier spin ``GOMP_SPINCOUNT`` times (default 300,000 ``pause`` instructions, ~15 ms on this
project's Xeon) before it sleeps on a futex — or only 100 (~5 us) while the process holds more OpenMP
threads than CPUs ("throttled"). Two measured facts set the default here (issue 35,
``tests/benchmarks/decode_overhead.py --async-engine``, batch-1 decode of the SmolLM2 Q4_1 GGUF, 2 threads):

- ``tokenops serve`` used to load the model on one thread and step it on another, two OpenMP pools on
  2 CPUs, so libgomp throttled every barrier: ~90 tok/s, against ~150 with the engine built and stepped
  on one thread (:meth:`AsyncLLMEngine.build_on_engine_thread`, what serve does now: unthrottled);
- unthrottled, libgomp's default spin collapses as soon as another process wants a core (a training
  job on one core: 8 tok/s; llama.cpp's spinning threads do the same), because a spinning thread holds
  the CPU its late partner needs. A bounded spin keeps most of the quiet-box speed and degrades
  gracefully instead: with that training job, 100 spins 84 tok/s, 300 74, 1,000 62, 300,000 8.3.

So the command sets ``GOMP_SPINCOUNT`` to :data:`DEFAULT_SPINS` unless ``TOKENOPS_OMP_SPIN=N`` says
otherwise (``0``: leave libgomp's own default) or the user set ``GOMP_SPINCOUNT`` or
``OMP_WAIT_POLICY`` themselves (theirs win). libgomp reads them once, when it is loaded, so the CLI calls
:func:`apply_spin_setting` before any command imports torch. Code that imports tokenops as a library
(the test suite's in-process engines) keeps libgomp's default.
"""

from __future__ import annotations

import os
import sys

#: The environment variable that sets the spin (iterations of ``pause``, ~50 ns each on the project's Xeon).
SPIN_ENV = "TOKENOPS_OMP_SPIN"
#: The ``tokenops`` command's barrier spin when ``TOKENOPS_OMP_SPIN`` is unset (~50 us).
DEFAULT_SPINS = 1000


def apply_spin_setting(environ: dict[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` in ``environ`` (the process's environment by default; another dict: a
    child process's) to ``TOKENOPS_OMP_SPIN`` or :data:`DEFAULT_SPINS`, unless that is 0, the user set
    ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``, or, for this process, torch (and with it libgomp) is loaded
    already. Returns whether it set it; raises ValueError on a value that is not an integer >= 0."""
    env = os.environ if environ is None else environ
    raw = env.get(SPIN_ENV, "").strip()
    if raw and not raw.isdigit():
        raise ValueError(f"{SPIN_ENV} must be a whole number of spins (0: libgomp's default), not {raw!r}")
    spins = int(raw) if raw else DEFAULT_SPINS
    if spins == 0 or (environ is None and "torch" in sys.modules):
        return False
    if env.get("OMP_WAIT_POLICY") or env.get("GOMP_SPINCOUNT"):
        return False
    env["GOMP_SPINCOUNT"] = str(spins)
    if environ is None:
        global _set_for_this_process
        _set_for_this_process = True
    return True


#: Whether :func:`apply_spin_setting` set ``GOMP_SPINCOUNT`` in this process's environment (not the user).
_set_for_this_process = False


def environ_for_other_programs() -> dict[str, str]:
    """This process's environment for a program that is not tokenops (vLLM, llama.cpp's server, SGLang,
    which ``tokenops tune`` launches): without the ``GOMP_SPINCOUNT`` the command set for tokenops' own
    engine, so a peer's OpenMP pool waits as it would when launched by hand. A value the user set stays."""
    env = dict(os.environ)
    if _set_for_this_process and env.get("GOMP_SPINCOUNT") == _spins_set():
        env.pop("GOMP_SPINCOUNT")
    return env


def _spins_set() -> str:
    raw = os.environ.get(SPIN_ENV, "").strip()
    return raw if raw else str(DEFAULT_SPINS)
