/*
 * C source of the fused step's LoRA products (:mod:`tokenops.engine.lora.lora_native`), compiled into the
 * fused decode library (:mod:`tokenops.engine.kernels._fused_decode_c` places it after `dot1`).
 *
 * For each of a layer's four products (q/k/v, o, gate/up, down) and each row that uses an adapter, the
 * step adds `(x A^T) B^T` (B already scaled) to the part of the output the adapter targets, in two
 * halves folded into the step's existing per-row loops, so the adapters add no synchronisation between
 * the threads (on a busy 2-core box each barrier of the step costs far more than the arithmetic):
 * `lora_a` right after the rows' input is made (`T = x A^T`, rank values per part) and `lora_b`
 * in the first per-row loop after the base product (`y += T B^T`, along the output features).
 *
 * Those loops run over *tiles*: up to `TK_LORA_TILE` rows of one adapter (or of the base), listed
 * by :class:`~tokenops.engine.lora.lora_native.NativeLora` in any order of the step's rows (no reordering
 * of the chunks, nor of the logits after). The products are register-blocked over a tile: `T = x
 * A^T` takes four ranks against every row of the tile per pass down `K` (each load of A serves all
 * the tile's rows, each load of x four ranks), and `y += T B^T` takes four vectors of outputs of
 * every row per step down the rank (each load of B serves all the tile's rows). A tile's matrices are
 * thus read once per tile from cache, not once per row (the segment-grouped product of Punica's SGMV),
 * and the arithmetic is vectorised with 16-lane (AVX-512) or 8-lane (AVX2) vectors, written with GCC's
 * vector extensions; float32 throughout. Base rows are untouched.
 */
/* Part of the fused decode library: fused_decode.c includes it after dot1. */
#include "fused_decode.h"
#if defined(__AVX512F__)
#define TK_VW 16
#elif defined(__AVX2__)
#define TK_VW 8
#else
#define TK_VW 4
#endif
/* a vector of TK_VW floats that may sit at any float address */
typedef float tk_vf __attribute__((vector_size(TK_VW * 4), aligned(4), may_alias));
#define TK_LORA_INLINE static inline __attribute__((always_inline))

/* tk_lora_part, tk_lora_adapter and tk_lora: see fused_decode.h */

/* the tiles the per-row loops run over: lo's, or (no adapters) one row each */
static inline int64_t lora_ntiles(const tk_lora *lo, int64_t M) { return lo ? lo->ntiles : M; }
/* tile b's rows into rows[], returns their number */
static inline int lora_tile(const tk_lora *lo, int64_t b, int64_t *rows) {
    if (!lo) { rows[0] = b; return 1; }
    int n = (int)(lo->tile[b + 1] - lo->tile[b]);
    for (int i = 0; i < n; i++) rows[i] = lo->rows[lo->tile[b] + i];
    return n;
}

static inline float tk_vsum(tk_vf v) {
    float s = 0.f;
    for (int i = 0; i < TK_VW; i++) s += v[i];
    return s;
}

/* t[i][j] = x[i] . a[j] for NR rows and NJ ranks (a: NJ rows, K apart), each load used NR or NJ times */
TK_LORA_INLINE void lora_a_block(const float *const *x, int NR, const float *a, int NJ, int64_t K, float *const *t) {
    tk_vf acc[TK_LORA_TILE][4];
    for (int i = 0; i < NR; i++) for (int j = 0; j < NJ; j++) acc[i][j] = (tk_vf){0};
    int64_t k = 0;
    for (; k + TK_VW <= K; k += TK_VW) {
        tk_vf av[4], xv[TK_LORA_TILE];
        for (int j = 0; j < NJ; j++) {
            av[j] = *(const tk_vf *)(a + j * K + k);
            __builtin_prefetch(a + j * K + k + 128, 0, 3);  /* A comes from memory: ask 512 bytes ahead */
        }
        for (int i = 0; i < NR; i++) xv[i] = *(const tk_vf *)(x[i] + k);
        for (int i = 0; i < NR; i++) for (int j = 0; j < NJ; j++) acc[i][j] += xv[i] * av[j];
    }
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NJ; j++) {
            float s = tk_vsum(acc[i][j]);
            for (int64_t kk = k; kk < K; kk++) s += x[i][kk] * a[j * K + kk];
            t[i][j] = s;
        }
}

