/*
 * C source, part 1 of the quantized linear kernels (:mod:`tokenops.engine.kernels.quant_kernels`): the GGUF
 * block formats, decoded to float32 (the GEMM path and the plain-C fallback) and the two-byte quantization
 * of activations that the integer GEMV path multiplies against.
 *
 * Block layouts are ggml's, byte for byte (`gguf.quants` decodes the same bytes in numpy):
 *
 * ===== ====== ===== ===========================================================================
 * type  values bytes layout
 * ===== ====== ===== ===========================================================================
 * Q8_0  32     34    f16 d, int8 q[32]; v = d*q
 * Q4_0  32     18    f16 d, q[16] nibbles (low: values 0-15, high: 16-31); v = d*(q-8)
 * Q4_1  32     20    f16 d, f16 m, nibbles as Q4_0; v = d*q + m
 * Q4_K  256    144   f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) for 8 sub-blocks of 32, q[128]
 *                    nibbles (32 bytes per two sub-blocks: low nibbles the first); v = d*sc*q - dmin*mn
 * Q5_K  256    176   as Q4_K plus qh[32] before q: bit 2i / 2i+1 of qh[l] is bit 4 of value l of
 *                    sub-block 2i / 2i+1
 * Q6_K  256    210   ql[128] low nibbles, qh[64] 2-bit highs, int8 scales[16] (one per 16 values),
 *                    f16 d; v = d*sc*(q-32)
 * ===== ====== ===== ===========================================================================
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: formats). */
#include "quant.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#if !defined(TK_PLAIN) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TK_AVX2 1
#endif

#define TK_INLINE static inline __attribute__((always_inline))
#ifdef TK_AVX2
static inline float qk_hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}
#endif
enum { TK_Q4_0 = 2, TK_Q4_1 = 3, TK_Q8_0 = 8, TK_Q4_K = 12, TK_Q5_K = 13, TK_Q6_K = 14 };

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef TK_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {  /* zero or subnormal: m * 2^-24 */
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= s;
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* the 6-bit scale and min of sub-block j (0-7) of a Q4_K / Q5_K super-block */
TK_INLINE void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* values per block, bytes per block */
static int qk_block(int t) {
    return t == TK_Q4_K || t == TK_Q5_K || t == TK_Q6_K ? 256 : 32;
}
static int qk_bytes(int t) {
    switch (t) {
        case TK_Q8_0: return 34;
        case TK_Q4_0: return 18;
        case TK_Q4_1: return 20;
        case TK_Q4_K: return 144;
        case TK_Q5_K: return 176;
        case TK_Q6_K: return 210;
        default: return 0;
    }
}

/* One weight row (K values, K a multiple of the block) as float32. Plain loops the compiler
   vectorizes: they run once per weight per call on the GEMM path, amortized over its rows. */
static void dequant_row(int t, const uint8_t *restrict w, float *restrict y, int64_t K) {
    int64_t nb = K / qk_block(t);
    for (int64_t b = 0; b < nb; b++) {
        switch (t) {
        case TK_Q8_0: {
            const uint8_t *p = w + b * 34;
            float d = h2f(p);
            const int8_t *q = (const int8_t *)(p + 2);
            float *o = y + b * 32;
            _Pragma("omp simd")
            for (int l = 0; l < 32; l++) o[l] = d * (float)q[l];
            break;
        }
        case TK_Q4_0:
        case TK_Q4_1: {
            const uint8_t *p = w + b * (t == TK_Q4_0 ? 18 : 20);
            float d = h2f(p), m = t == TK_Q4_0 ? -8.f * d : h2f(p + 2);
            const uint8_t *q = p + (t == TK_Q4_0 ? 2 : 4);
            float *o = y + b * 32;
            _Pragma("omp simd")
            for (int l = 0; l < 16; l++) {
                o[l] = d * (float)(q[l] & 15) + m;
                o[l + 16] = d * (float)(q[l] >> 4) + m;
            }
            break;
        }
        case TK_Q4_K:
        case TK_Q5_K: {
            const uint8_t *p = w + b * (t == TK_Q4_K ? 144 : 176);
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc = p + 4, *qh = p + 16, *q = p + (t == TK_Q4_K ? 16 : 48);
            float *o = y + b * 256;
            for (int i = 0; i < 4; i++) {
                int s0, m0, s1, m1;
                scale_min_k4(2 * i, sc, &s0, &m0);
                scale_min_k4(2 * i + 1, sc, &s1, &m1);
                float d0 = d * s0, c0 = dmin * m0, d1 = d * s1, c1 = dmin * m1;
                const uint8_t *qi = q + 32 * i;
                if (t == TK_Q4_K) {
                    _Pragma("omp simd")
                    for (int l = 0; l < 32; l++) {
                        o[64 * i + l] = d0 * (float)(qi[l] & 15) - c0;
                        o[64 * i + 32 + l] = d1 * (float)(qi[l] >> 4) - c1;
                    }
                } else {
                    _Pragma("omp simd")
                    for (int l = 0; l < 32; l++) {
                        int h0 = (qh[l] >> (2 * i)) & 1, h1 = (qh[l] >> (2 * i + 1)) & 1;
                        o[64 * i + l] = d0 * (float)((qi[l] & 15) | (h0 << 4)) - c0;
                        o[64 * i + 32 + l] = d1 * (float)((qi[l] >> 4) | (h1 << 4)) - c1;
                    }
                }
            }
            break;
        }
        case TK_Q6_K: {
            const uint8_t *p = w + b * 210;
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            float *o = y + b * 256;
            for (int n = 0; n < 2; n++) {
                const uint8_t *l0 = ql + 64 * n, *h = qh + 32 * n;
                const int8_t *s = sc + 8 * n;
                float *on = o + 128 * n;
                _Pragma("omp simd")
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    on[l] = d * s[is] * (float)(((l0[l] & 15) | ((h[l] & 3) << 4)) - 32);
                    on[l + 32] = d * s[is + 2] * (float)(((l0[l + 32] & 15) | (((h[l] >> 2) & 3) << 4)) - 32);
                    on[l + 64] = d * s[is + 4] * (float)(((l0[l] >> 4) | (((h[l] >> 4) & 3) << 4)) - 32);
                    on[l + 96] = d * s[is + 6] * (float)(((l0[l + 32] >> 4) | (((h[l] >> 6) & 3) << 4)) - 32);
                }
            }
            break;
        }
        }
    }
}

