"""C source, part 3 of the quantized linear kernels: the GEMM for many rows (prefill chunks, batched
decode steps) and the entry point that picks a path.

The GEMM decodes a panel of 24 weight rows to float32 once (at most 24 x K x 4 bytes: 147 KiB for
K = 1536, an L2-sized tile) and runs every input row against it, four rows by three weight rows at a
time: twelve accumulators, twelve independent FMA chains, the x rows in L1 and the panel in L2. The
cost of decoding a weight is paid once per call, whatever the number of rows, so from a few dozen
rows on the step runs at the float32 FMA rate. Threads share out the panels.

The same loop with plain-C tiles is the whole of a build without AVX2 (``TK_PLAIN`` forces one on any
CPU, so that the fallback stays tested)."""

SOURCE = r"""
#define TK_PANEL 24

/* t[r * 3 + c] = x row r . panel row c, R <= 4 rows (xs apart) and C <= 3 panel rows (K apart) */
TK_INLINE void tile_plain(const int R, const int C, const float *x, int64_t xs, const float *w, int64_t K,
                          float *t) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = 0.f;
            const float *xr = x + r * xs, *wc = w + c * K;
            _Pragma("omp simd reduction(+:s)")
            for (int64_t k = 0; k < K; k++) s += xr[k] * wc[k];
            t[r * 3 + c] = s;
        }
}

#ifdef TK_AVX2
TK_INLINE void tile_avx2(const int R, const int C, const float *x, int64_t xs, const float *w, int64_t K,
                         float *t) {
    __m256 acc[4][3];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++)
        _Pragma("GCC unroll 3")
        for (int c = 0; c < 3; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {  /* K is a multiple of 32 */
        __m256 wv[3];
        _Pragma("GCC unroll 3")
        for (int c = 0; c < C; c++) wv[c] = _mm256_loadu_ps(w + c * K + k);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * xs + k);
            _Pragma("GCC unroll 3")
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 3")
        for (int c = 0; c < C; c++) t[r * 3 + c] = hsum8(acc[r][c]);
}
#endif

static void tile(int simd, int R, int C, const float *x, int64_t xs, const float *w, int64_t K, float *t) {
#ifdef TK_AVX2
#define TK_TILE(R_, C_) case R_ * 4 + C_: if (simd) tile_avx2(R_, C_, x, xs, w, K, t); \
                                          else tile_plain(R_, C_, x, xs, w, K, t); break;
#else
#define TK_TILE(R_, C_) case R_ * 4 + C_: tile_plain(R_, C_, x, xs, w, K, t); break;
#endif
    switch (R * 4 + C) {
        TK_TILE(1, 1) TK_TILE(1, 2) TK_TILE(1, 3) TK_TILE(2, 1) TK_TILE(2, 2) TK_TILE(2, 3)
        TK_TILE(3, 1) TK_TILE(3, 2) TK_TILE(3, 3) TK_TILE(4, 1) TK_TILE(4, 2)
        default: TK_TILE(4, 3)
    }
#undef TK_TILE
}

/* y[M, N] = x[M, K] . W[N, K]^T through float32 panels; W in format t with rb bytes per row, or
   (packed) in groups of 8 rows of rb bytes each */
static int gemm(int t, int simd, int packed, const float *x, int64_t M, const uint8_t *W, int64_t rb, float *y,
                int64_t N, int64_t K, int nt) {
    int64_t num_panels = (N + TK_PANEL - 1) / TK_PANEL;
    int failed = 0;
    _Pragma("omp parallel num_threads(nt) if(nt > 1 && num_panels > 1)")
    {
        float *panel = (float *)malloc(sizeof(float) * TK_PANEL * K);
        if (!panel) failed = 1;
        _Pragma("omp for schedule(dynamic, 1)")
        for (int64_t p = 0; p < num_panels; p++) {
            if (!panel) continue;
            int64_t n0 = p * TK_PANEL, nn = N - n0 < TK_PANEL ? N - n0 : TK_PANEL;
            if (packed)  /* TK_PANEL is a multiple of 8: the panel holds whole groups */
                for (int64_t i = 0; i < nn; i += 8) dequant_group(t, W + (n0 + i) / 8 * rb, K, panel + i * K);
            else
                for (int64_t i = 0; i < nn; i++) dequant_row(t, W + (n0 + i) * rb, panel + i * K, K);
            for (int64_t m = 0; m < M; m += 4) {
                int R = M - m < 4 ? (int)(M - m) : 4;
                for (int64_t c = 0; c < nn; c += 3) {
                    int C = nn - c < 3 ? (int)(nn - c) : 3;
                    float tt[12];
                    tile(simd, R, C, x + m * K, K, panel + c * K, K, tt);
                    for (int r = 0; r < R; r++)
                        for (int j = 0; j < C; j++) y[(m + r) * N + n0 + c + j] = tt[r * 3 + j];
                }
            }
        }
        free(panel);
    }
    return failed ? -1 : 0;
}

#ifdef TK_AVX2
/* The activations of M rows quantized for the integer GEMV, in one allocation (NULL if it failed). */
static tk_act *quantize_rows(const float *x, int64_t M, int64_t K, int nt) {
    int64_t nbk = K / 32;
    size_t head = sizeof(tk_act) * (size_t)M, floats = sizeof(float) * (size_t)(M * nbk * 4);
    char *mem = (char *)malloc(head + floats + (size_t)(M * K));
    if (!mem) return NULL;
    tk_act *a = (tk_act *)mem;
    float *f = (float *)(mem + head);
    _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1 && M >= 16)")
    for (int64_t m = 0; m < M; m++) {
        a[m].d = f + m * nbk * 4;
        a[m].s32 = a[m].d + nbk;
        a[m].s16 = a[m].s32 + nbk;
        a[m].q = (int8_t *)(mem + head + floats) + m * K;
        quantize_act(x + m * K, K, a[m]);
    }
    return a;
}

/* y[M, N] = x . W^T through 8-bit activations and integer block products (few rows); W as in gemm */
static int gemv(int t, int vnni, int packed, const float *x, int64_t M, const uint8_t *W, int64_t rb, float *y,
                int64_t N, int64_t K, int nt) {
    tk_act *a = quantize_rows(x, M, K, nt);
    if (!a) return -1;
    if (packed) {
        int64_t G = (N + 7) / 8, nb = K / 32;
        tk_gemv_packed_fn fn = gemv_packed_fn(t);
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")
        for (int64_t g = 0; g < G; g++) {
            int64_t nn = N - g * 8 < 8 ? N - g * 8 : 8;
            for (int64_t m = 0; m < M; m += 4) {
                int R = M - m < 4 ? (int)(M - m) : 4;
                __m256 out[4];
                float o[8];
                fn(R, vnni, W + g * rb, nb, a + m, out);
                for (int r = 0; r < R; r++) {
                    if (nn == 8) {
                        _mm256_storeu_ps(y + (m + r) * N + g * 8, out[r]);
                    } else {
                        _mm256_storeu_ps(o, out[r]);
                        memcpy(y + (m + r) * N + g * 8, o, sizeof(float) * (size_t)nn);
                    }
                }
            }
        }
    } else {
        int64_t nb = K / qk_block(t);
        tk_gemv_fn fn = gemv_fn(t);
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(nt > 1)")
        for (int64_t n = 0; n < N; n++) {
            for (int64_t m = 0; m < M; m += 4) {
                int R = M - m < 4 ? (int)(M - m) : 4;
                float out[4];
                fn(R, vnni, W + n * rb, nb, a + m, out);
                for (int r = 0; r < R; r++) y[(m + r) * N + n] = out[r];
            }
        }
    }
    free(a);
    return 0;
}
#endif

/* What this build can do: bit 0 AVX2 (integer GEMV, SIMD GEMM), bit 1 VNNI. */
int qk_features(void) {
#ifdef TK_AVX2
    return 1 | (TK_HAVE_VNNI ? 2 : 0);
#else
    return 0;
#endif
}

int qk_block_values(int t) { return qk_bytes(t) ? qk_block(t) : 0; }
int qk_block_bytes(int t) { return qk_bytes(t); }
int qk_packable(int t) { return qk_packed_bytes(t) != 0; }

/* method: 1 integer GEMV (VNNI where built), 2 integer GEMV with maddubs, 3 GEMM; a build without AVX2
   runs its plain GEMM for all three. packed: W is qk_pack's output (groups of 8 rows, rb bytes each).
   Returns 0, -1 on allocation failure, -2 for an unknown (or unpackable) format or a ragged K. */
int qk_linear(int t, int packed, int method, const float *x, int64_t M, const uint8_t *W, int64_t rb, float *y,
              int64_t N, int64_t K, int nt) {
    if (!qk_bytes(t) || K % qk_block(t) || (packed && !qk_packed_bytes(t))) return -2;
#ifdef TK_AVX2
    if (method == 1 || method == 2) return gemv(t, method == 1 && TK_HAVE_VNNI, packed, x, M, W, rb, y, N, K, nt);
    return gemm(t, 1, packed, x, M, W, rb, y, N, K, nt);
#else
    (void)method;
    return gemm(t, 0, packed, x, M, W, rb, y, N, K, nt);
#endif
}

/* W rows [n0, n0 + nn) decoded to float32, y[nn, K] (tests and the slow path) */
int qk_dequantize(int t, const uint8_t *W, int64_t rb, float *y, int64_t nn, int64_t K) {
    if (!qk_bytes(t) || K % qk_block(t)) return -2;
    for (int64_t i = 0; i < nn; i++) dequant_row(t, W + i * rb, y + i * K, K);
    return 0;
}
"""
