/* The paged decode library (paged_decode.c): decode attention read straight from the paged KV cache,
 * and an int8 linear for a few rows. Loaded by tokenops/engine/kernels/native.py; its ctypes
 * signatures are generated from this header (tokenops/engine/kernels/c_header.py). */
#ifndef TK_PAGED_DECODE_H
#define TK_PAGED_DECODE_H
#include <stdint.h>

/* q [B, H, D] float32; caches [num_blocks, BS, KVH, D] (float32 or bfloat16 bits); tables [B, MB]
   block ids (negative: evicted); ctx [B] context lengths; out [B, H, D]. 0, or -1 when a score
   buffer could not be allocated. */
int paged_decode_f32(const float *q, const float *kc, const float *vc, const int64_t *tables, const int64_t *ctx,
                     float *out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t BS, int64_t MB,
                     float scale, int64_t window, int64_t max_len, int nthreads);
int paged_decode_bf16(const float *q, const uint16_t *kc, const uint16_t *vc, const int64_t *tables,
                      const int64_t *ctx, float *out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t BS,
                      int64_t MB, float scale, int64_t window, int64_t max_len, int nthreads);

/* y[M, N] = x[M, K] q[N, K]^T * s[N] (+ b[N]), q int8 row-major */
int linear_q8(const float *x, const int8_t *q, const float *s, const float *b, float *y, int64_t M, int64_t N,
              int64_t K, int nthreads);

#endif
