/* CPU kernels of the lean decoder (the frozen target's runtime): small-M GEMM over prepacked
 * weights, RMSNorm, SiLU-gated product, and attention over a static KV cache with RoPE.
 *
 * Why our own: on the CPUs speclab runs on, torch's fp32 GEMM streams a decoder's weights
 * at a fraction of the memory bandwidth when M (tokens per pass) is 1..64, and its kernels
 * change their blocking with M, so a 1-token step and a k-token verification round
 * differently. Every kernel here is *batch-invariant*: an output element is computed by
 * the same sequence of floating-point operations whatever the number of rows, the row it
 * sits in, or the thread that computes it. So plain decoding, chain verification and tree
 * verification see bit-identical logits for the same context, in fp32 and with bf16
 * weights alike, and greedy speculative decoding is exactly lossless.
 *
 * Compiled at first use with the machine's own flags (-march=native, see __init__.py);
 * GCC vector extensions give AVX-512 or AVX2 code from the same source. The pure-torch
 * reference of each kernel is in ops.py (TorchOps). Compute is fp32; weights are fp32 or
 * bf16 (a bf16 weight is the upper half of an fp32 word, widened exactly on load).
 *
 * On CPUs with AVX512-BF16 (vdpbf16ps) a second path exists for bf16 weights: round the
 * input rows to bf16 (round-to-nearest-even, as torch's .to(bfloat16)) and multiply bf16
 * pairs with fp32 accumulation, as transformers' bf16 matmuls do, with weights packed as
 * pairs ([blocks, K/2, NR, 2]). Which of the two is faster depends on the CPU: where
 * vdpbf16ps issues at a quarter of the fp32 FMA rate (an AVX512-BF16 Xeon measured 0.5 per
 * cycle against 2), widening wins; where the two rates are closer, the pairs would.
 * pair_choice.py times both once per machine and the caller passes the format it packed
 * (enum lean_weights). Either path is the same for every M: batch invariance holds.
 */
#include "lean.h"

int lean_vector_len(void) { return VL; }
int lean_pack_width(void) { return NR; }
/* 1 where bf16 weights may be multiplied as bf16 pairs (packed [blocks, ceil(K/2), NR, 2]). */
int lean_bf16_dot(void) { return BF16_DOT; }

/* Two vectors of weights at p: fp32, or bf16 packed as interleaved halves. A bf16 panel
 * row holds, for each pair of vectors (r, r + 1), VL 32-bit words whose low half is output
 * r*VL + j and high half output (r+1)*VL + j (ops.py NativeOps.pack): one load, a shift and
 * a mask widen both exactly (bf16 is a truncated fp32). Why: widening VL consecutive bf16
 * values (zero-extend to 32 bits, then shift) compiled on AVX2 to four shuffles per vector,
 * which outnumbered the multiply-adds they fed. */
static inline void load2_f32(const float *p, vf *w) { w[0] = load_f32(p); w[1] = load_f32(p + VL); }
static inline void load2_bf16(const uint16_t *p, vf *w) {
    vu u; memcpy(&u, p, sizeof u);
    vu lo = u << 16, hi = u & 0xffff0000u;
    memcpy(&w[0], &lo, sizeof lo);
    memcpy(&w[1], &hi, sizeof hi);
}
/* fp32 -> bf16, round to nearest even (NaN stays NaN), bit for bit torch's .to(bfloat16). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline void store_kv(void *p, int64_t at, const float *x, int n, int bf16) {
    if (!bf16) { memcpy((float *)p + at, x, n * sizeof(float)); return; }
    for (int d = 0; d < n; d++) ((uint16_t *)p)[at + d] = to_bf16(x[d]);
}

/* A micro-tile's accumulators acc[tbn][rb] into y (or added to it), clipped at N outputs. */
static inline __attribute__((always_inline)) void store_tile(const vf *acc, int tbn, int rb, float *y, int64_t ldy,
                                                             int n0, int N, int accumulate) {
    for (int i = 0; i < tbn; i++) {
        float *yi = y + i * ldy;
        for (int r = 0; r < rb; r++) {
            int n = n0 + r * VL;
            vf v = acc[i * rb + r];
            if (n + VL <= N) {
                if (accumulate) v = load_f32(yi + n) + v;
                store_f32(yi + n, v);
            } else {
                for (int j = 0; j < VL && n + j < N; j++) yi[n + j] = accumulate ? yi[n + j] + v[j] : v[j];
            }
        }
    }
}

/* Fetch a panel row of `bytes` towards L2 (locality 2: prefetcht1 on x86), a cache line at a time. */
static inline void prefetch_row(const char *row, int bytes) {
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 2);
}

/* One micro-tile: rows t0..t0+tb of y, outputs nb*NR..+NR. acc[i][r] += x[i,k] * w[k, r]
 * for k = 0..K-1 in order: each output's sum is one fused multiply-add chain over k.
 * next: the panel this thread reads after this one (NULL: none), fetched into L2 row by row
 * as this one is read (prefetch_row); lean_gemm says why. */
