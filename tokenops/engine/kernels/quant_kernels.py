"""Linear layers straight from GGUF block encodings: ``y = x @ dequantize(W).T`` without ever holding
``W`` in float32.

Batch-1 decode on a CPU is bound by the bytes of weights it reads per token. A Q4_1 layer is 5 bits a
weight, a sixth of float32, so a kernel that multiplies the blocks where they lie reads a sixth of the
bytes. Two paths, picked by the number of rows:

* **GEMV** (up to :data:`GEMV_MAX_ROWS` rows: decode and verify steps; every row count for weights
  repacked by :func:`pack`). The activations are rounded to two bytes per value (per block of 32,
  ``q d + q2 d2``: an int8 code and an int8 remainder on a 254x finer scale) and multiplied against
  the weight blocks with integer byte products (AVX2 ``maddubs``, or AVX-VNNI ``dpbusd``; on weights
  packed by :func:`pack`, 512-bit ``vpdpbusd`` over two row groups where the CPU has AVX-512 VNNI,
  checked at run time, ``quant_avx512 = False`` to keep the 256-bit kernels), as
  llama.cpp does with one byte; up to four rows share each unpacked weight block. The error is
  ~3e-5 of the largest output (one byte, llama.cpp's Q8 activations: ~7e-3, enough to flip
  near-tied greedy tokens of a real model).
* **GEMM** (more rows of a weight in GGUF's layout: prefill chunks, batched decode). A panel of
  weight rows is decoded to float32 once into an L2-sized tile and every row runs against it at the
  float32 FMA rate, so the decoding is paid once per call however many rows there are.

Both multiply the activations rounded the same way, so which path a row count picks does
not change a row's result beyond float32 rounding (a batched or speculative step yields the tokens
a single decode would). The engine's ``quant_exact`` (:attr:`Method.EXACT`) multiplies the float32
activations instead, through the GEMM: the products of a float32 reference, for parity checks
against another implementation.

The C source (``tokenops/engine/csrc/quant.c`` and its parts ``quant_*.c``, declared in ``quant.h``) is
compiled at first use by :func:`tokenops.engine.kernels.native.build_library` with ``-march=native``, into a
cache keyed by the sources and the CPU's feature flags, so the instructions used are the ones this CPU has (the
run-time check). A CPU without AVX2 gets the plain-C GEMM for every path (on rounded activations
but for ``EXACT``); ``TK_PLAIN`` builds that fallback on any CPU, and the tests run it. With no C
compiler (or with ``native_kernels`` off) :func:`linear` falls back to ``gguf``'s numpy decoder
and ``torch``'s matmul on the float32 activations.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tokenops.engine.kernels import switches
from tokenops.engine.kernels.c_header import bind, read

log = logging.getLogger(__name__)

SUPPORTED = frozenset(
    {
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
    }
)
GEMV_MAX_ROWS = 8
"""Up to this many rows of a weight in GGUF's layout take the integer GEMV, more take the GEMM. A packed
weight takes the integer path at every row count: four rows per pass over a group of eight weight
rows out-run the float32 GEMM (docs/engine-optimizations.md has the figures)."""


class Method(enum.IntEnum):
    """Which product :meth:`QuantKernels.linear` runs (the C side's ``method``). All but ``EXACT``
    compute one function, ``W @ round(x)`` (activations rounded to two bytes per block of 32), to
    float32 rounding, so a row's result does not depend on which path its batch's size picked."""

    AUTO = 0
    GEMV = 1  # integer products (VNNI where the CPU has it)
    GEMV_MADDUBS = 2  # the same without VNNI: AVX2 maddubs + madd
    EXACT = 3  # float32 panels on the float32 activations: W @ x to float32 rounding
    GEMM = 4  # float32 panels on the rounded activations


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight repacked by :meth:`QuantKernels.pack`: ``data`` is uint8 ``[ceil(out_features / 8),
    group_bytes]``, groups of eight rows interleaved (see ``csrc/quant_packed.c``, ``csrc/quant_packed_k.c``)."""

    data: torch.Tensor
    qtype: int
    in_features: int
    out_features: int


class QuantKernels:
    """The loaded library. ``plain`` builds are the no-SIMD fallback (every method is their GEMM)."""

    def __init__(self, path: Path, plain: bool = False) -> None:
        self.path, self.plain = path, plain
        self.lib = bind(ctypes.CDLL(str(path)), read("quant.h"))
        switches.register(self.lib)
        features = self.lib.qk_features()
        self.has_avx2, self.has_vnni = bool(features & 1), bool(features & 2)
        self.has_avx512 = bool(features & 4)
        self.has_amx = bool(features & 8)

    def set_avx512(self, on: bool | None) -> bool:
        """Use the 512-bit kernels for packed products (where the build and the CPU
        have AVX-512 VNNI) or the 256-bit ones (``None``: as the engine's ``quant_avx512`` says, see
        :mod:`tokenops.engine.kernels.switches`); returns whether the 512-bit ones are now used. This
        library only (the switches reach every library). Not while a product runs."""
        return bool(self.lib.qk_set_avx512(int(switches.current.quant_avx512 if on is None else on)))

    @property
    def avx512_active(self) -> bool:
        """Whether packed products run the 512-bit kernels."""
        return bool(self.lib.qk_avx512_active())

    def set_amx(self, on: bool | None) -> bool:
        """Use AMX tiles for packed products of :attr:`amx_min_rows` or more rows (Q8_0, Q4_0, Q4_1;
        where the build, the CPU and the OS allow them) or not (``None``: as the engine's ``quant_amx``
        says); returns whether they are now used. The same floats either way. This library only. Not
        while a product runs."""
        return bool(self.lib.qk_set_amx(int(switches.current.quant_amx if on is None else on)))

    def set_act_bytes(self, n: int | None) -> int:
        """Round the activations of the integer products to ``n`` bytes per value: 2 (``q d + q2 d2``, the
        default) or 1 (``q d``, llama.cpp's one byte with a scale per 32 values: half the integer work,
        ~7e-3 of the largest output instead of ~3e-5); ``None``: as the engine's ``quant_act_bytes`` says.
        Returns the bytes now. This library only (the switches reach every library). Not while a
        product runs."""
        return int(self.lib.qk_set_act_bytes(int(switches.current.quant_act_bytes if n is None else n)))

    @property
    def act_bytes(self) -> int:
        """Bytes per activation value in the integer products (:meth:`set_act_bytes`)."""
        return int(self.lib.qk_set_act_bytes(0))

    @property
    def amx_min_rows(self) -> int:
        """The fewest rows a packed product takes the tiles for (3, or the engine's ``quant_amx_min_rows``)."""
        return int(self.lib.qk_amx_min_rows())

    @property
    def amx_active(self) -> bool:
        """Whether packed products of :attr:`amx_min_rows` or more rows run on AMX tiles."""
        return bool(self.lib.qk_amx_active())

    @property
    def isa(self) -> str:
        """What packed products run on now: ``"avx512-vnni"``, ``"avx2-vnni"``, ``"avx2"`` (``+amx`` where
        tiles take the many-row products) or ``"plain"``; the engine stats show it as ``quant_kernels``."""
        if self.plain or not self.has_avx2:
            return "plain"
        name = "avx512-vnni" if self.avx512_active else "avx2-vnni" if self.has_vnni else "avx2"
        return name + "+amx" if self.amx_active else name

    def row_bytes(self, qtype: int, in_features: int) -> int:
        """Bytes of one encoded row of ``in_features`` values (ValueError if it cannot be encoded)."""
        values, nbytes = self.lib.qk_block_values(int(qtype)), self.lib.qk_block_bytes(int(qtype))
        if not values:
            raise ValueError(
                f"quantization type {qtype} has no kernel (supported: {', '.join(sorted(t.name for t in SUPPORTED))})"
            )
        if in_features % values:
            raise ValueError(f"in_features={in_features} is not a multiple of the {values}-value block of {qtype}")
        return in_features // values * nbytes

    def _check_raw(self, raw: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
        row_bytes = self.row_bytes(qtype, in_features)
        if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] != row_bytes:
            raise ValueError(f"raw must be uint8 [out_features, {row_bytes}], got {raw.dtype} {list(raw.shape)}")
        return raw.contiguous()

    def packed_bytes(self, qtype: int, out_features: int, in_features: int) -> int:
        """Bytes :meth:`pack` writes for this weight (0 for a type without a packed kernel)."""
        if not self.lib.qk_packable(int(qtype)):
            return 0
        return (out_features + 7) // 8 * self.group_bytes(qtype, in_features)

    def group_bytes(self, qtype: int, in_features: int) -> int:
        """Bytes of one packed group of eight rows: eight rows' bytes, and for Q4_K / Q5_K four more
        per row and super-block (their 6-bit scales and mins held a byte each)."""
        self.row_bytes(qtype, in_features)  # raises for a type or width without a kernel
        return int(self.lib.qk_group_bytes(int(qtype), in_features))

    def pack(
        self, raw: torch.Tensor, qtype: int, in_features: int, out: torch.Tensor | None = None
    ) -> PackedWeight | None:
        """``raw`` repacked into groups of eight interleaved rows, for a faster GEMV (``None`` for a
        type without a packed kernel: every type of :data:`SUPPORTED` has one). ``out``: contiguous uint8 of
        :meth:`packed_bytes` elements to pack into (a slice of one huge-page arena for a whole
        model: streaming ~100 MB per token through 4 KiB pages measured ~25% slower here)."""
        raw = self._check_raw(raw, qtype, in_features)
        if not self.lib.qk_packable(int(qtype)):
            return None
        out_features = raw.shape[0]
        shape = ((out_features + 7) // 8, self.group_bytes(qtype, in_features))
        if out is None:
            data = torch.empty(shape, dtype=torch.uint8)
        else:
            assert out.dtype == torch.uint8 and out.is_contiguous() and out.numel() == shape[0] * shape[1], out.shape
            data = out.view(shape)
        rc = self.lib.qk_pack(int(qtype), raw.data_ptr(), raw.shape[1], out_features, in_features, data.data_ptr())
        assert rc == 0, rc
        return PackedWeight(data, int(qtype), in_features, out_features)

    def unpack_rows(self, packed: PackedWeight, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (int64, any shape; all rows when None) of a packed weight as float32
        ``[*ids.shape, in_features]``: an embedding lookup, or the whole weight for a slow path."""
        if ids is None:
            ids = torch.arange(packed.out_features)
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= packed.out_features):
            raise IndexError(f"row ids out of range [0, {packed.out_features})")
        out = torch.empty(flat.numel(), packed.in_features, dtype=torch.float32)
        rc = self.lib.qk_unpack_rows(
            packed.qtype,
            packed.data.data_ptr(),
            packed.data.shape[1],
            flat.data_ptr(),
            flat.numel(),
            packed.in_features,
            out.data_ptr(),
        )
        assert rc == 0, rc
        return out.reshape(*ids.shape, packed.in_features)

    def linear(
        self,
        x: torch.Tensor,
        raw: torch.Tensor | None,
        qtype: int,
        in_features: int,
        method: Method = Method.AUTO,
        num_threads: int | None = None,
        packed: PackedWeight | None = None,
    ) -> torch.Tensor:
        """``x`` float32 ``[..., in_features]`` times the encoded weight transposed: float32
        ``[..., out_features]``. The weight is ``packed`` when given (``raw`` may then be ``None``),
        else ``raw``: uint8 ``[out_features, row_bytes]`` in GGUF's block layout."""
        if packed is not None:
            assert packed.qtype == int(qtype) and packed.in_features == in_features, "packed weight of another layer"
            weight, out_features, row_bytes = packed.data, packed.out_features, packed.data.shape[1]
        else:
            assert raw is not None, "linear needs raw or packed"
            weight = self._check_raw(raw, qtype, in_features)
            out_features, row_bytes = weight.shape
        if x.dtype != torch.float32 or x.shape[-1] != in_features:
            raise ValueError(f"x must be float32 [..., {in_features}], got {x.dtype} {list(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, in_features).contiguous()
        num_rows = x2.shape[0]
        y = torch.empty(num_rows, out_features, dtype=torch.float32)
        if num_rows and out_features:
            if method == Method.AUTO:
                if exact():
                    method = Method.EXACT
                else:
                    method = Method.GEMV if packed is not None or num_rows <= GEMV_MAX_ROWS else Method.GEMM
            rc = self.lib.qk_linear(
                int(qtype),
                packed is not None,
                int(method),
                x2.data_ptr(),
                num_rows,
                weight.data_ptr(),
                row_bytes,
                y.data_ptr(),
                out_features,
                in_features,
                num_threads or torch.get_num_threads(),
            )
            if rc == -1:
                raise MemoryError("quantized linear kernel could not allocate its buffers")
            assert rc == 0, rc
        return y.reshape(*lead, out_features)

    def dequantize(self, raw: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
        """The float32 weight ``[out_features, in_features]`` that ``raw`` encodes."""
        raw = self._check_raw(raw, qtype, in_features)
        out = torch.empty(raw.shape[0], in_features, dtype=torch.float32)
        rc = self.lib.qk_dequantize(int(qtype), raw.data_ptr(), raw.shape[1], out.data_ptr(), raw.shape[0], in_features)
        assert rc == 0, rc
        return out


def exact() -> bool:
    """Whether the engine's ``quant_exact`` asks for float32 activations (see the module docstring;
    default from ``TOKENOPS_QUANT_EXACT``)."""
    return switches.current.quant_exact


_lock = threading.Lock()
_loaded: dict[tuple[bool, str], QuantKernels | None] = {}  # (plain, cpu_isa) -> the library


def get_kernels(plain: bool = False) -> QuantKernels | None:
    """The compiled kernels (``plain``: the no-SIMD fallback build) for the engine's ``cpu_isa``, or
    ``None`` when disabled or no compiler is available (logged once)."""
    if not switches.current.native_kernels:
        return None
    key = (plain, switches.current.cpu_isa)
    if key in _loaded:
        return _loaded[key]
    with _lock:
        if key not in _loaded:
            from tokenops.engine.kernels.native import build_library

            kernels = None
            try:
                defines = ["TK_PLAIN=1"] if plain else []
                path = build_library(
                    main="quant.c", stem="quant_plain" if plain else "quant", defines=defines, isa=key[1]
                )
                kernels = QuantKernels(path, plain)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                log.warning("quantized linear kernels unavailable, dequantizing with numpy: %s", e)
            _loaded[key] = kernels
    return _loaded[key]


def loaded_isa() -> str | None:
    """:attr:`QuantKernels.isa` of the SIMD build for the engine's ``cpu_isa`` when it is loaded (never
    builds it), else None."""
    kernels = _loaded.get((False, switches.current.cpu_isa))
    return kernels.isa if kernels is not None else None


def dequantize_reference(raw: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """``gguf``'s numpy decoding of ``raw`` as float32 ``[out_features, in_features]`` (the oracle)."""
    values = gguf_dequantize(raw.numpy(), GGMLQuantizationType(qtype))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(raw.shape[0], in_features)


def pack(raw: torch.Tensor, qtype: int, in_features: int) -> PackedWeight | None:
    """:meth:`QuantKernels.pack` with the compiled kernels (``None`` without them, or for a type that
    has no packed kernel: keep ``raw`` then)."""
    kernels = get_kernels()
    return kernels.pack(raw, qtype, in_features) if kernels is not None and int(qtype) in SUPPORTED else None


def linear(
    x: torch.Tensor,
    raw: torch.Tensor | None,
    qtype: int,
    in_features: int,
    packed: PackedWeight | None = None,
    method: Method = Method.AUTO,
) -> torch.Tensor:
    """``x @ W.T`` for the GGUF-encoded ``W`` (``packed`` by :func:`pack` when given, else ``raw``):
    the compiled kernels when they are available, else ``gguf``'s decoder and ``torch``'s matmul."""
    kernels = get_kernels()
    if kernels is not None and int(qtype) in SUPPORTED:
        return kernels.linear(x, raw, qtype, in_features, method, packed=packed)
    assert raw is not None and packed is None, "a packed weight needs the compiled kernels"
    return torch.nn.functional.linear(x, dequantize_reference(raw, qtype, in_features))
