/*
 * C source, part 2 of the fused decode step (fused_decode.c includes it last): the step itself over the
 * products and attention of part 1, the Gemma family's additions (tk_model; the sandwich norms, GELU,
 * soft caps, per-layer rotary tables), the entry points and greedy drafting.
 */
/* meta: M, hidden, H, KVH, D, I, V, BS, MB (table width), layers, max_len, then tokens[M], slots[M],
   context lengths[M], positions[M], group lengths[M] (rows of one sequence at consecutive positions:
   the first row holds the count, the others 0), block tables[M][MB], then L and the L rows whose
   logits are wanted (logits [L, V] in that order: a prefill chunk needs only its last row's).
   cos/sin: [positions, D] (each layer's table at rope_off: Gemma 3's local layers have their own). work: x[M*hidden] h[M*hidden] qkv[M*(H+2KVH)*D] att[M*H*D] gu[M*2I]. */
/* The step's products and embedding lookup: float32 panels, or (TK_QUANT: tokenops.engine.kernels.quant_kernels'
   source is prepended) GGUF blocks, where every weight pointer (the layers', lm_head, embed) is a
   qk_weight and the products are its integer GEMV on 8-bit activations, for any number of rows. */
#ifdef TK_QUANT
#define TK_LINEAR(x, xs, M, w, b, y, N, K, acc, nt) \
    qk_product((const qk_weight *)(const void *)(w), 1, x, xs, M, b, y, N, acc, qscratch, NULL)
#define TK_EMBED(out, embed, tok, HD) qk_embed_row((const qk_weight *)(const void *)(embed), tok, out)
#else
#define TK_LINEAR(x, xs, M, w, b, y, N, K, acc, nt) gemm(x, xs, M, w, b, y, N, K, acc, nt)
#define TK_EMBED(out, embed, tok, HD) memcpy(out, (embed) + (tok) * (HD), sizeof(float) * (HD))
#endif

/* row[i] = gelu(row[i]) * row[I + i] for i < I, GELU's tanh approximation written as
   g * sigmoid(2u), u = sqrt(2 / pi) (g + 0.044715 g^3) (the same function as 0.5 g (1 + tanh u), without
   the cancellation of 1 + tanh u for very negative u) */
#if defined(__AVX2__) && defined(__FMA__)
static inline void gelu_mul(float *row, int64_t I) {
    const __m256 c0 = _mm256_set1_ps(-2.f * 0.7978845608028654f), c1 = _mm256_set1_ps(0.044715f);
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) {
        __m256 g = _mm256_loadu_ps(row + i);
        __m256 u = _mm256_mul_ps(c0, _mm256_fmadd_ps(_mm256_mul_ps(c1, g), _mm256_mul_ps(g, g), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(u)));
        _mm256_storeu_ps(row + i, _mm256_mul_ps(s, _mm256_loadu_ps(row + I + i)));
    }
    for (; i < I; i++) {
        float g = row[i];
        row[i] = g / (1.f + expf(-2.f * 0.7978845608028654f * (g + 0.044715f * g * g * g))) * row[I + i];
    }
}
#else
static inline void gelu_mul(float *row, int64_t I) {
    for (int64_t i = 0; i < I; i++) {
        float g = row[i];
        row[i] = g / (1.f + expf(-2.f * 0.7978845608028654f * (g + 0.044715f * g * g * g))) * row[I + i];
    }
}
#endif

