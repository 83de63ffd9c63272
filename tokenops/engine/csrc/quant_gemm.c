/*
 * C source, part 3 of the quantized linear kernels: the GEMM for many rows (prefill chunks, batched
 * decode steps) and the entry point that picks a path.
 *
 * The GEMM decodes a panel of 24 weight rows to float32 once (at most 24 x K x 4 bytes: 147 KiB for
 * K = 1536, an L2-sized tile) and runs every input row against it, four rows by three weight rows at a
 * time: twelve accumulators, twelve independent FMA chains, the x rows in L1 and the panel in L2. The
 * cost of decoding a weight is paid once per call, whatever the number of rows, so from a few dozen
 * rows on the step runs at the float32 FMA rate. Threads share out the panels.
 *
 * The same loop with plain-C tiles is the whole of a build without AVX2 (`TK_PLAIN` forces one on any
 * CPU, so that the fallback stays tested).
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: gemm). */
#include "quant.h"
#define TK_PANEL 24

/* t[r * 3 + c] = x row r . panel row c, R <= 4 rows (xs apart) and C <= 3 panel rows (K apart) */
TK_INLINE void qk_tile_plain(const int R, const int C, const float *x, int64_t xs, const float *w, int64_t K,
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
TK_INLINE void qk_tile_avx2(const int R, const int C, const float *x, int64_t xs, const float *w, int64_t K,
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
        for (int c = 0; c < C; c++) t[r * 3 + c] = qk_hsum8(acc[r][c]);
}
#endif

static void qk_tile(int simd, int R, int C, const float *x, int64_t xs, const float *w, int64_t K, float *t) {
#ifdef TK_AVX2
#define QK_TILE(R_, C_) case R_ * 4 + C_: { if (simd) qk_tile_avx2(R_, C_, x, xs, w, K, t); \
                                            else qk_tile_plain(R_, C_, x, xs, w, K, t); } break;
#else
    (void)simd;
#define QK_TILE(R_, C_) case R_ * 4 + C_: qk_tile_plain(R_, C_, x, xs, w, K, t); break;
#endif
    switch (R * 4 + C) {
        QK_TILE(1, 1) QK_TILE(1, 2) QK_TILE(1, 3) QK_TILE(2, 1) QK_TILE(2, 2) QK_TILE(2, 3)
        QK_TILE(3, 1) QK_TILE(3, 2) QK_TILE(3, 3) QK_TILE(4, 1) QK_TILE(4, 2)
        default: QK_TILE(4, 3)
    }
#undef QK_TILE
}

/* qk_weight: see quant.h */

/* y row m's outputs [n0, n0 + nn) (+)= v (+ bias) */
static inline void qk_put(float *restrict y, const float *restrict v, const float *restrict b, int64_t n0, int64_t nn,
                          int acc) {
    for (int64_t j = 0; j < nn; j++) {
        float val = v[j] + (b ? b[n0 + j] : 0.f);
        y[n0 + j] = acc ? y[n0 + j] + val : val;
    }
}

/* Bytes of scratch a product of M rows needs (the quantized activations, or the GEMM's rounded
   ones), and the integer path's layout. */
size_t qk_scratch_bytes(int64_t M, int64_t K) {
    /* + TK_AMX_ROWS rows past the last: an AMX tile of a last short pass reads (and ignores) them */
    size_t ints = sizeof(tk_act) * (size_t)M + sizeof(float) * (size_t)(M * (K / 32) * 5) +
                  (size_t)(2 * (M + TK_AMX_ROWS) * K) + sizeof(int16_t) * (size_t)(M * (K / 32) * 3);
    size_t floats = sizeof(float) * (size_t)(M * K);
    return ints > floats ? ints : floats;
}
static inline tk_act qk_act_at(void *scratch, int64_t M, int64_t K, int64_t m) {
    int64_t nbk = K / 32;
    char *mem = (char *)scratch;
    float *f = (float *)(mem + sizeof(tk_act) * (size_t)M) + m * nbk * 5;
    int8_t *q0 = (int8_t *)(mem + sizeof(tk_act) * (size_t)M + sizeof(float) * (size_t)(M * nbk * 5)), *q = q0 + 2 * m * K;
    int16_t *bs = (int16_t *)(q0 + 2 * (M + TK_AMX_ROWS) * K) + m * nbk * 3;
    /* q q2 | d d2 s32 s16 (2 per block) | b16 (2 per block) b32 */
    tk_act a = {q, q + K, f, f + nbk, f + 2 * nbk, f + 3 * nbk, bs, bs + 2 * nbk};
    return a;
}

