/*
 * C source of the fused decode step (:mod:`tokenops.engine.kernels.fused_decode`), compiled at first use by
 * :func:`tokenops.engine.kernels.native.build_library` (`cc -O3 -march=native -fopenmp`): AVX2 products and
 * exp where the CPU has them, plain C with `omp simd` otherwise. The LoRA products
 * (:mod:`tokenops.engine.lora._lora_c`) are placed after `dot1`.
 */
#include "fused_decode.h"
#ifdef TK_QUANT  /* the products from GGUF blocks: the quantized kernels, built in */
#include "quant.c"
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

/* panel_t, kv_t and tk_layer are declared in fused_decode.h.

   Weight panels (below) hold float32, or bfloat16 when compiled with TK_PANEL_BF16: the top 16 bits
   of the float32, half the bytes to stream, products still in float32. A bfloat16 panel row stores
   its 16 features in the order 0-3, 8-11, 4-7, 12-15, so that interleaving it with zeros (one
   in-lane unpack per 8 features) gives features 0-7 and 8-15 in order. */
#ifdef TK_PANEL_BF16
static inline float panel_at(const panel_t *row, int j) {  /* feature j of a panel row */
    uint32_t u = (uint32_t)row[(j & 3) | ((j & 4) << 1) | ((j & 8) >> 1)] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#else
static inline float panel_at(const panel_t *row, int j) { return row[j]; }
#endif

/* The KV cache holds float32, or bfloat16 when compiled with TK_KV_BF16 (kv_cache_dtype "bfloat16":
   half the memory a cached token holds and a decode streams). Values are written rounded to
   nearest even, as torch's .to(torch.bfloat16) rounds, so this step and the PyTorch forward fill
   the cache with the same bits; scores and sums stay float32. */
#ifdef TK_KV_BF16
static inline float kv_at(const kv_t *p, int64_t i) {
    uint32_t u = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void kv_store(kv_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof u);
        dst[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
}
#else
static inline float kv_at(const kv_t *p, int64_t i) { return p[i]; }
static inline void kv_store(kv_t *dst, const float *src, int64_t n) { memcpy(dst, src, sizeof(float) * (size_t)n); }
#endif

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
#else
static inline float dot1(const float *w, const float *x, int64_t K) {
    float s = 0.f;
    _Pragma("omp simd reduction(+:s)")
    for (int64_t k = 0; k < K; k++) s += w[k] * x[k];
    return s;
}
#endif
#include "lora.c"

/* Linear weights are packed in panels of 16 output features: P[N/16][K][16] (the last panel
   zero-padded), so one step down K reads 16 consecutive weights (one cache line in float32). tile_RP computes R
   input rows against P consecutive panels (R * P <= 6): 2RP accumulators of 8 lanes, the register
   tile of BLIS-style AVX2 kernels. Twelve accumulators are twelve independent FMA chains, enough to
   cover the FMA latency on both pipes, and a tile of few rows reads several panels at once, so a
   small step (a decode of one or two sequences, a verify chunk) keeps several memory streams going.
   Every output is one FMA chain down K in order, so a row's result does not depend on how many
   rows share the call nor on the tile it lands in. */
#if defined(__AVX2__) && defined(__FMA__)
/* one panel row: features 0-7 in lo, 8-15 in hi */
static inline __attribute__((always_inline)) void panel_row(const panel_t *p, __m256 *lo, __m256 *hi) {
#ifdef TK_PANEL_BF16
    __m256i w = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w));
#else
    *lo = _mm256_loadu_ps(p);
    *hi = _mm256_loadu_ps(p + 8);
#endif
}
static inline __attribute__((always_inline)) void tile_RP(const int R, const int P, const float *x, int64_t xs,
                                                          const panel_t *p, int64_t K, float *t) {
    __m256 c[6][2];
    _Pragma("GCC unroll 6")
    for (int i = 0; i < 6; i++) c[i][0] = c[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        /* 2 KiB ahead in the first panel: without it a tile of many rows waits on memory */
        _mm_prefetch((const char *)(p + k * 16) + 2048, _MM_HINT_T0);
        if (R == 1) {  /* one broadcast for every panel (float32 panel loads fold into the FMAs) */
            __m256 a = _mm256_broadcast_ss(x + k);
            _Pragma("GCC unroll 6")
            for (int q = 0; q < P; q++) {
                __m256 b0, b1;
                panel_row(p + q * K * 16 + k * 16, &b0, &b1);
                c[q][0] = _mm256_fmadd_ps(a, b0, c[q][0]);
                c[q][1] = _mm256_fmadd_ps(a, b1, c[q][1]);
            }
        } else {  /* one panel's line in two registers, each row's element broadcast to meet it */
            _Pragma("GCC unroll 6")
            for (int q = 0; q < P; q++) {
                __m256 b0, b1;
                panel_row(p + q * K * 16 + k * 16, &b0, &b1);
                _Pragma("GCC unroll 6")
                for (int r = 0; r < R; r++) {
                    __m256 a = _mm256_broadcast_ss(x + r * xs + k);
                    c[r * P + q][0] = _mm256_fmadd_ps(a, b0, c[r * P + q][0]);
                    c[r * P + q][1] = _mm256_fmadd_ps(a, b1, c[r * P + q][1]);
                }
            }
        }
    }
    _Pragma("GCC unroll 6")
    for (int i = 0; i < R * P; i++) {
        _mm256_storeu_ps(t + i * 16, c[i][0]);
        _mm256_storeu_ps(t + i * 16 + 8, c[i][1]);
    }
}
#else
static inline void tile_RP(const int R, const int P, const float *x, int64_t xs, const panel_t *p, int64_t K,
                           float *t) {
    for (int r = 0; r < R; r++)
        for (int q = 0; q < P; q++) {
            float c[16] = {0};
            const float *xr = x + r * xs;
            const panel_t *pq = p + q * K * 16;
            for (int64_t k = 0; k < K; k++) {
                _Pragma("omp simd")
                for (int j = 0; j < 16; j++) c[j] += xr[k] * panel_at(pq + k * 16, j);
            }
            memcpy(t + (r * P + q) * 16, c, sizeof c);
        }
}
#endif