/* x += rmsnorm(y) (a sandwich norm on a block's output before the residual); y is overwritten */
static inline void add_normed(float *x, float *y, const float *w, int64_t n, float eps) {
    rmsnorm(y, w, y, n, eps);
    _Pragma("omp simd")
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static const tk_model tk_llama = {1.f, 0.f, 0.f, 0};  /* a step without tk_model: the plain Llama block */

static int fused_step(const tk_layer *layers, const int64_t *meta, float eps, float scale,
                      const float *embed, const float *final_norm, const panel_t *lm_head,
                      const float *cos_tab, const float *sin_tab, float *logits, float *work, int nthreads,
                      const tk_model *md, const tk_lora *lora) {
    if (!md) md = &tk_llama;
    int64_t M = meta[0], HD = meta[1], H = meta[2], KVH = meta[3], D = meta[4], I = meta[5], V = meta[6];
    int64_t BS = meta[7], MB = meta[8], NL = meta[9], max_len = meta[10];
    const int64_t *tokens = meta + 11, *slots = tokens + M, *ctx = slots + M, *pos = ctx + M, *glen = pos + M;
    const int64_t *tables = glen + M, *lrows = tables + M * MB + 1;
    int64_t L = lrows[-1], rmax = 1, NT = lora_ntiles(lora, M);
    for (int64_t m = 0; m < M; m++) rmax = glen[m] > rmax ? glen[m] : rmax;
    if (rmax > TK_ROW_BLOCK) rmax = TK_ROW_BLOCK;  /* a long chunk attends in blocks of rows */
    int64_t QKV = (H + 2 * KVH) * D;
    float *x = work, *h = x + M * HD, *qkv = h + M * HD, *att = qkv + M * QKV, *gu = att + M * H * D;
    int failed = 0;
    int64_t S = nthreads > 1 ? nthreads : 1, PS = H * (D + 2);
    float *partbuf = (float *)malloc(sizeof(float) * (size_t)(M * S * PS));
    if (!partbuf) return -1;
#ifdef TK_QUANT
    int64_t kmax = HD > H * D ? HD : H * D;
    void *qscratch = malloc(qk_scratch_bytes(M, kmax > I ? kmax : I));  /* the rows' 8-bit activations */
    if (!qscratch) { free(partbuf); return -1; }
#endif
    _Pragma("omp parallel num_threads(nthreads) if(nthreads > 1)")
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(rmax * H * (max_len > 0 ? max_len : 1)));
        int64_t lo[rmax > 0 ? rmax : 1], tr[TK_LORA_TILE];  /* tr: a tile's rows */
        if (!scores) failed = 1;
        _Pragma("omp for schedule(static)")
        for (int64_t m = 0; m < M; m++) {
            TK_EMBED(x + m * HD, embed, tokens[m], HD);
            if (md->embed_scale != 1.f)
                for (int64_t i = 0; i < HD; i++) x[m * HD + i] *= md->embed_scale;
        }
        for (int64_t l = 0; l < NL; l++) {
            const tk_layer *ly = layers + l;
            _Pragma("omp for schedule(static)")
            for (int64_t b = 0; b < NT; b++) {  /* tiles of rows (lora_tile): one row each without adapters */
                int nr = lora_tile(lora, b, tr);
                if (l > 0 && ly[-1].post_ff_norm) {  /* the previous layer's down_proj (in h), normed, + x */
                    lora_b(lora, l - 1, 3, tr, nr, h, HD);
                    for (int i = 0; i < nr; i++) add_normed(x + tr[i] * HD, h + tr[i] * HD, ly[-1].post_ff_norm, HD, eps);
                } else if (l > 0) {
                    lora_b(lora, l - 1, 3, tr, nr, x, HD);  /* the previous layer's down_proj, added in place */
                }
                for (int i = 0; i < nr; i++) rmsnorm(x + tr[i] * HD, ly->in_norm, h + tr[i] * HD, HD, eps);
                lora_a(lora, l, 0, tr, nr, h, HD, HD);
            }
            TK_LINEAR(h, HD, M, ly->wqkv, ly->bqkv, qkv, QKV, HD, 0, nthreads);
            _Pragma("omp for schedule(static)")
            for (int64_t b = 0; b < NT; b++) {
                int nr = lora_tile(lora, b, tr);
                lora_b(lora, l, 0, tr, nr, qkv, QKV);
                for (int i = 0; i < nr; i++) {
                    int64_t m = tr[i];
                    float *q = qkv + m * QKV, *k = q + H * D, *v = k + KVH * D;
                    const float *c = cos_tab + ly->rope_off + pos[m] * D, *s = sin_tab + ly->rope_off + pos[m] * D;
                    for (int64_t j = 0; j < H; j++) {
                        if (ly->q_norm) rmsnorm(q + j * D, ly->q_norm, q + j * D, D, eps);
                        rope(q + j * D, c, s, D);
                    }
                    for (int64_t j = 0; j < KVH; j++) {
                        if (ly->k_norm) rmsnorm(k + j * D, ly->k_norm, k + j * D, D, eps);
                        rope(k + j * D, c, s, D);
                    }
                    kv_store(ly->kc + slots[m] * KVH * D, k, KVH * D);
                    kv_store(ly->vc + slots[m] * KVH * D, v, KVH * D);
                }
            }
            /* each group's window split into S stretches of at least 32 positions, one per thread; a
               long chunk (a prefill) is split by rows instead, into S parts of about equal work */
            _Pragma("omp for schedule(dynamic, 1)")
            for (int64_t u = 0; u < M * S; u++) {
                int64_t m = u / S, sp = u % S, R = glen[m];
                if (R == 0) continue;  /* a later row of a group: its leader does it */
                if (R > TK_ROW_SPLIT) {
                    attend_rows(ly, qkv, QKV, m, R, sp, S, ctx, tables + m * MB, partbuf, PS, scores, lo, H, KVH, D,
                                BS, scale, md->attn_softcap);
                    continue;
                }
                for (int64_t r = 0; r < R; r++) lo[r] = window_start(ly, ctx[m + r]);
                int64_t start = lo[0], end = ctx[m + R - 1];
                int64_t n = end - start, parts = n / 32 < S ? (n / 32 > 0 ? n / 32 : 1) : S;
                if (sp >= parts || !scores) {
                    for (int64_t r = 0; r < R; r++) for (int64_t h = 0; h < H; h++) partbuf[((m + r) * S + sp) * PS + h] = -INFINITY;
                    continue;
                }
                int64_t a = start + n * sp / parts, b = start + n * (sp + 1) / parts;
                attend_part(qkv + m * QKV, QKV, R, lo, ctx + m, ly->kc, ly->vc, tables + m * MB, a, b,
                            partbuf + (m * S + sp) * PS, S * PS, scores, H, KVH, D, BS, scale, md->attn_softcap);
            }
            _Pragma("omp for schedule(static)")
            for (int64_t u = 0; u < M * H; u++)
                merge(partbuf + (u / H) * S * PS, S, PS, u % H, H, D, att + u * D);
            if (lora) {  /* no barrier: the product's own loops end with one */
                _Pragma("omp for schedule(static) nowait")
                for (int64_t b = 0; b < NT; b++) {
                    int nr = lora_tile(lora, b, tr);
                    lora_a(lora, l, 1, tr, nr, att, H * D, H * D);
                }
            }
            /* sandwich norms (Gemma 2/3): o_proj and down_proj write h, normed before the residual */
            int sw = ly->pre_ff_norm != NULL;
            TK_LINEAR(att, H * D, M, ly->wo, ly->bo, sw ? h : x, HD, H * D, !sw, nthreads);
            _Pragma("omp for schedule(static)")
            for (int64_t b = 0; b < NT; b++) {
                int nr = lora_tile(lora, b, tr);
                lora_b(lora, l, 1, tr, nr, sw ? h : x, HD);
                for (int i = 0; i < nr; i++) {
                    float *xr = x + tr[i] * HD, *hr = h + tr[i] * HD;
                    if (sw) add_normed(xr, hr, ly->post_norm, HD, eps);
                    rmsnorm(xr, sw ? ly->pre_ff_norm : ly->post_norm, hr, HD, eps);
                }
                lora_a(lora, l, 2, tr, nr, h, HD, HD);
            }
            TK_LINEAR(h, HD, M, ly->wgu, ly->bgu, gu, 2 * I, HD, 0, nthreads);
            _Pragma("omp for schedule(static)")
            for (int64_t b = 0; b < NT; b++) {
                int nr = lora_tile(lora, b, tr);
                lora_b(lora, l, 2, tr, nr, gu, 2 * I);
                for (int i = 0; i < nr; i++) {
                    if (md->gelu) gelu_mul(gu + tr[i] * 2 * I, I);
                    else silu_mul(gu + tr[i] * 2 * I, I);
                }
                lora_a(lora, l, 3, tr, nr, gu, 2 * I, I);
            }
            TK_LINEAR(gu, 2 * I, M, ly->wd, ly->bd, sw ? h : x, HD, I, !sw, nthreads);
        }
        const tk_layer *last = layers + NL - 1;
        if (last->post_ff_norm) {  /* the last down_proj (in h), normed into the residual, on the rows that matter */
            _Pragma("omp for schedule(static)")
            for (int64_t j = 0; j < L; j++) {
                lora_b(lora, NL - 1, 3, lrows + j, 1, h, HD);
                add_normed(x + lrows[j] * HD, h + lrows[j] * HD, last->post_ff_norm, HD, eps);
            }
        }
        _Pragma("omp for schedule(static)")
        for (int64_t j = 0; j < L; j++) {
            if (!last->post_ff_norm) lora_b(lora, NL - 1, 3, lrows + j, 1, x, HD);  /* the last down_proj */
            rmsnorm(x + lrows[j] * HD, final_norm, h + j * HD, HD, eps);
        }
        TK_LINEAR(h, HD, L, lm_head, NULL, logits, V, HD, 0, nthreads);
        if (md->final_softcap > 0.f) {  /* Gemma 2: the logits capped as the scores */
            float cap = md->final_softcap;
            _Pragma("omp for schedule(static)")
            for (int64_t u = 0; u < L * V; u++) logits[u] = tanhf(logits[u] / cap) * cap;
        }
        free(scores);
    }
    free(partbuf);
