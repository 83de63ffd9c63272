/*
 * C source, part 4 of the quantized linear kernels: weights repacked at load into groups of eight
 * interleaved rows (Q8_0, Q4_0, Q4_1), and the GEMV over them.
 *
 * In GGUF's own layout every output row is a separate dot product: its int32 lanes must be summed
 * across the register and its fp16 scales are read one at a time. Repacked, one group of eight rows
 * keeps, per block of 32 values, the eight rows' scales side by side (one `vcvtph2ps` reads them) and
 * their codes interleaved four bytes at a time, so that a 32-byte load holds four values of each of the
 * eight rows; multiplied by the activations' four matching bytes broadcast to every lane, the eight
 * int32 lanes *are* the eight rows' partial sums. A block for eight rows then costs about as many
 * instructions as one row's block did unpacked. The packed bytes are exactly as many as the original
 * ones (plus zero rows to fill the last group); llama.cpp calls this layout `q4_0_8x8`.
 *
 * Per block and group: Q4_0 `d[8]` (fp16), codes; Q4_1 `d[8]`, `m[8]`, codes; Q8_0 `d[8]`,
 * codes. Q4 codes are 4 chunks of 32 bytes, chunk j holding bytes 4j-4j+3 of each row (low nibbles:
 * values 4j-4j+3, high nibbles: values 16+4j-16+4j+3); Q8_0 codes are 8 such chunks of one byte each,
 * stored plus 128 (unsigned), so the integer products take them as the unsigned operand as they are.
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: packed). */
#include "quant.h"
static int qk_packed_bytes(int t) {  /* bytes per block of a group of 8 rows (0: not packable) */
    switch (t) {
        case TK_Q8_0: return 8 * 34;
        case TK_Q4_0: return 8 * 18;
        case TK_Q4_1: return 8 * 20;
        case TK_Q4_K: return 1184;  /* the K-quants' layouts: _quant_packed_k_c */
        case TK_Q5_K: return 1440;
        case TK_Q6_K: return 1680;
        default: return 0;
    }
}
static void pack_k_row(int t, const uint8_t *src, int64_t K, int r, uint8_t *dst, int pb);
static void dequant_group_row_k(int t, const uint8_t *restrict g, int64_t K, int r, float *restrict y);

/* out[G = ceil(N / 8)][nb][qk_packed_bytes] from raw rows (rb bytes apart); rows past N are zeros */
int qk_pack(int t, const uint8_t *raw, int64_t rb, int64_t N, int64_t K, uint8_t *out) {
    int pb = qk_packed_bytes(t);
    if (!pb || K % qk_block(t)) return -2;
    int64_t nb = K / qk_block(t), G = (N + 7) / 8;
    int hdr = t == TK_Q4_1 ? 32 : 16, cb = t == TK_Q8_0 ? 8 : 4;  /* header bytes, chunks */
    int bb = qk_bytes(t), qoff = t == TK_Q4_1 ? 4 : 2;
    memset(out, 0, (size_t)(G * nb * pb));
    if (qk_block(t) == 256) {
        for (int64_t n = 0; n < N; n++) pack_k_row(t, raw + n * rb, K, (int)(n % 8), out + n / 8 * nb * pb, pb);
        return 0;
    }
    for (int64_t n = 0; n < N; n++) {
        int64_t g = n / 8, r = n % 8;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *src = raw + n * rb + b * bb;
            uint8_t *dst = out + (g * nb + b) * pb;
            memcpy(dst + 2 * r, src, 2);
            if (t == TK_Q4_1) memcpy(dst + 16 + 2 * r, src + 2, 2);
            for (int j = 0; j < cb; j++) memcpy(dst + hdr + 32 * j + 4 * r, src + qoff + 4 * j, 4);
            if (t == TK_Q8_0)  /* codes stored offset by 128 (unsigned): the GEMV's u8 x s8 products need no sign shuffle */
                for (int j = 0; j < cb; j++)
                    for (int v = 0; v < 4; v++) dst[hdr + 32 * j + 4 * r + v] ^= 0x80;
        }
    }
    return 0;
}

