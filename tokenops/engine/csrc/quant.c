/* The quantized linear kernels (tokenops/engine/kernels/quant_kernels.py), one translation unit built
 * from its parts in order. Variants by -D: TK_PLAIN (the plain-C fallback on any CPU). Declared in
 * quant.h. */
#include "quant.h"
#include "quant_formats.c"
#include "quant_gemv.c"
#include "quant_packed.c"
#include "quant_packed_k.c"
#include "quant_avx512.c"
#include "quant_amx.c"
#include "quant_gemm.c"
