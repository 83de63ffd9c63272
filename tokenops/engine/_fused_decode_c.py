"""C source of the fused decode step (:mod:`tokenops.engine.fused_decode`), compiled at first use by
:func:`tokenops.engine.native.build_library` (``cc -O3 -march=native -fopenmp``): AVX2 products and
exp where the CPU has them, plain C with ``omp simd`` otherwise."""

SOURCE = r"""
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
#endif

/* y[m, n] (+)= W[n, :] . x[m, :] (+ b[n]) for m < M; W is [N, K] row-major, x rows xs apart.
   Called inside a parallel region: each thread streams a contiguous range of W's rows once
   (up to four inputs share each read of a row; more re-read it from L1). */
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
