/*
 * C source, part 2 of the quantized linear kernels: the integer GEMV for a few rows (decode and
 * verify steps), AVX2 only (the plain-C build leaves it out and takes the dequantizing path).
 *
 * Each weight block is unpacked once into 32 unsigned bytes (its 4-, 5- or 6-bit codes, or |q| for
 * Q8_0) and multiplied against up to four rows of activations (both bytes of each) with `maddubs` + `madd` (or one
 * `dpbusd` where the CPU has AVX-VNNI): 32 multiply-adds in two instructions, integer-exact. The
 * block's scale turns the 8 int32 lanes into float once per block; the formats' offsets (Q4_0's -8,
 * Q4_1's min, the K-quants' mins, Q6_K's -32) become one scalar product per block with the activation
 * block's sum, which :c:func:`quantize_act` kept. This is llama.cpp's `vec_dot` scheme; the rows
 * share each unpacked block, so a step of four rows costs little more than one.
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: gemv). */
#include "quant.h"
#ifdef TK_AVX2
#if defined(__AVXVNNI__)
#define TK_DPBUSD(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
#define TK_HAVE_VNNI 1
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TK_DPBUSD(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define TK_HAVE_VNNI 1
#else
#define TK_DPBUSD(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define TK_HAVE_VNNI 0
#endif

/* sum over groups of 4 bytes of u8 u * s8 s, as 8 int32 lanes (lane i: bytes 4i-4i+3) */
TK_INLINE __m256i dot_us(__m256i u, __m256i s, const int vnni) {
    if (vnni) return TK_DPBUSD(u, s);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* two nibble halves of 16 bytes: low nibbles in the low lane, high nibbles in the high lane */
TK_INLINE __m256i nibbles16(const uint8_t *q) {
    __m128i raw = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

/* out[r] = W row . x row r for R <= 4 activation rows; nb blocks of the row's format. A template:
   R, T and vnni are constants at each call site, so the accumulators live in registers. */
TK_INLINE void gemv_row(const int T, const int R, const int vnni, const uint8_t *restrict w, int64_t nb,
                        const tk_act *a, float *out) {
    __m256 acc[4];
    float off[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) { acc[r] = _mm256_setzero_ps(); off[r] = 0.f; }
    const __m256i m15 = _mm256_set1_epi8(15), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        if (T == TK_Q8_0 || T == TK_Q4_0 || T == TK_Q4_1) {
            const uint8_t *p = w + b * (T == TK_Q8_0 ? 34 : T == TK_Q4_0 ? 18 : 20);
            float d = h2f(p), m = T == TK_Q4_1 ? h2f(p + 2) : -8.f * d;
            __m256i q;
            if (T == TK_Q8_0) q = _mm256_loadu_si256((const __m256i *)(p + 2));
            else q = nibbles16(p + (T == TK_Q4_0 ? 2 : 4));
            __m256i u = T == TK_Q8_0 ? _mm256_sign_epi8(q, q) : q;
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) {
                __m256i s = _mm256_loadu_si256((const __m256i *)(a[r].q + b * 32));
                __m256i s2 = _mm256_loadu_si256((const __m256i *)(a[r].q2 + b * 32));
                if (T == TK_Q8_0) {  /* |w| * (x * sign w) = w * x */
                    s = _mm256_sign_epi8(s, q);
                    s2 = _mm256_sign_epi8(s2, q);
                }
                __m256 f = _mm256_cvtepi32_ps(dot_us(u, s, vnni)), f2 = _mm256_cvtepi32_ps(dot_us(u, s2, vnni));
                acc[r] = _mm256_fmadd_ps(f, _mm256_set1_ps(d * a[r].d[b]), acc[r]);
                acc[r] = _mm256_fmadd_ps(f2, _mm256_set1_ps(d * a[r].d2[b]), acc[r]);
                if (T != TK_Q8_0) off[r] += m * a[r].s32[b];
            }
        } else if (T == TK_Q4_K || T == TK_Q5_K) {
            const uint8_t *p = w + b * (T == TK_Q4_K ? 144 : 176);
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc = p + 4, *q = p + (T == TK_Q4_K ? 16 : 48);
            float ds[8], mins[8];
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++) {
                int s, m;
                scale_min_k4(j, sc, &s, &m);
                ds[j] = d * (float)s;
                mins[j] = dmin * (float)m;
            }
            __m256i qh = T == TK_Q5_K ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; i++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
                __m256i lo = _mm256_and_si256(raw, m15), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
                if (T == TK_Q5_K) {  /* bits 2i and 2i+1 of each qh byte (shifting words: bits stay in their byte) */
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, m1), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), m1), 4));
                    qh = _mm256_srli_epi16(qh, 2);
                }
                int64_t c = b * 8 + 2 * i;  /* activation block of the low sub-block */
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    for (int h = 0; h < 2; h++) {  /* the activations' two bytes */
                        const int8_t *aq = h ? a[r].q2 : a[r].q;
                        const float *ad = h ? a[r].d2 : a[r].d;
                        __m256i s0 = _mm256_loadu_si256((const __m256i *)(aq + c * 32));
                        __m256i s1 = _mm256_loadu_si256((const __m256i *)(aq + c * 32 + 32));
                        __m256 f0 = _mm256_cvtepi32_ps(dot_us(lo, s0, vnni));
                        __m256 f1 = _mm256_cvtepi32_ps(dot_us(hi, s1, vnni));
                        acc[r] = _mm256_fmadd_ps(f0, _mm256_set1_ps(ds[2 * i] * ad[c]), acc[r]);
                        acc[r] = _mm256_fmadd_ps(f1, _mm256_set1_ps(ds[2 * i + 1] * ad[c + 1]), acc[r]);
                    }
                    off[r] -= mins[2 * i] * a[r].s32[c] + mins[2 * i + 1] * a[r].s32[c + 1];
                }
            }
        } else {  /* Q6_K */
            const uint8_t *p = w + b * 210;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            _Pragma("GCC unroll 2")
            for (int n = 0; n < 2; n++) {
                __m256i ql0 = _mm256_loadu_si256((const __m256i *)(p + 64 * n));
                __m256i ql1 = _mm256_loadu_si256((const __m256i *)(p + 64 * n + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * n));
                __m256i c4[4];
                c4[0] = _mm256_or_si256(_mm256_and_si256(ql0, m15), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                c4[1] = _mm256_or_si256(_mm256_and_si256(ql1, m15),
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
                c4[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m15),
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                c4[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m15),
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) {
                    int sa = sc[8 * n + 2 * j], sb = sc[8 * n + 2 * j + 1];
                    /* i16 pair sums: bytes 0-15 (scale sa) in the low lane, 16-31 (sb) in the high */
                    __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)sb), _mm_set1_epi16((short)sa));
                    int64_t c = b * 8 + 4 * n + j;
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < R; r++) {
                        for (int h = 0; h < 2; h++) {  /* the activations' two bytes */
                            const int8_t *aq = h ? a[r].q2 : a[r].q;
                            __m256i s = _mm256_loadu_si256((const __m256i *)(aq + c * 32));
                            __m256i i32 = _mm256_madd_epi16(_mm256_maddubs_epi16(c4[j], s), scv);
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32),
                                                     _mm256_set1_ps(d * (h ? a[r].d2[c] : a[r].d[c])), acc[r]);
                        }
                        off[r] -= 32.f * d * ((float)sa * a[r].s16[2 * c] + (float)sb * a[r].s16[2 * c + 1]);
                    }
                }
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) out[r] = qk_hsum8(acc[r]) + off[r];
}