/* t[(r * P + q) * 16 ..] = rows r < R of x against panels q < P from p (R * P <= 6; the shapes
   gemm uses, each compiled with its registers fixed) */
static void tile(int64_t R, int64_t P, const float *x, int64_t xs, const panel_t *p, int64_t K, float *t) {
#define TK_TILE(R_, P_) case R_ * 8 + P_: tile_RP(R_, P_, x, xs, p, K, t); break;
    switch (R * 8 + P) {
        TK_TILE(1, 1) TK_TILE(1, 2) TK_TILE(1, 3) TK_TILE(1, 4) TK_TILE(1, 5) TK_TILE(1, 6)
        TK_TILE(2, 1) TK_TILE(2, 2) TK_TILE(2, 3) TK_TILE(3, 1) TK_TILE(3, 2) TK_TILE(4, 1) TK_TILE(5, 1)
        default: tile_RP(6, 1, x, xs, p, K, t); break;
    }
#undef TK_TILE
}

/* the bias of one panel (16 outputs from n0, nn of them real; zeros without a bias) */
static inline void panel_bias(const float *b, int64_t n0, int64_t nn, float *bias) {
    for (int j = 0; j < 16; j++) bias[j] = b && j < nn ? b[n0 + j] : 0.f;
}

/* one row of a panel's output, nn of its 16 real: yr (+)= tr + bias */
static inline void put_row(float *restrict yr, const float *restrict tr, const float *restrict bias, int64_t nn,
                           int acc) {
    if (nn == 16 && acc) {
        _Pragma("omp simd")
        for (int j = 0; j < 16; j++) yr[j] += tr[j] + bias[j];
    } else if (nn == 16) {
        _Pragma("omp simd")
        for (int j = 0; j < 16; j++) yr[j] = tr[j] + bias[j];
    } else {
        for (int64_t j = 0; j < nn; j++) yr[j] = acc ? yr[j] + (tr[j] + bias[j]) : tr[j] + bias[j];
    }
}