/* y[m * ys + n] (+)= x[m * xs ..] . W[n] (+ b[n]) for m < M, n < N. Called by every thread of a
   parallel region (or outside one); the threads share out the weight. method 1/2: integer products,
   3: float32 panels, 4: float32 panels on the activations rounded per block as 1/2 round
   them (the same function as 1/2 to float32 rounding, so results do not depend on the path the row
   count picks). scratch: qk_scratch_bytes, shared (none for 3); panel: TK_PANEL * K floats per
   thread (3/4). A build without AVX2 runs 1/2 as 4. */
#define TK_ROW_TILE 64
#ifdef TK_AMX
/* qk_product's packed integer path on AMX tiles (every thread of the region calls it): passes of three
   pairs of groups over blocks of TK_ROW_TILE rows; an odd last group takes the 256-bit kernel fn */
static void qk_product_amx(const qk_weight *w, int vnni, tk_gemv_packed_fn fn, const tk_act *a, int64_t M,
                           const float *b, float *y, int64_t ys, int acc) {
    const int64_t N = w->N, K = w->K, rb = w->rb, G = (N + 7) / 8, P = G / 2, nb = K / qk_block(w->t);
    const int64_t S = (P + TK_AMX_PAIRS - 1) / TK_AMX_PAIRS + (G & 1);
    float tacc[TK_AMX_PAIRS * TK_ROW_TILE * 16] __attribute__((aligned(64)));
    tk_amx_begin(M < TK_AMX_ROWS ? (int)M : TK_AMX_ROWS);
    for (int64_t m0 = 0; m0 < M; m0 += TK_ROW_TILE) {
        int64_t mm = M - m0 < TK_ROW_TILE ? M - m0 : TK_ROW_TILE;
        _Pragma("omp for schedule(dynamic, 1) nowait")
        for (int64_t su = 0; su < S; su++) {
            int64_t p0 = su * TK_AMX_PAIRS;
            if (p0 >= P) {  /* the odd last group */
                int64_t g = G - 1, nn = N - g * 8;
                for (int64_t m = m0; m < m0 + mm; m += 4) {
                    int R = m0 + mm - m < 4 ? (int)(m0 + mm - m) : 4;
                    float o[8];
                    __m256 out[4];
                    fn(R, vnni, w->data + g * rb, nb, a + m, out);
                    for (int r = 0; r < R; r++) {
                        _mm256_storeu_ps(o, out[r]);
                        qk_put(y + (m + r) * ys, o, b, g * 8, nn, acc);
                    }
                }
                continue;
            }
            int U = P - p0 < TK_AMX_PAIRS ? (int)(P - p0) : TK_AMX_PAIRS;
            amx_pairs_any(w->t, U, mm, w->data + 2 * p0 * rb, rb, nb, a + m0, K, tacc);
            for (int i = 0; i < U; i++) {
                int64_t g = 2 * (p0 + i), nn = N - g * 8 < 16 ? N - g * 8 : 16;
                for (int64_t r = 0; r < mm; r++) qk_put(y + (m0 + r) * ys, tacc + (i * mm + r) * 16, b, g * 8, nn, acc);
            }
        }
    }
    tk_amx_end();
}
#endif
/* whether a part's one-byte activations take a scale per 256 values: on a TK_ACT_K256 build, for a
   K-quant (quant_packed_km.c's kernels need it; llama.cpp's q8_K), not for the 32-value formats (its
   q8_0, a scale per 32) */
static inline int qk_act_k256(const qk_weight *w) { return TK_ACT_K256 && qk_block(w->t) == 256; }

/* one part of w (ready: the activations are already quantized, or rounded, in scratch, as this part
   takes them) */
