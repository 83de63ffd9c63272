/* The AVX2 `maddubs` kernels (no VNNI) for packed Q4_K and Q6_K on one-byte activations with one scale
 * per 256 values (TK_ACT_K256, llama.cpp's q8_K; included by quant_packed_k.c inside its TK_AVX2 block on
 * such builds only): up to TK_M_ROWS activation rows per pass over a group of eight weight rows, so one
 * unpacking of a chunk of codes serves them all (the 512-bit path's 8-row passes, on 256-bit registers).
 *
 * A weight super-block of 256 values meets activations of one scale, so the weights' sub-block scales
 * are applied in integer, as llama.cpp's q8_K dot products do: per row and super-block an int32 sum over
 * the sub-blocks of scale x (codes . q), the mins (Q4_K) or the -32 offsets (Q6_K) from the activations'
 * integer sums (tk_act's b32 per 32, b16 per 16) times the integer mins / scales (`madd` of two
 * sub-blocks' at once), then one float epilogue per super-block and row (the weights' d and dmin, the
 * activations' d) where a scale per 32 values took one per sub-block (a quarter of the work).
 * `maddubs` adds byte products into int16 with saturation; one byte is |q| <= 127, so:
 * - Q4_K: codes 0-15, a `maddubs` lane <= 2 * 15 * 127 = 3810, eight chunks of a sub-block <= 30480:
 *   they add in int16, then `madd` by the sub-block's 6-bit scales (<= 63) widens and scales them; a
 *   super-block's sum <= 8 * 63 * 32 * 15 * 127 = 30.7M, its mins' 8 * 63 * 32 * 127 = 2.0M: int32;
 * - Q6_K: codes 0-63, a lane <= 2 * 63 * 127 = 16002, two chunks <= 32004: pairs of chunks add in
 *   int16, and `madd` by the eight rows' int8 scales (|sc| <= 128) widens and scales them; a
 *   super-block's sum <= 256 * 128 * 63 * 127 = 262M, its offsets' 32 * 256 * 128 * 127 = 133M: int32.
 * The int32 sums become float32 once (exact to 2^24, else rounded to float32, as llama.cpp's are).
 * The one-row Q6_K kernel (batch-1 decode, from memory) unpacks a chunk's four sub-blocks at once (its
 * low bits, high bits and their 2-bit fields each loaded once) and prefetches ahead. */
/* Part of the quantized kernels' library (this one: the AVX2 one-byte K-quant kernels). */
#include "quant.h"
/* super-blocks ahead the one-row kernels prefetch */
#define TK_Q6K_PREFETCH_M 4

/* the eight rows' int8 scales at sc as int16 pairs (lanes 2i, 2i + 1: row i), for `madd` */
TK_INLINE __m256i scale_pairs(const uint8_t *sc) {
    __m128i b = _mm_loadl_epi64((const __m128i *)sc);
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b, b));
}

/* the eight rows' byte fields of two sub-blocks (at f and f + 8; int8 where is_signed, else uint8) as
   int16 pairs (lanes 2i, 2i + 1: row i's first, second), for `madd` against two activation sums */
TK_INLINE __m256i field_pairs(const uint8_t *f, const int is_signed) {
    __m128i b = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)f), _mm_loadl_epi64((const __m128i *)(f + 8)));
    return is_signed ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
}

/* sum over k < n of fp[k] . (s[2k], s[2k + 1]): the eight rows' fields times the activations' integer
   sums, int32 per row */
TK_INLINE __m256i pair_dot(const int n, const __m256i *fp, const int16_t *s) {
    __m256i t = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int k = 0; k < n; k++) {
        int32_t v;
        memcpy(&v, s + 2 * k, 4);
        t = _mm256_add_epi32(t, _mm256_madd_epi16(fp[k], _mm256_set1_epi32(v)));
    }
    return t;
}

