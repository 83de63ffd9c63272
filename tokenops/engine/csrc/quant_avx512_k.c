/* The 512-bit packed K-quant kernels' shared-load variants (included by quant_avx512.c inside its
   TK_AVX512 block, before the per-type dispatch).

   The packed GEMV of quant_avx512.c assembles each code before its products: for Q6_K a 64-byte load
   of ql serves one sub-block and is shifted and masked, qh is loaded, shifted, masked and shifted
   again per sub-block, ten 512-bit uops per 64 codes at one row. Here a load serves every
   sub-block that reads it (ql two, qh four; Q4_K's code bytes both nibbles) and a code's bits are
   only masked in place: the products of the masked bytes are the assembled code's times a power
   of two, undone on the int32 sums by a shift (exact: every product is a multiple of it). So the
   integer sums are bit for bit those of gemv_pair512_k, and the float epilogue is its own in its
   order: the outputs are equal, which tests/engine/test_quant_kernels.py checks against the
   256-bit kernels at one and more rows. */

/* Q6_K at one activation row, the products of gemv_pair512_k in its order: each 64-byte load of ql
   serves two sub-blocks and each of qh four; the 6-bit code is never assembled. A code is
   lo + 16 hi, so its sum with the activations is the sum over the masked low bits (ql & 0x0F, or
   ql & 0xF0 = 16 lo: shifted back by 4 in int32) plus the sum over the masked high bits
   (qh & 3 << 2j = 4^j hi: scaled by 16 / 4^j in int32). The integer sums are the ones of
   the assembled code, exactly; the float epilogue is gemv_pair512_k's, in its order. */
/* Super-blocks ahead that the one-row Q6_K kernels ask the caches for: with the products this lean
   the one-row kernel waits on memory, and the hardware prefetcher alone kept it at ~6.5 GB/s on one
   core of the shared box (~9 GB/s with this; 4 and 8 measured the same; Q4_K gained nothing). */
#define TK_Q6K_PREFETCH 4

TK_INLINE void gemv_pair512_q6k_r1(const int H2, const uint8_t *restrict g0, int64_t rb, int64_t nb, const tk_act *a,
                                   __m512 *out) {
    const __m512i mlo = _mm512_set1_epi8(0x0F), mhi = _mm512_set1_epi8((char)0xF0);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = g0 + b * 1680, *p1 = g0 + rb + b * 1680;
        if (b + TK_Q6K_PREFETCH < nb)
            for (int l = 0; l < 1680; l += 64) {
                _mm_prefetch((const char *)(p0 + TK_Q6K_PREFETCH * 1680 + l), _MM_HINT_T0);
                _mm_prefetch((const char *)(p1 + TK_Q6K_PREFETCH * 1680 + l), _MM_HINT_T0);
            }
        __m512 dv = halves_ph(p0, p1);
        for (int n = 0; n < 2; n++) {
            __m512 f0[4];
            for (int hh = 0; hh < 2; hh++) {
                __m512i sl[4], sh[4], tl[4], th[4];  /* q and q2 sums of the low and high bits, per j */
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) sl[j] = sh[j] = tl[j] = th[j] = _mm512_setzero_si512();
                _Pragma("GCC unroll 4")
                for (int c = 4 * hh; c < 4 * hh + 4; c++) {
                    const int l0 = 144 + 256 * (2 * n) + 32 * c, l1 = l0 + 256, h = 144 + 1024 + 256 * n + 32 * c;
                    __m512i lv[2] = {cat256(p0 + l0, p1 + l0), cat256(p0 + l1, p1 + l1)};
                    __m512i hv = cat256(p0 + h, p1 + h);
                    _Pragma("GCC unroll 4")
                    for (int j = 0; j < 4; j++) {
                        __m512i lo = _mm512_and_si512(lv[j & 1], j >= 2 ? mhi : mlo);
                        __m512i hi = _mm512_and_si512(hv, _mm512_set1_epi8((char)(3 << (2 * j))));
                        int64_t at = (b * 8 + 4 * n + j) * 32 + 4 * c;
                        __m512i q = bcast4_512(a->q + at), q2 = bcast4_512(a->q2 + at);
                        sl[j] = _mm512_dpbusd_epi32(sl[j], lo, q);
                        sh[j] = _mm512_dpbusd_epi32(sh[j], hi, q);
                        if (H2) tl[j] = _mm512_dpbusd_epi32(tl[j], lo, q2);
                        if (H2) th[j] = _mm512_dpbusd_epi32(th[j], hi, q2);
                    }
                }
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) {
                    __m512i s = j >= 2 ? _mm512_srai_epi32(sl[j], 4) : sl[j];
                    __m512i s2 = j >= 2 ? _mm512_srai_epi32(tl[j], 4) : tl[j];
                    __m512i hs = j == 0 ? _mm512_slli_epi32(sh[j], 4) : j == 1 ? _mm512_slli_epi32(sh[j], 2)
                               : j == 2 ? sh[j] : _mm512_srai_epi32(sh[j], 2);
                    __m512i hs2 = j == 0 ? _mm512_slli_epi32(th[j], 4) : j == 1 ? _mm512_slli_epi32(th[j], 2)
                                : j == 2 ? th[j] : _mm512_srai_epi32(th[j], 2);
                    s = _mm512_add_epi32(s, hs);
                    s2 = _mm512_add_epi32(s2, hs2);
                    int64_t c32 = b * 8 + 4 * n + j;
                    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a->d[c32]));
                    if (H2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2), _mm512_set1_ps(a->d2[c32]), f);
                    f = _mm512_sub_ps(f, _mm512_set1_ps(32.f * a->s16[2 * c32 + hh]));
                    if (hh == 0) {
                        f0[j] = f;
                        continue;
                    }
                    int so0 = 16 + 8 * (8 * n + 2 * j), so1 = so0 + 8;  /* sub-block 4n + j: halves 0, 1 */
                    acc = _mm512_fmadd_ps(f0[j], scales512(dv, p0 + so0, p1 + so0, 1), acc);
                    acc = _mm512_fmadd_ps(f, scales512(dv, p0 + so1, p1 + so1, 1), acc);
                }
            }
        }
    }
    out[0] = acc;
}