#ifdef TK_QUANT
    free(qscratch);
#endif
    return failed ? -1 : 0;
}

int fused_decode_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale,
                     const float *embed, const float *final_norm, const panel_t *lm_head,
                     const float *cos_tab, const float *sin_tab, float *logits, float *work, int nthreads,
                     const tk_model *model) {
    return fused_step(layers, meta, eps, scale, embed, final_norm, lm_head, cos_tab, sin_tab, logits, work, nthreads,
                      model, 0);
}

/* The step with LoRA adapter rows (lora: see tk_lora). */
int fused_decode_lora_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale,
                          const float *embed, const float *final_norm, const panel_t *lm_head,
                          const float *cos_tab, const float *sin_tab, float *logits, float *work, int nthreads,
                          const tk_model *model, const tk_lora *lora) {
    return fused_step(layers, meta, eps, scale, embed, final_norm, lm_head, cos_tab, sin_tab, logits, work, nthreads,
                      model, lora);
}

/* Greedy drafting in one call: fused steps, each feeding every chunk's argmax back as its next
   token (a draft model proposing for speculative decoding, without a return to Python per token).
   meta is the first step's (above): nchunks chunks of consecutive rows, their table width MB
   covering every position they will write, its logit rows each chunk's last row in order. Chunk c
   drafts want[c] tokens, or stops at one whose probability is under min_conf (0: never). Writes the
   tokens to out[c * kmax ..], their number to count[c] and the steps chunk c ran to steps[c]; step
   j > 0 computed position (first step's last position) + j. logits: [nchunks, V] scratch. */
