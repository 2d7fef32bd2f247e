"""Fused linear + distillation loss as Triton kernels (maths and gradient: reference.py).

Forward: one program per block of BLOCK_N rows walks the vocabulary in BLOCK_V tiles; each
tile's draft and target logits are formed in registers by tl.dot over the hidden sizes and
folded into the online log-sum-exp state, so no logits ever reach global memory.

Backward: one program per (row block, vocabulary tile) recomputes that tile's logits, forms
dL/dz = gamma (q - p) there and adds its contributions to dL/dh and dL/dW with atomic adds
(float32 buffers; the order of the additions, hence the last bits, is not deterministic).

Under TRITON_INTERPRET=1 (CPU tests), tiles are upcast to float32 before tl.dot: the
interpreter's bf16 dot is wrong. On a GPU, bf16 products are exact in the fp32 accumulator,
so the upcast changes only the summation order; fp32 inputs use IEEE (not TF32) dots so
that they match the fp32 reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

from .reference import DistillKind

_KINDS = {"kl": 0, "ce": 1}


def _interpreting() -> bool:
    return bool(knobs.runtime.interpret)


@triton.jit
def _logits_tile(h_ptr, w_ptr, rows, cols, N, V, D,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                 UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """[BLOCK_N, BLOCK_V] fp32 tile of h[rows] @ w[cols]^T, h [N, D] and w [V, D] row-major."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    ds = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + ds
        h = tl.load(h_ptr + rows[:, None] * D + dd[None, :], mask=(rows[:, None] < N) & (dd[None, :] < D), other=0.0)
        w = tl.load(w_ptr + cols[:, None] * D + dd[None, :], mask=(cols[:, None] < V) & (dd[None, :] < D), other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _distill_fwd(hd_ptr, wd_ptr, ht_ptr, wt_ptr, loss_ptr, lse_z_ptr, lse_t_ptr, arg_z_ptr, arg_t_ptr,
                 N, V, D, H, KIND: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                 UPCAST: tl.constexpr, PREC_D: tl.constexpr, PREC_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_z = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    m_t = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s_z = tl.zeros((BLOCK_N,), tl.float32)
    s_t = tl.zeros((BLOCK_N,), tl.float32)
    a = tl.zeros((BLOCK_N,), tl.float32)
    z_at_y = tl.zeros((BLOCK_N,), tl.float32)
    arg_z = tl.zeros((BLOCK_N,), tl.int32)
    arg_t = tl.zeros((BLOCK_N,), tl.int32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        inside = (cols < V)[None, :]
        z = _logits_tile(hd_ptr, wd_ptr, rows, cols, N, V, D, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST, PREC_D)
        t = _logits_tile(ht_ptr, wt_ptr, rows, cols, N, V, H, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST, PREC_T)
        if KIND == 0:
            diff = t - z  # before the -inf padding: outside the vocabulary both tiles are 0
        z = tl.where(inside, z, float("-inf"))
        t = tl.where(inside, t, float("-inf"))
        cmax_z = tl.max(z, axis=1)
        cmax_t = tl.max(t, axis=1)
        carg_z = tl.argmax(z, axis=1).to(tl.int32) + v0
        carg_t = tl.argmax(t, axis=1).to(tl.int32) + v0
        # Strictly greater: an earlier tile keeps a tie, so the first index wins as in torch.argmax.
        arg_z = tl.where(cmax_z > m_z, carg_z, arg_z)
        take = cmax_t > m_t
        arg_t = tl.where(take, carg_t, arg_t)
        z_here = tl.sum(tl.where(cols[None, :] == carg_t[:, None], z, 0.0), axis=1)
        z_at_y = tl.where(take, z_here, z_at_y)
        new_m_z = tl.maximum(m_z, cmax_z)
        new_m_t = tl.maximum(m_t, cmax_t)
        s_z = s_z * tl.exp(m_z - new_m_z) + tl.sum(tl.exp(z - new_m_z[:, None]), axis=1)
        scale_t = tl.exp(m_t - new_m_t)
        e_t = tl.exp(t - new_m_t[:, None])  # 0 outside the vocabulary
        s_t = s_t * scale_t + tl.sum(e_t, axis=1)
        if KIND == 0:
            a = a * scale_t + tl.sum(e_t * diff, axis=1)
        m_z = new_m_z
        m_t = new_m_t
    lse_z = m_z + tl.log(s_z)
    lse_t = m_t + tl.log(s_t)
    if KIND == 0:
        loss = a / s_t - lse_t + lse_z
    else:
        loss = lse_z - z_at_y
    ok = rows < N
    tl.store(loss_ptr + rows, loss, mask=ok)
    tl.store(lse_z_ptr + rows, lse_z, mask=ok)
    tl.store(lse_t_ptr + rows, lse_t, mask=ok)
    tl.store(arg_z_ptr + rows, arg_z, mask=ok)
    tl.store(arg_t_ptr + rows, arg_t, mask=ok)


@triton.jit
def _distill_bwd(hd_ptr, wd_ptr, ht_ptr, wt_ptr, gamma_ptr, lse_z_ptr, lse_t_ptr, arg_t_ptr, grad_h_ptr, grad_w_ptr,
                 N, V, D, H, KIND: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                 UPCAST: tl.constexpr, PREC_D: tl.constexpr, PREC_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < N
    col_ok = cols < V
    z = _logits_tile(hd_ptr, wd_ptr, rows, cols, N, V, D, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST, PREC_D)
    lse_z = tl.load(lse_z_ptr + rows, mask=row_ok, other=0.0)
    gamma = tl.load(gamma_ptr + rows, mask=row_ok, other=0.0)
    grad_z = tl.exp(z - lse_z[:, None])  # q
    if KIND == 0:
        t = _logits_tile(ht_ptr, wt_ptr, rows, cols, N, V, H, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST, PREC_T)
        lse_t = tl.load(lse_t_ptr + rows, mask=row_ok, other=0.0)
        grad_z = grad_z - tl.exp(t - lse_t[:, None])
    else:
        y = tl.load(arg_t_ptr + rows, mask=row_ok, other=-1)
        grad_z = grad_z - tl.where(cols[None, :] == y[:, None], 1.0, 0.0)
    grad_z = tl.where(row_ok[:, None] & col_ok[None, :], grad_z * gamma[:, None], 0.0)
    ds = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + ds
        d_ok = dd < D
        h = tl.load(hd_ptr + rows[:, None] * D + dd[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        w = tl.load(wd_ptr + cols[:, None] * D + dd[None, :], mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            g = grad_z
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        else:
            g = grad_z.to(h.dtype)  # bf16 tensor-core dots on a GPU; fp32 stays fp32
        dh = tl.dot(g, w, input_precision=PREC_D)  # [BLOCK_N, BLOCK_D]
        tl.atomic_add(grad_h_ptr + rows[:, None] * D + dd[None, :], dh, mask=row_ok[:, None] & d_ok[None, :])
        dw = tl.dot(tl.trans(g), h, input_precision=PREC_D)  # [BLOCK_V, BLOCK_D]
        tl.atomic_add(grad_w_ptr + cols[:, None] * D + dd[None, :], dw, mask=col_ok[:, None] & d_ok[None, :])


def _launch_config(interpreting: bool) -> dict:
    # tl.dot needs every tile side >= 16. Small tiles keep the interpreter quick; the GPU tiles
    # are a reasonable untuned default (no GPU was available to tune them).
    if interpreting:
        return dict(BLOCK_N=16, BLOCK_V=64, BLOCK_D=32)
    return dict(BLOCK_N=64, BLOCK_V=128, BLOCK_D=64, num_warps=8)


def _precision(dtype: torch.dtype) -> str | None:
    return "ieee" if dtype == torch.float32 else None  # None: the default, for 16-bit inputs


class TritonDistillLoss(torch.autograd.Function):
    """Same contract as reference.ChunkedDistillLoss; chunk_size (a power of two >= 16, or
    None for the default) is the vocabulary tile BLOCK_V."""

    @staticmethod
    def forward(ctx, draft_hidden, draft_weight, target_hidden, target_weight, kind: DistillKind,
                chunk_size: int | None):
        hd, wd = draft_hidden.contiguous(), draft_weight.contiguous()
        ht, wt = target_hidden.to(target_weight.dtype).contiguous(), target_weight.contiguous()
        assert hd.dtype == wd.dtype, f"draft hidden {hd.dtype} and head {wd.dtype} must share a dtype"
        (N, D), (V, H) = hd.shape, wt.shape
        assert wd.shape[0] == V and ht.shape == (N, H), "draft and target heads must cover the same vocabulary"
        interp = _interpreting()
        cfg = _launch_config(interp)
        if chunk_size is not None:
            assert chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0, "Triton tiles are powers of two >= 16"
            cfg["BLOCK_V"] = chunk_size
        extra = dict(UPCAST=interp, PREC_D=_precision(hd.dtype), PREC_T=_precision(ht.dtype))
        loss, lse_z, lse_t = (torch.empty(N, dtype=torch.float32, device=hd.device) for _ in range(3))
        arg_z, arg_t = (torch.empty(N, dtype=torch.int32, device=hd.device) for _ in range(2))
        grid = (triton.cdiv(N, cfg["BLOCK_N"]),)
        _distill_fwd[grid](hd, wd, ht, wt, loss, lse_z, lse_t, arg_z, arg_t, N, V, D, H, _KINDS[kind], **cfg, **extra)
        ctx.save_for_backward(hd, wd, ht, wt, lse_z, lse_t, arg_t)
        ctx.kind, ctx.cfg, ctx.extra = kind, cfg, extra
        arg_z, arg_t_long = arg_z.long(), arg_t.long()
        ctx.mark_non_differentiable(arg_z, arg_t_long)
        return loss, arg_z, arg_t_long

    @staticmethod
    def backward(ctx, grad_loss, _grad_arg_z, _grad_arg_t):
        hd, wd, ht, wt, lse_z, lse_t, arg_t = ctx.saved_tensors
        (N, D), V = hd.shape, wd.shape[0]
        grad_h = torch.zeros(N, D, dtype=torch.float32, device=hd.device)
        grad_w = torch.zeros(V, D, dtype=torch.float32, device=hd.device)
        cfg = ctx.cfg
        grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(V, cfg["BLOCK_V"]))
        _distill_bwd[grid](hd, wd, ht, wt, grad_loss.float().contiguous(), lse_z, lse_t, arg_t, grad_h, grad_w,
                           N, V, D, ht.shape[1], _KINDS[ctx.kind], **cfg, **ctx.extra)
        return (grad_h.to(hd.dtype) if ctx.needs_input_grad[0] else None,
                grad_w.to(wd.dtype) if ctx.needs_input_grad[1] else None, None, None, None, None)


def distill_loss_triton(draft_hidden, draft_weight, target_hidden, target_weight,
                        kind: DistillKind = "kl", chunk_size: int | None = None):
    """Per-row loss [N] fp32, draft argmax [N], target argmax [N] (reference.py's contract)."""
    return TritonDistillLoss.apply(draft_hidden, draft_weight, target_hidden, target_weight, kind, chunk_size)