/* y[m, n] (+)= W[n, :] . x[m, :] (+ b[n]) for m < M, x rows xs apart, W packed in panels (above).
   Called inside a parallel region of nt threads: they share out groups of panels; each group is read
   from memory once and stays in cache while every row tile passes over it. The rows go in tiles of
   six, the rest (1-5 rows) in one tile, except that 4 rows are two tiles of 2 (a 4-row tile has only
   eight FMA chains). A tile of R rows takes 6 / R panels at a time, so a group is 6 / R panels for
   the smallest tile (capped so that every thread gets at least two groups). */
static void gemm(const float *restrict x, int64_t xs, int64_t M, const panel_t *restrict P,
                 const float *restrict b, float *restrict y, int64_t N, int64_t K, int acc, int nt) {
    int64_t num_panels = (N + 15) / 16;
    int64_t rest = M % 6, full = M / 6, last = rest == 4 ? 2 : rest;
    int64_t tiles = full + (rest == 4 ? 2 : rest > 0), G = 6 / (last ? last : 6);
    int64_t cap = num_panels / (2 * (nt > 1 ? nt : 1));
    if (G > cap) G = cap > 1 ? cap : 1;
    int64_t groups = (num_panels + G - 1) / G;
    _Pragma("omp for schedule(dynamic, 1)")
    for (int64_t g = 0; g < groups; g++) {
        int64_t p0 = g * G, np = num_panels - p0 < G ? num_panels - p0 : G;
        float t[6 * 16], bias[16];
        for (int64_t ti = 0; ti < tiles; ti++) {
            int64_t R = ti < full ? 6 : last, m = ti < full ? ti * 6 : full * 6 + (ti - full) * last;
            for (int64_t q0 = 0; q0 < np; q0 += 6 / R) {
                int64_t nq = np - q0 < 6 / R ? np - q0 : 6 / R;
                tile(R, nq, x + m * xs, xs, P + (p0 + q0) * K * 16, K, t);
                for (int64_t q = 0; q < nq; q++) {
                    int64_t n0 = (p0 + q0 + q) * 16, nn = N - n0 < 16 ? N - n0 : 16;
                    panel_bias(b, n0, nn, bias);
                    for (int64_t r = 0; r < R; r++) put_row(y + (m + r) * N + n0, t + (r * nq + q) * 16, bias, nn, acc);
                }
            }
        }
    }
}

/* A linear layer on its own (the PyTorch forward, for steps over the fused step's rows): y = x W^T (+ b), x [M, K]. */
int linear_panels(const float *x, int64_t M, const panel_t *P, const float *b, float *y, int64_t N, int64_t K,
                  int nthreads) {
    _Pragma("omp parallel num_threads(nthreads) if(nthreads > 1)")
    gemm(x, K, M, P, b, y, N, K, 0, nthreads);
    return 0;
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
/* row[i] = silu(row[i]) * row[I + i] for i < I (gate and up halves of one gate/up output row) */
static inline void silu_mul(float *row, int64_t I) {
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) {
        __m256 g = _mm256_loadu_ps(row + i), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(row + i, _mm256_mul_ps(s, _mm256_loadu_ps(row + I + i)));
    }
    for (; i < I; i++) row[i] = row[i] / (1.f + expf(-row[i])) * row[I + i];
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
static inline void silu_mul(float *row, int64_t I) {
    for (int64_t i = 0; i < I; i++) row[i] = row[i] / (1.f + expf(-row[i])) * row[I + i];
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#ifdef TK_KV_BF16
static inline __m256 kv_load8(const kv_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline float dot_kv(const float *q, const kv_t *k, int64_t D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv_load8(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), kv_load8(k + d + 8), a1);
    }
    for (; d + 8 <= D; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv_load8(k + d), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; d < D; d++) s += q[d] * kv_at(k, d);
    return s;
}
static inline void axpy_kv(float *o, float w, const kv_t *v, int64_t D) {
    __m256 w8 = _mm256_set1_ps(w);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w8, kv_load8(v + d), _mm256_loadu_ps(o + d)));
    for (; d < D; d++) o[d] += w * kv_at(v, d);
}
#else
static inline __m256 kv_load8(const kv_t *p) { return _mm256_loadu_ps(p); }
#endif
/* scale * q_h . k_(h/G) for the 8 query heads h0..h0+7 of one row, k the cache row of one position
   (all KV heads), D a multiple of 8: eight dot products side by side, their lanes summed by one
   transpose-and-add (lane j holds head h0 + j) */