/* row r (0-7) of group g as float32, y[K] */
static void dequant_group_row(int t, const uint8_t *restrict g, int64_t K, int r, float *restrict y) {
    if (qk_block(t) == 256) {
        dequant_group_row_k(t, g, K, r, y);
        return;
    }
    int64_t nb = K / 32;
    int pb = qk_packed_bytes(t), hdr = t == TK_Q4_1 ? 32 : 16;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * pb;
        float d = h2f(p + 2 * r), m = t == TK_Q4_1 ? h2f(p + 16 + 2 * r) : -8.f * d;
        float *o = y + b * 32;
        if (t == TK_Q8_0) {
            for (int v = 0; v < 32; v++) o[v] = d * (float)(int8_t)(p[hdr + 32 * (v / 4) + 4 * r + v % 4] ^ 0x80);
        } else {
            for (int v = 0; v < 16; v++) {
                uint8_t byte = p[hdr + 32 * (v / 4) + 4 * r + v % 4];
                o[v] = d * (float)(byte & 15) + m;
                o[v + 16] = d * (float)(byte >> 4) + m;
            }
        }
    }
}

/* the 8 rows of group g as float32, y[8][K] (the GEMM's panels: rows two at a time, as 8 lanes) */
static void dequant_group(int t, const uint8_t *restrict g, int64_t K, float *restrict y) {
#ifdef TK_AVX2
    if (qk_block(t) == 256) {  /* the K-quants' panels: row by row (EXACT and the plain build only) */
        for (int r = 0; r < 8; r++) dequant_group_row_k(t, g, K, r, y + r * K);
        return;
    }
    int64_t nb = K / 32;
    int pb = qk_packed_bytes(t), hdr = t == TK_Q4_1 ? 32 : 16;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * pb;
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        __m256 mv = t == TK_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))
                                 : _mm256_mul_ps(dv, _mm256_set1_ps(-8.f));
        for (int r = 0; r < 8; r += 2) {
            __m256i pick = _mm256_setr_epi32(r, r, r, r, r + 1, r + 1, r + 1, r + 1);
            __m256 d2 = _mm256_permutevar8x32_ps(dv, pick), m2 = _mm256_permutevar8x32_ps(mv, pick);
            float *y0 = y + r * K + b * 32, *y1 = y0 + K;
            for (int j = 0; j < (t == TK_Q8_0 ? 8 : 4); j++) {
                __m128i q = _mm_loadl_epi64((const __m128i *)(p + hdr + 32 * j + 4 * r));  /* rows r, r+1 */
                if (t == TK_Q8_0) {
                    q = _mm_xor_si128(q, _mm_set1_epi8((char)0x80));
                    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d2);
                    _mm_storeu_ps(y0 + 4 * j, _mm256_castps256_ps128(v));
                    _mm_storeu_ps(y1 + 4 * j, _mm256_extractf128_ps(v, 1));
                } else {
                    __m128i lo = _mm_and_si128(q, _mm_set1_epi8(15));
                    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15));
                    __m256 vl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d2, m2);
                    __m256 vh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d2, m2);
                    _mm_storeu_ps(y0 + 4 * j, _mm256_castps256_ps128(vl));
                    _mm_storeu_ps(y1 + 4 * j, _mm256_extractf128_ps(vl, 1));
                    _mm_storeu_ps(y0 + 16 + 4 * j, _mm256_castps256_ps128(vh));
                    _mm_storeu_ps(y1 + 16 + 4 * j, _mm256_extractf128_ps(vh, 1));
                }
            }
        }
    }
#else
    for (int r = 0; r < 8; r++) dequant_group_row(t, g, K, r, y + r * K);
#endif
}

/* rows ids[0..n) of a packed weight (rb bytes per group) as float32 y[n][K]: an embedding lookup */
int qk_unpack_rows(int t, const uint8_t *P, int64_t rb, const int64_t *ids, int64_t n, int64_t K, float *y) {
    if (!qk_packed_bytes(t) || K % qk_block(t)) return -2;
    for (int64_t i = 0; i < n; i++) dequant_group_row(t, P + ids[i] / 8 * rb, K, (int)(ids[i] % 8), y + i * K);
    return 0;
}

