"""A whole decode step in one native call, for the decode-only steps of small batches.

At batch 1 on CPU a decode step reads every weight once and does little arithmetic, so it is
bound by memory bandwidth, and everything else it does is overhead: through PyTorch a step of
the 32M benchmark Llama makes ~15 operator calls per layer (norms, rotary, cache write,
attention, activation, residuals), each with dispatch costs of a few microseconds, and its
matrix-vector products run through GEMM kernels built for larger batches (oneDNN reaches
~22 GB/s here, against ~31 GB/s for llama.cpp's hand-written dot products;
``docs/engine-optimizations.md``).

:class:`FusedDecoder` runs the step's decodes (one new token each, at most
:attr:`FusedDecoder.max_rows` of them) through all layers of a float32 Llama-family model in
ONE call into a small C library compiled like the paged attention kernel
(:mod:`tokenops.engine.native`): embedding lookup, RMSNorm, the fused QKV product (+ bias),
Qwen3's q/k norms, rotary embedding (from the same cos/sin table the PyTorch path computes),
the cache write, paged attention with grouped-query heads, sliding windows and evicted
blocks, the output projection with the residual added in place, the gated SiLU MLP, and the
final norm and vocabulary projection. Matrix-vector products stream each weight row once
(AVX2 with four independent accumulators where the CPU has it; each OpenMP thread a contiguous
range of rows, inside one parallel region, so a step pays one thread fork instead of dozens).
Attention splits each sequence's context between the threads (each streams its own stretch of
the cache, reading every K and V row once for all heads) and merges the partial softmaxes.

The products read plain row-major weights, which the oneDNN layout
(:mod:`tokenops.engine.weight_layout`) releases, so the decoder copies the linear weights at load
into one arena of its own, in the order a step reads them, 2 MiB aligned and advised onto
transparent huge pages: the linear weights are held twice. ``[engine] decode_kernel = "auto"``
therefore uses the decoder only while that copy stays under :data:`AUTO_MAX_EXTRA_BYTES`;
``"native"`` always (or an error when the model is not eligible), ``"torch"`` never. Steps of
decodes and of speculative decoding's verify chunks (every token wants logits; each becomes a row
that attends causally), and short chunks such as a draft model catching up on accepted tokens, take
the fused call up to :attr:`FusedDecoder.max_rows` tokens in all; longer steps take the PyTorch
path, which stays the reference: greedy output is the same either way in the tests, and logits agree to float32
rounding (the sums run in another order).

Eligible: a dense (not MoE) model in float32 on CPU, SiLU MLP, float32 KV cache, no weight
transform (quantized layers) and no compiled forward (the runner drops the decoder when a
compile plugin returns a model).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from typing import TYPE_CHECKING

import torch

from tokenops.engine.models.layers import Linear, rope_cos_sin

if TYPE_CHECKING:
    from tokenops.engine.batch import ChunkInput

log = logging.getLogger(__name__)

DECODE_KERNELS = ("auto", "native", "torch")
#: ``auto`` makes the decoder's copy of the linear weights only up to this size.
AUTO_MAX_EXTRA_BYTES = 512 << 20
#: Most decode rows one fused step takes: on the 32M benchmark Llama (2 threads) the fused step
#: beat the PyTorch forward (oneDNN) up to 16 rows and tied at 24 (docs/engine-optimizations.md).
MAX_ROWS = 16

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

typedef struct {
    const float *in_norm, *post_norm, *q_norm, *k_norm;
    const float *wqkv, *bqkv, *wo, *bo, *wgu, *bgu, *wd, *bd;
    float *kc, *vc;          /* this layer's cache, [num_blocks, BS, KVH, D] */
    int64_t window;          /* 0: full attention */
} tk_layer;

/* dot products of one weight row w (K floats) with M input rows x (xs apart) into out[0..M). */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_hadd_ps(a, a);
    a = _mm_hadd_ps(a, a);
    return _mm_cvtss_f32(a);
}
/* four independent accumulators: one FMA chain would stall on its latency, not on memory */
static inline float dot1(const float *w, const float *x, int64_t K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; k++) s += w[k] * x[k];
    return s;
}
static inline void dot2(const float *w, const float *x0, const float *x1, int64_t K, float *o0, float *o1) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), a1);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), b0);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), b1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1)), t = hsum8(_mm256_add_ps(b0, b1));
    for (; k < K; k++) { s += w[k] * x0[k]; t += w[k] * x1[k]; }
    *o0 = s; *o1 = t;
}
static inline void dot4(const float *w, const float *x, int64_t xs, int64_t K, float *o) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    const float *x0 = x, *x1 = x + xs, *x2 = x + 2 * xs, *x3 = x + 3 * xs;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0); a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), a1);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), b0); b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), b1);
        c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), c0); c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + k + 8), c1);
        d0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), d0); d1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + k + 8), d1);
    }
    o[0] = hsum8(_mm256_add_ps(a0, a1)); o[1] = hsum8(_mm256_add_ps(b0, b1));
    o[2] = hsum8(_mm256_add_ps(c0, c1)); o[3] = hsum8(_mm256_add_ps(d0, d1));
    for (; k < K; k++) { o[0] += w[k] * x0[k]; o[1] += w[k] * x1[k]; o[2] += w[k] * x2[k]; o[3] += w[k] * x3[k]; }
}
/* four weight rows (K apart) against two inputs: eight accumulators, six loads per eight FMAs */
static inline void dot4x2(const float *w, int64_t K, const float *x0, const float *x1, float *o0, float *o1) {
    const float *w1 = w + K, *w2 = w1 + K, *w3 = w2 + K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 u = _mm256_loadu_ps(x0 + k), v = _mm256_loadu_ps(x1 + k), r;
        r = _mm256_loadu_ps(w + k);  a0 = _mm256_fmadd_ps(r, u, a0); b0 = _mm256_fmadd_ps(r, v, b0);
        r = _mm256_loadu_ps(w1 + k); a1 = _mm256_fmadd_ps(r, u, a1); b1 = _mm256_fmadd_ps(r, v, b1);
        r = _mm256_loadu_ps(w2 + k); a2 = _mm256_fmadd_ps(r, u, a2); b2 = _mm256_fmadd_ps(r, v, b2);
        r = _mm256_loadu_ps(w3 + k); a3 = _mm256_fmadd_ps(r, u, a3); b3 = _mm256_fmadd_ps(r, v, b3);
    }
    o0[0] = hsum8(a0); o0[1] = hsum8(a1); o0[2] = hsum8(a2); o0[3] = hsum8(a3);
    o1[0] = hsum8(b0); o1[1] = hsum8(b1); o1[2] = hsum8(b2); o1[3] = hsum8(b3);
    for (; k < K; k++) {
        o0[0] += w[k] * x0[k]; o0[1] += w1[k] * x0[k]; o0[2] += w2[k] * x0[k]; o0[3] += w3[k] * x0[k];
        o1[0] += w[k] * x1[k]; o1[1] += w1[k] * x1[k]; o1[2] += w2[k] * x1[k]; o1[3] += w3[k] * x1[k];
    }
}
static inline void dot4x1(const float *w, int64_t K, const float *x0, float *o0) {
    const float *w1 = w + K, *w2 = w1 + K, *w3 = w2 + K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 u = _mm256_loadu_ps(x0 + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), u, a0); a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), u, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), u, a2); a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), u, a3);
    }
    o0[0] = hsum8(a0); o0[1] = hsum8(a1); o0[2] = hsum8(a2); o0[3] = hsum8(a3);
    for (; k < K; k++) { o0[0] += w[k] * x0[k]; o0[1] += w1[k] * x0[k]; o0[2] += w2[k] * x0[k]; o0[3] += w3[k] * x0[k]; }
}
#else
static inline float dot1(const float *w, const float *x, int64_t K) {
    float s = 0.f;
    _Pragma("omp simd reduction(+:s)")
    for (int64_t k = 0; k < K; k++) s += w[k] * x[k];
    return s;
}
static inline void dot2(const float *w, const float *x0, const float *x1, int64_t K, float *o0, float *o1) {
    *o0 = dot1(w, x0, K); *o1 = dot1(w, x1, K);
}
static inline void dot4(const float *w, const float *x, int64_t xs, int64_t K, float *o) {
    for (int j = 0; j < 4; j++) o[j] = dot1(w, x + j * xs, K);
}
static inline void dot4x2(const float *w, int64_t K, const float *x0, const float *x1, float *o0, float *o1) {
    for (int j = 0; j < 4; j++) { o0[j] = dot1(w + j * K, x0, K); o1[j] = dot1(w + j * K, x1, K); }
}
static inline void dot4x1(const float *w, int64_t K, const float *x0, float *o0) {
    for (int j = 0; j < 4; j++) o0[j] = dot1(w + j * K, x0, K);
}
#endif

/* y[m, n] (+)= W[n, :] . x[m, :] (+ b[n]) for m < M; W is [N, K] row-major, x rows xs apart.
   Called inside a parallel region: each thread streams a contiguous range of W's rows once
   (up to four inputs share each read of a row; more re-read it from L1). */
static inline void put(float *y, float v, int acc) { if (acc) *y += v; else *y = v; }

static void gemv(const float *restrict x, int64_t xs, int64_t M, const float *restrict W,
                 const float *restrict b, float *restrict y, int64_t N, int64_t K, int acc) {
    _Pragma("omp for schedule(static)")
    for (int64_t n = 0; n < N; n++) {
        const float *w = W + n * K;
        float bias = b ? b[n] : 0.f;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) {
            float o[4];
            dot4(w, x + m * xs, xs, K, o);
            for (int j = 0; j < 4; j++) {
                if (acc) y[(m + j) * N + n] += o[j] + bias; else y[(m + j) * N + n] = o[j] + bias;
            }
        }
        for (; m + 2 <= M; m += 2) {
            float s, t;
            dot2(w, x + m * xs, x + (m + 1) * xs, K, &s, &t);
            if (acc) { y[m * N + n] += s + bias; y[(m + 1) * N + n] += t + bias; }
            else { y[m * N + n] = s + bias; y[(m + 1) * N + n] = t + bias; }
        }
        if (m < M) {
            float s = dot1(w, x + m * xs, K) + bias;
            if (acc) y[m * N + n] += s; else y[m * N + n] = s;
        }
    }
}

static void rmsnorm(const float *x, const float *w, float *out, int64_t n, float eps) {
    float ss = 0.f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] * r) * w[i];
}

/* x * cos + rotate_half(x) * sin for one head (HF's layout: halves, not interleaved). */
static void rope(float *x, const float *c, const float *s, int64_t D) {
    int64_t h = D / 2;
    for (int64_t i = 0; i < h; i++) {
        float x1 = x[i], x2 = x[i + h];
        x[i] = x1 * c[i] + (-x2) * s[i];
        x[i + h] = x2 * c[i + h] + x1 * s[i + h];
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* exp(x) for 8 lanes: x = n ln2 + r (ln2 split in two for precision), e^r by a degree-6 polynomial
   (the classic Cephes single-precision coefficients), times 2^n through the exponent bits; about
   1 ulp from expf over the softmax's range (x <= 0). -inf gives 0. */
static inline __m256 exp8(__m256 x) {
    __m256 ninf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(ninf, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
/* sh[i] = exp(sh[i] - mx) in place; returns the sum */
static inline float exp_shift_sum(float *sh, int64_t n, float mx) {
    __m256 acc = _mm256_setzero_ps(), m8 = _mm256_set1_ps(mx);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + i), m8));
        _mm256_storeu_ps(sh + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; i < n; i++) { float e = sh[i] == -INFINITY ? 0.f : expf(sh[i] - mx); sh[i] = e; sum += e; }
    return sum;
}
static inline void axpy(float *o, float w, const float *v, int64_t D) {
    __m256 w8 = _mm256_set1_ps(w);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w8, _mm256_loadu_ps(v + d), _mm256_loadu_ps(o + d)));
    for (; d < D; d++) o[d] += w * v[d];
}
#else
static inline float exp_shift_sum(float *sh, int64_t n, float mx) {
    float sum = 0.f;
    for (int64_t i = 0; i < n; i++) { float e = sh[i] == -INFINITY ? 0.f : expf(sh[i] - mx); sh[i] = e; sum += e; }
    return sum;
}
static inline void axpy(float *o, float w, const float *v, int64_t D) {
    _Pragma("omp simd")
    for (int64_t d = 0; d < D; d++) o[d] += w * v[d];
}
#endif

/* Split-KV attention for R consecutive rows of one sequence (a decode is one row; a verify or
   catch-up chunk several, at consecutive positions): their R x H query heads over positions
   [a, b), a stretch of the union of their windows. Every K row (all KV heads, contiguous in the
   cache) is read once, in order, for all R rows, then every V row: each thread streams its own
   stretch of the cache once. Row r sees positions in [lo[r], ctx[r]) (causal, sliding window).
   Writes each row's part (parts + r * pstride): per-head max and exp-sum (part[0..H),
   part[H..2H)) and its unnormalised output (part + 2H, [H, D]); merge() combines the parts. */
static void attend_part(const float *q, int64_t qs, int64_t R, const int64_t *lo, const int64_t *ctx,
                        const float *kc, const float *vc, const int64_t *tab, int64_t a, int64_t b,
                        float *parts, int64_t pstride, float *scores, int64_t H, int64_t KVH, int64_t D,
                        int64_t BS, float scale) {
    int64_t n = b - a, G = H / KVH;
    for (int64_t i = 0; i < n; i++) {
        int64_t p = a + i, blk = tab[p / BS];
        const float *row = blk < 0 ? NULL : kc + (blk * BS + p % BS) * KVH * D;
        for (int64_t r = 0; r < R; r++) {
            float *sr = scores + r * H * n;
            if (!row || p >= ctx[r] || p < lo[r]) { for (int64_t h = 0; h < H; h++) sr[h * n + i] = -INFINITY; continue; }
            for (int64_t h = 0; h < H; h++) sr[h * n + i] = dot1(q + r * qs + h * D, row + (h / G) * D, D) * scale;
        }
    }
    for (int64_t r = 0; r < R; r++) {
        float *part = parts + r * pstride, *mx = part, *sum = part + H;
        for (int64_t h = 0; h < H; h++) {
            float *sh = scores + (r * H + h) * n, m = -INFINITY;
            for (int64_t i = 0; i < n; i++) m = sh[i] > m ? sh[i] : m;
            mx[h] = m;
            sum[h] = m == -INFINITY ? 0.f : exp_shift_sum(sh, n, m);
            if (m == -INFINITY) for (int64_t i = 0; i < n; i++) sh[i] = 0.f;
        }
        memset(part + 2 * H, 0, sizeof(float) * H * D);
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t p = a + i, blk = tab[p / BS];
        if (blk < 0) continue;
        const float *row = vc + (blk * BS + p % BS) * KVH * D;
        for (int64_t r = 0; r < R; r++) {
            if (p >= ctx[r] || p < lo[r]) continue;
            float *acc = parts + r * pstride + 2 * H;
            const float *sr = scores + r * H * n;
            for (int64_t h = 0; h < H; h++) axpy(acc + h * D, sr[h * n + i], row + (h / G) * D, D);
        }
    }
}

/* out[h] = sum_s e^(mx_s - M) acc_s[h] / sum_s e^(mx_s - M) sum_s[h] over the S parts of one sequence */
static void merge(const float *parts, int64_t S, int64_t stride, int64_t h, int64_t H, int64_t D, float *out) {
    float m = -INFINITY, total = 0.f;
    for (int64_t s = 0; s < S; s++) { float v = parts[s * stride + h]; m = v > m ? v : m; }
    memset(out, 0, sizeof(float) * D);
    if (m == -INFINITY) return;
    for (int64_t s = 0; s < S; s++) {
        const float *pt = parts + s * stride;
        if (pt[h] == -INFINITY) continue;
        float w = expf(pt[h] - m);
        total += w * pt[H + h];
        axpy(out, w, pt + 2 * H + h * D, D);
    }
    float inv = total > 0.f ? 1.f / total : 0.f;
    for (int64_t d = 0; d < D; d++) out[d] *= inv;
}

/* meta: M, hidden, H, KVH, D, I, V, BS, MB (table width), layers, max_len, then tokens[M], slots[M],
   context lengths[M], positions[M], group lengths[M] (rows of one sequence at consecutive positions:
   the first row holds the count, the others 0) and block tables[M][MB]. cos/sin: [positions, D].
   work: x[M*hidden] h[M*hidden] qkv[M*(H+2KVH)*D] att[M*H*D] gu[M*2I]. */
int fused_decode_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale,
                     const float *embed, const float *final_norm, const float *lm_head,
                     const float *cos_tab, const float *sin_tab, float *logits, float *work, int nthreads) {
    int64_t M = meta[0], HD = meta[1], H = meta[2], KVH = meta[3], D = meta[4], I = meta[5], V = meta[6];
    int64_t BS = meta[7], MB = meta[8], NL = meta[9], max_len = meta[10];
    const int64_t *tokens = meta + 11, *slots = tokens + M, *ctx = slots + M, *pos = ctx + M, *glen = pos + M;
    const int64_t *tables = glen + M;
    int64_t rmax = 1;
    for (int64_t m = 0; m < M; m++) rmax = glen[m] > rmax ? glen[m] : rmax;
    int64_t QKV = (H + 2 * KVH) * D;
    float *x = work, *h = x + M * HD, *qkv = h + M * HD, *att = qkv + M * QKV, *gu = att + M * H * D;
    int failed = 0;
    int64_t S = nthreads > 1 ? nthreads : 1, PS = H * (D + 2);
    float *partbuf = (float *)malloc(sizeof(float) * (size_t)(M * S * PS));
    if (!partbuf) return -1;
    _Pragma("omp parallel num_threads(nthreads) if(nthreads > 1)")
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(rmax * H * (max_len > 0 ? max_len : 1)));
        int64_t lo[rmax > 0 ? rmax : 1];
        if (!scores) failed = 1;
        _Pragma("omp for schedule(static)")
        for (int64_t m = 0; m < M; m++) memcpy(x + m * HD, embed + tokens[m] * HD, sizeof(float) * HD);
        for (int64_t l = 0; l < NL; l++) {
            const tk_layer *ly = layers + l;
            _Pragma("omp for schedule(static)")
            for (int64_t m = 0; m < M; m++) rmsnorm(x + m * HD, ly->in_norm, h + m * HD, HD, eps);
            gemv(h, HD, M, ly->wqkv, ly->bqkv, qkv, QKV, HD, 0);
            _Pragma("omp for schedule(static)")
            for (int64_t m = 0; m < M; m++) {
                float *q = qkv + m * QKV, *k = q + H * D, *v = k + KVH * D;
                const float *c = cos_tab + pos[m] * D, *s = sin_tab + pos[m] * D;
                for (int64_t j = 0; j < H; j++) {
                    if (ly->q_norm) rmsnorm(q + j * D, ly->q_norm, q + j * D, D, eps);
                    rope(q + j * D, c, s, D);
                }
                for (int64_t j = 0; j < KVH; j++) {
                    if (ly->k_norm) rmsnorm(k + j * D, ly->k_norm, k + j * D, D, eps);
                    rope(k + j * D, c, s, D);
                }
                memcpy(ly->kc + slots[m] * KVH * D, k, sizeof(float) * KVH * D);
                memcpy(ly->vc + slots[m] * KVH * D, v, sizeof(float) * KVH * D);
            }
            /* each group's window split into S stretches of at least 32 positions, one per thread */
            _Pragma("omp for schedule(static)")
            for (int64_t u = 0; u < M * S; u++) {
                int64_t m = u / S, sp = u % S, R = glen[m];
                if (R == 0) continue;  /* a later row of a group: its leader does it */
                for (int64_t r = 0; r < R; r++) {
                    int64_t L = ctx[m + r];
                    lo[r] = (ly->window > 0 && L > ly->window) ? L - ly->window : 0;
                }
                int64_t start = lo[0], end = ctx[m + R - 1];
                int64_t n = end - start, parts = n / 32 < S ? (n / 32 > 0 ? n / 32 : 1) : S;
                if (sp >= parts || !scores) {
                    for (int64_t r = 0; r < R; r++) for (int64_t h = 0; h < H; h++) partbuf[((m + r) * S + sp) * PS + h] = -INFINITY;
                    continue;
                }
                int64_t a = start + n * sp / parts, b = start + n * (sp + 1) / parts;
                attend_part(qkv + m * QKV, QKV, R, lo, ctx + m, ly->kc, ly->vc, tables + m * MB, a, b,
                            partbuf + (m * S + sp) * PS, S * PS, scores, H, KVH, D, BS, scale);
            }
            _Pragma("omp for schedule(static)")
            for (int64_t u = 0; u < M * H; u++)
                merge(partbuf + (u / H) * S * PS, S, PS, u % H, H, D, att + u * D);
            gemv(att, H * D, M, ly->wo, ly->bo, x, HD, H * D, 1);
            _Pragma("omp for schedule(static)")
            for (int64_t m = 0; m < M; m++) rmsnorm(x + m * HD, ly->post_norm, h + m * HD, HD, eps);
            gemv(h, HD, M, ly->wgu, ly->bgu, gu, 2 * I, HD, 0);
            _Pragma("omp for schedule(static)")
            for (int64_t i = 0; i < M * I; i++) {
                float *row = gu + (i / I) * 2 * I;
                float g0 = row[i % I];
                row[i % I] = g0 / (1.f + expf(-g0)) * row[I + i % I];
            }
            gemv(gu, 2 * I, M, ly->wd, ly->bd, x, HD, I, 1);
        }
        _Pragma("omp for schedule(static)")
        for (int64_t m = 0; m < M; m++) rmsnorm(x + m * HD, final_norm, h + m * HD, HD, eps);
        gemv(h, HD, M, lm_head, NULL, logits, V, HD, 0);
        free(scores);
    }
    free(partbuf);
    return failed ? -1 : 0;
}
"""


