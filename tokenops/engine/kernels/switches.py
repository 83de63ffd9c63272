"""The native kernels' switches: settings of the engine (``EngineConfig`` fields), handed to the kernels
when a model runner is built, never read from the environment by the kernels.

- ``native_kernels`` (default from ``TOKENOPS_NATIVE_ATTENTION``): off, no C kernel runs (paged attention,
  fused step, quantized products): the PyTorch paths;
- ``quant_exact`` (``TOKENOPS_QUANT_EXACT``): quantized products on float32 activations;
- ``quant_avx512`` (``TOKENOPS_QUANT_AVX512``): off, the 256-bit packed kernels;
- ``quant_amx`` (``TOKENOPS_QUANT_AMX``): off, no AMX tiles;
- ``quant_amx_min_rows`` (``TOKENOPS_QUANT_AMX_MIN_ROWS``): the fewest rows on the tiles (0: the build's 3);
- ``quant_act_bytes`` (``TOKENOPS_QUANT_ACT_BYTES``): bytes per activation value in the integer products, 1
  (the default, llama.cpp's one byte: half the integer work, ~7e-3 of the largest output) or 2 (``q d + q2 d2``,
  ~3e-5; perplexity moves under 0.1% between them on the registry's files);
- ``cpu_isa`` (``TOKENOPS_CPU``): ``"native"`` builds the C libraries for this CPU (``-march=native``),
  ``"avx2"`` for a Haswell-class one (``-march=haswell``: AVX2 + FMA + F16C, no AVX-512, no VNNI, no AMX;
  its own cache entry), so the kernels run as they would on such a machine: the packed products take the
  AVX2 ``maddubs`` path. PyTorch's own kernels follow only the environment variable, read before torch is
  imported (:func:`limit_torch_isa`, called by the CLI): ``ATEN_CPU_CAPABILITY=avx2`` and
  ``ONEDNN_MAX_CPU_ISA=AVX2``.

The environment is read when an ``EngineConfig`` is made (its fields' defaults), once per config.
The switches are process-wide (the libraries are loaded once per process): :func:`apply` sets
:data:`current` and passes it to every loaded library (``qk_set_avx512``, ``qk_set_amx``,
``qk_set_amx_min_rows`` of ``csrc/quant.h``); a library loaded later gets it at load
(:func:`register`). The hot paths read :data:`current`, a frozen dataclass: no environment lookups.
Models served by one process should share their switches: a runner whose step finds another runner's
in force applies its own again (the products give the same floats on either SIMD path, but
``quant_exact`` and ``native_kernels`` change what a step computes).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """``name`` from the environment as a boolean (unset or unreadable: ``default``)."""
    value = (os.environ if environ is None else environ).get(name, "").strip().lower()
    return False if value in _OFF else True if value in _ON else default


def env_isa(environ: Mapping[str, str] | None = None) -> str:
    """``TOKENOPS_CPU`` (lower case; unset or empty: ``"native"``); the config checks it is one of :data:`CPU_ISAS`."""
    return (os.environ if environ is None else environ).get("TOKENOPS_CPU", "").strip().lower() or "native"


#: the values of ``cpu_isa``: the compiler's target for the C libraries
CPU_ISAS = ("native", "avx2")
#: what PyTorch is told for each ``cpu_isa`` (environment variables it reads once, at its first use)
TORCH_ISA_ENV: dict[str, dict[str, str]] = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def limit_torch_isa(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Hold PyTorch's own kernels to ``TOKENOPS_CPU``'s instruction set (``avx2``: no AVX-512 in ATen or
    oneDNN either) by setting the variables it reads, unless already set; call before torch is imported.
    Returns what it set."""
    env = os.environ if environ is None else environ
    wanted = TORCH_ISA_ENV.get(env_isa(env), {})
    added = {name: value for name, value in wanted.items() if name not in env}
    env.update(added)
    return added


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """``name`` from the environment as a positive integer (else ``default``)."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else default


@dataclass(frozen=True, slots=True)
class KernelSwitches:
    native_kernels: bool = True
    quant_exact: bool = False
    quant_avx512: bool = True
    quant_amx: bool = True
    quant_amx_min_rows: int = 0
    cpu_isa: str = "native"
    quant_act_bytes: int = 1

    @classmethod
    def of(cls, config: Any) -> KernelSwitches:
        """The switches an engine config carries (a field it lacks keeps :data:`current`'s value)."""
        return cls(**{name: getattr(config, name, getattr(current, name)) for name in cls.__slots__})


#: what the kernels run with now (the built-in defaults until an engine is built)
current = KernelSwitches()
_lock = threading.Lock()
_libraries: list[ctypes.CDLL] = []  # loaded libraries with the quantized kernels' switches


def _push(lib: ctypes.CDLL, switches: KernelSwitches) -> None:
    lib.qk_set_avx512(int(switches.quant_avx512))
    lib.qk_set_amx(int(switches.quant_amx))
    lib.qk_set_amx_min_rows(int(switches.quant_amx_min_rows))
    lib.qk_set_act_bytes(int(switches.quant_act_bytes))


def register(lib: ctypes.CDLL) -> None:
    """A library with the quantized kernels was loaded: it gets the current switches, and later ones."""
    with _lock:
        _libraries.append(lib)
        _push(lib, current)


def apply(switches: KernelSwitches) -> None:
    """Make ``switches`` the current ones, in every loaded library too. Not while a product runs."""
    global current
    with _lock:
        current = switches
        for lib in _libraries:
            _push(lib, switches)