#ifdef TK_AVX2
TK_INLINE __m256i dot_acc(__m256i acc, __m256i u, __m256i s, const int vnni) {
#if TK_HAVE_VNNI && defined(__AVXVNNI__)
    if (vnni) return _mm256_dpbusd_avx_epi32(acc, u, s);
#elif TK_HAVE_VNNI
    if (vnni) return _mm256_dpbusd_epi32(acc, u, s);
#endif
    (void)vnni;  /* a build without VNNI: always maddubs */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

TK_INLINE __m256i bcast4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* y rows r < R, 8 outputs each (one group): out[r] lane i = row i of the group . activation row r */
TK_INLINE void gemv_group(const int H2, const int T, const int R, const int vnni, const uint8_t *restrict g, int64_t nb,
                          const tk_act *a, __m256 *out) {
    const int pb = T == TK_Q8_0 ? 272 : T == TK_Q4_0 ? 144 : 160, hdr = T == TK_Q4_1 ? 32 : 16;
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * pb;
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        __m256i s[4], s2[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) s[r] = s2[r] = _mm256_setzero_si256();
        if (T == TK_Q8_0) {
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++) {
                __m256i u = _mm256_loadu_si256((const __m256i *)(p + hdr + 32 * j));  /* w + 128 */
                if (vnni) {  /* dpbusd sums into int32: (w + 128) x, the 128 x taken off below */
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < R; r++) {
                        s[r] = dot_acc(s[r], u, bcast4(a[r].q + b * 32 + 4 * j), vnni);
                        if (H2) s2[r] = dot_acc(s2[r], u, bcast4(a[r].q2 + b * 32 + 4 * j), vnni);
                    }
                } else {  /* maddubs saturates int16 pairs: |w| x (x sign w), as before */
                    __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
                    u = _mm256_sign_epi8(w, w);
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < R; r++) {
                        s[r] = dot_acc(s[r], u, _mm256_sign_epi8(bcast4(a[r].q + b * 32 + 4 * j), w), vnni);
                        if (H2) s2[r] = dot_acc(s2[r], u, _mm256_sign_epi8(bcast4(a[r].q2 + b * 32 + 4 * j), w), vnni);
                    }
                }
            }
        } else {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(p + hdr + 32 * j));
                __m256i lo = _mm256_and_si256(raw, m15), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    s[r] = dot_acc(s[r], lo, bcast4(a[r].q + b * 32 + 4 * j), vnni);
                    s[r] = dot_acc(s[r], hi, bcast4(a[r].q + b * 32 + 16 + 4 * j), vnni);
                    if (H2) s2[r] = dot_acc(s2[r], lo, bcast4(a[r].q2 + b * 32 + 4 * j), vnni);
                    if (H2) s2[r] = dot_acc(s2[r], hi, bcast4(a[r].q2 + b * 32 + 16 + 4 * j), vnni);
                }
            }
        }
        /* the offsets: Q4_1's m, Q4_0's -8 d, and -128 d for Q8_0's codes stored as w + 128 */
        __m256 mv = T == TK_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))
                                 : _mm256_mul_ps(dv, _mm256_set1_ps(T == TK_Q8_0 ? -128.f : -8.f));
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s[r]), _mm256_set1_ps(a[r].d[b]));
            if (H2) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2[r]), _mm256_set1_ps(a[r].d2[b]), f);
            acc[r] = _mm256_fmadd_ps(f, dv, acc[r]);
            if (T != TK_Q8_0 || vnni) acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a[r].s32[b]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

#define TK_GEMV_P(T_, KERNEL)                                                                           \
TK_INLINE void packed_h_##T_(const int H_, int R, int vnni, const uint8_t *g, int64_t nb, const tk_act *a, \
                              __m256 *out) {                                                            \
    switch (R * 2 + vnni) {                                                                             \
        case 2: KERNEL(H_, T_, 1, 0, g, nb, a, out); break;                                                 \
        case 4: KERNEL(H_, T_, 2, 0, g, nb, a, out); break;                                                 \
        case 6: KERNEL(H_, T_, 3, 0, g, nb, a, out); break;                                                 \
        case 8: KERNEL(H_, T_, 4, 0, g, nb, a, out); break;                                                 \
        case 3: KERNEL(H_, T_, 1, TK_HAVE_VNNI, g, nb, a, out); break;                                      \
        case 5: KERNEL(H_, T_, 2, TK_HAVE_VNNI, g, nb, a, out); break;                                      \
        case 7: KERNEL(H_, T_, 3, TK_HAVE_VNNI, g, nb, a, out); break;                                      \
        default: KERNEL(H_, T_, 4, TK_HAVE_VNNI, g, nb, a, out); break;                                     \
    }                                                                                                   \
}                                                                                                       \
static void gemv_packed_##T_(int R, int vnni, const uint8_t *g, int64_t nb, const tk_act *a, __m256 *out) { \
    if (tk_act_one()) packed_h_##T_(0, R, vnni, g, nb, a, out);                                         \
    else packed_h_##T_(1, R, vnni, g, nb, a, out);                                                      \
}
TK_GEMV_P(TK_Q8_0, gemv_group) TK_GEMV_P(TK_Q4_0, gemv_group) TK_GEMV_P(TK_Q4_1, gemv_group)

typedef void (*tk_gemv_packed_fn)(int, int, const uint8_t *, int64_t, const tk_act *, __m256 *);
#endif