static inline __m256 dot8(const float *q, const kv_t *k, int64_t h0, int64_t G, int64_t D, float scale) {
    __m256 a[8];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++) {
        const float *qh = q + (h0 + j) * D;
        const kv_t *kh = k + ((h0 + j) / G) * D;
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(qh), kv_load8(kh));
        for (int64_t d = 8; d < D; d += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), kv_load8(kh + d), s);
        a[j] = s;
    }
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    return _mm256_mul_ps(s, _mm256_set1_ps(scale));
}

/* out[h][0..8ND) = sum over positions a + i, i in [i0, i1), of w[i * ws + h] * v(p)[0..8ND) for the NH
   heads h < NH that share one KV head; v(p) is that head's slice of the cache row of position p
   (vs floats per cache row, found through the block table). The NH x ND accumulators stay in
   registers down the whole stretch, each position's slice is loaded once for all NH heads. */
static inline __attribute__((always_inline)) void value_tile(const int NH, const int ND, const float *w, int64_t ws,
        const kv_t *v, int64_t vs, const int64_t *tab, int64_t BS, int64_t a, int64_t i0, int64_t i1, float *out,
        int64_t os) {
    __m256 c[3][4];
    _Pragma("GCC unroll 3")
    for (int h = 0; h < 3; h++) c[h][0] = c[h][1] = c[h][2] = c[h][3] = _mm256_setzero_ps();
    for (int64_t i = i0; i < i1;) {
        int64_t p = a + i, blk = tab[p / BS], off = p % BS, cnt = BS - off < i1 - i ? BS - off : i1 - i;
        if (blk >= 0) {
            const kv_t *row = v + (blk * BS + off) * vs;
            for (int64_t t = 0; t < cnt; t++, row += vs) {
                const float *wi = w + (i + t) * ws;
                _Pragma("GCC unroll 4")
                for (int d = 0; d < ND; d++) {
                    __m256 x = kv_load8(row + d * 8);
                    _Pragma("GCC unroll 3")
                    for (int h = 0; h < NH; h++) c[h][d] = _mm256_fmadd_ps(_mm256_broadcast_ss(wi + h), x, c[h][d]);
                }
            }
        }
        i += cnt;
    }
    _Pragma("GCC unroll 3")
    for (int h = 0; h < NH; h++) {
        _Pragma("GCC unroll 4")
        for (int d = 0; d < ND; d++) _mm256_storeu_ps(out + h * os + d * 8, c[h][d]);
    }
}
static void value_pass(int shape, const float *w, int64_t ws, const kv_t *v, int64_t vs, const int64_t *tab, int64_t BS,
                       int64_t a, int64_t i0, int64_t i1, float *out, int64_t os) {
#define TK_VALUE(NH_, ND_) case NH_ * 8 + ND_: value_tile(NH_, ND_, w, ws, v, vs, tab, BS, a, i0, i1, out, os); break;
    switch (shape) {
        TK_VALUE(1, 1) TK_VALUE(1, 2) TK_VALUE(1, 3) TK_VALUE(1, 4) TK_VALUE(2, 1) TK_VALUE(2, 2)
        TK_VALUE(2, 3) TK_VALUE(2, 4) TK_VALUE(3, 1) TK_VALUE(3, 2) TK_VALUE(3, 3)
        default: value_tile(3, 4, w, ws, v, vs, tab, BS, a, i0, i1, out, os); break;
    }
#undef TK_VALUE
}
#define TK_VEC 8
#else
#define TK_VEC 0
#ifdef TK_KV_BF16
static inline float dot_kv(const float *q, const kv_t *k, int64_t D) {
    float s = 0.f;
    for (int64_t d = 0; d < D; d++) s += q[d] * kv_at(k, d);
    return s;
}
static inline void axpy_kv(float *o, float w, const kv_t *v, int64_t D) {
    for (int64_t d = 0; d < D; d++) o[d] += w * kv_at(v, d);
}
#endif
#endif
#ifndef TK_KV_BF16  /* float32 rows: the plain helpers, bit for bit the products they always were */
#define dot_kv dot1
#define axpy_kv axpy
#endif

