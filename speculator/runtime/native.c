/* CPU kernels of the lean decoder (speculator/runtime): small-M GEMM over prepacked
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
 * Compiled at first use with the machine's own flags (-march=native, see native.py);
 * GCC vector extensions give AVX-512 or AVX2 code from the same source. The pure-torch
 * reference of each kernel is in ops.py (TorchOps). Compute is fp32; weights are fp32 or
 * bf16 (a bf16 weight is the upper half of an fp32 word, widened exactly on load).
 *
 * On CPUs with AVX512-BF16 (vdpbf16ps), a GEMM over bf16 weights instead rounds its input
 * rows to bf16 (round-to-nearest-even, as torch's .to(bfloat16)) and multiplies bf16 pairs
 * with fp32 accumulation, as transformers' bf16 matmuls do. Why: widening each bf16 weight
 * to fp32 costs more instructions than the FMA that uses it, so a k-token verification was
 * ~1.8x a 1-token step; the pair instruction does two products per lane with no widening.
 * Weights are then packed as pairs ([blocks, K/2, NR, 2], see lean_bf16_dot); the path is
 * the same for every M, so batch invariance holds unchanged.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define BF16_DOT 1
#else
#define BF16_DOT 0
#endif

#if defined(__AVX512F__)
#define VL 16 /* floats per vector register */
#define RB 4  /* vectors of outputs per micro-tile: NR = RB * VL outputs */
#else
#define VL 8
#define RB 2
#endif
#define NR (RB * VL)
#define TB 6 /* rows (tokens) per micro-tile */

typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

int lean_vector_len(void) { return VL; }
int lean_pack_width(void) { return NR; }
/* 1 where bf16 weights are multiplied as bf16 pairs (packed [blocks, ceil(K/2), NR, 2]). */
int lean_bf16_dot(void) { return BF16_DOT; }

