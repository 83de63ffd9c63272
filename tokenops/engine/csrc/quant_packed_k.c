/*
 * C source, part 5 of the quantized linear kernels: the K-quants (Q4_K, Q5_K, Q6_K) repacked at load
 * into groups of eight interleaved rows, and the integer GEMV over them (the same scheme as
 * :mod:`._quant_packed_c` for the 32-value formats: eight int32 lanes of one `dpbusd` are the eight
 * rows' sums against four broadcast activation bytes).
 *
 * A K-quant super-block is 256 values in eight sub-blocks of 32 (Q6_K: sixteen of 16), each with its
 * own scale (and min), which in GGUF's layout are packed into 12 bytes of 6-bit fields that every row
 * decodes again per block. Packed, per super-block and group of eight rows (all offsets in bytes):
 *
 * ======= ===== ====================================================================================
 * type    bytes layout
 * ======= ===== ====================================================================================
 * Q4_K    1184  d[8] f16 | dmin[8] f16 | sc[8 sub][8 rows] u8 | mn[8][8] u8 | codes: 4 pairs of
 *               sub-blocks x 8 chunks x 32 bytes, chunk c of pair i = bytes 4c-4c+3 of the row's
 *               q[32i..32i+31] for each row (low nibbles: sub-block 2i, high: 2i+1)
 * Q5_K    1440  as Q4_K, with qh between the mins and the codes: 8 chunks x 32 bytes (chunk c = bytes
 *               4c-4c+3 of each row's qh; bit j of a byte is bit 4 of that value in sub-block j)
 * Q6_K    1680  d[8] f16 | sc[16][8] i8 | ql: 4 segments of 32 bytes x 8 chunks | qh: 2 x 8 chunks
 * ======= ===== ====================================================================================
 *
 * The 6-bit scales and mins are held one byte each (so a group reads them with one `vpmovzxbd`):
 * Q4_K and Q5_K take 4 bytes more per row and super-block than the file (2.8% / 2.3%); Q6_K the same
 * bytes. The activations' blocks of 32 line up with the sub-blocks, so per sub-block the kernel is the
 * Q4_1 one: integer sums of both activation bytes, one float scale per row (`d * sc`), the offset
 * (`dmin * mn`, Q6_K's `32 d sc`) times the activation block's sum.
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: packed_k). */
#include "quant.h"
static int pk_header(int t) { return t == TK_Q6_K ? 144 : t == TK_Q5_K ? 416 : 160; }

/* one row (raw, K values) into slot r of its group's super-blocks (pb bytes each) */
static void pack_k_row(int t, const uint8_t *src, int64_t K, int r, uint8_t *dst, int pb) {
    int bb = qk_bytes(t);
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *s = src + b * bb;
        uint8_t *o = dst + b * pb;
        if (t == TK_Q6_K) {
            memcpy(o + 2 * r, s + 208, 2);
            for (int j = 0; j < 16; j++) o[16 + 8 * j + r] = s[192 + j];
            for (int seg = 0; seg < 6; seg++)  /* ql's 4 segments, then qh's 2: each 8 chunks */
                for (int c = 0; c < 8; c++) memcpy(o + 144 + 256 * seg + 32 * c + 4 * r, s + 32 * seg + 4 * c, 4);
            continue;
        }
        memcpy(o + 2 * r, s, 2);
        memcpy(o + 16 + 2 * r, s + 2, 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            scale_min_k4(j, s + 4, &sc, &mn);
            o[32 + 8 * j + r] = (uint8_t)sc;
            o[96 + 8 * j + r] = (uint8_t)mn;
        }
        const uint8_t *q = s + 16;
        if (t == TK_Q5_K) {
            for (int c = 0; c < 8; c++) memcpy(o + 160 + 32 * c + 4 * r, s + 16 + 4 * c, 4);
            q = s + 48;
        }
        int h = pk_header(t);
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < 8; c++) memcpy(o + h + 256 * i + 32 * c + 4 * r, q + 32 * i + 4 * c, 4);
    }
}

/* row r of a packed K-quant group as float32 y[K] */
static void dequant_group_row_k(int t, const uint8_t *restrict g, int64_t K, int r, float *restrict y) {
    int pb = qk_packed_bytes(t), h = pk_header(t);
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *p = g + b * pb;
        float *o = y + b * 256;
        if (t == TK_Q6_K) {
            float d = h2f(p + 2 * r);
            for (int v = 0; v < 256; v++) {
                int n = v / 128, j = (v % 128) / 32, l = v % 32;  /* half, sub-block, value */
                uint8_t lb = p[144 + 256 * (2 * n + (j & 1)) + 32 * (l / 4) + 4 * r + l % 4];
                uint8_t hb = p[144 + 1024 + 256 * n + 32 * (l / 4) + 4 * r + l % 4];
                int q = ((j >= 2 ? lb >> 4 : lb) & 15) | (((hb >> (2 * j)) & 3) << 4);
                o[v] = d * (float)(int8_t)p[16 + 8 * (8 * n + 2 * j + l / 16) + r] * (float)(q - 32);
            }
            continue;
        }
        float d = h2f(p + 2 * r), dmin = h2f(p + 16 + 2 * r);
        for (int v = 0; v < 256; v++) {
            int j = v / 32, l = v % 32;
            uint8_t byte = p[h + 256 * (j / 2) + 32 * (l / 4) + 4 * r + l % 4];
            int q = (j & 1) ? byte >> 4 : byte & 15;
            if (t == TK_Q5_K) q |= ((p[160 + 32 * (l / 4) + 4 * r + l % 4] >> j) & 1) << 4;
            o[v] = d * (float)p[32 + 8 * j + r] * (float)q - dmin * (float)p[96 + 8 * j + r];
        }
    }
}