/* Split-KV attention for R consecutive rows of one sequence (a decode is one row; a verify or
   catch-up chunk several, at consecutive positions): their R x H query heads over positions
   [a, b), a stretch of the union of their windows. Every K row (all KV heads, contiguous in the
   cache) is read once, in order, for all R rows, then every V row: each thread streams its own
   stretch of the cache once. Row r sees positions in [lo[r], ctx[r]) (causal, sliding window).
   Scores are kept per row as [position][head], so eight heads are scored, maxed and exponentiated
   in one vector. Writes each row's part (parts + r * pstride): per-head max and exp-sum
   (part[0..H), part[H..2H)) and its unnormalised output (part + 2H, [H, D]); merge() combines the
   parts. softcap > 0: scores capped (Gemma 2). */
static void attend_part(const float *q, int64_t qs, int64_t R, const int64_t *lo, const int64_t *ctx,
                        const kv_t *kc, const kv_t *vc, const int64_t *tab, int64_t a, int64_t b,
                        float *parts, int64_t pstride, float *scores, int64_t H, int64_t KVH, int64_t D,
                        int64_t BS, float scale, float softcap) {
    int64_t n = b - a, G = H / KVH, H8 = (TK_VEC && D % 8 == 0) ? H / 8 * 8 : 0;
    (void)H8;  /* a build without AVX2 has no 8-head loops */
    for (int64_t i = 0; i < n; i++) {
        int64_t p = a + i, blk = tab[p / BS];
        const kv_t *row = blk < 0 ? NULL : kc + (blk * BS + p % BS) * KVH * D;
        for (int64_t r = 0; r < R; r++) {
            float *si = scores + (r * n + i) * H;
            const float *qr = q + r * qs;
            if (!row || p >= ctx[r] || p < lo[r]) { for (int64_t h = 0; h < H; h++) si[h] = -INFINITY; continue; }
            int64_t h = 0;
#if TK_VEC
            for (; h < H8; h += 8) _mm256_storeu_ps(si + h, dot8(qr, row, h, G, D, scale));
#endif
            for (; h < H; h++) si[h] = dot_kv(qr + h * D, row + (h / G) * D, D) * scale;
            if (softcap > 0.f)  /* Gemma 2: cap * tanh(s / cap), before the mask (masked scores stay -inf) */
                for (h = 0; h < H; h++) si[h] = tanhf(si[h] / softcap) * softcap;
        }
    }
    for (int64_t r = 0; r < R; r++) {
        float *part = parts + r * pstride, *mx = part, *sum = part + H, *sr = scores + r * n * H;
        memset(part + 2 * H, 0, sizeof(float) * H * D);
        /* masking is per position, the same for every head: a row sees all or none of its heads */
        int64_t seen = 0;
        for (int64_t i = 0; i < n && !seen; i++) seen = sr[i * H] != -INFINITY;
        if (!seen) {
            for (int64_t h = 0; h < H; h++) { mx[h] = -INFINITY; sum[h] = 0.f; }
            for (int64_t i = 0; i < n * H; i++) sr[i] = 0.f;
            continue;
        }
        int64_t h = 0;
#if TK_VEC
        for (; h < H8; h += 8) {
            __m256 m8 = _mm256_set1_ps(-INFINITY), s8 = _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i++) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sr + i * H + h));
            for (int64_t i = 0; i < n; i++) {
                __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + i * H + h), m8));
                _mm256_storeu_ps(sr + i * H + h, e);
                s8 = _mm256_add_ps(s8, e);
            }
            _mm256_storeu_ps(mx + h, m8);
            _mm256_storeu_ps(sum + h, s8);
        }
#endif
        for (; h < H; h++) {
            float m = -INFINITY, s = 0.f;
            for (int64_t i = 0; i < n; i++) m = sr[i * H + h] > m ? sr[i * H + h] : m;
            for (int64_t i = 0; i < n; i++) {
                float e = sr[i * H + h] == -INFINITY ? 0.f : expf(sr[i * H + h] - m);
                sr[i * H + h] = e;
                s += e;
            }
            mx[h] = m;
            sum[h] = s;
        }
    }