/* Q6_K's codes of sub-block j (0-3) of a half, chunk at lv (low bits) and hv (2-bit fields) */
TK_INLINE __m256i q6k_code(const int j, __m256i lv, __m256i hv) {
    const __m256i m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(0x30);
    /* bits 2j, 2j + 1 of hv's bytes to bits 4, 5: word shifts, what crosses a byte is masked off */
    __m256i h = j == 0 ? _mm256_slli_epi16(hv, 4) : j == 1 ? _mm256_slli_epi16(hv, 2)
              : j == 2 ? hv : _mm256_srli_epi16(hv, 2);
    __m256i l = j >= 2 ? _mm256_srli_epi16(lv, 4) : lv;
    return _mm256_or_si256(_mm256_and_si256(l, m15), _mm256_and_si256(h, m48));
}

/* acc + a Q4_K super-block's floats for one activation row: is = sum of sc x (codes . q), im = sum of
   mn x the activations' sums per 32, d the activations' scale; p the super-block (its d, dmin) */
TK_INLINE __m256 q4k_super(__m256 acc, __m256i is, __m256i im, const uint8_t *p, float d) {
    __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
    __m256 f = _mm256_fnmadd_ps(mv, _mm256_cvtepi32_ps(im), _mm256_mul_ps(dv, _mm256_cvtepi32_ps(is)));
    return _mm256_fmadd_ps(f, _mm256_set1_ps(d), acc);
}

/* y rows r < R (R <= TK_M_ROWS), 8 outputs each: a packed Q4_K group of nb super-blocks, one byte */
TK_INLINE void gemv_group_q4k_m(const int R, const uint8_t *restrict g, int64_t nb, const tk_act *a, __m256 *out) {
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[TK_M_ROWS];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < TK_M_ROWS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * 1184;
        for (int l = 0; l < 1184; l += 64) _mm_prefetch((const char *)(p + TK_Q6K_PREFETCH_M * 1184 + l), _MM_HINT_T0);
        __m256i is[TK_M_ROWS];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < TK_M_ROWS; r++) is[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {  /* sub-block j: the low (j even) or high nibbles of pair j / 2 */
            const uint8_t *q = p + 160 + 256 * (j / 2);
            __m256i u[8];
            _Pragma("GCC unroll 8")
            for (int c = 0; c < 8; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
                u[c] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, m15);
            }
            __m256i sc = scale_pairs(p + 32 + 8 * j);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) {
                const int8_t *x = a[r].q + b * 256 + 32 * j;
                __m256i s0 = _mm256_maddubs_epi16(u[0], bcast4(x)), s1 = _mm256_maddubs_epi16(u[1], bcast4(x + 4));
                _Pragma("GCC unroll 8")
                for (int c = 2; c < 8; c += 2) {
                    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(u[c], bcast4(x + 4 * c)));
                    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(u[c + 1], bcast4(x + 4 * c + 4)));
                }
                is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(_mm256_add_epi16(s0, s1), sc));
            }
        }
        __m256i mp[4];
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) mp[k] = field_pairs(p + 96 + 16 * k, 0);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) acc[r] = q4k_super(acc[r], is[r], pair_dot(4, mp, a[r].b32 + b * 8), p, a[r].d[b * 8]);
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one activation row of a Q4_K group: each chunk of codes loaded once for its two sub-blocks (the
   floats of gemv_group_q4k_m's row), the group's next super-blocks prefetched */
TK_INLINE void gemv_group_q4k_m1(const uint8_t *restrict g, int64_t nb, const tk_act *a, __m256 *out) {
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * 1184;
        for (int l = 0; l < 1184; l += 64)  /* past the group: the next group's (a prefetch never faults) */
            _mm_prefetch((const char *)(p + TK_Q6K_PREFETCH_M * 1184 + l), _MM_HINT_T0);
        __m256i is = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {  /* sub-blocks 2i (low nibbles) and 2i + 1 (high) */
            const uint8_t *q = p + 160 + 256 * i;
            const int8_t *x = a->q + b * 256 + 64 * i;
            __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
            _Pragma("GCC unroll 8")
            for (int c = 0; c < 8; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(raw, m15), bcast4(x + 4 * c)));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m15),
                                                               bcast4(x + 32 + 4 * c)));
            }
            is = _mm256_add_epi32(is, _mm256_add_epi32(_mm256_madd_epi16(s0, scale_pairs(p + 32 + 16 * i)),
                                                       _mm256_madd_epi16(s1, scale_pairs(p + 40 + 16 * i))));
        }
        __m256i mp[4];
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) mp[k] = field_pairs(p + 96 + 16 * k, 0);
        acc = q4k_super(acc, is, pair_dot(4, mp, a->b32 + b * 8), p, a->d[b * 8]);
    }
    out[0] = acc;
}

