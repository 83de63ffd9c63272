/* Decode attention straight from the paged KV cache, and an int8 linear for a few rows
 * (tokenops.engine.kernels.native). */
#include "paged_decode.h"
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