/* rows m0..m0+R of y for output n, one format: R and vnni fixed per instance */
#define TK_GEMV_T(T_)                                                                                   \
static void gemv_##T_(int R, int vnni, const uint8_t *w, int64_t nb, const tk_act *a, float *out) {     \
    switch (R * 2 + vnni) {                                                                             \
        case 2: gemv_row(T_, 1, 0, w, nb, a, out); break;                                               \
        case 4: gemv_row(T_, 2, 0, w, nb, a, out); break;                                               \
        case 6: gemv_row(T_, 3, 0, w, nb, a, out); break;                                               \
        case 8: gemv_row(T_, 4, 0, w, nb, a, out); break;                                               \
        case 3: gemv_row(T_, 1, TK_HAVE_VNNI, w, nb, a, out); break;                                    \
        case 5: gemv_row(T_, 2, TK_HAVE_VNNI, w, nb, a, out); break;                                    \
        case 7: gemv_row(T_, 3, TK_HAVE_VNNI, w, nb, a, out); break;                                    \
        default: gemv_row(T_, 4, TK_HAVE_VNNI, w, nb, a, out); break;                                   \
    }                                                                                                   \
}
TK_GEMV_T(TK_Q8_0) TK_GEMV_T(TK_Q4_0) TK_GEMV_T(TK_Q4_1) TK_GEMV_T(TK_Q4_K) TK_GEMV_T(TK_Q5_K) TK_GEMV_T(TK_Q6_K)

typedef void (*tk_gemv_fn)(int, int, const uint8_t *, int64_t, const tk_act *, float *);
static tk_gemv_fn gemv_fn(int t) {
    switch (t) {
        case TK_Q8_0: return gemv_TK_Q8_0;
        case TK_Q4_0: return gemv_TK_Q4_0;
        case TK_Q4_1: return gemv_TK_Q4_1;
        case TK_Q4_K: return gemv_TK_Q4_K;
        case TK_Q5_K: return gemv_TK_Q5_K;
        default: return gemv_TK_Q6_K;
    }
}
#endif