#define MICRO(NAME, WT, LOADW, PF, TBN)                                                            \
static void NAME(const float *x, int64_t ldx, const WT *w, float *y, int64_t ldy, int K,       \
                 int n0, int N, int accumulate, const WT *next) {                             \
    vf acc[TBN][RB];                                                                          \
    for (int i = 0; i < TBN; i++) for (int r = 0; r < RB; r++) acc[i][r] = (vf){0};           \
    for (int k = 0; k < K; k++) {                                                             \
        const WT *wk = w + (int64_t)k * NR;                                                   \
        if (PF) __builtin_prefetch((const char *)wk + PF);                                    \
        if (next) prefetch_row((const char *)(next + (int64_t)k * NR), NR * (int)sizeof(WT));  \
        vf wv[RB];                                                                            \
        for (int r = 0; r < RB; r += 2) LOADW(wk + r * VL, wv + r);                           \
        for (int i = 0; i < TBN; i++) {                                                       \
            vf xb = splat(x[i * ldx + k]);                                                    \
            for (int r = 0; r < RB; r++) acc[i][r] = FMA(xb, wv[r], acc[i][r]);           \
        }                                                                                     \
    }                                                                                         \
    store_tile(acc[0], TBN, RB, y, ldy, n0, N, accumulate);                                   \
}

/* Vector FMA: GCC contracts a * b + c on vector types into vfmadd under -ffp-contract=fast,
 * which __init__.py passes explicitly so the contraction never depends on defaults. */
#define FMA(a, b, c) ((a) * (b) + (c))