/* Activations for the integer GEMV, two bytes per value: per block of 32, q = round(x / d) with
   d = max|x| / 127, then the remainder x - q d rounded the same way on a 254x finer scale, q2 =
   round((x - q d) / d2) with d2 = d / 254 (|q2| <= 127). x ~ q d + q2 d2 to 1/64516 of the block's
   largest value, near float16's precision, where 8 bits alone (llama.cpp's Q8 activations) leave
   0.4%: on SmolLM2-135M that moved logits by ~3% of the largest and flipped near-tied greedy
   tokens. Each product is then two integer dot products (q and q2 against the same weight bytes).
   The block's sums are kept scaled (s32 per 32 values, s16 per 16): the formats' offsets, v = scale
   * code + offset, need sum(x) over a block, and Q6_K's scales cover 16 values.
   * One byte on a build without VNNI (TK_ACT_K256), for a product with a K-quant weight: one scale per
   * 256 values, llama.cpp's q8_K; d is still filled per 32 (each block of a super-block has its
   * scale), and b16 / b32 are the integer sums of q per 16 / 32 values (its bsums; |b32| <= 32 * 127),
   * which the kernels that apply the weights' sub-block scales in integer need (quant_packed_km.c).
   * Elsewhere b16 / b32 are not filled. */
typedef struct {
    int8_t *q, *q2;
    float *d, *d2, *s32, *s16;
    int16_t *b16, *b32;
} tk_act;

/* One byte per 256 values where the kernels for one byte multiply with `maddubs` (no VNNI): a scale per
   32 values costs the K-quant kernels a float epilogue per 32 values and row (a quarter of their work),
   a scale per 256 one per 256. As llama.cpp's: q8_K for the products with a K-quant weight, q8_0 (a
   scale per 32) for the 32-value formats (qk_act_k256). With VNNI (and the plain build) one byte keeps
   a scale per 32 for all. */