int fused_draft_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale, const float *embed,
                    const float *final_norm, const panel_t *lm_head, const float *cos_tab, const float *sin_tab,
                    float *logits, float *work, int nthreads, const tk_model *model, int64_t nchunks,
                    const int64_t *want, int64_t kmax, float min_conf, int64_t *out, int64_t *count, int64_t *steps) {
    int64_t M = meta[0], V = meta[6], BS = meta[7], MB = meta[8];
    const int64_t *glen = meta + 11 + 4 * M, *tables = glen + M;
    int64_t *row = (int64_t *)malloc(sizeof(int64_t) * (size_t)(4 * nchunks));
    int64_t *next = (int64_t *)malloc(sizeof(int64_t) * (size_t)(12 + nchunks * (6 + MB)));
    if (!row || !next) { free(row); free(next); return -1; }
    int64_t *pos = row + nchunks, *live = pos + nchunks, *lead = live + nchunks;  /* lead: first-step row */
    for (int64_t m = 0, c = 0; m < M; m++)
        if (glen[m] > 0) { lead[c] = m; row[c] = c; pos[c] = meta[11 + 3 * M + m + glen[m] - 1]; live[c] = 1; c++; }
    for (int64_t c = 0; c < nchunks; c++) count[c] = steps[c] = 0;
    const int64_t *cur = meta;
    int rc = 0;
    for (;;) {
        if ((rc = fused_decode_f32(layers, cur, eps, scale, embed, final_norm, lm_head, cos_tab, sin_tab, logits,
                                   work, nthreads, model)) != 0) break;
        int64_t n = 0, max_len = 0;
        for (int64_t c = 0; c < nchunks; c++) {
            if (!live[c]) continue;
            float *lg = logits + row[c] * V;
            int64_t best = 0;
            for (int64_t v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
            steps[c]++;
            /* p(best) = 1 / sum_v e^(l_v - l_best) (the row is scratch: exponentiated in place) */
            if (min_conf > 0.f && 1.f / exp_shift_sum(lg, V, lg[best]) < min_conf) { live[c] = 0; continue; }
            out[c * kmax + count[c]++] = best;
            if (count[c] >= want[c]) { live[c] = 0; continue; }
            pos[c]++;
            row[c] = n;
            const int64_t *tab = tables + lead[c] * MB;
            next[11 + n] = best;                                                  /* token */
            next[11 + nchunks + n] = tab[pos[c] / BS] * BS + pos[c] % BS;         /* slot */
            next[11 + 2 * nchunks + n] = pos[c] + 1;                              /* context */
            next[11 + 3 * nchunks + n] = pos[c];                                  /* position */
            next[11 + 4 * nchunks + n] = 1;                                       /* one row */
            memcpy(next + 11 + 5 * nchunks + n * MB, tab, sizeof(int64_t) * (size_t)MB);
            max_len = pos[c] + 1 > max_len ? pos[c] + 1 : max_len;
            n++;
        }
        if (n == 0) break;
        /* the row arrays were laid out for nchunks rows: close them up to n; every row's logits */
        if (n < nchunks) {
            for (int a = 1; a < 5; a++) memmove(next + 11 + a * n, next + 11 + a * nchunks, sizeof(int64_t) * (size_t)n);
            memmove(next + 11 + 5 * n, next + 11 + 5 * nchunks, sizeof(int64_t) * (size_t)(n * MB));
        }
        next[11 + 5 * n + n * MB] = n;
        for (int64_t j = 0; j < n; j++) next[12 + 5 * n + n * MB + j] = j;
        memcpy(next, meta, sizeof(int64_t) * 11);
        next[0] = n;
        next[10] = max_len;
        cur = next;
    }
    free(row);
    free(next);
    return rc;
}