/* Q4_K with each 64-byte load of codes serving both sub-blocks of its pair (up to 8 rows: the 5-8 row
   passes are taken with one-byte activations only, whose 16 integer sums fit the registers): the high
   nibbles masked in place (16 x the code) and their int32 sums shifted back by 4 (exact). The
   products and the float epilogue are gemv_pair512_k's, in its order. */
TK_INLINE void gemv_pair512_q4k(const int H2, const int T, const int R, const uint8_t *restrict g0, int64_t rb,
                                int64_t nb,
                                const tk_act *a, __m512 *out) {
    const int pb = 1184, codes = 160;
    (void)T;
    const __m512i mlo = _mm512_set1_epi8(0x0F), mhi = _mm512_set1_epi8((char)0xF0);
    __m512 acc[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = g0 + b * pb, *p1 = g0 + rb + b * pb;
        __m512 dv = halves_ph(p0, p1), mv = halves_ph(p0 + 16, p1 + 16);
        for (int i = 0; i < 4; i++) {  /* the pair of sub-blocks 2i (low nibbles), 2i + 1 (high) */
            __m512i s[8][2], s2[8][2];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < 8; r++) s[r][0] = s[r][1] = s2[r][0] = s2[r][1] = _mm512_setzero_si512();
            const int64_t e = (b * 8 + 2 * i) * 32, o = e + 32;
            _Pragma("GCC unroll 8")
            for (int c = 0; c < 8; c++) {
                int at = codes + 256 * i + 32 * c;
                __m512i raw = cat256(p0 + at, p1 + at);
                __m512i lo = _mm512_and_si512(raw, mlo), hi = _mm512_and_si512(raw, mhi);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    s[r][0] = _mm512_dpbusd_epi32(s[r][0], lo, bcast4_512(a[r].q + e + 4 * c));
                    if (H2) s2[r][0] = _mm512_dpbusd_epi32(s2[r][0], lo, bcast4_512(a[r].q2 + e + 4 * c));
                    s[r][1] = _mm512_dpbusd_epi32(s[r][1], hi, bcast4_512(a[r].q + o + 4 * c));
                    if (H2) s2[r][1] = _mm512_dpbusd_epi32(s2[r][1], hi, bcast4_512(a[r].q2 + o + 4 * c));
                }
            }
            _Pragma("GCC unroll 2")
            for (int k = 0; k < 2; k++) {
                const int j = 2 * i + k;
                const int64_t c32 = b * 8 + j;
                __m512 dsc = scales512(dv, p0 + 32 + 8 * j, p1 + 32 + 8 * j, 0);
                __m512 dmn = scales512(mv, p0 + 96 + 8 * j, p1 + 96 + 8 * j, 0);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    __m512i si = k ? _mm512_srai_epi32(s[r][1], 4) : s[r][0];
                    __m512i si2 = k ? _mm512_srai_epi32(s2[r][1], 4) : s2[r][0];
                    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(a[r].d[c32]));
                    if (H2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si2), _mm512_set1_ps(a[r].d2[c32]), f);
                    acc[r] = _mm512_fmadd_ps(f, dsc, acc[r]);
                    acc[r] = _mm512_fnmadd_ps(dmn, _mm512_set1_ps(a[r].s32[c32]), acc[r]);
                }
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