static void qk_product_one(const qk_weight *w, int method, const float *x, int64_t xs, int64_t M, const float *b,
                           float *y, int64_t ys, int acc, void *scratch, float *panel, int ready) {
    const int64_t N = w->N, K = w->K, rb = w->rb;
    const int t = w->t;
    const uint8_t *W = w->data;
#ifdef TK_AVX2
    if (method == 1 || method == 2) {
        int vnni = method == 1 && TK_HAVE_VNNI;
        tk_act *a = (tk_act *)scratch;
        if (!ready) {
            _Pragma("omp for schedule(static)")
            for (int64_t m = 0; m < M; m++) {
                a[m] = qk_act_at(scratch, M, K, m);
                quantize_act(x + m * xs, K, a[m], qk_act_k256(w));
            }
        }
        if (w->packed) {
            int64_t G = (N + 7) / 8, nb = K / qk_block(t);
            tk_gemv_packed_fn fn = gemv_packed_fn(t);
            int64_t step = 1;  /* groups per pass: 2 on the 512-bit path */
#ifdef TK_AVX512
            tk_pair512_fn fn512 = vnni && tk_use_avx512() ? pair512_fn(t) : NULL;
            if (fn512) step = 2;
#endif
            /* rows per pass: 8 for Q4_K and Q6_K on one-byte activations (quant_avx512_k.c, and on a build
               without VNNI quant_packed_km.c, whose calls take all 8: hs rows per call of fn) */
            int rs = 4, hs = 4;
            if (TK_ACT_K256 && (t == TK_Q4_K || t == TK_Q6_K) && tk_act_one()) rs = hs = TK_M_ROWS;
#ifdef TK_AVX512
            if (fn512 && (t == TK_Q4_K || t == TK_Q6_K) && tk_act_one()) rs = 8;
#endif
            /* (declared before the AMX branch: its `else` takes the loop below as its body) */
#ifdef TK_AMX
            /* TK_AMX_MIN_ROWS rows or more: AMX tiles (the same floats as fn512) */
            if (fn512 && M >= tk_amx_min_rows() && tk_amx_type(t) && tk_use_amx()) {
                qk_product_amx(w, vnni, fn, a, M, b, y, ys, acc);
            } else
#endif
            /* rows in blocks of TK_ROW_TILE (a multiple of 4: the same 4-row calls, the same results):
               one block's rounded activations stay in L2 while every weight group passes over them;
               a prefill chunk's 512 rows (1.5 MB at K = 1536) were re-read from L3 for every group */
            for (int64_t m0 = 0; m0 < M; m0 += TK_ROW_TILE) {
                int64_t m1 = M - m0 < TK_ROW_TILE ? M : m0 + TK_ROW_TILE;
                _Pragma("omp for schedule(dynamic, 2) nowait")
                for (int64_t u = 0; u < (G + step - 1) / step; u++) {  /* a unit: step groups */
                    int64_t g = u * step, nn = N - g * 8 < 8 * step ? N - g * 8 : 8 * step;
                    /* several passes over this unit: each asks the caches for a share of the next unit's
                       bytes, which the first pass over it would otherwise wait for line by line */
                    int64_t passes = (m1 - m0 + rs - 1) / rs, ub = (g + 2 * step <= G ? step : G - g - step) * rb;
#ifdef TK_AVX512
                    /* Q6_K, several passes over a pair: its codes assembled once (quant_avx512_k.c) */
                    uint8_t *codes = fn512 && nn > 8 && t == TK_Q6_K && passes > 1 ? q6k_codes_buffer(nb) : NULL;
                    if (codes) q6k_pair_codes(W + g * rb, rb, nb, codes);
#endif
                    /* the same without VNNI, one group (quant_packed_km.c), from three passes (at two, unpacking
                       in each pass, with its prefetch, was as fast or faster) */
#if TK_ACT_K256
                    uint8_t *kcodes = hs == TK_M_ROWS && t == TK_Q6_K && passes > 2 ? km_codes_buffer(nb) : NULL;
                    if (kcodes) q6k_group_codes(W + g * rb, nb, kcodes);
#endif
                    for (int64_t m = m0; m < m1; m += rs) {
                        int R = m1 - m < rs ? (int)(m1 - m) : rs;
                        if (passes > 1 && ub > 0) {
                            int64_t pi = (m - m0) / rs;
                            const char *nx = (const char *)(W + (g + step) * rb);
                            for (int64_t l = ub * pi / passes & ~(int64_t)63; l < ub * (pi + 1) / passes; l += 64)
                                _mm_prefetch(nx + l, _MM_HINT_T1);
                        }
                        float o[16];
#ifdef TK_AVX512
                        if (nn > 8) {  /* two groups in one 512-bit pass */
                            __m512 out[8];
                            if (rs == 8 && t == TK_Q4_K) gemv_pair512_q4k_8(R, W + g * rb, rb, nb, a + m, out);
                            else if (codes) gemv_pair512_q6k_from(R, W + g * rb, rb, nb, codes, a + m, out);
                            else  /* 4 rows a call */
                                for (int h = 0; h < R; h += 4)
                                    fn512(R - h < 4 ? R - h : 4, W + g * rb, rb, nb, a + m + h, out + h);
                            for (int r = 0; r < R; r++) {
                                _mm512_storeu_ps(o, out[r]);
                                qk_put(y + (m + r) * ys, o, b, g * 8, nn, acc);
                            }
                            continue;
                        }
#endif
                        for (int h = 0; h < R; h += hs) {  /* the 256-bit kernel: hs rows a call */
                            __m256 out[TK_M_ROWS];
                            int Rh = R - h < hs ? R - h : hs;
#if TK_ACT_K256
                            if (kcodes) gemv_packed_km(t, Rh, W + g * rb, kcodes, nb, a + m + h, out);
                            else
#endif
                            fn(Rh, vnni, W + g * rb, nb, a + m + h, out);
                            for (int r = 0; r < Rh; r++) {
                                _mm256_storeu_ps(o, out[r]);
                                qk_put(y + (m + h + r) * ys, o, b, g * 8, nn, acc);
                            }
                        }
                    }
                }
            }
            _Pragma("omp barrier")
        } else {
            int64_t nb = K / qk_block(t);
            tk_gemv_fn fn = gemv_fn(t);
            _Pragma("omp for schedule(dynamic, 16)")
            for (int64_t n = 0; n < N; n++) {
                for (int64_t m = 0; m < M; m += 4) {
                    int R = M - m < 4 ? (int)(M - m) : 4;
                    float out[4];
                    fn(R, vnni, W + n * rb, nb, a + m, out);
                    for (int r = 0; r < R; r++) qk_put(y + (m + r) * ys, out + r, b, n, 1, acc);
                }
            }
        }
        return;
    }
    const int simd = 1;
#else
    const int simd = 0;
#endif
    if (method != 3) {  /* the rounded activations (1/2 in a plain build, 4) */
        float *xr = (float *)scratch;
        if (!ready) {
            _Pragma("omp for schedule(static)")
            for (int64_t m = 0; m < M; m++) round_act(x + m * xs, K, xr + m * K, qk_act_k256(w));
        }
        x = xr;
        xs = K;
    }
    int64_t num_panels = (N + TK_PANEL - 1) / TK_PANEL;
    _Pragma("omp for schedule(dynamic, 1)")
    for (int64_t p = 0; p < num_panels; p++) {
        int64_t n0 = p * TK_PANEL, nn = N - n0 < TK_PANEL ? N - n0 : TK_PANEL;
        if (w->packed)  /* TK_PANEL is a multiple of 8: the panel holds whole groups */
            for (int64_t i = 0; i < nn; i += 8) dequant_group(t, W + (n0 + i) / 8 * rb, K, panel + i * K);
        else
            for (int64_t i = 0; i < nn; i++) dequant_row(t, W + (n0 + i) * rb, panel + i * K, K);
        for (int64_t m = 0; m < M; m += 4) {
            int R = M - m < 4 ? (int)(M - m) : 4;
            for (int64_t c = 0; c < nn; c += 3) {
                int C = nn - c < 3 ? (int)(nn - c) : 3;
                float tt[12];
                qk_tile(simd, R, C, x + m * xs, xs, panel + c * K, K, tt);
                for (int r = 0; r < R; r++) qk_put(y + (m + r) * ys, tt + r * 3, b, n0 + c, C, acc);
            }
        }
    }
}

