/*
 * C source, part 6 of the quantized linear kernels: the 512-bit path for packed weights (every
 * packed type; AVX-512 F + BW + VNNI), two groups of eight rows per instruction.
 *
 * The packed GEMV (:mod:`._quant_packed_c`) fills a 256-bit register with four code bytes of each of a
 * group's eight rows; here two adjacent groups' chunks share one 512-bit register, so one `vpdpbusd`
 * multiplies four activation bytes into sixteen rows' sums, and the nibble masks, scale conversions and
 * float epilogue are paid once for sixteen rows instead of twice for eight. The products and their
 * order are the 256-bit VNNI path's, lane for lane, so both give the same floats.
 *
 * Selected at run time: the source is compiled only where the compiler targets AVX-512 VNNI (the build
 * is `-march=native`, cached per CPU flags), and the library also asks the CPU
 * (`__builtin_cpu_supports`) before the first product. `EngineConfig.quant_avx512 = False` (or
 * :meth:`QuantKernels.set_avx512`) keeps the 256-bit path, which stays the fallback and is tested
 * against this one. An odd last group and the maddubs method take the 256-bit kernels.
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: avx512). */
#include "quant.h"
#if defined(TK_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define TK_AVX512 1
#endif

static int tk_avx512_state = -1;  /* -1: not decided yet, 0: 256-bit kernels, 1: the 512-bit ones */

/* whether the packed products use the 512-bit kernels: the build has them, the CPU says it runs them,
   (decided once, at the first product; qk_set_avx512 turns it off: EngineConfig.quant_avx512) */
static int tk_use_avx512(void) {
    int s = __atomic_load_n(&tk_avx512_state, __ATOMIC_RELAXED);
    if (s >= 0) return s;
#ifdef TK_AVX512
    __builtin_cpu_init();
    s = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    s = 0;
#endif
    __atomic_store_n(&tk_avx512_state, s, __ATOMIC_RELAXED);
    return s;
}

/* force the 512-bit path on (where it can run) or off, or (on < 0) back to the default (on where it can run);
   returns whether it is now on. Not while a product runs. */
int qk_set_avx512(int on) {
    __atomic_store_n(&tk_avx512_state, -1, __ATOMIC_RELAXED);
    if (on < 0) return tk_use_avx512();
#ifdef TK_AVX512
    __builtin_cpu_init();
    on = on && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    on = 0;
#endif
    __atomic_store_n(&tk_avx512_state, on, __ATOMIC_RELAXED);
    return on;
}
int qk_avx512_active(void) { return tk_use_avx512(); }

#ifdef TK_AVX512
TK_INLINE __m512i cat256(const uint8_t *lo, const uint8_t *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}
TK_INLINE __m512 halves_ph(const uint8_t *lo, const uint8_t *hi) {  /* 8 fp16 from each group */
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                                   _mm_loadu_si128((const __m128i *)hi), 1));
}
TK_INLINE __m512i bcast4_512(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
}

/* y rows r < R, 16 outputs each: lanes 0-7 group g0's rows, 8-15 the next group's (rb bytes on) */
TK_INLINE void gemv_pair512(const int H2, const int T, const int R, const uint8_t *restrict g0, int64_t rb, int64_t nb,
                            const tk_act *a, __m512 *out) {
    const int pb = T == TK_Q8_0 ? 272 : T == TK_Q4_0 ? 144 : 160, hdr = T == TK_Q4_1 ? 32 : 16;
    const __m512i m15 = _mm512_set1_epi8(15);
    __m512 acc[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = g0 + b * pb, *p1 = g0 + rb + b * pb;
        __m512 dv = halves_ph(p0, p1);
        __m512i s[4], s2[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) s[r] = s2[r] = _mm512_setzero_si512();
        if (T == TK_Q8_0) {
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++) {
                __m512i u = cat256(p0 + hdr + 32 * j, p1 + hdr + 32 * j);  /* w + 128 */
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    s[r] = _mm512_dpbusd_epi32(s[r], u, bcast4_512(a[r].q + b * 32 + 4 * j));
                    if (H2) s2[r] = _mm512_dpbusd_epi32(s2[r], u, bcast4_512(a[r].q2 + b * 32 + 4 * j));
                }
            }
        } else {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                __m512i raw = cat256(p0 + hdr + 32 * j, p1 + hdr + 32 * j);
                __m512i lo = _mm512_and_si512(raw, m15), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m15);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    s[r] = _mm512_dpbusd_epi32(s[r], lo, bcast4_512(a[r].q + b * 32 + 4 * j));
                    s[r] = _mm512_dpbusd_epi32(s[r], hi, bcast4_512(a[r].q + b * 32 + 16 + 4 * j));
                    if (H2) s2[r] = _mm512_dpbusd_epi32(s2[r], lo, bcast4_512(a[r].q2 + b * 32 + 4 * j));
                    if (H2) s2[r] = _mm512_dpbusd_epi32(s2[r], hi, bcast4_512(a[r].q2 + b * 32 + 16 + 4 * j));
                }
            }
        }
        __m512 mv = T == TK_Q4_1 ? halves_ph(p0 + 16, p1 + 16)
                                 : _mm512_mul_ps(dv, _mm512_set1_ps(T == TK_Q8_0 ? -128.f : -8.f));
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]), _mm512_set1_ps(a[r].d[b]));
            if (H2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2[r]), _mm512_set1_ps(a[r].d2[b]), f);
            acc[r] = _mm512_fmadd_ps(f, dv, acc[r]);
            acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a[r].s32[b]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