/* Q6_K over many rows (prefill chunks, batched steps): gemv_pair512_k assembles each 6-bit code from
   its ql and qh bits again in every 4-row pass (six shifts and masks per 64 codes against four
   products). Here a unit's codes are assembled once, into a thread's buffer of 4 KiB per super-block
   (at most 140 KiB: it stays in L2), laid out as gemv_pair512_k forms them (super-block, sub-block,
   chunk: 64 bytes), and every pass reads them as they are. The integer sums and the float epilogue are
   gemv_pair512_k's in its order: the same floats. */
#define TK_Q6K_CODES 4096  /* bytes of one super-block's assembled codes for two groups */

static void q6k_pair_codes(const uint8_t *restrict g0, int64_t rb, int64_t nb, uint8_t *restrict codes) {
    const __m512i m15 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = g0 + b * 1680, *p1 = g0 + rb + b * 1680;
        for (int sb = 0; sb < 8; sb++) {
            const int n = sb / 4, j = sb % 4, ql = 144 + 256 * (2 * n + (j & 1)), qh = 144 + 1024 + 256 * n;
            for (int c = 0; c < 8; c++) {
                __m512i lv = cat256(p0 + ql + 32 * c, p1 + ql + 32 * c);
                __m512i hv = cat256(p0 + qh + 32 * c, p1 + qh + 32 * c);
                if (j >= 2) lv = _mm512_srli_epi16(lv, 4);
                __m512i u = _mm512_or_si512(_mm512_and_si512(lv, m15),
                                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hv, 2 * j), m3), 4));
                _mm512_storeu_si512((void *)(codes + b * TK_Q6K_CODES + (sb * 8 + c) * 64), u);
            }
        }
    }
}

TK_INLINE void gemv_pair512_q6k_codes(const int H2, const int R, const uint8_t *restrict g0, int64_t rb,
                                      int64_t nb, const uint8_t *restrict codes, const tk_act *a, __m512 *out) {
    __m512 acc[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = g0 + b * 1680, *p1 = g0 + rb + b * 1680;
        __m512 dv = halves_ph(p0, p1);
        for (int sb = 0; sb < 8; sb++) {
            const int n = sb / 4, j = sb % 4;
            int64_t c32 = b * 8 + sb;
            for (int hh = 0; hh < 2; hh++) {
                __m512i s[8], s2[8];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < 8; r++) s[r] = s2[r] = _mm512_setzero_si512();
                _Pragma("GCC unroll 4")
                for (int c = 4 * hh; c < 4 * hh + 4; c++) {
                    __m512i u = _mm512_loadu_si512((const void *)(codes + b * TK_Q6K_CODES + (sb * 8 + c) * 64));
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < R; r++) {
                        s[r] = _mm512_dpbusd_epi32(s[r], u, bcast4_512(a[r].q + c32 * 32 + 4 * c));
                        if (H2) s2[r] = _mm512_dpbusd_epi32(s2[r], u, bcast4_512(a[r].q2 + c32 * 32 + 4 * c));
                    }
                }
                int so = 16 + 8 * (8 * n + 2 * j + hh);
                __m512 dsc = scales512(dv, p0 + so, p1 + so, 1);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]), _mm512_set1_ps(a[r].d[c32]));
                    if (H2) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2[r]), _mm512_set1_ps(a[r].d2[c32]), f);
                    f = _mm512_sub_ps(f, _mm512_set1_ps(32.f * a[r].s16[2 * c32 + hh]));
                    acc[r] = _mm512_fmadd_ps(f, dsc, acc[r]);
                }
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