static void qk_product(const qk_weight *w, int method, const float *x, int64_t xs, int64_t M, const float *b,
                       float *y, int64_t ys, int acc, void *scratch, float *panel) {
    /* each part's outputs after the last's; the activations quantized once for the parts that take them
       alike (a part that takes another scale, qk_act_k256, after every thread is done with the last's:
       each product ends at a barrier) */
    for (const qk_weight *last = NULL; w; last = w, w = w->next) {
        int ready = last && qk_act_k256(last) == qk_act_k256(w);
        qk_product_one(w, method, x, xs, M, b, y, ys, acc, scratch, panel, ready);
        y += w->N;
        if (b) b += w->N;
    }
}

/* row tok of w as float32 (an embedding lookup; w packed or in GGUF's layout) */
static inline void qk_embed_row(const qk_weight *w, int64_t tok, float *out) {
    if (w->packed) dequant_group_row(w->t, w->data + tok / 8 * w->rb, w->K, (int)(tok % 8), out);
    else dequant_row(w->t, w->data + tok * w->rb, out, w->K);
}

/* What this build can do: bit 0 AVX2 (integer GEMV, SIMD GEMM), bit 1 VNNI, bit 2 the 512-bit packed
   kernels (built, and the CPU runs them). */
int qk_features(void) {
#ifdef TK_AVX2
    int avx512 = 0;
#ifdef TK_AVX512
    __builtin_cpu_init();
    avx512 = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#endif
    return 1 | (TK_HAVE_VNNI ? 2 : 0) | (avx512 ? 4 : 0) | (avx512 && tk_amx_allowed() ? 8 : 0);
#else
    return 0;
#endif
}

