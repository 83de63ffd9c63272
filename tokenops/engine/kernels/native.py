"""A small C kernel for decode attention straight from the paged KV cache.

The pure-PyTorch decode path (:func:`tokenops.engine.kernels.attention._decode`) gathers every
sequence's context out of the block-structured cache into a padded contiguous buffer
and then runs SDPA over it: on CPU the step is memory-bound, and the gather writes and
re-reads the whole context once more per layer. This kernel walks each sequence's
block table and reads every K/V row of the context exactly once, with no padding, no
mask tensor and no copy: one pass computes the scores of all query heads that share
a KV head, a second accumulates the values.

The source (``tokenops/engine/csrc/paged_decode.c``, declared in ``paged_decode.h``) is compiled on
first use with the system C compiler (``cc``, ``-O3 -march=native``; ``-march=haswell`` where the engine's
``cpu_isa`` is ``"avx2"``, see :data:`ISA_FLAGS`) into a per-user cache folder
keyed by the text of the source and every header it includes, the variant's defines, the flags and
the CPU, and loaded with :mod:`ctypes` (which releases the GIL during the call; the signatures come
from the header, :mod:`tokenops.engine.kernels.c_header`). :func:`build_library` builds the other
libraries of ``csrc`` the same way. Nothing
needs Python or torch headers, so building takes well under a second. When no compiler
is available, or the engine's ``native_kernels`` is off (``TOKENOPS_NATIVE_ATTENTION=0``), :func:`get_kernel` returns
``None`` and the engine keeps the PyTorch path; both paths are tested to agree.

Supported: float32 and bfloat16 caches (queries and outputs float32 or the cache's
dtype), grouped-query heads, sliding windows, and blocks evicted by a KV policy
(negative block ids, skipped).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from tokenops.engine.kernels import switches
from tokenops.engine.kernels.c_header import CSRC, bind, read, sources

log = logging.getLogger(__name__)

_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
#: the compiler's target for each ``cpu_isa`` (:mod:`tokenops.engine.kernels.switches`): ``avx2`` is a
#: Haswell-class CPU (AVX2, FMA, F16C; no AVX-512, VNNI or AMX), whatever this one has
ISA_FLAGS = {"native": ["-march=native"], "avx2": ["-march=haswell", "-mtune=haswell"]}
#: ``TOKENOPS_NATIVE_SANITIZE=1`` (read once, at import: a debugging build, see tests/engine/test_csrc.py)
#: builds every library with AddressSanitizer and UndefinedBehaviorSanitizer; the process must preload
#: the ASan runtime.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]
SANITIZE = os.environ.get("TOKENOPS_NATIVE_SANITIZE", "").strip().lower() in ("1", "true", "yes", "on")
if SANITIZE:
    _FLAGS = [*_FLAGS, *SANITIZE_FLAGS]

_lock = threading.Lock()
_kernels: dict[str, PagedDecodeKernel | None] = {}  # cpu_isa -> the kernel (None: could not be built)


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    root = os.environ.get("TOKENOPS_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenops", "native"
    )
    return Path(root)


def build_library(
    compiler: str | None = None,
    main: str = "paged_decode.c",
    stem: str = "paged_decode",
    defines: Sequence[str] = (),
    folder: Path = CSRC,
    isa: str | None = None,
) -> Path:
    """Compile ``main`` of ``folder`` (``tokenops/engine/csrc``) with ``-D`` ``defines`` (a variant), or
    find it compiled, and return the shared library's path. The cache key covers the text of ``main``
    and of every file it includes, so an edit to any source or header builds anew. ``isa``: the target
    (a key of :data:`ISA_FLAGS`; ``None``: the engine's ``cpu_isa``), a name of its own in the cache."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    isa = isa or switches.current.cpu_isa
    flags = [_FLAGS[0], *ISA_FLAGS[isa], *_FLAGS[1:]]  # native: the flags (and cache keys) of old
    texts = [f"{path.name}\0{path.read_text()}" for path in sources(main, folder)]
    define_flags = [f"-D{d}" for d in defines]
    key = hashlib.sha256(
        "\0".join([*texts, " ".join(define_flags), " ".join(flags), cc, platform.machine(), _cpu_signature()]).encode()
    ).hexdigest()[:16]
    out_dir = _cache_dir()
    lib = out_dir / f"{stem}{'' if isa == 'native' else '-' + isa}-{key}.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    from tokenops.engine.kernels.compile_notice import compiling

    # an avx2 build is named so on serve's start lines ("the quantized kernels (quant_avx2)")
    with (
        compiling(stem if isa == "native" else f"{stem}_{isa}", out_dir),
        tempfile.TemporaryDirectory(dir=out_dir) as tmp,
    ):
        tmp_lib = Path(tmp) / lib.name
        command = [cc, *flags, *define_flags, f"-I{folder}", str(folder / main), "-o", str(tmp_lib), "-lm"]
        # minutes on a loaded box for the quantized kernels; longer still with the sanitizers
        r = subprocess.run(command, capture_output=True, text=True, timeout=900 if SANITIZE else 300)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        os.replace(tmp_lib, lib)  # atomic: concurrent builders each install a complete file
    return lib


class PagedDecodeKernel:
    """The loaded library; :meth:`__call__` runs decode attention for a batch."""

    DTYPES = (torch.float32, torch.bfloat16)

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = bind(ctypes.CDLL(str(path)), read("paged_decode.h"))
        self._fns = {torch.float32: self.lib.paged_decode_f32, torch.bfloat16: self.lib.paged_decode_bf16}

    def linear_q8(
        self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``[M, K]`` float32 times int8 ``qweight`` ``[N, K]`` with per-row float32 ``scale``
        ``[N]`` (and ``bias``): ``[M, N]`` float32. Meant for a few rows (decode at batch 1-2),
        where reading int8 weights beats dequantizing them; it does not block rows for larger M."""
        num_rows, in_features = x.shape
        out_features = qweight.shape[0]
        x = x.contiguous()
        qweight, scale = qweight.contiguous(), scale.reshape(-1).contiguous()
        bias = None if bias is None else bias.contiguous()
        out = torch.empty(num_rows, out_features, dtype=torch.float32)
        self.lib.linear_q8(
            x.data_ptr(),
            qweight.data_ptr(),
            scale.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            num_rows,
            out_features,
            in_features,
            torch.get_num_threads(),
        )
        return out

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        context_lens: torch.Tensor,
        max_len: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """``q`` ``[B, H, D]``; caches ``[num_blocks, block_size, KVH, D]``; ``tables``
        ``[B, max_blocks]`` int64 block ids (negative: evicted); ``context_lens`` ``[B]``
        int64. Returns ``[B, H, D]`` in ``q``'s dtype."""
        num_rows, num_heads, head_dim = q.shape
        _, block_size, num_kv_heads, _ = k_cache.shape
        qf = q.float().contiguous()
        out = torch.empty(num_rows, num_heads, head_dim, dtype=torch.float32)
        tables = tables.contiguous()
        context_lens = context_lens.contiguous()
        rc = self._fns[k_cache.dtype](
            qf.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            tables.data_ptr(),
            context_lens.data_ptr(),
            out.data_ptr(),
            num_rows,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            tables.shape[1],
            float(scale),
            int(window or 0),
            int(max_len),
            torch.get_num_threads(),
        )
        if rc != 0:
            raise MemoryError("paged decode kernel could not allocate its score buffer")
        return out if q.dtype == torch.float32 else out.to(q.dtype)


def disabled() -> bool:
    """Whether the engine's ``native_kernels`` switch is off (default from ``TOKENOPS_NATIVE_ATTENTION``,
    see :mod:`tokenops.engine.kernels.switches`): no native kernel runs, this one, the fused decode step
    of :mod:`tokenops.engine.kernels.fused_decode` or the quantized products."""
    return not switches.current.native_kernels


def get_kernel() -> PagedDecodeKernel | None:
    """The compiled kernel for the engine's ``cpu_isa``, or ``None`` (disabled, or no compiler: logged once)."""
    if disabled():
        return None
    isa = switches.current.cpu_isa
    if isa in _kernels:
        return _kernels[isa]
    with _lock:
        if isa not in _kernels:
            try:
                _kernels[isa] = PagedDecodeKernel(build_library(isa=isa))
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                log.warning("native decode attention unavailable, using the PyTorch path: %s", e)
                _kernels[isa] = None
    return _kernels[isa]
