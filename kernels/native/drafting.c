/* --- The mlp speculator's greedy chain in one call ---------------------------------------
 * IBM's MLP speculator (speculator/mlp.py) drafts k tokens, stage by stage: stage i reads the
 * state s (the target's last hidden state [H] for i = 0, else the previous stage's [D]) and
 * the embedding of the previous token x (the pending token for i = 0):
 *     s = GELU(LayerNorm_i(W_i s * state_weight + E_i[x] * emb_weight)),  [D]
 *     x = vocab_ids[argmax(head_i s)]   (the draft vocabulary's id mapped to the target's;
 *                                        vocab_ids NULL: the whole vocabulary, the identity)
 * drafts[i] = x; states[i] = s when states is not NULL (what the tests compare).
 * Why one call: eager PyTorch ran a stage as some twenty small ops around its two GEMVs, about
 * 0.25 ms a stage with its weights in cache, where the GEMVs themselves stream ~4 MB.
 * work: max(H, D) + D + N floats. The argmax is the first index of the maximum, as torch's. */
#include "lean.h"

static float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

void lean_mlp_chain(const lean_mlp_stage *stages, int k, const float *hidden, int64_t token, int H, int D, int N,
                    const int64_t *vocab_ids, float state_weight, float emb_weight, float *work,
                    int64_t *drafts, float *states) {
    float *s = work, *mixed = work + (H > D ? H : D), *logits = mixed + D;
    memcpy(s, hidden, (size_t)H * sizeof(float));
    int width = H; /* the state's width: the target's for stage 0, the draft's after */
    for (int i = 0; i < k; i++) {
        const lean_mlp_stage *st = stages + i;
        lean_gemm(s, width, st->proj, st->proj_format, mixed, D, 1, width, D, 0);
        float mean = 0.f, var = 0.f;
        for (int d = 0; d < D; d++) {
            mixed[d] = mixed[d] * state_weight + kv_at(st->emb, token * D + d, st->emb_bf16) * emb_weight;
            mean += mixed[d];
        }
        mean /= D;
        for (int d = 0; d < D; d++) var += (mixed[d] - mean) * (mixed[d] - mean);
        float inv = 1.0f / sqrtf(var / D + st->eps);
        for (int d = 0; d < D; d++) s[d] = gelu((mixed[d] - mean) * inv * st->norm_weight[d] + st->norm_bias[d]);
        width = D;
        if (states) memcpy(states + (int64_t)i * D, s, (size_t)D * sizeof(float));
        lean_gemm(s, D, st->head, st->head_format, logits, N, 1, D, N, 0);
        float top;
        int64_t arg;
        row_max_arg(logits, 0, N, 0, &top, &arg);
        token = vocab_ids ? vocab_ids[arg] : arg;
        drafts[i] = token;
    }
}