int qk_block_values(int t) { return qk_bytes(t) ? qk_block(t) : 0; }
int qk_block_bytes(int t) { return qk_bytes(t); }
int qk_packable(int t) { return qk_packed_bytes(t) != 0; }
/* bytes of one packed group of 8 rows of K values (0: not packable, or K not a multiple of the block) */
int64_t qk_group_bytes(int t, int64_t K) { return K % qk_block(t) ? 0 : K / qk_block(t) * qk_packed_bytes(t); }

/* y[M, N] = x[M, K] . W^T, method as for qk_product. packed: W is qk_pack's output (groups of 8 rows,
   rb bytes each). Returns 0, -1 on allocation failure, -2 for an unknown (or unpackable) format, a
   ragged K or an unknown method. */
int qk_linear(int t, int packed, int method, const float *x, int64_t M, const uint8_t *W, int64_t rb, float *y,
              int64_t N, int64_t K, int nt) {
    if (!qk_bytes(t) || K % qk_block(t) || (packed && !qk_packed_bytes(t)) || method < 1 || method > 4) return -2;
    qk_weight w = {W, rb, N, K, t, packed, NULL};
    int gemm_path = method >= 3 || !(qk_features() & 1);
    void *scratch = method == 3 ? NULL : malloc(qk_scratch_bytes(M, K));
    if (method != 3 && !scratch) return -1;
    int failed = 0;
    _Pragma("omp parallel num_threads(nt) if(nt > 1)")
    {
        float *panel = gemm_path ? (float *)malloc(sizeof(float) * TK_PANEL * (size_t)K) : NULL;
        if (gemm_path && !panel) failed = 1;  /* every thread must meet the work-sharing loops */
        _Pragma("omp barrier")
        if (!failed) qk_product(&w, method, x, K, M, NULL, y, N, 0, scratch, panel);
        free(panel);
    }
    free(scratch);
    return failed ? -1 : 0;
}

/* W rows [n0, n0 + nn) decoded to float32, y[nn, K] (tests and the slow path) */
int qk_dequantize(int t, const uint8_t *W, int64_t rb, float *y, int64_t nn, int64_t K) {
    if (!qk_bytes(t) || K % qk_block(t)) return -2;
    for (int64_t i = 0; i < nn; i++) dequant_row(t, W + i * rb, y + i * K, K);
    return 0;
}
