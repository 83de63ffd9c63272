"""C source of the fused step's LoRA products (:mod:`tokenops.engine.lora_native`), compiled into the
fused decode library (:mod:`tokenops.engine._fused_decode_c` places it after ``dot1``).

After each of a layer's four products (q/k/v, o, gate/up, down) the fused step calls ``lora_add``:
for every adapter present in the step (a *segment*: the rows that use it) and every part of the
projection it adapts, ``T = x[rows] A^T`` then ``y[rows, off:off + n] += T B^T`` (B already scaled).
Each adapter's matrices are read once per step whatever its number of rows (the segment-grouped
product of Punica's SGMV); base rows are untouched. Both passes share out their work between the
threads of the step's parallel region (every output element written by one thread)."""

LORA_SOURCE = r"""
typedef struct {          /* one part of one projection of one adapter: y[:, off:off+n] += (x A^T) B^T */
    const float *a;       /* A [r, K] */
    const float *b;       /* B [n, r], scaling folded in */
    int64_t r, n, off, t; /* rank, output features, first output column, first column of the row's T */
} tk_lora_part;

typedef struct {          /* one adapter: (layer l, projection p) has parts[start[4l+p] .. start[4l+p+1]) */
    const tk_lora_part *parts;
    const int64_t *start; /* [layers * 4 + 1]; p: 0 q/k/v, 1 o, 2 gate/up, 3 down */
} tk_lora_adapter;

typedef struct {          /* one step: nseg adapters, adapter s on rows[seg[s] .. seg[s+1]) */
    int64_t nseg;
    const tk_lora_adapter *adapters;
    const int64_t *seg, *rows;
    float *t;             /* scratch [M, tw] */
    int64_t tw;
} tk_lora;

/* unit u of a pass (a rank column of a part, or a block of 16 output features) -> segment, part, index */
static const tk_lora_part *lora_unit(const tk_lora *lo, int64_t i, int blocks, int64_t u, int64_t *seg,
                                     int64_t *idx) {
    for (int64_t s = 0; s < lo->nseg; s++) {
        const tk_lora_adapter *ad = lo->adapters + s;
        for (int64_t q = ad->start[i]; q < ad->start[i + 1]; q++) {
            const tk_lora_part *pt = ad->parts + q;
            int64_t w = blocks ? (pt->n + 15) / 16 : pt->r;
            if (u < w) { *seg = s; *idx = u; return pt; }
            u -= w;
        }
    }
    return 0;
}

/* y[m] += the LoRA products of x[m] (rows xs apart, K wide; y rows ys apart) for projection p of
   layer l, for every adapter row of the step. Called by every thread of the parallel region. */
static void lora_add(const tk_lora *lo, int64_t l, int p, const float *x, int64_t xs, int64_t K, float *y,
                     int64_t ys) {
    if (!lo) return;
    int64_t i = l * 4 + p, u1 = 0, u2 = 0;
    for (int64_t s = 0; s < lo->nseg; s++) {
        const tk_lora_adapter *ad = lo->adapters + s;
        for (int64_t q = ad->start[i]; q < ad->start[i + 1]; q++) { u1 += ad->parts[q].r; u2 += (ad->parts[q].n + 15) / 16; }
    }
    if (u1 == 0) return;  /* the same answer in every thread */
    _Pragma("omp for schedule(dynamic, 2)")
    for (int64_t u = 0; u < u1; u++) {
        int64_t s, j;
        const tk_lora_part *pt = lora_unit(lo, i, 0, u, &s, &j);
        const float *a = pt->a + j * K;
        for (int64_t e = lo->seg[s]; e < lo->seg[s + 1]; e++) {
            int64_t m = lo->rows[e];
            lo->t[m * lo->tw + pt->t + j] = dot1(a, x + m * xs, K);
        }
    }
    _Pragma("omp for schedule(dynamic, 2)")
    for (int64_t u = 0; u < u2; u++) {
        int64_t s, c;
        const tk_lora_part *pt = lora_unit(lo, i, 1, u, &s, &c);
        int64_t n0 = c * 16, nn = pt->n - n0 < 16 ? pt->n - n0 : 16, r = pt->r;
        const float *b = pt->b + n0 * r;
        for (int64_t e = lo->seg[s]; e < lo->seg[s + 1]; e++) {
            int64_t m = lo->rows[e];
            const float *t = lo->t + m * lo->tw + pt->t;
            float *yr = y + m * ys + pt->off + n0;
            for (int64_t k = 0; k < nn; k++) {
                float acc = 0.f;
                _Pragma("omp simd reduction(+:acc)")
                for (int64_t j = 0; j < r; j++) acc += b[k * r + j] * t[j];
                yr[k] += acc;
            }
        }
    }
}
"""
