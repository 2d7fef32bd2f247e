"""Greedy and rejection-sampling verification in one Triton kernel (rules: reference.py).

One program per sequence b walks the vocabulary in BLOCK_V tiles; nothing [B, k+1, V]-sized
is written, and the decisions never leave the device (no host sync):

    greedy: a running argmax per position i (first index on ties, as torch.argmax);
            n = leading run of d_{i+1} == argmax_i; next = argmax_n.
    sample: per position i < k an online (max, sum) of the target logits gives
            p_i(d) = exp(t_d - m) / s; accept iff u_i < min(1, p_i(d) / q_i(d)).
            At row n, a second pass forms r = max(0, p_n - q_n) (q_k = 0: the bonus is drawn
            from p_k), its total R, and a third counts the prefixes with cumsum(r) <= u_k R:
            that count is the smallest j with cumsum(r)[j] > u_k R. An empty residual falls
            back to p_n; a count past the end takes the last token with weight, as the
            reference does.

The cumulative sum runs tile by tile (tl.cumsum inside a tile plus the running total), so its
last bits can differ from torch.cumsum's; with the same randoms the decisions agree except
when u lands within float rounding of a boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

_MODES = {"greedy": 0, "sample": 1}


@triton.jit
def _row_max_sum(logit_ptr, V, BLOCK_V: tl.constexpr):
    """Online (max, sum of exp(x - max), first argmax) of one row of V logits, in fp32."""
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    arg = tl.zeros([], tl.int32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(logit_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        cmax = tl.max(x, axis=0)
        carg = tl.argmax(x, axis=0).to(tl.int32) + v0
        arg = tl.where(cmax > m, carg, arg)  # strictly greater: first index wins ties
        new_m = tl.maximum(m, cmax)
        # A row masked to -inf up to here has m = new_m = -inf: keep s at 0, not exp(NaN).
        s = tl.where(new_m == float("-inf"), 0.0, s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), axis=0))
        m = new_m
    return m, s, arg


@triton.jit
def _probs_tile(row_ptr, q_row_ptr, cols, m, s, V, q_len):
    """p and q of one tile in fp32; q is 0 from column q_len on (q_len = 0: no q at all)."""
    p = tl.exp(tl.load(row_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32) - m) / s
    q = tl.load(q_row_ptr + cols, mask=cols < q_len, other=0.0).to(tl.float32)
    return p, q


@triton.jit
def _verify_kernel(draft_ptr, q_ptr, logit_ptr, u_ptr, n_ptr, next_ptr, K, V,
                   MODE: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    logits_b = logit_ptr + b * (K + 1) * V  # [k+1, V]
    q_b = q_ptr + b * K * V  # [k, V]
    n = tl.zeros([], tl.int32) + K
    rejected = tl.zeros([], tl.int32)
    for i in range(0, K):
        d = tl.load(draft_ptr + b * K + i)
        m, s, arg = _row_max_sum(logits_b + i * V, V, BLOCK_V)
        if MODE == 0:
            ok = arg == d
        else:
            p_d = tl.exp(tl.load(logits_b + i * V + d).to(tl.float32) - m) / s
            q_d = tl.load(q_b + i * V + d).to(tl.float32)
            # u < min(1, p/q) is u < p/q since u < 1: q = 0 gives inf (accept), 0/0 NaN (reject),
            # exactly as the reference's clamp; tl.minimum would drop the NaN.
            ok = tl.load(u_ptr + b * (K + 1) + i) < p_d / q_d
        first_reject = (rejected == 0) & (ok == 0)
        n = tl.where(first_reject, i, n)
        rejected = tl.where(first_reject, 1, rejected)
    m, s, arg = _row_max_sum(logits_b + n * V, V, BLOCK_V)
    if MODE == 0:
        token = arg
    else:
        row, q_row = logits_b + n * V, q_b + n * V
        q_len = tl.where(n < K, V, 0)  # q_k = 0: at the bonus row the residual is p itself
        total_r = tl.zeros([], tl.float32)
        total_p = tl.zeros([], tl.float32)
        last_r = tl.zeros([], tl.int32)
        last_p = tl.zeros([], tl.int32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            p, q = _probs_tile(row, q_row, cols, m, s, V, q_len)
            r = tl.maximum(p - q, 0.0)
            total_r += tl.sum(r, axis=0)
            total_p += tl.sum(p, axis=0)
            last_r = tl.maximum(last_r, tl.max(tl.where(r > 0, cols, -1), axis=0))
            last_p = tl.maximum(last_p, tl.max(tl.where(p > 0, cols, -1), axis=0))
        # A rejection implies some p > q; only rounding empties the residual, then p is used.
        use_p = total_r <= 0
        total = tl.where(use_p, total_p, total_r)
        last = tl.where(use_p, last_p, last_r)
        threshold = tl.load(u_ptr + b * (K + 1) + K) * total
        below = tl.zeros([], tl.int32)
        running = tl.zeros([], tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            p, q = _probs_tile(row, q_row, cols, m, s, V, tl.where(use_p, 0, q_len))
            r = tl.maximum(p - q, 0.0)
            cdf = running + tl.cumsum(r, axis=0)
            below += tl.sum(tl.where((cols < V) & (cdf <= threshold), 1, 0), axis=0)
            running += tl.sum(r, axis=0)
        token = tl.where(below >= V, last, below)
    tl.store(n_ptr + b, n.to(tl.int64))
    tl.store(next_ptr + b, token.to(tl.int64))


def verify_triton(
    draft_tokens: torch.Tensor,  # [B, k] long
    draft_probs: torch.Tensor | None,  # [B, k, V]; "sample" only
    target_logits: torch.Tensor,  # [B, k+1, V]; warped for "sample"
    mode: str = "greedy",
    randoms: torch.Tensor | None = None,  # [B, k+1] in [0, 1); "sample" only
    block_v: int | None = None,  # vocabulary tile, a power of two; None: 1024 (GPU) / 256 (interpreter)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_accepted [B] long, next_token [B] long), the contract of reference.py."""
    batch, k = draft_tokens.shape
    if target_logits.shape[:2] != (batch, k + 1):
        raise ValueError(f"target_logits must be [B, k+1, V] = [{batch}, {k + 1}, V]; got {tuple(target_logits.shape)}")
    vocab = target_logits.shape[-1]
    if mode == "sample":
        if draft_probs is None or randoms is None:
            raise ValueError("verify_triton(mode='sample') needs draft_probs [B, k, V] and randoms [B, k+1]")
        if draft_probs.shape != (batch, k, vocab) or randoms.shape != (batch, k + 1):
            raise ValueError(f"draft_probs must be [{batch}, {k}, {vocab}] and randoms [{batch}, {k + 1}]; got "
                             f"{tuple(draft_probs.shape)} and {tuple(randoms.shape)}")
        q, u = draft_probs.contiguous(), randoms.float().contiguous()
    elif mode == "greedy":
        q = u = target_logits  # unread placeholders: the greedy branch is compiled out
    else:
        raise NotImplementedError(f"verify mode {mode!r}; valid: greedy, sample")
    if block_v is None:
        block_v = 256 if knobs.runtime.interpret else 1024
    n = torch.empty(batch, dtype=torch.long, device=target_logits.device)
    next_token = torch.empty_like(n)
    if batch:
        _verify_kernel[(batch,)](draft_tokens.contiguous(), q, target_logits.contiguous(), u, n, next_token,
                                 k, vocab, MODE=_MODES[mode], BLOCK_V=block_v)
    return n, next_token