#if defined(TK_AVX2) && !defined(__AVXVNNI__) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define TK_ACT_K256 1
#else
#define TK_ACT_K256 0
#endif

/* Bytes per activation value: 2 (q and q2, the default) or 1 (q alone, q2 = 0 and d2 = 0: llama.cpp's
   one-byte activations, with a scale per 32 values, or per 256 as its q8_K where TK_ACT_K256). The
   kernels specialised for one byte skip the q2 products (half the integer work); every other kernel
   multiplies the zeros, so any kernel is right in either mode. Set by qk_set_act_bytes (the engine's
   quant_act_bytes), not while a product runs. */
static int tk_act_bytes = 2;
int qk_set_act_bytes(int n) {
    if (n == 1 || n == 2) __atomic_store_n(&tk_act_bytes, n, __ATOMIC_RELAXED);
    return __atomic_load_n(&tk_act_bytes, __ATOMIC_RELAXED);
}
static inline int tk_act_one(void) { return __atomic_load_n(&tk_act_bytes, __ATOMIC_RELAXED) == 1; }

/* x as the integer GEMV sees it (q d + q2 d2), back in float32: what the GEMM multiplies when its
   results must match the integer GEMV's (to float32 rounding); k256 as for quantize_act */
static void round_act(const float *restrict x, int64_t K, float *restrict y, int k256) {
    const int one = tk_act_one();
#if TK_ACT_K256
    if (one && k256) {  /* quantize_act_k256's q d */
        for (int64_t s0 = 0; s0 < K; s0 += 256) {
            const int64_t n = K - s0 < 256 ? K - s0 : 256;
            float amax = 0.f;
            for (int64_t l = 0; l < n; l++) amax = fmaxf(amax, fabsf(x[s0 + l]));
            float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
            for (int64_t l = 0; l < n; l++) y[s0 + l] = (float)lrintf(x[s0 + l] * id) * d;
        }
        return;
    }
#else
    (void)k256;
#endif
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.f;
        _Pragma("omp simd reduction(max:amax)")
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(xb[l]));
        float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f, d2 = d / 254.f, id2 = d2 > 0.f ? 1.f / d2 : 0.f;
        if (one) d2 = id2 = 0.f;
        for (int l = 0; l < 32; l++) {
            float q = (float)lrintf(xb[l] * id), r = xb[l] - q * d;
            float q2 = fminf(fmaxf((float)lrintf(r * id2), -127.f), 127.f);
            y[b * 32 + l] = q * d + q2 * d2;
        }
    }
}

#if TK_ACT_K256
static inline int qk_hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

/* one byte, one scale per 256 values (a last part of K % 256 values has its own): d = max|x| / 127 over
   them, q = round(x / d); per block of 32 the same d, q2 = 0, d2 = 0, the sums as quantize_act keeps
   them and as integers (b16, b32) */
static void quantize_act_k256(const float *restrict x, int64_t K, tk_act a) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t s0 = 0; s0 < K; s0 += 256) {
        const int64_t n = K - s0 < 256 ? K - s0 : 256;
        __m256 mx = _mm256_setzero_ps();
        for (int64_t l = 0; l < n; l += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + s0 + l)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int64_t b = s0 / 32; b < (s0 + n) / 32; b++) {
            __m256i q[4];
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b * 32 + 8 * i), _mm256_set1_ps(id)));
            int s16a = qk_hsum8i(_mm256_add_epi32(q[0], q[1])), s16b = qk_hsum8i(_mm256_add_epi32(q[2], q[3]));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(a.q + b * 32), _mm256_permutevar8x32_epi32(p, order));
            _mm256_storeu_si256((__m256i *)(a.q2 + b * 32), _mm256_setzero_si256());
            a.d[b] = d;
            a.d2[b] = 0.f;
            a.s16[2 * b] = d * (float)s16a;
            a.s16[2 * b + 1] = d * (float)s16b;
            a.s32[b] = d * (float)(s16a + s16b);
            a.b16[2 * b] = (int16_t)s16a;
            a.b16[2 * b + 1] = (int16_t)s16b;
            a.b32[b] = (int16_t)(s16a + s16b);
        }
    }
}
#endif

