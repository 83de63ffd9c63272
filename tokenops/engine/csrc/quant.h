/* The quantized linear kernels' library (quant.c and its parts quant_*.c): products straight from GGUF
 * block encodings. Loaded by tokenops/engine/kernels/quant_kernels.py, and built into the fused decode
 * library for GGUF models (fused_decode.c with TK_QUANT). The ctypes signatures and structures are
 * generated from / checked against this header (tokenops/engine/kernels/c_header.py). */
#ifndef TK_QUANT_H
#define TK_QUANT_H
#include <stddef.h>
#include <stdint.h>

/* A weight as the products read it: format t, rb bytes per row (packed: per group of 8 rows). next: the
   weight's next part (NULL: none), N rows more of the same K in its own format, whose outputs follow
   (a fused q/k/v whose v is stored in another format): the activations are quantized once for all. */
typedef struct qk_weight_s {
    const uint8_t *data;
    int64_t rb, N, K;
    int32_t t, packed;
    const struct qk_weight_s *next;
} qk_weight;

/* y[M, N] = x[M, K] . W^T; method 1 GEMV (VNNI where the CPU has it), 2 GEMV with maddubs, 3 exact
   (float32 activations), 4 GEMM. 0, -1 on allocation failure, -2 for bad arguments. */
int qk_linear(int t, int packed, int method, const float *x, int64_t M, const uint8_t *W, int64_t rb, float *y,
              int64_t N, int64_t K, int nt);
int qk_dequantize(int t, const uint8_t *W, int64_t rb, float *y, int64_t nn, int64_t K);
int qk_pack(int t, const uint8_t *raw, int64_t rb, int64_t N, int64_t K, uint8_t *out);
int qk_unpack_rows(int t, const uint8_t *P, int64_t rb, const int64_t *ids, int64_t n, int64_t K, float *y);
int64_t qk_group_bytes(int t, int64_t K);
size_t qk_scratch_bytes(int64_t M, int64_t K);
/* bit 0 AVX2, 1 VNNI, 2 AVX-512 VNNI, 3 AMX */
int qk_features(void);
int qk_block_values(int t);
int qk_block_bytes(int t);
int qk_packable(int t);
/* switches: on/off (where the build and the CPU allow), returns whether now on; not while a product runs */
int qk_set_avx512(int on);
int qk_avx512_active(void);
int qk_set_amx(int on);
int qk_amx_active(void);
int qk_set_amx_min_rows(int rows);
int qk_amx_min_rows(void);
/* bytes per activation value in the integer products: 2 (q + q2, the default) or 1 (llama.cpp's one byte);
   another n only reads it. Returns the bytes now. */
int qk_set_act_bytes(int n);

#endif
