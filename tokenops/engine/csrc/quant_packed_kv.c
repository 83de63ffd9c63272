/* The 256-bit VNNI twins of quant_avx512_k.c's shared-load kernels, over one group of eight rows
   (included by quant_packed_k.c inside its TK_AVX2 block): the same masked-in-place products, equal
   to gemv_group_k's sums bit for bit, and its float epilogue in its order. VNNI only: ``maddubs``
   adds byte products into int16 with saturation, which codes masked in place (up to 240) would
   reach; without VNNI the products stay gemv_group_k's. */

#if TK_HAVE_VNNI
TK_INLINE __m256i dot_vnni(__m256i acc, __m256i u, __m256i s) { return dot_acc(acc, u, s, 1); }

/* super-blocks ahead the one-row Q6_K kernel prefetches (see quant_avx512_k.c's TK_Q6K_PREFETCH) */
#define TK_Q6K_PREFETCH_256 4

TK_INLINE void gemv_group_q6k_v1(const int H2, const uint8_t *restrict g, int64_t nb, const tk_act *a, __m256 *out) {
    const __m256i mlo = _mm256_set1_epi8(0x0F), mhi = _mm256_set1_epi8((char)0xF0);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * 1680;
        if (b + TK_Q6K_PREFETCH_256 < nb)
            for (int l = 0; l < 1680; l += 64)
                _mm_prefetch((const char *)(p + TK_Q6K_PREFETCH_256 * 1680 + l), _MM_HINT_T0);
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        for (int n = 0; n < 2; n++) {
            __m256 f0[4];
            for (int hh = 0; hh < 2; hh++) {
                __m256i sl[4], sh[4], tl[4], th[4];  /* q and q2 sums of the low and high bits, per j */
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) sl[j] = sh[j] = tl[j] = th[j] = _mm256_setzero_si256();
                _Pragma("GCC unroll 4")
                for (int c = 4 * hh; c < 4 * hh + 4; c++) {
                    const int l0 = 144 + 256 * (2 * n) + 32 * c, l1 = l0 + 256, h = 144 + 1024 + 256 * n + 32 * c;
                    __m256i lv[2] = {_mm256_loadu_si256((const __m256i *)(p + l0)),
                                      _mm256_loadu_si256((const __m256i *)(p + l1))};
                    __m256i hv = _mm256_loadu_si256((const __m256i *)(p + h));
                    _Pragma("GCC unroll 4")
                    for (int j = 0; j < 4; j++) {
                        __m256i lo = _mm256_and_si256(lv[j & 1], j >= 2 ? mhi : mlo);
                        __m256i hi = _mm256_and_si256(hv, _mm256_set1_epi8((char)(3 << (2 * j))));
                        int64_t at = (b * 8 + 4 * n + j) * 32 + 4 * c;
                        __m256i q = bcast4(a->q + at), q2 = bcast4(a->q2 + at);
                        sl[j] = dot_vnni(sl[j], lo, q);
                        sh[j] = dot_vnni(sh[j], hi, q);
                        if (H2) tl[j] = dot_vnni(tl[j], lo, q2);
                        if (H2) th[j] = dot_vnni(th[j], hi, q2);
                    }
                }
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) {
                    __m256i s = j >= 2 ? _mm256_srai_epi32(sl[j], 4) : sl[j];
                    __m256i s2 = j >= 2 ? _mm256_srai_epi32(tl[j], 4) : tl[j];
                    __m256i hs = j == 0 ? _mm256_slli_epi32(sh[j], 4) : j == 1 ? _mm256_slli_epi32(sh[j], 2)
                               : j == 2 ? sh[j] : _mm256_srai_epi32(sh[j], 2);
                    __m256i hs2 = j == 0 ? _mm256_slli_epi32(th[j], 4) : j == 1 ? _mm256_slli_epi32(th[j], 2)
                                : j == 2 ? th[j] : _mm256_srai_epi32(th[j], 2);
                    s = _mm256_add_epi32(s, hs);
                    s2 = _mm256_add_epi32(s2, hs2);
                    int64_t c32 = b * 8 + 4 * n + j;
                    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(a->d[c32]));
                    if (H2) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), _mm256_set1_ps(a->d2[c32]), f);
                    f = _mm256_sub_ps(f, _mm256_set1_ps(32.f * a->s16[2 * c32 + hh]));
                    if (hh == 0) {
                        f0[j] = f;
                        continue;
                    }
                    int so0 = 16 + 8 * (8 * n + 2 * j), so1 = so0 + 8;  /* sub-block 4n + j: halves 0, 1 */
                    acc = _mm256_fmadd_ps(f0[j], row_scales(dv, p + so0, 1), acc);
                    acc = _mm256_fmadd_ps(f, row_scales(dv, p + so1, 1), acc);
                }
            }
        }
    }
    out[0] = acc;
}

TK_INLINE void gemv_group_q4k_v(const int H2, const int R, const uint8_t *restrict g, int64_t nb, const tk_act *a,
                                __m256 *out) {
    const int pb = 1184, codes = 160;
    const __m256i mlo = _mm256_set1_epi8(0x0F), mhi = _mm256_set1_epi8((char)0xF0);
    __m256 acc[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * pb;
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        for (int i = 0; i < 4; i++) {  /* the pair of sub-blocks 2i (low nibbles), 2i + 1 (high) */
            __m256i s[4][2], s2[4][2];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < 4; r++) s[r][0] = s[r][1] = s2[r][0] = s2[r][1] = _mm256_setzero_si256();
            const int64_t e = (b * 8 + 2 * i) * 32, o = e + 32;
            _Pragma("GCC unroll 8")
            for (int c = 0; c < 8; c++) {
                int at = codes + 256 * i + 32 * c;
                __m256i raw = _mm256_loadu_si256((const __m256i *)(p + at));
                __m256i lo = _mm256_and_si256(raw, mlo), hi = _mm256_and_si256(raw, mhi);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    s[r][0] = dot_vnni(s[r][0], lo, bcast4(a[r].q + e + 4 * c));
                    if (H2) s2[r][0] = dot_vnni(s2[r][0], lo, bcast4(a[r].q2 + e + 4 * c));
                    s[r][1] = dot_vnni(s[r][1], hi, bcast4(a[r].q + o + 4 * c));
                    if (H2) s2[r][1] = dot_vnni(s2[r][1], hi, bcast4(a[r].q2 + o + 4 * c));
                }
            }
            _Pragma("GCC unroll 2")
            for (int k = 0; k < 2; k++) {
                const int j = 2 * i + k;
                const int64_t c32 = b * 8 + j;
                __m256 dsc = row_scales(dv, p + 32 + 8 * j, 0);
                __m256 dmn = row_scales(mv, p + 96 + 8 * j, 0);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < R; r++) {
                    __m256i si = k ? _mm256_srai_epi32(s[r][1], 4) : s[r][0];
                    __m256i si2 = k ? _mm256_srai_epi32(s2[r][1], 4) : s2[r][0];
                    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(a[r].d[c32]));
                    if (H2) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si2), _mm256_set1_ps(a[r].d2[c32]), f);
                    acc[r] = _mm256_fmadd_ps(f, dsc, acc[r]);
                    acc[r] = _mm256_fnmadd_ps(dmn, _mm256_set1_ps(a[r].s32[c32]), acc[r]);
                }
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++) out[r] = acc[r];
}
#endif
