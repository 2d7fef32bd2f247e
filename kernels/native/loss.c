/* --- Training: forward KL over a vocabulary, fused ------------------------------------------
 * Per row n of draft logits d[N, V] (fp32, or bf16 where d_bf16) and the target's row
 * t[t_rows[n]] (t[n] where t_rows is NULL: the rows of a later draft step are a subset):
 *   loss[n] = KL(p || q) = sum_v p_v (log p_v - log q_v), p = softmax(t), q = softmax(d),
 *   grad[n] = q - p (d loss / d d; the caller scales it by the upstream gradient),
 *   d_arg[n], t_arg[n] = the first index of each row's maximum (the metrics' agreement).
 * Why fused: torch computes this as log_softmax twice, exp, a subtraction, a product and a
 * sum forward, then their backward, each a pass over [N, V] in memory: at SmolLM2's shapes
 * ([~500, 8192] per draft step) those passes were ~60% of an mlp training step. Here a row is
 * read three times and written once, with the vector exp (lean.h). Not batch-invariant work
 * (training needs none): rows split across threads. */
#include "lean.h"

void lean_forward_kl(const void *d, int d_bf16, const float *t, const int64_t *t_rows, int N, int V, float *loss,
                     float *grad, int64_t *d_arg, int64_t *t_arg) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int64_t at = (int64_t)n * V, t_at = (t_rows ? t_rows[n] : n) * (int64_t)V; /* target row read in place */
        const float *tn = t + t_at;
        float *gn = grad + at, md, mt;
        row_max_arg(d, at, V, d_bf16, &md, d_arg + n);
        row_max_arg(t, t_at, V, 0, &mt, t_arg + n);
        vf sd = (vf){0}, st = (vf){0}, cross = (vf){0};
        int v = 0;
        for (; v + VL <= V; v += VL) { /* e^(d - md) kept in grad; sums of both and of e_t (t - d) */
            vf dv = load_kv(d, at + v, d_bf16), tv = load_f32(tn + v);
            vf ed = vexp(dv - md), et = vexp(tv - mt);
            store_f32(gn + v, ed);
            sd = sd + ed, st = st + et, cross = et * (tv - dv) + cross;
        }
        float sum_d = hsum(sd), sum_t = hsum(st), sum_cross = hsum(cross);
        for (; v < V; v++) {
            float dv = kv_at(d, at + v, d_bf16), tv = tn[v], ed = expf(dv - md), et = expf(tv - mt);
            gn[v] = ed;
            sum_d += ed, sum_t += et, sum_cross += et * (tv - dv);
        }
        /* sum p (log p - log q) = sum p (t - d) - (mt + log sum_t) + (md + log sum_d), as sum p = 1 */
        loss[n] = sum_cross / sum_t - (mt + logf(sum_t)) + (md + logf(sum_d));
        vf inv_d = splat(1.0f / sum_d), inv_t = splat(1.0f / sum_t);
        for (v = 0; v + VL <= V; v += VL)
            store_f32(gn + v, load_f32(gn + v) * inv_d - vexp(load_f32(tn + v) - mt) * inv_t);
        for (; v < V; v++) gn[v] = gn[v] / sum_d - expf(tn[v] - mt) / sum_t;
    }
}
