/*
 * C source, part 7 of the quantized linear kernels: Intel AMX tiles for packed integer products of
 * three rows or more (Q8_0, Q4_0, Q4_1).
 *
 * Why: the 512-bit kernel (:mod:`._quant_avx512_c`) multiplies four activation bytes into sixteen
 * weight rows per `vpdpbusd`, one activation row at a time, so each row of a step costs its own 16
 * `vpdpbusd` per pair of groups and block. One AMX `tdpbsud` multiplies one block (32 values) of up
 * to eight activation rows by the block's codes of a pair of groups (16 weight rows), whatever the rows;
 * what still grows with the rows is the float epilogue. Measured (docs/engine-optimizations.md, "AMX
 * tiles for six rows and more"): 0.70-0.92x the 512-bit kernel's time from 6 rows on for one large
 * matrix alone; over a whole step of the default model (every matrix, thirteenth session) the tiles
 * already win from 3 rows (0.96x the step at 3 rows, 0.90x at 4, 0.83x at 5) and lose at 2, so fewer
 * rows keep the 512-bit kernel (`TK_AMX_MIN_ROWS`, or `EngineConfig.quant_amx_min_rows` for another CPU).
 *
 * The integer sums are exact, and each row's float epilogue is the 512-bit kernel's, operation for
 * operation (block scale products, then `acc += f * d`, then the offset term), so a row gives the same
 * floats on either path, whatever the number of rows beside it: a verify row still equals the row
 * decoded alone. Tiles: 0-2 the int32 sums of up to three pairs of groups (each activation row's `q`
 * and `q2` sums on two tile rows), 3 one block's `q` and `q2` bytes of the rows (straight from
 * the scratch, where they lie `K` apart), 4-6 each pair's codes of the block as unsigned bytes
 * (nibbles unpacked; Q8_0's codes are stored as `w + 128`).
 *
 * Selected at run time: compiled only where the compiler targets AMX-INT8 (the `-march=native`
 * build on a CPU that has it), used when the CPU reports AMX-TILE and AMX-INT8, Linux grants the
 * process the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`) and `EngineConfig.quant_amx` is on
 * (:meth:`QuantKernels.set_amx` switches it for tests). Each product loads the tile configuration on
 * every thread that takes part and releases the tiles at its end, so nothing else in the thread (a
 * oneDNN kernel of PyTorch) finds them configured.
 */
/* Part of the quantized kernels' library: quant.c includes the parts in order (this one: amx). */
#include "quant.h"
#if defined(TK_AVX512) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define TK_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
long syscall(long number, ...);  /* unistd.h declares it only with _DEFAULT_SOURCE, not under -std=c11 */
#endif

#define TK_AMX_MIN_ROWS 3  /* fewer rows stay on the 512-bit kernel: it is faster there (docs) */
#define TK_AMX_ROWS 8      /* activation rows per pass (their q and q2 fill a tile's 16 rows) */

static int tk_amx_state = -1;  /* -1: not decided yet, 0: off, 1: on */
static int tk_amx_rows = 0;    /* 0: not read yet; else the fewest rows a product takes the tiles for */

/* TK_AMX_MIN_ROWS, or what qk_set_amx_min_rows set (EngineConfig.quant_amx_min_rows) */
static int tk_amx_min_rows(void) {
    int r = __atomic_load_n(&tk_amx_rows, __ATOMIC_RELAXED);
    return r > 0 ? r : TK_AMX_MIN_ROWS;
}

/* the CPU has AMX-TILE and AMX-INT8 and the kernel lets this process use the tile data */
static int tk_amx_allowed(void) {
#ifdef TK_AMX
    static int allowed = -1;
    if (allowed >= 0) return allowed;
    unsigned a, b, c, d;
    int cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): granted once per process */
    allowed = cpu && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return allowed;
#else
    return 0;
#endif
}

static int tk_use_amx(void) {
    int s = __atomic_load_n(&tk_amx_state, __ATOMIC_RELAXED);
    if (s >= 0) return s;
    s = tk_amx_allowed();
    __atomic_store_n(&tk_amx_state, s, __ATOMIC_RELAXED);
    return s;
}

/* force the AMX path on (where it can run) or off, or (on < 0) back to the default (on where it can run);
   returns whether it is now on. Not while a product runs. */
int qk_set_amx(int on) {
    __atomic_store_n(&tk_amx_state, -1, __ATOMIC_RELAXED);
    if (on < 0) return tk_use_amx();
    on = on && tk_amx_allowed();
    __atomic_store_n(&tk_amx_state, on, __ATOMIC_RELAXED);
    return on;
}
int qk_amx_active(void) { return tk_use_amx(); }
int qk_amx_min_rows(void) { return tk_amx_min_rows(); }
/* the fewest rows a packed product takes the tiles for (rows <= 0: TK_AMX_MIN_ROWS); returns it */
int qk_set_amx_min_rows(int rows) {
    __atomic_store_n(&tk_amx_rows, rows > 0 ? rows : 0, __ATOMIC_RELAXED);
    return tk_amx_min_rows();
}

/* the types the tiles take (the K-quants keep the 512-bit kernel: 16-value sub-blocks, 6-bit scales) */
static inline int tk_amx_type(int t) { return t == TK_Q8_0 || t == TK_Q4_0 || t == TK_Q4_1; }

#ifdef TK_AMX
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tk_tilecfg;

/* this thread's tiles for R activation rows per pass (R <= TK_AMX_ROWS): tiles 0-2 the int32 sums of
   up to three pairs of weight groups (2R rows: each activation row's q and q2, interleaved), 3 one
   block's q and q2 bytes of the R rows (2R rows of 32 bytes, K apart in the scratch), 4-6 the
   block's weights of each pair (8 groups of 4 values x 16 weight rows) */
