/* The fused decode library (fused_decode.c with lora.c): a whole decode step of a Llama-family model in
 * one call. Variants by -D: TK_PANEL_BF16 (bfloat16 weight panels), TK_KV_BF16 (bfloat16 KV cache),
 * TK_QUANT (products from GGUF blocks: quant.c built in, weights are qk_weight). Loaded by
 * tokenops/engine/kernels/fused_library.py; the ctypes signatures and structures are generated from /
 * checked against this header (tokenops/engine/kernels/c_header.py). */
#ifndef TK_FUSED_DECODE_H
#define TK_FUSED_DECODE_H
#include <stdint.h>

#ifdef TK_PANEL_BF16
typedef uint16_t panel_t;
#else
typedef float panel_t;
#endif
#ifdef TK_KV_BF16
typedef uint16_t kv_t;
#else
typedef float kv_t;
#endif

/* one layer's weights (panels, or qk_weight with TK_QUANT) and cache. Norm weights are the scales the
   step multiplies by (Gemma's 1 + weight folded in by the caller). post_norm: the MLP's input norm, or with
   the sandwich norms (pre_ff_norm set: Gemma 2/3) the norm of the attention's output. */
typedef struct {
    const float *in_norm, *post_norm, *q_norm, *k_norm;
    const float *pre_ff_norm, *post_ff_norm;  /* Gemma 2/3: around the MLP; NULL: none */
    const panel_t *wqkv;
    const float *bqkv;
    const panel_t *wo;
    const float *bo;
    const panel_t *wgu;
    const float *bgu;
    const panel_t *wd;
    const float *bd;
    kv_t *kc, *vc;           /* this layer's cache, [num_blocks, BS, KVH, D] */
    int64_t window;          /* 0: full attention */
    int64_t rope_off;        /* this layer's rotary table: cos/sin tables + rope_off (Gemma 3's local layers) */
} tk_layer;

/* what the Gemma family adds to the Llama block, model wide (NULL: none of it) */
typedef struct {
    float embed_scale;       /* embeddings times this (Gemma: sqrt(hidden)) */
    float attn_softcap;      /* scores -> cap * tanh(scores / cap) before the mask (Gemma 2); 0: none */
    float final_softcap;     /* the same on the logits; 0: none */
    int32_t gelu;            /* the gated MLP's activation: 0 SiLU, 1 GELU (tanh approximation) */
} tk_model;

#define TK_LORA_TILE 4    /* rows per tile: 4 x 4 accumulators in T = x A^T, 4 x 4 in y += T B^T */

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
    int64_t ntiles;       /* tile i: rows[tile[i] .. tile[i+1]), at most TK_LORA_TILE, one adapter */
    const int64_t *tile;  /* [ntiles + 1] */
    const int64_t *rows;  /* [M]: every row of the step once */
} tk_lora;

/* a linear layer on its own: y = x W^T (+ b), x [M, K], W in panels */
int linear_panels(const float *x, int64_t M, const panel_t *P, const float *b, float *y, int64_t N, int64_t K,
                  int nthreads);
/* one decode step of M rows (meta: see fused_step.c); logits [rows asked, V]; 0, or -1 */
int fused_decode_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale,
                     const float *embed, const float *final_norm, const panel_t *lm_head,
                     const float *cos_tab, const float *sin_tab, float *logits, float *work, int nthreads,
                     const tk_model *model);
/* the step with LoRA adapter rows */
int fused_decode_lora_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale,
                          const float *embed, const float *final_norm, const panel_t *lm_head,
                          const float *cos_tab, const float *sin_tab, float *logits, float *work, int nthreads,
                          const tk_model *model, const tk_lora *lora);
/* greedy drafting: fused steps feeding each chunk's argmax back */
int fused_draft_f32(const tk_layer *layers, const int64_t *meta, float eps, float scale, const float *embed,
                    const float *final_norm, const panel_t *lm_head, const float *cos_tab, const float *sin_tab,
                    float *logits, float *work, int nthreads, const tk_model *model, int64_t nchunks,
                    const int64_t *want, int64_t kmax, float min_conf, int64_t *out, int64_t *count, int64_t *steps);
/* y += (x A^T) B^T for a step's rows on projection p of layer l (the tests' entry to the LoRA products) */
int lora_apply_f32(const tk_lora *lo, int64_t l, int p, const float *x, int64_t K, float *y, int64_t ys);

#endif