/* acc + a Q6_K super-block's floats for one activation row: s = sum of sc x (codes . q); the offsets,
   v = d sc (q - 32): 32 x sum of sc x the activations' sums per 16 come off (op: the scales' pairs) */
TK_INLINE __m256 q6k_super(__m256 acc, __m256i s, const __m256i *op, const tk_act *a, int64_t b, __m256 dv) {
    __m256i i = _mm256_sub_epi32(s, _mm256_slli_epi32(pair_dot(8, op, a->b16 + b * 16), 5));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dv, _mm256_set1_ps(a->d[b * 8])), acc);
}

/* the eight rows' Q6_K scale pairs of a super-block at p, for q6k_super */
TK_INLINE void q6k_scale_pairs(const uint8_t *p, __m256i *op) {
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; k++) op[k] = field_pairs(p + 16 + 16 * k, 1);
}

/* a packed Q6_K group's codes (0-63), unpacked once for several passes: per super-block, sub-block
   sb's chunk c at (sb * 8 + c) * 32 */
#define TK_KM_CODES 2048
static void q6k_group_codes(const uint8_t *restrict g, int64_t nb, uint8_t *restrict codes) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * 1680;
        for (int sb = 0; sb < 8; sb++) {
            const int n = sb / 4, j = sb % 4;
            const uint8_t *ql = p + 144 + 256 * (2 * n + (j & 1)), *qh = p + 144 + 1024 + 256 * n;
            for (int c = 0; c < 8; c++) {
                __m256i u = q6k_code(j, _mm256_loadu_si256((const __m256i *)(ql + 32 * c)),
                                     _mm256_loadu_si256((const __m256i *)(qh + 32 * c)));
                _mm256_storeu_si256((__m256i *)(codes + b * TK_KM_CODES + (sb * 8 + c) * 32), u);
            }
        }
    }
}

/* this thread's buffer for a group's codes (grown as needed, kept for the thread's life; NULL when it
   cannot grow: the caller keeps the unpacking kernel) */
static uint8_t *km_codes_buffer(int64_t nb) {
    static __thread uint8_t *buf;
    static __thread int64_t cap;
    if (nb * TK_KM_CODES > cap) {
        uint8_t *grown = (uint8_t *)realloc(buf, (size_t)(nb * TK_KM_CODES));
        if (!grown) return NULL;
        buf = grown;
        cap = nb * TK_KM_CODES;
    }
    return buf;
}