#ifdef TK_AVX2
/* the group's eight rows' scale for sub-block (or 16-value group) j: d * sc, as 8 lanes */
TK_INLINE __m256 row_scales(__m256 d, const uint8_t *sc, const int is_signed) {
    __m128i b = _mm_loadl_epi64((const __m128i *)sc);
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)));
}

/* y rows r < R, 8 outputs each (one group), for a packed Q4_K / Q5_K / Q6_K weight of nb super-blocks */
TK_INLINE void gemv_group_k(const int H2, const int T, const int R, const int vnni, const uint8_t *restrict g,
                            int64_t nb,
                            const tk_act *a, __m256 *out) {
    const int pb = T == TK_Q4_K ? 1184 : T == TK_Q5_K ? 1440 : 1680;
    const __m256i m15 = _mm256_set1_epi8(15), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
    __m256 acc[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * pb;
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        if (T == TK_Q6_K) {
            for (int sb = 0; sb < 8; sb++) {  /* sub-block sb = 4n + j: 32 values, two scales */
                const int n = sb / 4, j = sb % 4;
                const uint8_t *ql = p + 144 + 256 * (2 * n + (j & 1)), *qh = p + 144 + 1024 + 256 * n;
                int64_t c32 = b * 8 + sb;
                for (int hh = 0; hh < 2; hh++) {
                    __m256i s[4], s2[4];
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < 4; r++) s[r] = s2[r] = _mm256_setzero_si256();
                    _Pragma("GCC unroll 4")
                    for (int c = 4 * hh; c < 4 * hh + 4; c++) {
                        __m256i lv = _mm256_loadu_si256((const __m256i *)(ql + 32 * c));
                        __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * c));
                        if (j >= 2) lv = _mm256_srli_epi16(lv, 4);
                        __m256i u = _mm256_or_si256(
                            _mm256_and_si256(lv, m15),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * j), m3), 4));
                        _Pragma("GCC unroll 4")
                        for (int r = 0; r < R; r++) {
                            s[r] = dot_acc(s[r], u, bcast4(a[r].q + c32 * 32 + 4 * c), vnni);
                            if (H2) s2[r] = dot_acc(s2[r], u, bcast4(a[r].q2 + c32 * 32 + 4 * c), vnni);
                        }
                    }
                    __m256 dsc = row_scales(dv, p + 16 + 8 * (8 * n + 2 * j + hh), 1);
                    _Pragma("GCC unroll 4")
                    for (int r = 0; r < R; r++) {  /* v = d sc (q - 32): 32 x the 16 values' sum comes off */
                        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s[r]), _mm256_set1_ps(a[r].d[c32]));
                        if (H2) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2[r]), _mm256_set1_ps(a[r].d2[c32]), f);
                        f = _mm256_sub_ps(f, _mm256_set1_ps(32.f * a[r].s16[2 * c32 + hh]));
                        acc[r] = _mm256_fmadd_ps(f, dsc, acc[r]);
                    }
                }
            }
            continue;
        }
        __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        const uint8_t *codes = p + (T == TK_Q5_K ? 416 : 160);
        for (int j = 0; j < 8; j++) {  /* sub-block j: the low (j even) or high nibbles of pair j / 2 */
            __m256i s[4], s2[4];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < 4; r++) s[r] = s2[r] = _mm256_setzero_si256();
            int64_t c32 = b * 8 + j;
            _Pragma("GCC unroll 8")
            for (int c = 0; c < 8; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(codes + 256 * (j / 2) + 32 * c));
                __m256i u = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, m15);
                if (T == TK_Q5_K) {
                    __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 160 + 32 * c));
                    u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), m1), 4));
                }
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    s[r] = dot_acc(s[r], u, bcast4(a[r].q + c32 * 32 + 4 * c), vnni);
                    if (H2) s2[r] = dot_acc(s2[r], u, bcast4(a[r].q2 + c32 * 32 + 4 * c), vnni);
                }
            }
            __m256 dsc = row_scales(dv, p + 32 + 8 * j, 0), dmn = row_scales(mv, p + 96 + 8 * j, 0);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < R; r++) {
                __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s[r]), _mm256_set1_ps(a[r].d[c32]));
                if (H2) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2[r]), _mm256_set1_ps(a[r].d2[c32]), f);
                acc[r] = _mm256_fmadd_ps(f, dsc, acc[r]);
                acc[r] = _mm256_fnmadd_ps(dmn, _mm256_set1_ps(a[r].s32[c32]), acc[r]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

#include "quant_packed_kv.c"
#define TK_M_ROWS 8  /* rows per call of quant_packed_km.c's kernels */
#if TK_ACT_K256 == TK_HAVE_VNNI
#error "one byte per 256 values is for the kernels without VNNI (quant_formats.c, quant_gemv.c)"
#endif
#if TK_ACT_K256
#include "quant_packed_km.c"
#endif

TK_GEMV_P(TK_Q5_K, gemv_group_k)

/* Q4_K (every row count) and Q6_K (one row) take the shared-load kernels where VNNI multiplies */
TK_INLINE void packed_q4k(const int H_, int R, int vnni, const uint8_t *g, int64_t nb, const tk_act *a, __m256 *out) {
    (void)vnni; /* read only where the build has VNNI */
#if TK_HAVE_VNNI
    if (vnni) {
        switch (R) {
            case 1: gemv_group_q4k_v(H_, 1, g, nb, a, out); break;
            case 2: gemv_group_q4k_v(H_, 2, g, nb, a, out); break;
            case 3: gemv_group_q4k_v(H_, 3, g, nb, a, out); break;
            default: gemv_group_q4k_v(H_, 4, g, nb, a, out); break;
        }
        return;
    }
#endif
    switch (R) {
        case 1: gemv_group_k(H_, TK_Q4_K, 1, 0, g, nb, a, out); break;
        case 2: gemv_group_k(H_, TK_Q4_K, 2, 0, g, nb, a, out); break;
        case 3: gemv_group_k(H_, TK_Q4_K, 3, 0, g, nb, a, out); break;
        default: gemv_group_k(H_, TK_Q4_K, 4, 0, g, nb, a, out); break;
    }
}
TK_INLINE void packed_q6k(const int H_, int R, int vnni, const uint8_t *g, int64_t nb, const tk_act *a, __m256 *out) {
#if TK_HAVE_VNNI
    if (vnni && R == 1) {
        gemv_group_q6k_v1(H_, g, nb, a, out);
        return;
    }
#endif
    switch (R * 2 + vnni) {
        case 2: gemv_group_k(H_, TK_Q6_K, 1, 0, g, nb, a, out); break;
        case 4: gemv_group_k(H_, TK_Q6_K, 2, 0, g, nb, a, out); break;
        case 6: gemv_group_k(H_, TK_Q6_K, 3, 0, g, nb, a, out); break;
        case 8: gemv_group_k(H_, TK_Q6_K, 4, 0, g, nb, a, out); break;
        case 3: gemv_group_k(H_, TK_Q6_K, 1, TK_HAVE_VNNI, g, nb, a, out); break;
        case 5: gemv_group_k(H_, TK_Q6_K, 2, TK_HAVE_VNNI, g, nb, a, out); break;
        case 7: gemv_group_k(H_, TK_Q6_K, 3, TK_HAVE_VNNI, g, nb, a, out); break;
        default: gemv_group_k(H_, TK_Q6_K, 4, TK_HAVE_VNNI, g, nb, a, out); break;
    }
}
/* each with the activations' one or two bytes (tk_act_one); one byte on a build without VNNI (a scale
   per 256 values, TK_ACT_K256): quant_packed_km.c's kernels, up to TK_M_ROWS rows a call (R <= 4 on
   every other path; a VNNI build with VNNI switched off has a scale per 32: gemv_group_k's maddubs) */
static void gemv_packed_TK_Q4_K(int R, int vnni, const uint8_t *g, int64_t nb, const tk_act *a, __m256 *out) {
#if TK_ACT_K256
    if (tk_act_one()) {
        gemv_packed_km(TK_Q4_K, R, g, NULL, nb, a, out);
        return;
    }
#endif
    if (tk_act_one()) packed_q4k(0, R, vnni, g, nb, a, out);
    else packed_q4k(1, R, vnni, g, nb, a, out);
}
static void gemv_packed_TK_Q6_K(int R, int vnni, const uint8_t *g, int64_t nb, const tk_act *a, __m256 *out) {
#if TK_ACT_K256
    if (tk_act_one()) {
        gemv_packed_km(TK_Q6_K, R, g, NULL, nb, a, out);
        return;
    }
#endif
    if (tk_act_one()) packed_q6k(0, R, vnni, g, nb, a, out);
    else packed_q6k(1, R, vnni, g, nb, a, out);
}

static tk_gemv_packed_fn gemv_packed_fn(int t) {
    switch (t) {
        case TK_Q8_0: return gemv_packed_TK_Q8_0;
        case TK_Q4_0: return gemv_packed_TK_Q4_0;
        case TK_Q4_1: return gemv_packed_TK_Q4_1;
        case TK_Q4_K: return gemv_packed_TK_Q4_K;
        case TK_Q5_K: return gemv_packed_TK_Q5_K;
        default: return gemv_packed_TK_Q6_K;
    }
}
#endif
