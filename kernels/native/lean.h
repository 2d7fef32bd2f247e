/* The native CPU library's one header: what every source file shares (the vector types
 * and the tile shape this build compiles for, the exact loads and the vector exp and sums
 * whose bits every kernel relies on) and the prototype of every exported function.
 *
 * Every exported function is declared here and its ctypes signature once, in __init__.py's
 * SIGNATURES; tests/kernels/native/test_signatures.py parses these prototypes and fails
 * when the two disagree, so a changed argument list cannot load silently.
 *
 * The library is one shared object built from decoder.c (the lean decoder's kernels),
 * loss.c (a training loss) and drafting.c (a draft family's chain); __init__.py compiles
 * them together with the machine's own compiler and flags.
 */
#ifndef LEAN_H
#define LEAN_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define BF16_DOT 1
#else
#define BF16_DOT 0
#endif

#if defined(__AVX512F__)
/* Micro-tile: RB vectors of outputs (NR = RB * VL) by TB rows (tokens), RB * TB accumulators
 * in registers. AVX-512 (32 registers): 2 x 12. Why: verification passes are 5-9 tokens, and
 * a 6-row tile walked an 8-token pass's panels twice, the second walk (2 rows) with no memory
 * traffic under it. On an AVX512-BF16 Xeon the 2 x 12 tile made SmolLM2 passes of 8-12 tokens
 * 1.19-1.20x faster than 4 x 6 with bf16 weights widened (2-5 tokens 1.08-1.09x; fp32
 * weights 1.04-1.22x at 1-12 tokens); 2 x 8, 2 x 10 and 2 x 14 were slower (docs/results.md).
 * AVX2 (16 registers): 2 x 6. */
#define VL 16 /* floats per vector register */
#define RB 2
#define TB 12
#else
#define VL 8
#define RB 2
#define TB 6
#endif
#define NR (RB * VL)
_Static_assert(RB % 2 == 0, "bf16 panels hold vectors in pairs (load2_bf16)");

typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

/* A GEMM's weight format, as the caller packed it (ops.py NativeOps.pack). */
enum lean_weights { LEAN_FP32 = 0, LEAN_BF16_WIDENED = 1, LEAN_BF16_PAIRS = 2, LEAN_BF16_AMX = 3 };

static inline vf load_f32(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void store_f32(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* Keys and values in the KV cache: fp32, or bf16 (bf16 = 1), the upper half of an fp32 word.
 * Why bf16: batched generation of a bf16 target reads every row's keys and values once a
 * step, half of a 128-row step's time in fp32; a bf16 cache halves the bytes, at the
 * precision transformers keeps a bf16 model's cache in. Element i of the cache at p. */
static inline __attribute__((always_inline)) vf load_kv(const void *p, int64_t i, int bf16) {
    if (!bf16) return load_f32((const float *)p + i);
    const uint16_t *h = (const uint16_t *)p + i;
#if defined(__AVX512F__)
    return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)), 16));
#elif defined(__AVX2__)
    return (vf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16));
#else
    vu u;
    for (int j = 0; j < VL; j++) u[j] = (uint32_t)h[j] << 16;
    vf v; memcpy(&v, &u, sizeof v); return v;
#endif
}
static inline __attribute__((always_inline)) float kv_at(const void *p, int64_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f; memcpy(&f, &u, sizeof f); return f;
}
/* A vector of x in every lane: one broadcast (`(vf){0} + x` compiled to an add and a
 * broadcast, a lane-by-lane fill to eight inserts). */
static inline vf splat(float x) {
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(x);
#elif defined(__AVX__)
    return (vf)_mm256_set1_ps(x);
#else
    return (vf){0} + x;
#endif
}

/* exp(x) per lane, one instruction sequence for every lane (Cephes' expf: x = n ln2 + r,
 * |r| <= ln2/2, a degree-7 polynomial for e^r, then 2^n through the exponent bits; within
 * 2 ulp of expf). Why our own: glibc's expf is scalar, and softmax and SiLU called it ~100k
 * times per token (a tenth of a decode step). Lanes never interact, so an element's value
 * does not depend on where it sits in a vector: a tail padded to a full vector gives the same
 * bits as a full one. Below -87.3 (where expf turns denormal) it is 0, so exp(-inf) = 0. */