#define MICROS(T, WT, LOADW, PF)                                                              \
MICRO(micro_##T##_1, WT, LOADW, PF, 1) MICRO(micro_##T##_2, WT, LOADW, PF, 2)                \
MICRO(micro_##T##_3, WT, LOADW, PF, 3) MICRO(micro_##T##_4, WT, LOADW, PF, 4)                \
MICRO(micro_##T##_5, WT, LOADW, PF, 5) MICRO(micro_##T##_6, WT, LOADW, PF, 6)               \
MICROS_WIDE(T, WT, LOADW, PF)
#if TB > 6
#define MICROS_WIDE(T, WT, LOADW, PF)                                                         \
MICRO(micro_##T##_7, WT, LOADW, PF, 7) MICRO(micro_##T##_8, WT, LOADW, PF, 8)                \
MICRO(micro_##T##_9, WT, LOADW, PF, 9) MICRO(micro_##T##_10, WT, LOADW, PF, 10)              \
MICRO(micro_##T##_11, WT, LOADW, PF, 11) MICRO(micro_##T##_12, WT, LOADW, PF, 12)
#define WIDE_TILES(T) , (micro_fn)micro_##T##_7, (micro_fn)micro_##T##_8, (micro_fn)micro_##T##_9, \
    (micro_fn)micro_##T##_10, (micro_fn)micro_##T##_11, (micro_fn)micro_##T##_12
#else
#define MICROS_WIDE(T, WT, LOADW, PF)
#define WIDE_TILES(T)
#endif
_Static_assert(TB == 6 || TB == 12, "micro-tiles exist for 1..6 and 7..12 rows");
/* PF: bytes of the panel prefetched ahead of the row being read (0: none). Widened bf16
 * panels read half the bytes per multiply-add of fp32 ones, and the hardware prefetcher
 * alone left a 1-token pass at ~1.5x its bandwidth bound on an AVX2 Zen 2; 1 KB ahead (32
 * rows of the panel) took 10-17% off passes of 1-6 tokens there (256 B and 512 B less,
 * 1.5-2 KB no more). fp32 panels, already near the bound at one token, were no faster. */
MICROS(f32, float, load2_f32, 0)
MICROS(bf16, uint16_t, load2_bf16, 1024)

typedef void (*micro_fn)(const float *, int64_t, const void *, float *, int64_t, int, int, int, int, const void *);
static const micro_fn MICRO_F32[TB + 1] = {0, (micro_fn)micro_f32_1, (micro_fn)micro_f32_2,
    (micro_fn)micro_f32_3, (micro_fn)micro_f32_4, (micro_fn)micro_f32_5, (micro_fn)micro_f32_6 WIDE_TILES(f32)};
static const micro_fn MICRO_BF16[TB + 1] = {0, (micro_fn)micro_bf16_1, (micro_fn)micro_bf16_2,
    (micro_fn)micro_bf16_3, (micro_fn)micro_bf16_4, (micro_fn)micro_bf16_5, (micro_fn)micro_bf16_6 WIDE_TILES(bf16)};

#if BF16_DOT
/* The pair path's tile is the widening one's (RB x TB = 2 x 12): on an AVX512-BF16 Xeon it made
 * pair passes of 4-16 tokens 1.10-1.19x faster than 4 x 6; 3 x 8 or 3 x 9 gained less. */
_Static_assert(TB == 12, "the pair micro-tiles below exist for 1..12 rows");
/* The bf16-pair micro-tile: x rows already rounded to bf16 (K2 pairs each), w a pair panel
 * [K2, NR, 2]. acc[i][r] lane j += x[i,2k] w[2k,n] + x[i,2k+1] w[2k+1,n], k = 0..K2-1 in order.
 * next: as in MICRO. */
#define MICRO_DOT(NAME, TBN)                                                                   \
static void NAME(const uint16_t *x, int64_t ldx, const uint16_t *w, float *y, int64_t ldy,     \
                 int K2, int n0, int N, int accumulate, const uint16_t *next) {               \
    vf acc[TBN][RB];                                                                         \
    for (int i = 0; i < TBN; i++) for (int r = 0; r < RB; r++) acc[i][r] = (vf){0};          \
    for (int k = 0; k < K2; k++) {                                                            \
        const uint16_t *wk = w + (int64_t)k * NR * 2;                                        \
        if (next) prefetch_row((const char *)(next + (int64_t)k * NR * 2), NR * 4);          \
        __m512bh wv[RB];                                                                     \
        for (int r = 0; r < RB; r++) wv[r] = (__m512bh)_mm512_loadu_si512(wk + r * VL * 2);  \
        for (int i = 0; i < TBN; i++) {                                                       \
            uint32_t pair;                                                                    \
            memcpy(&pair, x + i * ldx + 2 * k, sizeof pair);                                  \
            __m512bh xb = (__m512bh)_mm512_set1_epi32((int)pair);                             \
            for (int r = 0; r < RB; r++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xb, wv[r]); \
        }                                                                                     \
    }                                                                                         \
    store_tile(acc[0], TBN, RB, y, ldy, n0, N, accumulate);                                  \
}
MICRO_DOT(micro_dot_1, 1) MICRO_DOT(micro_dot_2, 2) MICRO_DOT(micro_dot_3, 3)
MICRO_DOT(micro_dot_4, 4) MICRO_DOT(micro_dot_5, 5) MICRO_DOT(micro_dot_6, 6)
MICRO_DOT(micro_dot_7, 7) MICRO_DOT(micro_dot_8, 8) MICRO_DOT(micro_dot_9, 9)
MICRO_DOT(micro_dot_10, 10) MICRO_DOT(micro_dot_11, 11) MICRO_DOT(micro_dot_12, 12)
typedef void (*micro_dot_fn)(const uint16_t *, int64_t, const uint16_t *, float *, int64_t, int, int, int, int,
                             const uint16_t *);
static const micro_dot_fn MICRO_DOT_FNS[TB + 1] = {0, micro_dot_1, micro_dot_2, micro_dot_3, micro_dot_4,
    micro_dot_5, micro_dot_6, micro_dot_7, micro_dot_8, micro_dot_9, micro_dot_10, micro_dot_11, micro_dot_12};

/* The calling thread's buffer for the bf16 copy of a GEMM's input rows: grown when a call
 * needs more, kept for the next (as large as the largest call's rows: ~100 KB while decoding,
 * a few MB when a batch of prompts is prefilled), so a decoding step's ~120 GEMMs allocate
 * nothing. Per thread because two Python threads may run GEMMs at once; a pthread key's
 * destructor frees it when its thread exits (the __thread pointer alone would leak it). */
static __thread uint16_t *rows_bf16;
static __thread size_t rows_bf16_len;
static pthread_key_t rows_bf16_key;
static pthread_once_t rows_bf16_once = PTHREAD_ONCE_INIT;

static void rows_bf16_key_create(void) {
    if (pthread_key_create(&rows_bf16_key, free) != 0) abort();
}

static uint16_t *bf16_rows_buffer(size_t len) {
    if (len > rows_bf16_len) {
        uint16_t *grown = realloc(rows_bf16, len * sizeof *grown);
        if (grown == NULL) abort();
        pthread_once(&rows_bf16_once, rows_bf16_key_create);
        if (pthread_setspecific(rows_bf16_key, grown) != 0) abort(); /* the destructor frees the newest block */
        rows_bf16 = grown;
        rows_bf16_len = len;
    }
    return rows_bf16;
}

static void gemm_bf16_dot(const float *x, int64_t ldx, const uint16_t *w, float *y, int64_t ldy,
                          int M, int K, int N, int accumulate) {
    const int blocks = (N + NR - 1) / NR, K2 = (K + 1) / 2;
    uint16_t *xb = bf16_rows_buffer((size_t)M * K2 * 2);
#pragma omp parallel for schedule(static) if ((int64_t)M * K > 65536)
    for (int t = 0; t < M; t++) {
        const float *xt = x + t * ldx;
        uint16_t *bt = xb + (int64_t)t * K2 * 2;
        for (int k = 0; k < K; k++) bt[k] = to_bf16(xt[k]);
        if (K & 1) bt[K] = 0; /* the padded half of the last pair */
    }
#pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const uint16_t *panel = w + (size_t)b * K2 * NR * 2;
        for (int t0 = 0; t0 < M; t0 += TB) {
            int tb = M - t0 < TB ? M - t0 : TB;
            const uint16_t *next = t0 == 0 && b + 1 < blocks ? panel + (size_t)K2 * NR * 2 : NULL;
            MICRO_DOT_FNS[tb](xb + (int64_t)t0 * K2 * 2, K2 * 2, panel, y + t0 * ldy, ldy, K2, b * NR, N, accumulate,
                              next);
        }
    }
}
#endif

#if BF16_DOT && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define AMX 1
#include <sys/syscall.h>
#include <unistd.h>
/* The bf16-pair GEMM on AMX tiles (Intel Sapphire Rapids and later): the same pair panels
 * ([blocks, K2, NR, 2], K padded to a multiple of 32 by ops.py), the same bf16-rounded input
 * rows, multiplied 16 rows x 16 outputs x 32 inputs per instruction (tdpbf16ps). Why: on
 * the pair path an AMX Xeon's 9-token verification cost ~1.8x a 1-token step, its vdpbf16ps
 * products (not memory) the limit; a tile does a 16-row block's products for the cost of
 * streaming the panel, so a verification pass costs little more than a decoding step.
 * Batch-invariant: an output element sums its 32-input chunks in k order, each chunk's
 * pairs in the instruction's one fixed order, from its own input row only; rows a block
 * lacks are zeros. So a row's bits do not depend on how many rows share the pass, and
 * plain decoding runs the same instruction sequence (a 1-row block) as verification. The
 * bits are not vdpbf16ps's (its chunks are pairs): pair_choice.py picks one path per
 * machine, and every pass of a process uses it. */
_Static_assert(NR == 32, "AMX panels are two tiles of 16 outputs");
#define AMX_ROWS 16 /* rows of an input block (a tile's rows) */
#define AMX_PAIRS 16 /* input pairs per tile step (64 bytes of a tile row) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

static int amx_granted = -1;
/* 1 where this process may use AMX tiles: Linux grants the tile state on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Asked once. */
int lean_amx(void) {
    if (amx_granted < 0) amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return amx_granted;
}

/* Tiles 0, 1: the block's outputs (rows x 16 fp32); 2: its input rows (rows x 32 bf16);
 * 3, 4: the panel's two halves (16 pairs x 16 outputs x 2). rows: 1..16, the rows of every
 * block of the call (a pass of fewer than 16 rows runs them alone: a 1-row step does a
 * sixteenth of the products and loads; a row's products are the same either way). Every
 * thread loads this before its first tile instruction: the configuration is per thread,
 * and torch's own AMX GEMMs may have changed it since. */
static void amx_configure(int rows) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) { c.colsb[t] = 64; c.rows[t] = t == 3 || t == 4 ? AMX_PAIRS : rows; }
    _tile_loadconfig(&c);
}

/* One panel (outputs n0..n0+NR) for one 16-row block of x (bf16 pairs, ld pairs per row). */
static void amx_block(const uint16_t *xb, int64_t ld, const uint16_t *panel, int K2, float *y, int64_t ldy,
                      int rows, int n0, int N, int accumulate, const uint16_t *next) {
    _tile_zero(0);
    _tile_zero(1);
    for (int k = 0; k < K2; k += AMX_PAIRS) {
        const uint16_t *wk = panel + (int64_t)k * NR * 2;
        if (next) prefetch_row((const char *)(next + (int64_t)k * NR * 2), AMX_PAIRS * NR * 4);
        for (int o = 0; o < AMX_PAIRS * NR * 4; o += 64) __builtin_prefetch((const char *)wk + 4096 + o, 0, 3);
        _tile_loadd(2, xb + 2 * k, ld * 4);
        _tile_loadd(3, wk, 64);
        _tile_loadd(4, wk + AMX_PAIRS * 32, 64);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
    }
    vf out[AMX_ROWS * RB]; /* row i's outputs as RB vectors: store_tile's accumulator layout */
    _tile_stored(0, out, NR * 4);
    _tile_stored(1, out + 1, NR * 4);
    store_tile(out, rows, RB, y, ldy, n0, N, accumulate);
}

static void gemm_bf16_amx(const float *x, int64_t ldx, const uint16_t *w, float *y, int64_t ldy,
                          int M, int K, int N, int accumulate) {
    if (M <= 0) return;
    const int blocks = (N + NR - 1) / NR, K2 = (K + 2 * AMX_PAIRS - 1) / (2 * AMX_PAIRS) * AMX_PAIRS;
    /* Rows per block: as few blocks as hold M rows, as even as can be (17 rows: two of 9, not
     * 16 and 1), the last padded with zero rows. */
    const int n_blocks = (M + AMX_ROWS - 1) / AMX_ROWS, block_rows = (M + n_blocks - 1) / n_blocks;
    const int Mp = n_blocks * block_rows;
    uint16_t *xb = bf16_rows_buffer((size_t)Mp * K2 * 2);
#pragma omp parallel for schedule(static) if ((int64_t)M * K > 65536)
    for (int t = 0; t < Mp; t++) {
        uint16_t *bt = xb + (int64_t)t * K2 * 2;
        int k = 0;
        if (t < M)
            for (const float *xt = x + t * ldx; k < K; k++) bt[k] = to_bf16(xt[k]);
        for (; k < 2 * K2; k++) bt[k] = 0; /* padded inputs and rows: zeros */
    }
#pragma omp parallel
    {
        amx_configure(block_rows);
#pragma omp for schedule(static)
        for (int b = 0; b < blocks; b++) {
            const uint16_t *panel = w + (size_t)b * K2 * NR * 2;
            for (int t0 = 0; t0 < M; t0 += block_rows) {
                const uint16_t *next = t0 == 0 && b + 1 < blocks ? panel + (size_t)K2 * NR * 2 : NULL;
                int rows = M - t0 < block_rows ? M - t0 : block_rows;
                amx_block(xb + (int64_t)t0 * K2 * 2, K2, panel, K2, y + t0 * ldy, ldy, rows, b * NR, N, accumulate,
                          next);
            }
        }
        _tile_release();
    }
}
#else
#define AMX 0
int lean_amx(void) { return 0; }
#endif

/* y[M, N] (+)= x[M, K] @ W^T, W prepacked as [ceil(N / NR), K, NR] (zero-padded outputs).
 * Threads split the output blocks; each block walks all M rows, so its K x NR weight panel
 * is read from memory once and reused from cache for every row tile. (Widening a bf16 panel
 * to fp32 once per block instead of per tile was measured slower at every M from 5 to 256.)
 * While a thread reads one panel it fetches its next one into L2, a row for each row read.
 * Why: with the hardware prefetcher alone, a panel's first rows waited on memory and a
 * compute-heavy walk (several tokens) issued its loads too slowly to keep memory busy; on an
 * AVX512-BF16 Xeon, SmolLM2 passes of 1-12 tokens ran 1.16-1.30x faster with it, and its AVX2
 * and plain AVX-512 builds 3-28% faster at 2-8 tokens (at 1 token too, but for the AVX-512
 * build's fp32 weights: 4% slower there). Two panels ahead, into L1, or the next GEMM's first
 * panel too were no better (docs/results.md). */
void lean_gemm(const float *x, int64_t ldx, const void *w, int weights, float *y, int64_t ldy,
               int M, int K, int N, int accumulate) {
#if BF16_DOT
    if (weights == LEAN_BF16_PAIRS) { gemm_bf16_dot(x, ldx, w, y, ldy, M, K, N, accumulate); return; }
#else
    if (weights == LEAN_BF16_PAIRS) abort(); /* packed for a path this build lacks (lean_bf16_dot says 0) */
#endif
#if AMX
    if (weights == LEAN_BF16_AMX) { gemm_bf16_amx(x, ldx, w, y, ldy, M, K, N, accumulate); return; }
#else
    if (weights == LEAN_BF16_AMX) abort(); /* likewise (lean_amx says 0) */
#endif
    const int w_bf16 = weights == LEAN_BF16_WIDENED;
    const int blocks = (N + NR - 1) / NR;
    const size_t esize = w_bf16 ? 2 : 4;
    const micro_fn *micro = w_bf16 ? MICRO_BF16 : MICRO_F32;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const void *panel = (const char *)w + (size_t)b * K * NR * esize;
        for (int t0 = 0; t0 < M; t0 += TB) {
            int tb = M - t0 < TB ? M - t0 : TB;
            const void *next = t0 == 0 && b + 1 < blocks ? (const char *)panel + (size_t)K * NR * esize : NULL;
            micro[tb](x + t0 * ldx, ldx, panel, y + t0 * ldy, ldy, K, b * NR, N, accumulate, next);
        }
    }
}

/* Sum of a row in a fixed order: VL lanes over the row, then the lanes left to right. */
static float row_sum_squares(const float *x, int D) {
    vf acc = (vf){0};
    int d = 0;
    for (; d + VL <= D; d += VL) { vf v = load_f32(x + d); acc = acc + v * v; }
    float s = 0.f;
    for (int j = 0; j < VL; j++) s += acc[j];
    for (; d < D; d++) s += x[d] * x[d];
    return s;
}

/* y[M, D] = x * rsqrt(mean(x^2) + eps) * weight, row by row (Llama's RMSNorm in fp32). */
void lean_rmsnorm(const float *x, const float *weight, float *y, int M, int D, float eps) {
#pragma omp parallel for schedule(static) if (M > 8)
    for (int t = 0; t < M; t++) {
        const float *xt = x + (int64_t)t * D;
        float *yt = y + (int64_t)t * D;
        float inv = 1.0f / sqrtf(row_sum_squares(xt, D) / D + eps);
        for (int d = 0; d < D; d++) yt[d] = (xt[d] * inv) * weight[d];
    }
}

static inline vf load_part(const float *p, int lanes) {
    if (lanes == VL) return load_f32(p);
    vf v = (vf){0};
    for (int j = 0; j < lanes; j++) v[j] = p[j];
    return v;
}
static inline void store_part(float *p, vf v, int lanes) {
    if (lanes == VL) { store_f32(p, v); return; }
    for (int j = 0; j < lanes; j++) p[j] = v[j];
}

/* out[M, I] = silu(gu[:, :I]) * gu[:, I:] (gate and up projections fused in one GEMM).
 * Vectorised with vexp: an element's value does not depend on where it sits. Split across
 * threads by rows and by chunks of a row, so a 1-token step's 1536 elements per layer stay
 * on one thread (a fork costs more) while a verification's rows spread over both. */
void lean_silu_mul(const float *gu, float *out, int M, int I) {
    const int chunk = 512, chunks = (I + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if ((int64_t)M * I > 4096)
    for (int tc = 0; tc < M * chunks; tc++) {
        int t = tc / chunks, c0 = (tc % chunks) * chunk, c1 = c0 + chunk < I ? c0 + chunk : I;
        const float *g = gu + (int64_t)t * 2 * I + c0, *u = g + I;
        float *o = out + (int64_t)t * I + c0;
        for (int i = 0; i < c1 - c0; i += VL) { /* the tail through the same vector code, padded */
            int lanes = c1 - c0 - i < VL ? c1 - c0 - i : VL;
            vf gv = load_part(g + i, lanes), uv = load_part(u + i, lanes);
            store_part(o + i, gv / (1.0f + vexp(-gv)) * uv, lanes);
        }
    }
}

/* Rotate one head vector in place (rotate-half convention: pairs (i, i + hd/2)). */
static void rope(float *v, const float *cos_row, const float *sin_row, int hd) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half], c = cos_row[i], s = sin_row[i];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

/* q . k over hd in two parts: the vector part (one fused multiply-add chain over the
 * vectors, whose lanes are then summed by the halving tree) and the scalar tail (hd mod VL).
 * always_inline so that hd = 64 is a constant where it is one. */
static inline __attribute__((always_inline)) vf dot_lanes(const float *a, const void *b, int64_t at, int n,
                                                          int bf16) {
    vf acc = (vf){0};
    for (int d = 0; d + VL <= n; d += VL) acc = load_f32(a + d) * load_kv(b, at + d, bf16) + acc;
    return acc;
}
static inline __attribute__((always_inline)) float dot_tail(const float *a, const void *b, int64_t at, int n,
                                                            int bf16) {
    float s = 0.f;
    for (int d = n / VL * VL; d < n; d++) s += a[d] * kv_at(b, at + d, bf16);
    return s;
}

/* VL keys' lane vectors -> one vector of their VL lane sums, key i in lane i. Each step
 * halves the vectors: pairs of keys' lanes j and j + w are added, exactly the additions of
 * hsum at width w, so every key's sum has the bits hsum gives it, whichever lane it lands
 * in. Shuffle masks: lane p of the low part takes 2p - p mod w, the high part w more. */
#if VL == 16
#define HALVING(a)                                                                                          \
    HALVE(a, 8, ((vi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}))                             \
    HALVE(a, 4, ((vi){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}))                           \
    HALVE(a, 2, ((vi){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}))                           \
    HALVE(a, 1, ((vi){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}))
#else
#define HALVING(a)                                                                                          \
    HALVE(a, 4, ((vi){0, 1, 2, 3, 8, 9, 10, 11}))                                                           \
    HALVE(a, 2, ((vi){0, 1, 4, 5, 8, 9, 12, 13}))                                                           \
    HALVE(a, 1, ((vi){0, 2, 4, 6, 8, 10, 12, 14}))
#endif
#define HALVE(a, w, lo)                                                                                     \
    for (int i = 0; i < (w); i++) /* w vectors out of 2w */                                                   \
        a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo) + __builtin_shuffle(a[2 * i], a[2 * i + 1], lo + (w));
static inline vf lane_sums(vf a[VL]) {
    HALVING(a)
    return a[0];
}

/* score[0..n) = softmax(score), VL at a time: the n scores are padded to whole vectors
 * with -inf (space for them is the caller's), whose exp is exactly 0. Each lane sums the
 * scores at its index mod VL, then the lanes are summed by hsum: the result depends only on
 * the list of scores, not on where their keys sit in the cache. */
static void softmax_weights(float *score, int n) {
    int padded = (n + VL - 1) / VL * VL;
    for (int s = n; s < padded; s++) score[s] = -INFINITY;
    vf m = splat(-INFINITY);
    for (int s = 0; s < padded; s += VL) m = vmax(load_f32(score + s), m);
    float top = -INFINITY;
    for (int j = 0; j < VL; j++) top = m[j] > top ? m[j] : top; /* max is exact in any order */
    vf total = (vf){0};
    for (int s = 0; s < padded; s += VL) {
        vf e = vexp(load_f32(score + s) - top);
        store_f32(score + s, e);
        total = total + e;
    }
    vf inv = splat(1.0f / hsum(total));
    for (int s = 0; s < padded; s += VL) store_f32(score + s, load_f32(score + s) * inv);
}

/* One score: (q . k) * scale, the vector part's lanes summed by hsum. */
static inline __attribute__((always_inline)) float score_one(const float *q, const void *k, int64_t at, int hd,
                                                             float scale, int bf16) {
    return (hsum(dot_lanes(q, k, at, hd, bf16)) + dot_tail(q, k, at, hd, bf16)) * scale;
}

/* acc[hd] += p[k] * v_k for the n values v_k at element at + k * hd of v, k in order (the
 * vector part in registers across the n values, then the scalar tail). */
static inline __attribute__((always_inline)) void add_scaled(float *acc, const float *p, const void *v, int64_t at,
                                                             int n, int hd, int bf16) {
    vf a[hd / VL + 1];
    for (int d = 0; d + VL <= hd; d += VL) a[d / VL] = load_f32(acc + d);
    for (int k = 0; k < n; k++) {
        int64_t vk = at + (int64_t)k * hd;
        for (int d = 0; d + VL <= hd; d += VL) a[d / VL] = splat(p[k]) * load_kv(v, vk + d, bf16) + a[d / VL];
        for (int d = hd / VL * VL; d < hd; d++) acc[d] += p[k] * kv_at(v, vk + d, bf16);
    }
    for (int d = 0; d + VL <= hd; d += VL) store_f32(acc + d, a[d / VL]);
}

#define LONG_RUN 32 /* attend_group: new tokens' values summed in one call from this many */

/* The attention of nq queries of one KV group: out_i[hd] = softmax(q_i k^T * scale) v over
 * the keys query i sees (every cached key, then the new tokens its mask shows, in slot order).
 * The queries share each block of VL cached keys (and values) while it is in L1, where one
 * query at a time had streamed them from L2. What a query computes does not depend on the
 * others: a key's score has the same bits in a block (lane_sums) or alone (hsum), the
 * softmax runs over the query's own list of scores, and its sum over values is in list order.
 * So a tree node, whose list of keys is the chain's through its ancestors, gets the chain's
 * bits, and so does a token verified among drafts and decoded alone. */
static inline __attribute__((always_inline)) void attend_group(
        const float *const *q, float *const *out, const int *tok, int nq, const void *kv_k, const void *kv_v,
        int64_t base, const uint8_t *mask, int T, int past, int hd, float scale, float *score, int stride,
        int32_t *fresh, int *n_fresh, int bf16) {
    for (int i = 0; i < nq; i++) { /* the new tokens each query sees */
        n_fresh[i] = 0;
        for (int j = 0; j < T; j++)
            if (mask ? mask[tok[i] * T + j] : j <= tok[i]) fresh[i * T + n_fresh[i]++] = past + j;
    }
    for (int s0 = 0; s0 < past; s0 += VL) {
        int nk = past - s0 < VL ? past - s0 : VL;
        for (int i = 0; i < nq; i++) {
            float *sc = score + (int64_t)i * stride + s0;
            if (nk == VL) {
                vf lanes[VL], tails;
                for (int k = 0; k < VL; k++) {
                    int64_t key = base + (int64_t)(s0 + k) * hd;
                    lanes[k] = dot_lanes(q[i], kv_k, key, hd, bf16);
                    tails[k] = dot_tail(q[i], kv_k, key, hd, bf16);
                }
                store_f32(sc, (lane_sums(lanes) + tails) * scale);
            } else {
                for (int k = 0; k < nk; k++) sc[k] = score_one(q[i], kv_k, base + (int64_t)(s0 + k) * hd, hd, scale, bf16);
            }
        }
    }
    for (int i = 0; i < nq; i++) {
        float *sc = score + (int64_t)i * stride + past;
        const int32_t *slots = fresh + i * T;
        int f = 0;
        for (; f + VL <= n_fresh[i]; f += VL) { /* a prefill's many new tokens: VL at a time too */
            vf lanes[VL], tails;
            for (int k = 0; k < VL; k++) {
                int64_t key = base + (int64_t)slots[f + k] * hd;
                lanes[k] = dot_lanes(q[i], kv_k, key, hd, bf16);
                tails[k] = dot_tail(q[i], kv_k, key, hd, bf16);
            }
            store_f32(sc + f, (lane_sums(lanes) + tails) * scale);
        }
        for (; f < n_fresh[i]; f++) sc[f] = score_one(q[i], kv_k, base + (int64_t)slots[f] * hd, hd, scale, bf16);
        softmax_weights(sc - past, past + n_fresh[i]);
        memset(out[i], 0, hd * sizeof(float));
    }
    for (int s0 = 0; s0 < past; s0 += VL) {
        int nk = past - s0 < VL ? past - s0 : VL;
        for (int i = 0; i < nq; i++) {
            const float *sc = score + (int64_t)i * stride + s0;
            add_scaled(out[i], sc, kv_v, base + (int64_t)s0 * hd, nk, hd, bf16);
        }
    }
    /* The new tokens' values: a long run of consecutive slots (a prefill's causal pass: hundreds)
     * in one call, whose sum stays in registers, where a call per value stores and reloads it.
     * fp32 either way and in the same order, so the bits are the same; a 768-token prefill ran
     * 20% faster. Shorter runs (a verification's few new tokens, a tree's branches) keep a call
     * per value: one call over them measured slower (16 tokens: 35 ms a pass against 27). */
    for (int i = 0; i < nq; i++) {
        const int32_t *slots = fresh + i * T;
        for (int f = 0, run; f < n_fresh[i]; f += run) {
            for (run = 1; f + run < n_fresh[i] && slots[f + run] == slots[f] + run; run++) {}
            if (run < LONG_RUN) run = 1;
            add_scaled(out[i], score + (int64_t)i * stride + past + f, kv_v, base + (int64_t)slots[f] * hd, run, hd,
                       bf16);
        }
    }
}

/* Attention of B rows x T new tokens over a static cache, grouped-query.
 *   qkv   [B, T, (H + 2 KV) * hd]  the fused projection (q heads, then k heads, then v heads)
 *   pos   [B, T] positions (RoPE); cos/sin [max_pos, hd / 2]
 *   kc/vc [rows, KV, S, hd] this layer's cache, fp32 or (kv_bf16) bf16; row[b] is batch row b's cache row and
 *         len[b] its cached length: new token j is written at slot len[b] + j
 *   mask  NULL (causal among the new tokens) or [T, T] bytes, 1 where token i sees token j
 *   out   [B, T, H * hd]
 * Work is split over (row, KV group, chunk of queries); attend_group says why a tree node
 * gets the chain's bits. */
void lean_attention(float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                    void *kc, void *vc, const int64_t *row, const int64_t *len,
                    const uint8_t *mask, float *out, int B, int T, int H, int KV, int hd, int S,
                    float scale, int kv_bf16) {
    const int width = (H + 2 * KV) * hd, half = hd / 2;
    /* 1. RoPE on q and k, then k and v into the cache. */
#pragma omp parallel for schedule(static) if (B * T > 4)
    for (int bt = 0; bt < B * T; bt++) {
        int b = bt / T, t = bt % T;
        float *q = qkv + (int64_t)bt * width;
        const float *c = cos_t + pos[bt] * half, *s = sin_t + pos[bt] * half;
        for (int h = 0; h < H + KV; h++) rope(q + h * hd, c, s, hd);
        int64_t slot = len[b] + t;
        for (int g = 0; g < KV; g++) {
            int64_t at = ((row[b] * KV + g) * S + slot) * hd;
            store_kv(kc, at, q + (H + g) * hd, hd, kv_bf16);
            store_kv(vc, at, q + (H + KV + g) * hd, hd, kv_bf16);
        }
    }
    /* 2. softmax(q k^T * scale) v, per KV group, in chunks of its H / KV * T queries: about a
     * dozen chunks per pass, so both threads get work (one query per chunk at T = 1). */
    const int per_group = H / KV * T, total = B * KV * per_group;
    int chunk = total <= 12 ? 1 : (total + 11) / 12 > 8 ? 8 : (total + 11) / 12;
    int longest = 0;
    for (int b = 0; b < B; b++) longest = len[b] > longest ? (int)len[b] : longest;
    int fits = 8192 / (longest + T + VL); /* a chunk's scores stay within 32 KB of its thread's stack */
    chunk = chunk < fits ? chunk : fits > 1 ? fits : 1;
    const int chunks = (per_group + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int item = 0; item < B * KV * chunks; item++) {
        int b = item / (KV * chunks), g = item / chunks % KV, c = item % chunks;
        int first = c * chunk, nq = per_group - first < chunk ? per_group - first : chunk;
        int past = (int)len[b], stride = past + T + VL;
        const float *qp[nq];
        float *op[nq];
        int tok[nq], n_fresh[nq];
        for (int i = 0; i < nq; i++) { /* query first + i: head g * H / KV + (first + i) / T, token (first + i) % T */
            int h = g * (H / KV) + (first + i) / T, t = (first + i) % T;
            tok[i] = t;
            qp[i] = qkv + ((int64_t)b * T + t) * width + h * hd;
            op[i] = out + ((int64_t)b * T + t) * H * hd + h * hd;
        }
        float score[nq * stride];
        int32_t fresh[nq * T];
        const int64_t base = (row[b] * KV + g) * (int64_t)S * hd; /* this row and group's first key */
        if (hd == 64 && kv_bf16)
            attend_group(qp, op, tok, nq, kc, vc, base, mask, T, past, 64, scale, score, stride, fresh, n_fresh, 1);
        else if (hd == 64)
            attend_group(qp, op, tok, nq, kc, vc, base, mask, T, past, 64, scale, score, stride, fresh, n_fresh, 0);
        else
            attend_group(qp, op, tok, nq, kc, vc, base, mask, T, past, hd, scale, score, stride, fresh, n_fresh, kv_bf16);
    }
}

/* Decoder layers l0..l1-1 of one pass, in one call (model.py gives the maths per layer).
 * Why: each kernel called from Python costs ~6 us of ctypes and tensor allocation, and a
 * layer makes eight calls: ~1.5 ms of a 12 ms decoding step on SmolLM2. The kernels and
 * their order are those of the per-call path, so the bits are the same. */
void lean_layers(const lean_layer *layers, int l0, int l1, int weights, float *x, int B, int T, int D, int Nqkv,
                 int I, float eps, void *kc, void *vc, int64_t layer_stride, int kv_bf16, const int64_t *pos,
                 const float *cos_t, const float *sin_t, const int64_t *row, const int64_t *len,
                 const uint8_t *mask, int H, int KV, int hd, int S, float scale, float *scratch) {
    const int M = B * T, A = H * hd;
    float *h = scratch, *qkv = h + (int64_t)M * D, *att = qkv + (int64_t)M * Nqkv, *gu = att + (int64_t)M * A;
    float *act = gu + (int64_t)M * 2 * I; /* scratch holds M * (D + Nqkv + A + 3 I) floats */
    for (int l = l0; l < l1; l++) {
        const lean_layer *L = layers + l;
        lean_rmsnorm(x, L->attn_norm, h, M, D, eps);
        lean_gemm(h, D, L->qkv, weights, qkv, Nqkv, M, D, Nqkv, 0);
        if (L->qkv_bias)
            for (int t = 0; t < M; t++)
                for (int n = 0; n < Nqkv; n++) qkv[(int64_t)t * Nqkv + n] += L->qkv_bias[n];
        const int64_t bytes = l * layer_stride * (kv_bf16 ? 2 : 4); /* layer_stride: elements per layer */
        lean_attention(qkv, pos, cos_t, sin_t, (char *)kc + bytes, (char *)vc + bytes, row, len, mask, att,
                       B, T, H, KV, hd, S, scale, kv_bf16);
        lean_gemm(att, A, L->o, weights, x, D, M, A, D, 1);
        lean_rmsnorm(x, L->mlp_norm, h, M, D, eps);
        lean_gemm(h, D, L->gate_up, weights, gu, 2 * I, M, D, 2 * I, 0);
        lean_silu_mul(gu, act, M, I);
        lean_gemm(act, I, L->down, weights, x, D, M, I, D, 1);
    }
}