static void tk_amx_begin(int R) {
    tk_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 4; i++) {
        c.rows[i] = (uint8_t)(2 * R);
        c.colsb[i] = i < 3 ? 64 : 32;
    }
    for (int i = 4; i < 7; i++) {
        c.rows[i] = 8;
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
}
static inline void tk_amx_end(void) { _tile_release(); }

#define TK_AMX_PAIRS 3  /* pairs of groups (48 weight rows) per pass: three independent tile products */

/* the block's codes of one pair of groups as unsigned bytes, B-tile order (row j: values 4j..4j+3) */
TK_INLINE void amx_unpack(const int T, const uint8_t *p0, const uint8_t *p1, uint8_t *restrict bt) {
    const int hdr = T == TK_Q4_1 ? 32 : 16;
    if (T == TK_Q8_0) {
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) _mm512_store_si512((__m512i *)(bt + 64 * j), cat256(p0 + hdr + 32 * j, p1 + hdr + 32 * j));
    } else {  /* chunk j: values 4j.. in the low nibbles, 16 + 4j.. in the high ones */
        const __m512i m15 = _mm512_set1_epi8(15);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            __m512i raw = cat256(p0 + hdr + 32 * j, p1 + hdr + 32 * j);
            _mm512_store_si512((__m512i *)(bt + 64 * j), _mm512_and_si512(raw, m15));
            _mm512_store_si512((__m512i *)(bt + 64 * (4 + j)), _mm512_and_si512(_mm512_srli_epi16(raw, 4), m15));
        }
    }
}

/* acc[(i * M + r) * 16 ..] for activation rows r < M and pairs i < U (U <= TK_AMX_PAIRS; pair i's first
   group at g0 + 2 i rb, its second rb on) in passes of TK_AMX_ROWS rows: the 512-bit kernel's floats */
TK_INLINE void amx_pairs(const int T, const int U, int64_t M, const uint8_t *restrict g0, int64_t rb, int64_t nb,
                         const tk_act *a, int64_t K, float *restrict acc) {
    const int pb = T == TK_Q8_0 ? 272 : T == TK_Q4_0 ? 144 : 160;
    uint8_t bt[TK_AMX_PAIRS][512] __attribute__((aligned(64)));
    int32_t c[TK_AMX_PAIRS][2 * TK_AMX_ROWS * 16] __attribute__((aligned(64)));
    __m512 dv[TK_AMX_PAIRS], mv[TK_AMX_PAIRS];
    for (int64_t i = 0; i < U * M * 16; i += 16) _mm512_store_ps(acc + i, _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        _Pragma("GCC unroll 3")
        for (int i = 0; i < U; i++) {
            const uint8_t *p0 = g0 + 2 * i * rb + b * pb, *p1 = p0 + rb;
            amx_unpack(T, p0, p1, bt[i]);
            dv[i] = halves_ph(p0, p1);
            mv[i] = T == TK_Q4_1 ? halves_ph(p0 + 16, p1 + 16)
                                 : _mm512_mul_ps(dv[i], _mm512_set1_ps(T == TK_Q8_0 ? -128.f : -8.f));
        }
        _tile_loadd(4, bt[0], 64);
        if (U > 1) _tile_loadd(5, bt[1], 64);
        if (U > 2) _tile_loadd(6, bt[2], 64);
        for (int64_t m = 0; m < M; m += TK_AMX_ROWS) {
            const int R = M - m < TK_AMX_ROWS ? (int)(M - m) : TK_AMX_ROWS;
            _tile_loadd(3, a[m].q + b * 32, K);  /* q, q2 of row m, then of row m + 1 ... */
            _tile_zero(0);
            _tile_dpbsud(0, 3, 4);
            if (U > 1) { _tile_zero(1); _tile_dpbsud(1, 3, 5); }
            if (U > 2) { _tile_zero(2); _tile_dpbsud(2, 3, 6); }
            _tile_stored(0, c[0], 64);
            if (U > 1) _tile_stored(1, c[1], 64);
            if (U > 2) _tile_stored(2, c[2], 64);
            for (int i = 0; i < U; i++)
                for (int r = 0; r < R; r++) {
                    const tk_act *ar = a + m + r;
                    float *o = acc + ((i * M) + m + r) * 16;
                    __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512((const __m512i *)(c[i] + 32 * r)));
                    __m512 s2 = _mm512_cvtepi32_ps(_mm512_load_si512((const __m512i *)(c[i] + 32 * r + 16)));
                    __m512 f = _mm512_fmadd_ps(s2, _mm512_set1_ps(ar->d2[b]), _mm512_mul_ps(s, _mm512_set1_ps(ar->d[b])));
                    __m512 v = _mm512_fmadd_ps(f, dv[i], _mm512_load_ps(o));
                    _mm512_store_ps(o, _mm512_fmadd_ps(mv[i], _mm512_set1_ps(ar->s32[b]), v));
                }
        }
    }
}

static void amx_pairs_any(int t, int U, int64_t M, const uint8_t *g0, int64_t rb, int64_t nb, const tk_act *a,
                          int64_t K, float *acc) {
#define TK_AMX_CASE(T_) \
    if (U == 3) amx_pairs(T_, 3, M, g0, rb, nb, a, K, acc); \
    else if (U == 2) amx_pairs(T_, 2, M, g0, rb, nb, a, K, acc); \
    else amx_pairs(T_, 1, M, g0, rb, nb, a, K, acc);
    switch (t) {
        case TK_Q8_0: TK_AMX_CASE(TK_Q8_0) break;
        case TK_Q4_0: TK_AMX_CASE(TK_Q4_0) break;
        default: TK_AMX_CASE(TK_Q4_1) break;
    }
#undef TK_AMX_CASE
}
#endif