typedef int32_t vi __attribute__((vector_size(VL * 4)));
static inline vf vselect(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline vf vmin(vf a, vf b) { return vselect(a < b, a, b); }
static inline vf vexp(vf x) {
    const vf hi = splat(88.3762626647949f), lo = splat(-87.3365478515625f);
    vi zero = x < lo; /* lanes of all ones where the result is 0 */
    x = vmin(vmax(x, lo), hi);
    vf n = x * 1.44269504088896341f + 12582912.0f; /* round(x / ln2) by the 1.5 * 2^23 shift */
    n = n - 12582912.0f;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vf e = p * (vf)((__builtin_convertvector(n, vi) + 127) << 23);
    return (vf)((vi)e & ~zero);
}

/* Sum of a vector's lanes by halving (a fixed tree: the same order for every call). */
static inline float hsum(vf v) {
    float lanes[VL];
    memcpy(lanes, &v, sizeof lanes);
    for (int w = VL / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) lanes[j] += lanes[j + w];
    return lanes[0];
}

/* The largest value of row x[at .. at + V) (fp32, or bf16 where bf16) and the first index of
 * it, as torch's argmax: the training loss's agreement metric and the mlp chain's greedy token. */
static inline void row_max_arg(const void *x, int64_t at, int V, int bf16, float *top, int64_t *arg) {
    vf m = splat(-INFINITY);
    vi idx = (vi){0}, pos;
    for (int j = 0; j < VL; j++) pos[j] = j;
    int v = 0;
    for (; v + VL <= V; v += VL, pos = pos + VL) {
        vf x_ = load_kv(x, at + v, bf16);
        vi up = x_ > m; /* strictly greater: each lane keeps its first maximum */
        m = vselect(up, x_, m);
        idx = (up & pos) | (~up & idx);
    }
    float best = -INFINITY;
    int64_t where = 0;
    for (int j = 0; j < VL; j++) /* lanes hold increasing indices: the smallest index of a tie */
        if (m[j] > best || (m[j] == best && idx[j] < where)) { best = m[j]; where = idx[j]; }
    for (; v < V; v++) {
        float x_ = kv_at(x, at + v, bf16);
        if (x_ > best) { best = x_; where = v; }
    }
    *top = best, *arg = where;
}

/* One decoder layer's weights, as lean_layers reads them (ops.py LayerStack). */
typedef struct {
    const float *attn_norm, *qkv_bias, *mlp_norm;
    const void *qkv, *o, *gate_up, *down;
} lean_layer;

/* One stage of the mlp speculator's chain, as lean_mlp_chain reads it (mlp_chain.py NativeMLPChain). */
typedef struct {
    const void *proj, *emb, *head; /* packed [D, H or D]; table [V, D]; packed [N, D] */
    const float *norm_weight, *norm_bias; /* [D] each */
    int proj_format, emb_bf16, head_format;
    float eps; /* the LayerNorm's */
} lean_mlp_stage;

/* --- Exported: decoder.c ------------------------------------------------------------------- */
int lean_vector_len(void);
int lean_pack_width(void);
int lean_bf16_dot(void);
int lean_amx(void);
void lean_gemm(const float *x, int64_t ldx, const void *w, int weights, float *y, int64_t ldy,
               int M, int K, int N, int accumulate);
void lean_rmsnorm(const float *x, const float *weight, float *y, int M, int D, float eps);
void lean_silu_mul(const float *gu, float *out, int M, int I);
void lean_attention(float *qkv, const int64_t *pos, const float *cos_t, const float *sin_t,
                    void *kc, void *vc, const int64_t *row, const int64_t *len,
                    const uint8_t *mask, float *out, int B, int T, int H, int KV, int hd, int S,
                    float scale, int kv_bf16);
void lean_layers(const lean_layer *layers, int l0, int l1, int weights, float *x, int B, int T, int D, int Nqkv,
                 int I, float eps, void *kc, void *vc, int64_t layer_stride, int kv_bf16, const int64_t *pos,
                 const float *cos_t, const float *sin_t, const int64_t *row, const int64_t *len,
                 const uint8_t *mask, int H, int KV, int hd, int S, float scale, float *scratch);
/* --- Exported: loss.c ---------------------------------------------------------------------- */
void lean_forward_kl(const void *d, int d_bf16, const float *t, const int64_t *t_rows, int N, int V, float *loss,
                     float *grad, int64_t *d_arg, int64_t *t_arg);
/* --- Exported: drafting.c ------------------------------------------------------------------ */
void lean_mlp_chain(const lean_mlp_stage *stages, int k, const float *hidden, int64_t token, int H, int D, int N,
                    const int64_t *vocab_ids, float state_weight, float emb_weight, float *work,
                    int64_t *drafts, float *states);

#endif