TK_INLINE __m512 scales512(__m512 d, const uint8_t *s0, const uint8_t *s1, const int is_signed) {
    __m128i b = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)s0), _mm_loadl_epi64((const __m128i *)s1));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b)));
}

/* the K-quants' packed kernel (gemv_group_k) two groups at a time: the same products in the same order */
TK_INLINE void gemv_pair512_k(const int H2, const int T, const int R, const uint8_t *restrict g0, int64_t rb,
                              int64_t nb,
                              const tk_act *a, __m512 *out) {
    const int pb = T == TK_Q4_K ? 1184 : T == TK_Q5_K ? 1440 : 1680;
    const __m512i m15 = _mm512_set1_epi8(15), m1 = _mm512_set1_epi8(1), m3 = _mm512_set1_epi8(3);
    __m512 acc[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = g0 + b * pb, *p1 = g0 + rb + b * pb;
        __m512 dv = halves_ph(p0, p1);
        if (T == TK_Q6_K) {
            for (int sb = 0; sb < 8; sb++) {
                const int n = sb / 4, j = sb % 4, ql = 144 + 256 * (2 * n + (j & 1)), qh = 144 + 1024 + 256 * n;
                int64_t c32 = b * 8 + sb;
                for (int hh = 0; hh < 2; hh++) {
                    __m512i s[4], s2[4];
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < 4; r++) s[r] = s2[r] = _mm512_setzero_si512();
                    _Pragma("GCC unroll 4")
                    for (int c = 4 * hh; c < 4 * hh + 4; c++) {
                        __m512i lv = cat256(p0 + ql + 32 * c, p1 + ql + 32 * c);
                        __m512i hv = cat256(p0 + qh + 32 * c, p1 + qh + 32 * c);
                        if (j >= 2) lv = _mm512_srli_epi16(lv, 4);
                        __m512i u = _mm512_or_si512(
                            _mm512_and_si512(lv, m15),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hv, 2 * j), m3), 4));
                        _Pragma("GCC unroll 4")
                        for (int r = 0; r < R; r++) {
                            s[r] = _mm512_dpbusd_epi32(s[r], u, bcast4_512(a[r].q + c32 * 32 + 4 * c));
                            if (H2) s2[r] = _mm512_dpbusd_epi32(s2[r], u, bcast4_512(a[r].q2 + c32 * 32 + 4 * c));
                        }
                    }
                    int so = 16 + 8 * (8 * n + 2 * j + hh);
                    __m512 dsc = scales512(dv, p0 + so, p1 + so, 1);
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < R; r++) {
                        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]), _mm512_set1_ps(a[r].d[c32]));
                        if (H2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2[r]), _mm512_set1_ps(a[r].d2[c32]), f);
                        f = _mm512_sub_ps(f, _mm512_set1_ps(32.f * a[r].s16[2 * c32 + hh]));
                        acc[r] = _mm512_fmadd_ps(f, dsc, acc[r]);
                    }
                }
            }
            continue;
        }
        __m512 mv = halves_ph(p0 + 16, p1 + 16);
        const int codes = T == TK_Q5_K ? 416 : 160;
        for (int j = 0; j < 8; j++) {
            __m512i s[4], s2[4];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < 4; r++) s[r] = s2[r] = _mm512_setzero_si512();
            int64_t c32 = b * 8 + j;
            _Pragma("GCC unroll 8")
            for (int c = 0; c < 8; c++) {
                int at = codes + 256 * (j / 2) + 32 * c;
                __m512i raw = cat256(p0 + at, p1 + at);
                __m512i u = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(raw, 4) : raw, m15);
                if (T == TK_Q5_K) {
                    __m512i qh = cat256(p0 + 160 + 32 * c, p1 + 160 + 32 * c);
                    u = _mm512_or_si512(u, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, j), m1), 4));
                }
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    s[r] = _mm512_dpbusd_epi32(s[r], u, bcast4_512(a[r].q + c32 * 32 + 4 * c));
                    if (H2) s2[r] = _mm512_dpbusd_epi32(s2[r], u, bcast4_512(a[r].q2 + c32 * 32 + 4 * c));
                }
            }
            __m512 dsc = scales512(dv, p0 + 32 + 8 * j, p1 + 32 + 8 * j, 0);
            __m512 dmn = scales512(mv, p0 + 96 + 8 * j, p1 + 96 + 8 * j, 0);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) {
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]), _mm512_set1_ps(a[r].d[c32]));
                if (H2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2[r]), _mm512_set1_ps(a[r].d2[c32]), f);
                acc[r] = _mm512_fmadd_ps(f, dsc, acc[r]);
                acc[r] = _mm512_fnmadd_ps(dmn, _mm512_set1_ps(a[r].s32[c32]), acc[r]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

#include "quant_avx512_k.c"

#define TK_PAIR512(T_, KERNEL)                                                                                 \
TK_INLINE void pair512_h_##T_(const int H_, int R, const uint8_t *g, int64_t rb, int64_t nb, const tk_act *a, \
                               __m512 *out) {                                                            \
    switch (R) {                                                                                        \
        case 1: KERNEL(H_, T_, 1, g, rb, nb, a, out); break;                                            \
        case 2: KERNEL(H_, T_, 2, g, rb, nb, a, out); break;                                            \
        case 3: KERNEL(H_, T_, 3, g, rb, nb, a, out); break;                                            \
        default: KERNEL(H_, T_, 4, g, rb, nb, a, out); break;                                           \
    }                                                                                                   \
}                                                                                                       \
static void gemv_pair512_##T_(int R, const uint8_t *g, int64_t rb, int64_t nb, const tk_act *a, __m512 *out) { \
    if (tk_act_one()) pair512_h_##T_(0, R, g, rb, nb, a, out);                                          \
    else pair512_h_##T_(1, R, g, rb, nb, a, out);                                                       \
}
TK_PAIR512(TK_Q8_0, gemv_pair512) TK_PAIR512(TK_Q4_0, gemv_pair512) TK_PAIR512(TK_Q4_1, gemv_pair512)
TK_PAIR512(TK_Q4_K, gemv_pair512_q4k) TK_PAIR512(TK_Q5_K, gemv_pair512_k)