static inline vf load_f32(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void store_f32(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf load_bf16(const uint16_t *p) {
    vh h; memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16; /* exact: bf16 is a truncated fp32 */
    vf f; memcpy(&f, &u, sizeof f); return f;
}
static inline vf splat(float x) { return (vf){0} + x; }

/* A micro-tile's accumulators acc[tbn][RB] into y (or added to it), clipped at N outputs. */
static inline void store_tile(const vf *acc, int tbn, float *y, int64_t ldy, int n0, int N, int accumulate) {
    for (int i = 0; i < tbn; i++) {
        float *yi = y + i * ldy;
        for (int r = 0; r < RB; r++) {
            int n = n0 + r * VL;
            vf v = acc[i * RB + r];
            if (n + VL <= N) {
                if (accumulate) v = load_f32(yi + n) + v;
                store_f32(yi + n, v);
            } else {
                for (int j = 0; j < VL && n + j < N; j++) yi[n + j] = accumulate ? yi[n + j] + v[j] : v[j];
            }
        }
    }
}

/* One micro-tile: rows t0..t0+tb of y, outputs nb*NR..+NR. acc[i][r] += x[i,k] * w[k, r]
 * for k = 0..K-1 in order: each output's sum is one fused multiply-add chain over k. */
#define MICRO(NAME, WT, LOADW, TBN)                                                            \
static void NAME(const float *x, int64_t ldx, const WT *w, float *y, int64_t ldy, int K,       \
                 int n0, int N, int accumulate) {                                             \
    vf acc[TBN][RB];                                                                          \
    for (int i = 0; i < TBN; i++) for (int r = 0; r < RB; r++) acc[i][r] = (vf){0};           \
    for (int k = 0; k < K; k++) {                                                             \
        const WT *wk = w + (int64_t)k * NR;                                                   \
        vf wv[RB];                                                                            \
        for (int r = 0; r < RB; r++) wv[r] = LOADW(wk + r * VL);                              \
        for (int i = 0; i < TBN; i++) {                                                       \
            vf xb = splat(x[i * ldx + k]);                                                    \
            for (int r = 0; r < RB; r++) acc[i][r] = FMA(xb, wv[r], acc[i][r]);           \
        }                                                                                     \
    }                                                                                         \
    store_tile(acc[0], TBN, y, ldy, n0, N, accumulate);                                       \
}

/* Vector FMA: GCC contracts a * b + c on vector types into vfmadd under -ffp-contract=fast,
 * which native.py passes explicitly so the contraction never depends on defaults. */
#define FMA(a, b, c) ((a) * (b) + (c))

#define MICROS(T, WT, LOADW)                                                                  \
MICRO(micro_##T##_1, WT, LOADW, 1) MICRO(micro_##T##_2, WT, LOADW, 2)                        \
MICRO(micro_##T##_3, WT, LOADW, 3) MICRO(micro_##T##_4, WT, LOADW, 4)                        \
MICRO(micro_##T##_5, WT, LOADW, 5) MICRO(micro_##T##_6, WT, LOADW, 6)
MICROS(f32, float, load_f32)
MICROS(bf16, uint16_t, load_bf16)

typedef void (*micro_fn)(const float *, int64_t, const void *, float *, int64_t, int, int, int, int);
static const micro_fn MICRO_F32[TB + 1] = {0, (micro_fn)micro_f32_1, (micro_fn)micro_f32_2,
    (micro_fn)micro_f32_3, (micro_fn)micro_f32_4, (micro_fn)micro_f32_5, (micro_fn)micro_f32_6};
static const micro_fn MICRO_BF16[TB + 1] = {0, (micro_fn)micro_bf16_1, (micro_fn)micro_bf16_2,
    (micro_fn)micro_bf16_3, (micro_fn)micro_bf16_4, (micro_fn)micro_bf16_5, (micro_fn)micro_bf16_6};

#if BF16_DOT
/* The bf16-pair micro-tile: x rows already rounded to bf16 (K2 pairs each), w a pair panel
 * [K2, NR, 2]. acc[i][r] lane j += x[i,2k] w[2k,n] + x[i,2k+1] w[2k+1,n], k = 0..K2-1 in order. */
#define MICRO_DOT(NAME, TBN)                                                                   \
static void NAME(const uint16_t *x, int64_t ldx, const uint16_t *w, float *y, int64_t ldy,     \
                 int K2, int n0, int N, int accumulate) {                                     \
    vf acc[TBN][RB];                                                                          \
    for (int i = 0; i < TBN; i++) for (int r = 0; r < RB; r++) acc[i][r] = (vf){0};           \
    for (int k = 0; k < K2; k++) {                                                            \
        const uint16_t *wk = w + (int64_t)k * NR * 2;                                         \
        __m512bh wv[RB];                                                                      \
        for (int r = 0; r < RB; r++) wv[r] = (__m512bh)_mm512_loadu_si512(wk + r * VL * 2);   \
        for (int i = 0; i < TBN; i++) {                                                       \
            uint32_t pair;                                                                    \
            memcpy(&pair, x + i * ldx + 2 * k, sizeof pair);                                  \
            __m512bh xb = (__m512bh)_mm512_set1_epi32((int)pair);                             \
            for (int r = 0; r < RB; r++) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xb, wv[r]);  \
        }                                                                                     \
    }                                                                                         \
    store_tile(acc[0], TBN, y, ldy, n0, N, accumulate);                                       \
}
MICRO_DOT(micro_dot_1, 1) MICRO_DOT(micro_dot_2, 2) MICRO_DOT(micro_dot_3, 3)
MICRO_DOT(micro_dot_4, 4) MICRO_DOT(micro_dot_5, 5) MICRO_DOT(micro_dot_6, 6)
typedef void (*micro_dot_fn)(const uint16_t *, int64_t, const uint16_t *, float *, int64_t, int, int, int, int);
static const micro_dot_fn MICRO_DOT_FNS[TB + 1] = {0, micro_dot_1, micro_dot_2, micro_dot_3, micro_dot_4,
                                                   micro_dot_5, micro_dot_6};

/* fp32 -> bf16, round to nearest even (NaN stays NaN), bit for bit torch's .to(bfloat16). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

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
            MICRO_DOT_FNS[tb](xb + (int64_t)t0 * K2 * 2, K2 * 2, panel, y + t0 * ldy, ldy, K2, b * NR, N, accumulate);
        }
    }
}
#endif

/* y[M, N] (+)= x[M, K] @ W^T, W prepacked as [ceil(N / NR), K, NR] (zero-padded outputs).
 * Threads split the output blocks; each block walks all M rows, so its K x NR weight panel
 * is read from memory once and reused from cache for every row tile. (Widening a bf16 panel
 * to fp32 once per block instead of per tile was measured slower at every M from 5 to 256.) */
void lean_gemm(const float *x, int64_t ldx, const void *w, int w_bf16, float *y, int64_t ldy,
               int M, int K, int N, int accumulate) {
#if BF16_DOT
    if (w_bf16) { gemm_bf16_dot(x, ldx, w, y, ldy, M, K, N, accumulate); return; }
#endif
    const int blocks = (N + NR - 1) / NR;
    const size_t esize = w_bf16 ? 2 : 4;
    const micro_fn *micro = w_bf16 ? MICRO_BF16 : MICRO_F32;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const void *panel = (const char *)w + (size_t)b * K * NR * esize;
        for (int t0 = 0; t0 < M; t0 += TB) {
            int tb = M - t0 < TB ? M - t0 : TB;
            micro[tb](x + t0 * ldx, ldx, panel, y + t0 * ldy, ldy, K, b * NR, N, accumulate);
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

/* out[M, I] = silu(gu[:, :I]) * gu[:, I:] (gate and up projections fused in one GEMM).
 * Scalar expf per element: the same value wherever the element sits (no vector tail). */
__attribute__((optimize("no-tree-vectorize")))
void lean_silu_mul(const float *gu, float *out, int M, int I) {
#pragma omp parallel for schedule(static) if (M > 8)
    for (int t = 0; t < M; t++) {
        const float *g = gu + (int64_t)t * 2 * I, *u = g + I;
        float *o = out + (int64_t)t * I;
        for (int i = 0; i < I; i++) o[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
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

static float dot(const float *a, const float *b, int n) {
    vf acc = (vf){0};
    int d = 0;
    for (; d + VL <= n; d += VL) acc = acc + load_f32(a + d) * load_f32(b + d);
    float s = 0.f;
    for (int j = 0; j < VL; j++) s += acc[j];
    for (; d < n; d++) s += a[d] * b[d];
    return s;
}

/* Attention of B rows x T new tokens over a static cache, grouped-query.
 *   qkv   [B, T, (H + 2 KV) * hd]  the fused projection (q heads, then k heads, then v heads)
 *   pos   [B, T] positions (RoPE); cos/sin [max_pos, hd / 2]
 *   kc/vc [rows, KV, S, hd] this layer's cache; row[b] is batch row b's cache row and
 *         len[b] its cached length: new token j is written at slot len[b] + j
 *   mask  NULL (causal among the new tokens) or [T, T] bytes, 1 where token i sees token j
 *   out   [B, T, H * hd]
 * Keys are visited in slot order and skipped where masked, so a tree node's sum runs over
 * the same keys in the same order as the chain through its ancestors. */
__attribute__((optimize("no-tree-vectorize")))
static void softmax_weights(float *score, int n) {
    float m = -INFINITY, total = 0.f;
    for (int s = 0; s < n; s++) if (score[s] > m) m = score[s];
    for (int s = 0; s < n; s++) { score[s] = expf(score[s] - m); total += score[s]; }
    float inv = 1.0f / total;
    for (int s = 0; s < n; s++) score[s] *= inv;
}

void lean_attention(float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                    float *kc, float *vc, const int64_t *row, const int64_t *len,
                    const uint8_t *mask, float *out, int B, int T, int H, int KV, int hd, int S,
                    float scale) {
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
            memcpy(kc + at, q + (H + g) * hd, hd * sizeof(float));
            memcpy(vc + at, q + (H + KV + g) * hd, hd * sizeof(float));
        }
    }
    /* 2. softmax(q k^T * scale) v per (row, head, token). */
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < B; b++)
        for (int ht = 0; ht < H * T; ht++) {
            int h = ht / T, t = ht % T, g = h / (H / KV);
            const float *q = qkv + ((int64_t)b * T + t) * width + h * hd;
            const float *kbase = kc + (row[b] * KV + g) * (int64_t)S * hd;
            const float *vbase = vc + (row[b] * KV + g) * (int64_t)S * hd;
            int past = (int)len[b], n = 0;
            float score[past + T];
            int64_t slot[past + T];
            for (int s = 0; s < past + T; s++) {
                int j = s - past;
                if (j >= 0 && (mask ? !mask[t * T + j] : j > t)) continue;
                score[n] = dot(q, kbase + (int64_t)s * hd, hd) * scale;
                slot[n++] = s;
            }
            softmax_weights(score, n);
            float *o = out + ((int64_t)b * T + t) * H * hd + h * hd;
            vf acc[hd / VL + 1];
            for (int d = 0; d * VL < hd; d++) acc[d] = (vf){0};
            float tail[VL] = {0};
            for (int i = 0; i < n; i++) {
                const float *v = vbase + slot[i] * hd;
                vf p = splat(score[i]);
                int d = 0;
                for (; d + VL <= hd; d += VL) acc[d / VL] = acc[d / VL] + p * load_f32(v + d);
                for (int j = 0; d + j < hd; j++) tail[j] += score[i] * v[d + j];
            }
            int d = 0;
            for (; d + VL <= hd; d += VL) store_f32(o + d, acc[d / VL]);
            for (int j = 0; d + j < hd; j++) o[d + j] = tail[j];
        }
}