class _Layer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "in_norm", "post_norm", "q_norm", "k_norm", "wqkv", "bqkv", "wo", "bo", "wgu", "bgu", "wd", "bd", "kc", "vc")] + [
        ("window", ctypes.c_int64)]


_lock = threading.Lock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet


def _library() -> ctypes.CDLL | None:
    global _lib
    if _lib is not False:
        return _lib  # type: ignore[return-value]
    with _lock:
        if _lib is False:
            from tokenops.engine.native import build_library

            try:
                lib = ctypes.CDLL(str(build_library(source=_SOURCE, stem="fused_decode")))
                p = ctypes.c_void_p
                lib.fused_decode_f32.argtypes = [p, p, ctypes.c_float, ctypes.c_float, p, p, p, p, p, p, p, ctypes.c_int]
                lib.fused_decode_f32.restype = ctypes.c_int
                _lib = lib
            except (RuntimeError, OSError) as e:
                log.warning("fused decode step unavailable, decodes use the PyTorch path: %s", e)
                _lib = None
    return _lib  # type: ignore[return-value]


def ineligible_reason(model: torch.nn.Module, kv_cache: torch.Tensor, device: torch.device) -> str | None:
    """Why ``model`` cannot use the fused decode step, or None when it can."""
    from tokenops.engine.models.llama import CausalLM

    if os.environ.get("TOKENOPS_NATIVE_ATTENTION", "1").strip().lower() in ("0", "false", "no", "off"):
        return "native kernels are disabled (TOKENOPS_NATIVE_ATTENTION=0)"
    if device.type != "cpu":
        return "it is for CPU"
    if not isinstance(model, CausalLM):
        return "the model was replaced by a transform"
    args = model.args
    if args.is_moe:
        return "the model has mixture-of-experts layers"
    if kv_cache.dtype != torch.float32:
        return "it needs a float32 KV cache"
    if args.hidden_act not in ("silu", "swish"):
        return f"activation {args.hidden_act!r} (only SiLU)"
    layers = [m for layer in model.model.layers
              for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    for module in layers + [model.lm_head]:
        if type(module) is not Linear:
            return f"a weight transform replaced a linear layer ({type(module).__name__})"
    if any(param.dtype != torch.float32 for param in model.parameters()):
        return "it needs float32 weights"
    if args.num_heads % args.num_kv_heads:
        return "query heads are not a multiple of KV heads"
    return None


def dense_linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of the float32 linear weights (what the decoder holds a copy of)."""
    return sum(m.weight.numel() * 4 for m in model.modules() if type(m) is Linear)


def _hugepage_arena(num_floats: int) -> tuple[mmap.mmap, torch.Tensor]:
    """A float32 tensor of ``num_floats`` in anonymous memory, 2 MiB aligned and advised to use
    transparent huge pages (Linux; elsewhere plain pages): streaming ~100 MB of weights per token
    through 4 KiB pages costs a TLB miss every 4 KiB, and huge pages measured ~15% faster here."""
    align = 2 << 20
    buf = mmap.mmap(-1, num_floats * 4 + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    offset = (-address) % align
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, offset, num_floats * 4 - (num_floats * 4) % mmap.PAGESIZE or mmap.PAGESIZE)
        except OSError:
            pass
    return buf, torch.frombuffer(buf, dtype=torch.float32, count=num_floats, offset=offset)


class FusedDecoder:
    """Runs decode-only steps of up to :attr:`max_rows` sequences in one native call (the PyTorch
    path keeps steps with prefill or verify chunks, and larger decode batches).

    Build it before the linear weights are packed: it copies the dense weights, in the order a
    step reads them, into one huge-page arena (so it holds its own copy of the linear weights)."""

    def __init__(self, model: torch.nn.Module, kv_cache: torch.Tensor, block_size: int,
                 max_rows: int = MAX_ROWS) -> None:
        lib = _library()
        if lib is None:
            raise RuntimeError("the fused decode library could not be built (see the log)")
        self._fn = lib.fused_decode_f32
        self.model = model
        args = model.args
        self.args = args
        self.block_size = block_size
        self.max_rows = max_rows
        self.eps = float(args.rms_norm_eps)
        self.scale = float(args.head_dim ** -0.5)
        self._keep: list[torch.Tensor] = []  # small tensors the native side points into
        stack = model.model
        big = [w for layer in stack.layers for w in (layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                                                       layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)]
        big.append(model.lm_head.weight)
        self._arena_buf, self.arena = _hugepage_arena(sum(w.numel() for w in big))
        copies: dict[int, int] = {}
        at = 0
        with torch.no_grad():
            for w in big:
                self.arena[at:at + w.numel()].copy_(w.detach().reshape(-1))
                copies[id(w)] = self.arena[at:].data_ptr()
                at += w.numel()

        def ptr(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            if id(t) in copies:
                return copies[id(t)]
            t = t.detach()
            assert t.dtype == torch.float32 and t.is_contiguous(), (t.dtype, t.shape)
            self._keep.append(t)
            return t.data_ptr()

        layers = (_Layer * args.num_layers)()
        for i, layer in enumerate(stack.layers):
            attn, mlp = layer.self_attn, layer.mlp
            layers[i] = _Layer(
                ptr(layer.input_layernorm.weight), ptr(layer.post_attention_layernorm.weight),
                ptr(attn.q_norm.weight if attn.q_norm is not None else None),
                ptr(attn.k_norm.weight if attn.k_norm is not None else None),
                ptr(attn.qkv_proj.weight), ptr(attn.qkv_proj.bias), ptr(attn.o_proj.weight), ptr(attn.o_proj.bias),
                ptr(mlp.gate_up_proj.weight), ptr(mlp.gate_up_proj.bias), ptr(mlp.down_proj.weight),
                ptr(mlp.down_proj.bias), ptr(kv_cache[0, i]), ptr(kv_cache[1, i]), int(attn.window or 0))
        self._layers = layers
        self._embed = ptr(stack.embed_tokens.weight)
        self._final_norm = ptr(stack.norm.weight)
        self._lm_head = ptr(model.lm_head.weight)
        hidden, inter = args.hidden_size, args.intermediate_size
        qkv = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim
        self._work = torch.empty(max_rows * (2 * hidden + qkv + args.num_heads * args.head_dim + 2 * inter))
        self._dims = [args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim, args.intermediate_size,
                      args.vocab_size, block_size, 0, args.num_layers]
        self._rope_len = 0
        self._cos = self._sin = torch.empty(0)

    def nbytes(self) -> int:
        """Bytes of the decoder's weight copy."""
        return self.arena.numel() * 4

    def _rope_tables(self, max_pos: int) -> None:
        """cos/sin rows for positions [0, max_pos] (grown by doubling; the same function and
        arithmetic the PyTorch forward uses per step)."""
        if max_pos < self._rope_len:
            return
        n = max(256, self._rope_len * 2)
        while n <= max_pos:
            n *= 2
        cos, sin = rope_cos_sin(self.model.inv_freq, torch.arange(n), torch.float32)
        self._cos, self._sin = cos.reshape(n, -1).contiguous(), sin.reshape(n, -1).contiguous()
        self._rope_len = n

    def accepts(self, chunks: list[ChunkInput]) -> bool:
        """Steps of at most :attr:`max_rows` tokens in all: decodes, speculative decoding's verify
        chunks and short chunks such as a draft model catching up on accepted tokens. Every token
        becomes a row; rows attend causally (each row's K/V is written before any row attends)."""
        return sum(len(c.token_ids) for c in chunks) <= self.max_rows

    @torch.inference_mode()
    def __call__(self, chunks: list[ChunkInput]) -> torch.Tensor:
        """float32 logits of the last ``num_logits`` tokens of each chunk, in order (as
        :meth:`ModelRunner.execute` returns them)."""
        bs = self.block_size
        for c in chunks:
            if c.end_pos > len(c.block_table) * bs:
                raise ValueError(f"block table of {len(c.block_table)} blocks cannot hold {c.end_pos} tokens "
                                 f"(block_size {bs})")
        tokens = [t for c in chunks for t in c.token_ids]
        positions = [c.start_pos + j for c in chunks for j in range(len(c.token_ids))]
        owners = [c for c in chunks for _ in c.token_ids]
        rows = len(tokens)
        lens = [p + 1 for p in positions]
        max_len = max(lens)
        width = (max_len + bs - 1) // bs
        self._rope_tables(max(positions))
        dims = self._dims
        meta = [rows, *dims[:7], width, dims[8], max_len]
        meta += tokens
        meta += [c.block_table[p // bs] * bs + p % bs for c, p in zip(owners, positions)]
        meta += lens
        meta += positions
        for c in chunks:  # the rows of one chunk share one pass over its cache
            meta += [len(c.token_ids)] + [0] * (len(c.token_ids) - 1)
        for c in owners:
            meta += c.block_table[:width]
            meta += [0] * (width - min(len(c.block_table), width))
        meta_t = torch.tensor(meta, dtype=torch.long)
        logits = torch.empty(rows, self.args.vocab_size, dtype=torch.float32)
        rc = self._fn(ctypes.addressof(self._layers), meta_t.data_ptr(), self.eps, self.scale, self._embed,
                      self._final_norm, self._lm_head, self._cos.data_ptr(), self._sin.data_ptr(), logits.data_ptr(),
                      self._work.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise MemoryError("fused decode step could not allocate its buffers")
        if rows == len(chunks) or all(c.num_logits == len(c.token_ids) for c in chunks):
            return logits
        keep, at = [], 0
        for c in chunks:  # the last num_logits rows of each chunk, as the PyTorch forward returns them
            at += len(c.token_ids)
            keep.extend(range(at - c.num_logits, at))
        return logits[keep]


def make_fused_decoder(model: torch.nn.Module, kv_cache: torch.Tensor, block_size: int, device: torch.device,
                       mode: str) -> FusedDecoder | None:
    """The decoder for ``[engine] decode_kernel = mode``, or None (logged when ``auto`` declines)."""
    if mode not in DECODE_KERNELS:
        raise ValueError(f"engine decode_kernel must be one of {', '.join(DECODE_KERNELS)}, not {mode!r}")
    if mode == "torch":
        return None
    why = ineligible_reason(model, kv_cache, device)
    if why is None and mode == "auto" and dense_linear_bytes(model) > AUTO_MAX_EXTRA_BYTES:
        why = (f"its weight copy ({dense_linear_bytes(model) / 2**20:.0f} MiB) would exceed "
               f"{AUTO_MAX_EXTRA_BYTES >> 20} MiB (decode_kernel = 'native' forces it)")
    if why is None and _library() is None:
        why = "the library could not be built (see the log)"
    if why is not None:
        if mode == "native":
            raise ValueError(f"engine decode_kernel 'native' is unavailable: {why}")
        log.info("fused decode step off: %s", why)
        return None
    return FusedDecoder(model, kv_cache, block_size)
