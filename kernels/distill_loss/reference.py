"""Fused linear + distillation loss in plain torch, chunked over the vocabulary.

The reference the Triton kernel is checked against, and the CPU path in its own right: the
[N, V] logits are never built, only [N, C] slices of them (C = `chunk_size` columns), so its
peak memory does not grow with V.

Notation, per row n (a trained position): h = draft hidden [D], W = draft head [V, D];
g = target hidden [H], U = the target's frozen LM head rows [V, H] (the draft vocabulary's).

    z = W h                         draft logits,  q = softmax(z)
    t = U g                         target logits, p = softmax(t)
    lse(x) = log sum_v exp(x_v), computed online: m <- max(m, max_c x), s <- s e^{m_old - m} + sum_c e^{x - m}

Objectives (`kind`):

    "kl":  KL(p || q) = sum_v p_v (t_v - z_v) - lse(t) + lse(z)
           with sum_v p_v (t_v - z_v) = a / s_t, a = sum_v e^{t_v - m_t} (t_v - z_v) rescaled online
    "ce":  -log q_y = lse(z) - z_y, y = argmax t (first index on ties, as torch.argmax)

Closed-form gradient, for an upstream gradient gamma_n of row n's loss:

    dL/dz = gamma (q - p)            ("kl")       dL/dz = gamma (q - onehot(y))   ("ce")
    dL/dh = W^T dL/dz   [D]          dL/dW = dL/dz h^T   [V, D] (summed over rows)

so the backward only needs lse(z), lse(t) and y per row ([N] each) and recomputes each
chunk's logits: compute is traded (the logits are formed twice) for never holding [N, V].
The target side is frozen and gets no gradient.

Logits are accumulated in float32 whatever the input dtype (bf16 inputs are upcast chunk by
chunk), as the Triton kernel's tl.dot accumulates.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

DistillKind = Literal["kl", "ce"]
DEFAULT_CHUNK = 4096  # columns per chunk: [N, 4096] fp32 slices, 134 MB at N = 8,192


def _logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [N, d], [C, d] -> [N, C] fp32
    return F.linear(hidden, weight.float())


class ChunkedDistillLoss(torch.autograd.Function):
    """(draft_hidden [N, D], draft_weight [V, D], target_hidden [N, H], target_weight [V, H])
    -> (loss [N] fp32, draft argmax [N] long, target argmax [N] long)."""

    @staticmethod
    def forward(ctx, draft_hidden, draft_weight, target_hidden, target_weight, kind: DistillKind, chunk_size: int):
        h, g = draft_hidden.float(), target_hidden.float()  # [N, D], [N, H]
        N, V = h.shape[0], draft_weight.shape[0]
        ninf = torch.full((N,), float("-inf"), device=h.device)
        m_z, s_z, m_t, s_t = ninf.clone(), h.new_zeros(N), ninf.clone(), h.new_zeros(N)
        a = h.new_zeros(N)  # sum_v e^{t_v - m_t} (t_v - z_v), "kl"
        z_at_y = h.new_zeros(N)  # z at the running target argmax, "ce"
        arg_z = torch.zeros(N, dtype=torch.long, device=h.device)
        arg_t = torch.zeros_like(arg_z)
        for c0 in range(0, V, chunk_size):
            z = _logits(h, draft_weight[c0:c0 + chunk_size])  # [N, C]
            t = _logits(g, target_weight[c0:c0 + chunk_size])  # [N, C]
            cmax_z, carg_z = z.max(-1)
            cmax_t, carg_t = t.max(-1)
            # Strictly greater: an earlier chunk keeps a tie, so the first index wins as in argmax.
            arg_z = torch.where(cmax_z > m_z, carg_z + c0, arg_z)
            take = cmax_t > m_t
            arg_t = torch.where(take, carg_t + c0, arg_t)
            z_at_y = torch.where(take, z.gather(1, carg_t[:, None]).squeeze(1), z_at_y)
            new_m_z, new_m_t = torch.maximum(m_z, cmax_z), torch.maximum(m_t, cmax_t)
            s_z = s_z * (m_z - new_m_z).exp() + (z - new_m_z[:, None]).exp().sum(-1)
            scale_t = (m_t - new_m_t).exp()
            e_t = (t - new_m_t[:, None]).exp_()  # [N, C]
            s_t = s_t * scale_t + e_t.sum(-1)
            if kind == "kl":
                a = a * scale_t + (e_t * (t - z)).sum(-1)
            m_z, m_t = new_m_z, new_m_t
            del z, t, e_t
        lse_z, lse_t = m_z + s_z.log(), m_t + s_t.log()
        loss = a / s_t - lse_t + lse_z if kind == "kl" else lse_z - z_at_y
        ctx.save_for_backward(draft_hidden, draft_weight, target_hidden, target_weight, lse_z, lse_t, arg_t)
        ctx.kind, ctx.chunk_size = kind, chunk_size
        ctx.mark_non_differentiable(arg_z, arg_t)
        return loss, arg_z, arg_t

    @staticmethod
    def backward(ctx, grad_loss, _grad_arg_z, _grad_arg_t):
        draft_hidden, draft_weight, target_hidden, target_weight, lse_z, lse_t, arg_t = ctx.saved_tensors
        h, g = draft_hidden.float(), target_hidden.float()
        gamma = grad_loss.float()[:, None]  # [N, 1]
        grad_h = torch.zeros_like(h)  # [N, D]
        grad_w = torch.zeros(draft_weight.shape, dtype=torch.float32, device=h.device) \
            if ctx.needs_input_grad[1] else None  # [V, D]
        rows = torch.arange(h.shape[0], device=h.device)
        for c0 in range(0, draft_weight.shape[0], ctx.chunk_size):
            w = draft_weight[c0:c0 + ctx.chunk_size]
            grad_z = (_logits(h, w) - lse_z[:, None]).exp_()  # q  [N, C]
            if ctx.kind == "kl":
                grad_z -= (_logits(g, target_weight[c0:c0 + ctx.chunk_size]) - lse_t[:, None]).exp_()
            else:
                inside = (arg_t >= c0) & (arg_t < c0 + w.shape[0])
                grad_z[rows[inside], arg_t[inside] - c0] -= 1.0
            grad_z *= gamma
            grad_h.addmm_(grad_z, w.float())
            if grad_w is not None:
                grad_w[c0:c0 + w.shape[0]] = grad_z.T @ h
            del grad_z
        return (grad_h.to(draft_hidden.dtype) if ctx.needs_input_grad[0] else None,
                grad_w.to(draft_weight.dtype) if grad_w is not None else None, None, None, None, None)


def distill_loss_reference(
    draft_hidden: torch.Tensor,  # [N, D]
    draft_weight: torch.Tensor,  # [V, D]
    target_hidden: torch.Tensor,  # [N, H]
    target_weight: torch.Tensor,  # [V, H], frozen
    kind: DistillKind = "kl",
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row loss [N] fp32, draft argmax [N], target argmax [N]; see the module docstring."""
    return ChunkedDistillLoss.apply(draft_hidden, draft_weight, target_hidden, target_weight, kind, chunk_size)


def distill_loss_naive(
    draft_hidden: torch.Tensor, draft_weight: torch.Tensor, target_hidden: torch.Tensor,
    target_weight: torch.Tensor, kind: DistillKind = "kl",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unfused computation (full [N, V] logits, autograd through log_softmax): the baseline
    the fused op is benchmarked and tested against."""
    z = _logits(draft_hidden.float(), draft_weight)  # [N, V]
    with torch.no_grad():
        t = _logits(target_hidden.float(), target_weight)  # [N, V]
    log_q = F.log_softmax(z, -1)
    if kind == "kl":
        log_p = F.log_softmax(t, -1)
        loss = (log_p.exp() * (log_p - log_q)).sum(-1)
    else:
        loss = -log_q.gather(1, t.argmax(-1, keepdim=True)).squeeze(1)
    return loss, z.detach().argmax(-1), t.argmax(-1)