/* y[i][0:NV*TK_VW] += sum_j t[i][j] * b[j][0:NV*TK_VW] for NR rows (b: r rows, n apart) */
TK_LORA_INLINE void lora_b_block(float *const *y, int NR, const float *b, int64_t r, int64_t n, const float *const *t,
                                 int NV) {
    tk_vf acc[TK_LORA_TILE][4];
    for (int i = 0; i < NR; i++) for (int v = 0; v < NV; v++) acc[i][v] = (tk_vf){0};
    for (int64_t j = 0; j < r; j++) {
        tk_vf bv[4];
        for (int v = 0; v < NV; v++) bv[v] = *(const tk_vf *)(b + j * n + v * TK_VW);
        for (int i = 0; i < NR; i++) {
            const float tj = t[i][j];
            for (int v = 0; v < NV; v++) acc[i][v] += tj * bv[v];
        }
    }
    for (int i = 0; i < NR; i++)
        for (int v = 0; v < NV; v++) *(tk_vf *)(y[i] + v * TK_VW) += acc[i][v];
}

/* T = x A^T of one part for NR rows */
TK_LORA_INLINE void lora_a_rows(const tk_lora_part *pt, const float *const *x, int NR, int64_t K, float *const *t) {
    float *tj[TK_LORA_TILE];
    int64_t j = 0;
    for (; j + 4 <= pt->r; j += 4) {
        for (int i = 0; i < NR; i++) tj[i] = t[i] + pt->t + j;
        lora_a_block(x, NR, pt->a + j * K, 4, K, tj);
    }
    for (; j < pt->r; j++) {
        for (int i = 0; i < NR; i++) tj[i] = t[i] + pt->t + j;
        lora_a_block(x, NR, pt->a + j * K, 1, K, tj);
    }
}

/* y[off:off+n] += T B^T of one part for NR rows (the last n % TK_VW outputs one by one) */
TK_LORA_INLINE void lora_b_rows(const tk_lora_part *pt, float *const *y, int NR, const float *const *t) {
    const float *tp[TK_LORA_TILE];
    float *yc[TK_LORA_TILE];
    for (int i = 0; i < NR; i++) tp[i] = t[i] + pt->t;
    const int64_t n = pt->n;
    int64_t c = 0;
    for (; c + 4 * TK_VW <= n; c += 4 * TK_VW) {
        for (int i = 0; i < NR; i++) yc[i] = y[i] + pt->off + c;
        lora_b_block(yc, NR, pt->b + c, pt->r, n, tp, 4);
    }
    for (; c + TK_VW <= n; c += TK_VW) {
        for (int i = 0; i < NR; i++) yc[i] = y[i] + pt->off + c;
        lora_b_block(yc, NR, pt->b + c, pt->r, n, tp, 1);
    }
    for (; c < n; c++)
        for (int i = 0; i < NR; i++) {
            float s = 0.f;
            for (int64_t j = 0; j < pt->r; j++) s += tp[i][j] * pt->b[j * n + c];
            y[i][pt->off + c] += s;
        }
}

/* the parts of projection p of layer l of the adapter of rows[0..nr) (NULL: the base) */
static inline const tk_lora_adapter *lora_rows(const tk_lora *lo, const int64_t *rows, int nr) {
    if (!lo || nr <= 0 || lo->ad[rows[0]] < 0) return 0;
    return lo->adapters + lo->ad[rows[0]];
}

/* T[m] = x[m] A^T for every part of projection p of layer l, for the tile's rows (one adapter;
   x: rows xs apart, K wide) */
