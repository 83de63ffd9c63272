"""A small C kernel for decode attention straight from the paged KV cache.

The pure-PyTorch decode path (:func:`tokenops.engine.kernels.attention._decode`) gathers every
sequence's context out of the block-structured cache into a padded contiguous buffer
and then runs SDPA over it: on CPU the step is memory-bound, and the gather writes and
re-reads the whole context once more per layer. This kernel walks each sequence's
block table and reads every K/V row of the context exactly once, with no padding, no
mask tensor and no copy: one pass computes the scores of all query heads that share
a KV head, a second accumulates the values.

The source is compiled on first use with the system C compiler (``cc``, ``-O3
-march=native``) into a per-user cache folder keyed by the source, the flags and the
CPU, and loaded with :mod:`ctypes` (which releases the GIL during the call). Nothing
needs Python or torch headers, so building takes well under a second. When no compiler
is available, or ``TOKENOPS_NATIVE_ATTENTION=0`` is set, :func:`get_kernel` returns
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
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

/* A cache row as float32: f32 rows are used in place, bf16 rows widened into buf. */
static inline const float *row_f32(const float *row, float *buf, int64_t n) { (void)buf; (void)n; return row; }
static inline const float *row_bf16(const uint16_t *row, float *buf, int64_t n) {
    uint32_t *out = (uint32_t *)buf;
    _Pragma("omp simd")
    for (int64_t j = 0; j < n; j++) out[j] = ((uint32_t)row[j]) << 16;
    return buf;
}

/* One sequence: its H query heads (G per KV head) attend to positions [start, L),
   read through its block table. Each position's K row (all KV heads, contiguous in
   the cache) is read once for every head, then each V row likewise. */
#define DEFINE_KERNEL(NAME, T, ROW)                                                               \
static void NAME##_one(const float *q, const T *kc, const T *vc, const int64_t *tab, int64_t L,  \
                       int64_t start, float *out, float *scores, float *rowbuf, int64_t H,      \
                       int64_t KVH, int64_t D, int64_t BS, float scale) {                       \
    int64_t n = L - start, G = H / KVH;                                                          \
    for (int64_t i = 0; i < n; i++) {                                                            \
        int64_t p = start + i;                                                                   \
        int64_t blk = tab[p / BS];                                                               \
        if (blk < 0) {                                                                           \
            for (int64_t h = 0; h < H; h++) scores[h * n + i] = -INFINITY;                       \
            continue;                                                                            \
        }                                                                                        \
        const float *row = ROW(kc + (blk * BS + p % BS) * KVH * D, rowbuf, KVH * D);             \
        for (int64_t h = 0; h < H; h++) {                                                        \
            const float *qh = q + h * D;                                                         \
            const float *k = row + (h / G) * D;                                                  \
            float s = 0.f;                                                                       \
            _Pragma("omp simd reduction(+:s)")                                                   \
            for (int64_t d = 0; d < D; d++) s += qh[d] * k[d];                                   \
            scores[h * n + i] = s * scale;                                                       \
        }                                                                                        \
    }                                                                                            \
    for (int64_t h = 0; h < H; h++) {                                                            \
        float *sh = scores + h * n;                                                              \
        float mx = -INFINITY, sum = 0.f;                                                         \
        for (int64_t i = 0; i < n; i++) mx = sh[i] > mx ? sh[i] : mx;                            \
        for (int64_t i = 0; i < n; i++) { float e = sh[i] == -INFINITY ? 0.f : expf(sh[i] - mx); \
                                          sh[i] = e; sum += e; }                                 \
        float inv = sum > 0.f ? 1.f / sum : 0.f;                                                 \
        for (int64_t i = 0; i < n; i++) sh[i] *= inv;                                            \
    }                                                                                            \
    memset(out, 0, sizeof(float) * H * D);                                                       \
    for (int64_t i = 0; i < n; i++) {                                                            \
        int64_t p = start + i;                                                                   \
        int64_t blk = tab[p / BS];                                                               \
        if (blk < 0) continue;                                                                   \
        const float *row = ROW(vc + (blk * BS + p % BS) * KVH * D, rowbuf, KVH * D);             \
        for (int64_t h = 0; h < H; h++) {                                                        \
            float w = scores[h * n + i];                                                         \
            const float *v = row + (h / G) * D;                                                  \
            float *o = out + h * D;                                                              \
            _Pragma("omp simd")                                                                  \
            for (int64_t d = 0; d < D; d++) o[d] += w * v[d];                                    \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
int NAME(const float *q, const T *kc, const T *vc, const int64_t *tables, const int64_t *ctx,    \
         float *out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,       \
         float scale, int64_t window, int64_t max_len, int nthreads) {                           \
    int failed = 0;                                                                              \
    int64_t cap = max_len > 0 ? max_len : 1;                                                     \
    _Pragma("omp parallel num_threads(nthreads) if(nthreads > 1 && B > 1)")                      \
    {                                                                                            \
        float *scores = (float *)malloc(sizeof(float) * (size_t)(H * cap + KVH * D));          \
        if (!scores) failed = 1;                                                                 \
        _Pragma("omp for schedule(dynamic, 1)")                                                  \
        for (int64_t b = 0; b < B; b++) {                                                        \
            if (!scores) continue;                                                               \
            int64_t L = ctx[b];                                                                  \
            int64_t start = (window > 0 && L > window) ? L - window : 0;                         \
            NAME##_one(q + b * H * D, kc, vc, tables + b * MB, L, start, out + b * H * D, scores, \
                       scores + H * cap, H, KVH, D, BS, scale);                                  \
        }                                                                                        \
        free(scores);                                                                            \
    }                                                                                            \
    return failed ? -1 : 0;                                                                      \
}

DEFINE_KERNEL(paged_decode_f32, float, row_f32)
DEFINE_KERNEL(paged_decode_bf16, uint16_t, row_bf16)

/* A linear layer with int8 weights for a few rows (decode at batch 1-2):
   y[m, n] = s[n] * sum_k x[m, k] * q[n, k] (+ b[n]); q is [N, K] row-major. Each weight row is
   read once, as int8, and widened in registers: a quarter of the bytes of a float32 GEMV. */
int linear_q8(const float *x, const int8_t *q, const float *s, const float *b, float *y,
              int64_t M, int64_t N, int64_t K, int nthreads) {
    _Pragma("omp parallel for num_threads(nthreads) schedule(static) if(nthreads > 1)")
    for (int64_t n = 0; n < N; n++) {
        const int8_t *qr = q + n * K;
        for (int64_t m = 0; m < M; m++) {
            const float *xr = x + m * K;
            float acc = 0.f;
            _Pragma("omp simd reduction(+:acc)")
            for (int64_t k = 0; k < K; k++) acc += xr[k] * (float)qr[k];
            y[m * N + n] = acc * s[n] + (b ? b[n] : 0.f);
        }
    }
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]

_lock = threading.Lock()
_kernel: PagedDecodeKernel | None | bool = False  # False: not tried yet


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


def build_library(compiler: str | None = None, source: str = _SOURCE, stem: str = "paged_decode") -> Path:
    """Compile ``source`` (the paged decode kernel by default; :mod:`tokenops.engine.kernels.fused_decode`
    passes its own) or find it compiled, and return the shared library's path."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    key = hashlib.sha256(
        "\0".join([source, " ".join(_FLAGS), cc, platform.machine(), _cpu_signature()]).encode()
    ).hexdigest()[:16]
    out_dir = _cache_dir()
    lib = out_dir / f"{stem}-{key}.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    from tokenops.engine.kernels.compile_notice import compiling

    with compiling(stem, out_dir), tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src = Path(tmp) / f"{stem}.c"
        src.write_text(source)
        tmp_lib = Path(tmp) / lib.name
        r = subprocess.run(
            [cc, *_FLAGS, str(src), "-o", str(tmp_lib), "-lm"], capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        os.replace(tmp_lib, lib)  # atomic: concurrent builders each install a complete file
    return lib


class PagedDecodeKernel:
    """The loaded library; :meth:`__call__` runs decode attention for a batch."""

    DTYPES = (torch.float32, torch.bfloat16)

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        for name in ("paged_decode_f32", "paged_decode_bf16"):
            fn = getattr(self.lib, name)
            fn.argtypes = [p, p, p, p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, i64, i64, ctypes.c_int]
            fn.restype = ctypes.c_int
        self._fns = {torch.float32: self.lib.paged_decode_f32, torch.bfloat16: self.lib.paged_decode_bf16}
        self.lib.linear_q8.argtypes = [p, p, p, p, p, i64, i64, i64, ctypes.c_int]
        self.lib.linear_q8.restype = ctypes.c_int

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
    """Whether ``TOKENOPS_NATIVE_ATTENTION=0`` (or false/no/off) turns the native kernels off (this
    one and the fused decode step of :mod:`tokenops.engine.kernels.fused_decode`)."""
    return os.environ.get("TOKENOPS_NATIVE_ATTENTION", "1").strip().lower() in ("0", "false", "no", "off")


def get_kernel() -> PagedDecodeKernel | None:
    """The compiled kernel, or ``None`` (disabled, or no compiler: logged once)."""
    global _kernel
    if _kernel is not False:
        return _kernel  # type: ignore[return-value]  # never True: the flag is False or the result
    with _lock:
        if _kernel is not False:
            return _kernel
        if disabled():
            _kernel = None
            return None
        try:
            _kernel = PagedDecodeKernel(build_library())
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            log.warning("native decode attention unavailable, using the PyTorch path: %s", e)
            _kernel = None
    return _kernel