/* Q6_K: one activation row (batch-1 decode) takes the shared-load kernel, more rows gemv_pair512_k */
TK_INLINE void pair512_q6k(const int H_, int R, const uint8_t *g, int64_t rb, int64_t nb, const tk_act *a,
                            __m512 *out) {
    switch (R) {
        case 1: gemv_pair512_q6k_r1(H_, g, rb, nb, a, out); break;
        case 2: gemv_pair512_k(H_, TK_Q6_K, 2, g, rb, nb, a, out); break;
        case 3: gemv_pair512_k(H_, TK_Q6_K, 3, g, rb, nb, a, out); break;
        default: gemv_pair512_k(H_, TK_Q6_K, 4, g, rb, nb, a, out); break;
    }
}
static void gemv_pair512_TK_Q6_K(int R, const uint8_t *g, int64_t rb, int64_t nb, const tk_act *a, __m512 *out) {
    if (tk_act_one()) pair512_q6k(0, R, g, rb, nb, a, out);
    else pair512_q6k(1, R, g, rb, nb, a, out);
}

typedef void (*tk_pair512_fn)(int, const uint8_t *, int64_t, int64_t, const tk_act *, __m512 *);
/* the 512-bit kernel for packed type t */
static tk_pair512_fn pair512_fn(int t) {
    switch (t) {
        case TK_Q8_0: return gemv_pair512_TK_Q8_0;
        case TK_Q4_0: return gemv_pair512_TK_Q4_0;
        case TK_Q4_1: return gemv_pair512_TK_Q4_1;
        case TK_Q4_K: return gemv_pair512_TK_Q4_K;
        case TK_Q5_K: return gemv_pair512_TK_Q5_K;
        default: return gemv_pair512_TK_Q6_K;
    }
}
#endif