/* k256: one byte takes a scale per 256 values (where TK_ACT_K256; qk_act_k256) */
__attribute__((unused))  /* the plain build (TK_PLAIN) multiplies float32 activations only */
static void quantize_act(const float *restrict x, int64_t K, tk_act a, int k256) {
    const int one = tk_act_one();  /* one byte: d2 = 0 (id2 = 0 makes q2 = 0) */
#if TK_ACT_K256
    if (one && k256) {
        quantize_act_k256(x, K, a);
        return;
    }
#else
    (void)k256;
#endif
#ifdef TK_AVX2
    /* the same arithmetic 8 lanes at a time (cvtps rounds half to even, as lrintf does) */
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + b * 32;
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / 127.f, id = d > 0.f ? 1.f / d : 0.f, d2 = d / 254.f;
        float id2 = d2 > 0.f && !one ? 1.f / d2 : 0.f;
        if (one) d2 = 0.f;
        __m256i q[4], q2[4];
        for (int i = 0; i < 4; i++) {
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
            __m256 r = _mm256_sub_ps(v[i], _mm256_mul_ps(_mm256_cvtepi32_ps(q[i]), _mm256_set1_ps(d)));
            q2[i] = _mm256_cvtps_epi32(_mm256_mul_ps(r, _mm256_set1_ps(id2)));
            q2[i] = _mm256_min_epi32(_mm256_max_epi32(q2[i], nlim), lim);
        }
        float s0 = qk_hsum8(_mm256_cvtepi32_ps(_mm256_add_epi32(q[0], q[1])));
        float s1 = qk_hsum8(_mm256_cvtepi32_ps(_mm256_add_epi32(q[2], q[3])));
        float t0 = qk_hsum8(_mm256_cvtepi32_ps(_mm256_add_epi32(q2[0], q2[1])));
        float t1 = qk_hsum8(_mm256_cvtepi32_ps(_mm256_add_epi32(q2[2], q2[3])));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(a.q + b * 32), _mm256_permutevar8x32_epi32(p, order));
        p = _mm256_packs_epi16(_mm256_packs_epi32(q2[0], q2[1]), _mm256_packs_epi32(q2[2], q2[3]));
        _mm256_storeu_si256((__m256i *)(a.q2 + b * 32), _mm256_permutevar8x32_epi32(p, order));
        a.d[b] = d;
        a.d2[b] = d2;
        a.s16[2 * b] = d * s0 + d2 * t0;
        a.s16[2 * b + 1] = d * s1 + d2 * t1;
        a.s32[b] = d * (s0 + s1) + d2 * (t0 + t1);
    }
#else
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.f;
        _Pragma("omp simd reduction(max:amax)")
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(xb[l]));
        float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f, d2 = d / 254.f, id2 = d2 > 0.f ? 1.f / d2 : 0.f;
        if (one) d2 = id2 = 0.f;
        int8_t *q = a.q + b * 32, *q2 = a.q2 + b * 32;
        int s[2] = {0, 0}, t[2] = {0, 0};
        for (int l = 0; l < 32; l++) {
            float qf = (float)lrintf(xb[l] * id), r = xb[l] - qf * d;
            long r2 = lrintf(r * id2);
            q[l] = (int8_t)qf;
            q2[l] = (int8_t)(r2 > 127 ? 127 : r2 < -127 ? -127 : r2);
            s[l / 16] += q[l];
            t[l / 16] += q2[l];
        }
        a.d[b] = d;
        a.d2[b] = d2;
        a.s16[2 * b] = d * (float)s[0] + d2 * (float)t[0];
        a.s16[2 * b + 1] = d * (float)s[1] + d2 * (float)t[1];
        a.s32[b] = d * (float)(s[0] + s[1]) + d2 * (float)(t[0] + t[1]);
    }
#endif
}