static __attribute__((noinline)) void lora_a_tile(const tk_lora *lo, int64_t l, int p, const int64_t *rows, int nr,
                                                 const float *x, int64_t xs, int64_t K) {
    /*lora_a*/
    const tk_lora_adapter *ad = lora_rows(lo, rows, nr);
    if (!ad) return;
    const float *xr[TK_LORA_TILE];
    float *tr[TK_LORA_TILE];
    for (int i = 0; i < nr; i++) { xr[i] = x + rows[i] * xs; tr[i] = lo->t + rows[i] * lo->tw; }
    for (int64_t q = ad->start[l * 4 + p], end = ad->start[l * 4 + p + 1]; q < end; q++) {
        tk_lora_part pt[1] = {ad->parts[q]};
        /* parts whose A are stacked (q/k/v, gate/up: one matrix, T side by side) in one pass */
        for (; q + 1 < end && ad->parts[q + 1].a == pt->a + pt->r * K && ad->parts[q + 1].t == pt->t + pt->r; q++)
            pt->r += ad->parts[q + 1].r;
        switch (nr) {
            case 4: lora_a_rows(pt, xr, 4, K, tr); break;
            case 3: lora_a_rows(pt, xr, 3, K, tr); break;
            case 2: lora_a_rows(pt, xr, 2, K, tr); break;
            default: for (int i = 0; i < nr; i++) lora_a_rows(pt, xr + i, 1, K, tr + i);
        }
    }
}

/* y[m][off:off+n] += T[m] B^T for the same parts and rows (y: rows ys apart) */
static __attribute__((noinline)) void lora_b_tile(const tk_lora *lo, int64_t l, int p, const int64_t *rows, int nr,
                                                 float *y, int64_t ys) {
    /*lora_b*/
    const tk_lora_adapter *ad = lora_rows(lo, rows, nr);
    if (!ad) return;
    float *yr[TK_LORA_TILE];
    const float *tr[TK_LORA_TILE];
    for (int i = 0; i < nr; i++) { yr[i] = y + rows[i] * ys; tr[i] = lo->t + rows[i] * lo->tw; }
    for (int64_t q = ad->start[l * 4 + p]; q < ad->start[l * 4 + p + 1]; q++) {
        const tk_lora_part *pt = ad->parts + q;
        switch (nr) {
            case 4: lora_b_rows(pt, yr, 4, tr); break;
            case 3: lora_b_rows(pt, yr, 3, tr); break;
            case 2: lora_b_rows(pt, yr, 2, tr); break;
            default: for (int i = 0; i < nr; i++) lora_b_rows(pt, yr + i, 1, tr + i);
        }
    }
}

/* the step's calls: nothing but a test on base rows and steps without adapters */
static inline void lora_a(const tk_lora *lo, int64_t l, int p, const int64_t *rows, int nr, const float *x, int64_t xs,
                          int64_t K) {
    if (lo && nr > 0 && lo->ad[rows[0]] >= 0) lora_a_tile(lo, l, p, rows, nr, x, xs, K);
}
static inline void lora_b(const tk_lora *lo, int64_t l, int p, const int64_t *rows, int nr, float *y, int64_t ys) {
    if (lo && nr > 0 && lo->ad[rows[0]] >= 0) lora_b_tile(lo, l, p, rows, nr, y, ys);
}

/* Exported for the tests: y[m] += (x[m] A^T) B^T over every part of (layer l, projection p) of the
   step's adapters, the tiles run as the fused step runs them (x: [M, K], y: [M, ys], both rows apart). */
int lora_apply_f32(const tk_lora *lo, int64_t l, int p, const float *x, int64_t K, float *y, int64_t ys) {
    int64_t rows[TK_LORA_TILE];
    for (int64_t b = 0; b < lo->ntiles; b++) {
        int nr = lora_tile(lo, b, rows);
        lora_a(lo, l, p, rows, nr, x, K, K);
        lora_b(lo, l, p, rows, nr, y, ys);
    }
    return 0;
}