#if TK_VEC
    /* rows of one chunk: per row, the stretch of V read once per KV head (from cache after the first
       row), the outputs in registers. A lone decode row keeps the position-major pass below, which
       streams each V row once: per KV head passes were slower on 48 single-row sequences. */
    if (D % 8 == 0 && R > 1) {
        for (int64_t r = 0; r < R; r++) {
            int64_t i0 = (lo[r] > a ? lo[r] : a) - a, i1 = (ctx[r] < b ? ctx[r] : b) - a;
            float *acc = parts + r * pstride + 2 * H;
            for (int64_t j = 0; j < KVH; j++)
                for (int64_t g = 0; g < G; g += 3)
                    for (int64_t d = 0; d < D; d += 32) {
                        int64_t nh = G - g < 3 ? G - g : 3, nd = (D - d) / 8 < 4 ? (D - d) / 8 : 4;
                        value_pass(nh * 8 + nd, scores + r * n * H + j * G + g, H, vc + j * D + d, KVH * D, tab, BS,
                                   a, i0, i1, acc + (j * G + g) * D + d, D);
                    }
        }
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        int64_t p = a + i, blk = tab[p / BS];
        if (blk < 0) continue;
        const kv_t *row = vc + (blk * BS + p % BS) * KVH * D;
        for (int64_t r = 0; r < R; r++) {
            if (p >= ctx[r] || p < lo[r]) continue;
            float *acc = parts + r * pstride + 2 * H;
            const float *si = scores + (r * n + i) * H;
            for (int64_t h = 0; h < H; h++) axpy_kv(acc + h * D, si[h], row + (h / G) * D, D);
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

/* the first position a row with context length L sees (a sliding window starts later) */
static inline int64_t window_start(const tk_layer *ly, int64_t L) {
    return (ly->window > 0 && L > ly->window) ? L - ly->window : 0;
}

/* Chunks over TK_ROW_SPLIT rows (prefills) split their attention between the threads by rows
   (attend_rows), attending in blocks of at most TK_ROW_BLOCK rows; shorter ones by positions. */
#define TK_ROW_SPLIT 16
#define TK_ROW_BLOCK 64
/* The attention of a long chunk (R rows of sequence m from row m), part sp of S: the rows that start
   in the sp-th S-th of the chunk's work (positions seen, summed over rows), in blocks of rows over
   the stretch their windows span. Rows owned elsewhere are skipped; the other parts of the owned
   rows are marked empty for merge(). */
static void attend_rows(const tk_layer *ly, const float *qkv, int64_t QKV, int64_t m, int64_t R, int64_t sp,
                        int64_t S, const int64_t *ctx, const int64_t *tab, float *partbuf, int64_t PS, float *scores,
                        int64_t *lo, int64_t H, int64_t KVH, int64_t D, int64_t BS, float scale, float softcap) {
    int64_t total = 0, r0 = -1, r1 = 0, seen = 0;
    for (int64_t r = 0; r < R; r++) total += ctx[m + r] - window_start(ly, ctx[m + r]);
    for (int64_t r = 0; r < R; r++) {  /* row r is part (work before it) * S / total's */
        int64_t t = seen * S / total;
        if (t > sp) break;
        if (t == sp) { r0 = r0 < 0 ? r : r0; r1 = r + 1; }
        seen += ctx[m + r] - window_start(ly, ctx[m + r]);
    }
    if (r0 < 0) return;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < S; t++)
            if (t != sp) for (int64_t h = 0; h < H; h++) partbuf[((m + r) * S + t) * PS + h] = -INFINITY;
    for (int64_t b0 = r0; b0 < r1; b0 += TK_ROW_BLOCK) {
        int64_t nb = r1 - b0 < TK_ROW_BLOCK ? r1 - b0 : TK_ROW_BLOCK, a = -1;
        for (int64_t r = 0; r < nb; r++) {
            lo[r] = window_start(ly, ctx[m + b0 + r]);
            a = a < 0 || lo[r] < a ? lo[r] : a;
        }
        attend_part(qkv + (m + b0) * QKV, QKV, nb, lo, ctx + m + b0, ly->kc, ly->vc, tab, a, ctx[m + b0 + nb - 1],
                    partbuf + ((m + b0) * S + sp) * PS, S * PS, scores, H, KVH, D, BS, scale, softcap);
    }
}

#include "fused_step.c"