/* as gemv_group_q4k_m for a packed Q6_K group; codes: q6k_group_codes' (NULL: unpacked here) */
TK_INLINE void gemv_group_q6k_m(const int R, const uint8_t *restrict g, const uint8_t *restrict codes, int64_t nb,
                                const tk_act *a, __m256 *out) {
    __m256 acc[TK_M_ROWS];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < TK_M_ROWS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * 1680;
        if (!codes)
            for (int l = 0; l < 1680; l += 64) _mm_prefetch((const char *)(p + TK_Q6K_PREFETCH_M * 1680 + l), _MM_HINT_T0);
        __m256i s[TK_M_ROWS];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < TK_M_ROWS; r++) s[r] = _mm256_setzero_si256();
        for (int sb = 0; sb < 8; sb++) {  /* sub-block sb = 4n + j: 32 values, two scales */
            const int n = sb / 4, j = sb % 4;
            const uint8_t *ql = p + 144 + 256 * (2 * n + (j & 1)), *qh = p + 144 + 1024 + 256 * n;
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 8; c += 2) {  /* chunk pairs: c / 4 is the half, its scale */
                __m256i sc = scale_pairs(p + 16 + 8 * (8 * n + 2 * j + c / 4));
                __m256i u0, u1;
                if (codes) {
                    const uint8_t *u = codes + b * TK_KM_CODES + (sb * 8 + c) * 32;
                    u0 = _mm256_loadu_si256((const __m256i *)u);
                    u1 = _mm256_loadu_si256((const __m256i *)(u + 32));
                } else {
                    u0 = q6k_code(j, _mm256_loadu_si256((const __m256i *)(ql + 32 * c)),
                                  _mm256_loadu_si256((const __m256i *)(qh + 32 * c)));
                    u1 = q6k_code(j, _mm256_loadu_si256((const __m256i *)(ql + 32 * c + 32)),
                                  _mm256_loadu_si256((const __m256i *)(qh + 32 * c + 32)));
                }
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    const int8_t *x = a[r].q + b * 256 + sb * 32 + 4 * c;
                    __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(u0, bcast4(x)),
                                                 _mm256_maddubs_epi16(u1, bcast4(x + 4)));
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(t, sc));
                }
            }
        }
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        __m256i op[8];
        q6k_scale_pairs(p, op);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) acc[r] = q6k_super(acc[r], s[r], op, a + r, b, dv);
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* one activation row: each chunk's ql / qh loaded once for the four sub-blocks of a half */
TK_INLINE void gemv_group_q6k_m1(const uint8_t *restrict g, int64_t nb, const tk_act *a, __m256 *out) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * 1680;
        for (int l = 0; l < 1680; l += 64)  /* past the group: the next group's (a prefetch never faults) */
            _mm_prefetch((const char *)(p + TK_Q6K_PREFETCH_M * 1680 + l), _MM_HINT_T0);
        __m256i s[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) s[j] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 8; c += 2) {
                const uint8_t *l0 = p + 144 + 512 * n + 32 * c, *h = p + 144 + 1024 + 256 * n + 32 * c;
                __m256i la[2] = {_mm256_loadu_si256((const __m256i *)l0), _mm256_loadu_si256((const __m256i *)(l0 + 32))};
                __m256i lb[2] = {_mm256_loadu_si256((const __m256i *)(l0 + 256)),
                                 _mm256_loadu_si256((const __m256i *)(l0 + 288))};
                __m256i hv[2] = {_mm256_loadu_si256((const __m256i *)h), _mm256_loadu_si256((const __m256i *)(h + 32))};
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) {
                    const int8_t *x = a->q + b * 256 + (4 * n + j) * 32 + 4 * c;
                    __m256i u0 = q6k_code(j, j & 1 ? lb[0] : la[0], hv[0]);
                    __m256i u1 = q6k_code(j, j & 1 ? lb[1] : la[1], hv[1]);
                    __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(u0, bcast4(x)),
                                                 _mm256_maddubs_epi16(u1, bcast4(x + 4)));
                    __m256i sc = scale_pairs(p + 16 + 8 * (8 * n + 2 * j + c / 4));
                    s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(t, sc));
                }
            }
        }
        __m256i op[8];
        q6k_scale_pairs(p, op);
        __m256i st = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
        acc = q6k_super(acc, st, op, a, b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
    }
    out[0] = acc;
}

/* the packed Q4_K / Q6_K products on one byte without VNNI: R <= TK_M_ROWS rows (Q6_K codes: see
   gemv_group_q6k_m) */
static void gemv_packed_km(int t, int R, const uint8_t *g, const uint8_t *codes, int64_t nb, const tk_act *a,
                           __m256 *out) {
    if (t == TK_Q6_K && R == 1 && !codes) {
        gemv_group_q6k_m1(g, nb, a, out);
        return;
    }
    if (t == TK_Q4_K && R == 1) {
        gemv_group_q4k_m1(g, nb, a, out);
        return;
    }
#define TK_KM_CASE(R_) case R_: { if (t == TK_Q4_K) gemv_group_q4k_m(R_, g, nb, a, out); \
                                  else gemv_group_q6k_m(R_, g, codes, nb, a, out); } break;
    switch (R) {
        TK_KM_CASE(1) TK_KM_CASE(2) TK_KM_CASE(3) TK_KM_CASE(4) TK_KM_CASE(5) TK_KM_CASE(6) TK_KM_CASE(7)
        default: TK_KM_CASE(8)
    }
#undef TK_KM_CASE
}
