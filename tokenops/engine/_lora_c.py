"""C source of the fused step's LoRA products (:mod:`tokenops.engine.lora_native`), compiled into the
fused decode library (:mod:`tokenops.engine._fused_decode_c` places it after ``dot1``).

For each of a layer's four products (q/k/v, o, gate/up, down) and each row that uses an adapter, the
step adds ``(x A^T) B^T`` (B already scaled) to the part of the output the adapter targets, in two
halves folded into the step's existing per-row loops, so the adapters add no synchronisation between
the threads (on a busy 2-core box each barrier of the step costs far more than the arithmetic):
``lora_a`` right after the row's input is made (``T = x A^T``, rank values per part) and ``lora_b``
in the first per-row loop after the base product (``y += T B^T``, along the output features). The
runner orders the step's chunks by adapter, so consecutive rows of a thread read the same A and B
from cache: each adapter's matrices come from memory about once per step, however many rows use it
(the segment-grouped product of Punica's SGMV). Base rows are untouched."""

LORA_SOURCE = r"""
typedef struct {          /* one part of one projection of one adapter: y[:, off:off+n] += (x A^T) B^T */
    const float *a;       /* A [r, K] */
    const float *b;       /* B transposed, [r, n], scaling folded in */
    int64_t r, n, off, t; /* rank, output features, first output column, first column of the row's T */
} tk_lora_part;

typedef struct {          /* one adapter: (layer l, projection p) has parts[start[4l+p] .. start[4l+p+1]) */
    const tk_lora_part *parts;
    const int64_t *start; /* [layers * 4 + 1]; p: 0 q/k/v, 1 o, 2 gate/up, 3 down */
} tk_lora_adapter;

typedef struct {          /* one step: row m uses adapters[ad[m]] (ad[m] < 0: the base) */
    const tk_lora_adapter *adapters;
    const int64_t *ad;
    float *t;             /* scratch [M, tw]: a row's T, from lora_a to the lora_b after the product */
    int64_t tw;
} tk_lora;

/* out[i] = w[i * ws ..] . x for i < 4: four rows of A against one x, each x load used four times */
static inline void dot4(const float *w, int64_t ws, const float *x, int64_t K, float *out) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + ws + k), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * ws + k), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * ws + k), xv, a3);
    }
    out[0] = hsum8(a0); out[1] = hsum8(a1); out[2] = hsum8(a2); out[3] = hsum8(a3);
    for (; k < K; k++) for (int i = 0; i < 4; i++) out[i] += w[i * ws + k] * x[k];
#else
    for (int i = 0; i < 4; i++) out[i] = dot1(w + i * ws, x, K);
#endif
}

/* T[m] = x A^T for every part of projection p of layer l of row m's adapter (x: the row, K wide) */
static inline void lora_a(const tk_lora *lo, int64_t l, int p, int64_t m, const float *x, int64_t K) {
    if (!lo || lo->ad[m] < 0) return;
    const tk_lora_adapter *ad = lo->adapters + lo->ad[m];
    float *t = lo->t + m * lo->tw;
    for (int64_t q = ad->start[l * 4 + p]; q < ad->start[l * 4 + p + 1]; q++) {
        const tk_lora_part *pt = ad->parts + q;
        int64_t j = 0;
        for (; j + 4 <= pt->r; j += 4) dot4(pt->a + j * K, K, x, K, t + pt->t + j);
        for (; j < pt->r; j++) t[pt->t + j] = dot1(pt->a + j * K, x, K);
    }
}

/* y[off:off+n] += T[m] B^T for the same parts (y: the row of the product's output) */
static inline void lora_b(const tk_lora *lo, int64_t l, int p, int64_t m, float *y) {
    if (!lo || lo->ad[m] < 0) return;
    const tk_lora_adapter *ad = lo->adapters + lo->ad[m];
    const float *t = lo->t + m * lo->tw;
    for (int64_t q = ad->start[l * 4 + p]; q < ad->start[l * 4 + p + 1]; q++) {
        const tk_lora_part *pt = ad->parts + q;
        float *yr = y + pt->off;
        const int64_t n = pt->n;
        for (int64_t k0 = 0; k0 < n; k0 += 16) {  /* 16 outputs in registers down the rank */
            const int64_t nn = n - k0 < 16 ? n - k0 : 16;
            float acc[16] = {0};
            for (int64_t j = 0; j < pt->r; j++) {
                const float tj = t[pt->t + j], *bj = pt->b + j * n + k0;
                if (nn == 16) {
                    _Pragma("omp simd")
                    for (int64_t k = 0; k < 16; k++) acc[k] += tj * bj[k];
                } else {
                    for (int64_t k = 0; k < nn; k++) acc[k] += tj * bj[k];
                }
            }
            for (int64_t k = 0; k < nn; k++) yr[k0 + k] += acc[k];
        }
    }
}
"""