TK_INLINE void q6k_codes_h(const int H_, int R, const uint8_t *g, int64_t rb, int64_t nb, const uint8_t *codes,
                           const tk_act *a, __m512 *out) {
    switch (R) {
        case 1: gemv_pair512_q6k_codes(H_, 1, g, rb, nb, codes, a, out); break;
        case 2: gemv_pair512_q6k_codes(H_, 2, g, rb, nb, codes, a, out); break;
        case 3: gemv_pair512_q6k_codes(H_, 3, g, rb, nb, codes, a, out); break;
        default: gemv_pair512_q6k_codes(H_, 4, g, rb, nb, codes, a, out); break;
    }
}
/* R <= 4 rows (R <= 8 with one-byte activations) of a pair of Q6_K groups whose codes q6k_pair_codes
   assembled */
static void gemv_pair512_q6k_from(int R, const uint8_t *g, int64_t rb, int64_t nb, const uint8_t *codes,
                                  const tk_act *a, __m512 *out) {
    if (!tk_act_one()) q6k_codes_h(1, R, g, rb, nb, codes, a, out);
    else if (R <= 4) q6k_codes_h(0, R, g, rb, nb, codes, a, out);
    else if (R == 5) gemv_pair512_q6k_codes(0, 5, g, rb, nb, codes, a, out);
    else if (R == 6) gemv_pair512_q6k_codes(0, 6, g, rb, nb, codes, a, out);
    else if (R == 7) gemv_pair512_q6k_codes(0, 7, g, rb, nb, codes, a, out);
    else gemv_pair512_q6k_codes(0, 8, g, rb, nb, codes, a, out);
}

/* this thread's buffer for a unit's assembled codes (grown as needed, kept for the thread's life;
   NULL when it cannot grow: the caller keeps the assembling kernel) */
static uint8_t *q6k_codes_buffer(int64_t nb) {
    static __thread uint8_t *buf;
    static __thread int64_t cap;
    if (nb * TK_Q6K_CODES > cap) {
        uint8_t *grown = (uint8_t *)realloc(buf, (size_t)(nb * TK_Q6K_CODES));
        if (!grown) return NULL;
        buf = grown;
        cap = nb * TK_Q6K_CODES;
    }
    return buf;
}

/* R <= 8 rows of a pair of Q4_K groups with one-byte activations: half the passes over the pair */
static void gemv_pair512_q4k_8(int R, const uint8_t *g, int64_t rb, int64_t nb, const tk_act *a, __m512 *out) {
    switch (R) {
        case 1: gemv_pair512_q4k(0, TK_Q4_K, 1, g, rb, nb, a, out); break;
        case 2: gemv_pair512_q4k(0, TK_Q4_K, 2, g, rb, nb, a, out); break;
        case 3: gemv_pair512_q4k(0, TK_Q4_K, 3, g, rb, nb, a, out); break;
        case 4: gemv_pair512_q4k(0, TK_Q4_K, 4, g, rb, nb, a, out); break;
        case 5: gemv_pair512_q4k(0, TK_Q4_K, 5, g, rb, nb, a, out); break;
        case 6: gemv_pair512_q4k(0, TK_Q4_K, 6, g, rb, nb, a, out); break;
        case 7: gemv_pair512_q4k(0, TK_Q4_K, 7, g, rb, nb, a, out); break;
        default: gemv_pair512_q4k(0, TK_Q4_K, 8, g, rb, nb, a, out); break;
    }
}
