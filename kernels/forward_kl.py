"""Forward KL over given logits, with both argmaxes, fused on the CPU.

`forward_kl_rows(draft_logits, target_logits)` -> (loss [N], draft argmax [N], target argmax
[N]): the unfused objective of `Speculator.token_loss` (training/losses.py `forward_kl`), in
one native pass per row (native/loss.c `lean_forward_kl`) where the CPU kernels
are built, and in torch elsewhere (CUDA, or no compiler). The native pass also writes the
gradient q - p, which backward scales: no log-probabilities are kept for autograd.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import native


def forward_kl_torch(draft_logits: torch.Tensor, target_logits: torch.Tensor, target_rows=None):
    """The reference: KL(p || q) per row, p = softmax(target), q = softmax(draft); first
    argmaxes. Draft row n goes with target row target_rows[n] (n where None)."""
    if target_rows is not None:
        target_logits = target_logits[target_rows]
    log_q = F.log_softmax(draft_logits.float(), -1)
    log_p = F.log_softmax(target_logits.float(), -1)
    loss = (log_p.exp() * (log_p - log_q)).sum(-1)
    return loss, draft_logits.detach().max(-1).indices, target_logits.max(-1).indices


class _NativeForwardKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, draft_logits, target_logits, target_rows, lib):
        d = draft_logits.detach().contiguous()
        t = target_logits.detach().float().contiguous()
        N, V = d.shape
        rows = None if target_rows is None else target_rows.to(torch.int64).contiguous()
        loss, grad = t.new_empty(N), t.new_empty(N, V)
        d_arg, t_arg = (torch.empty(N, dtype=torch.int64) for _ in range(2))
        ptr = lambda x: None if x is None else ctypes.c_void_p(x.data_ptr())  # noqa: E731
        lib.lean_forward_kl(ptr(d), int(d.dtype == torch.bfloat16), ptr(t), ptr(rows), N, V, ptr(loss), ptr(grad),
                            ptr(d_arg), ptr(t_arg))
        ctx.save_for_backward(grad)
        ctx.draft_dtype = draft_logits.dtype
        ctx.mark_non_differentiable(d_arg, t_arg)
        return loss, d_arg, t_arg

    @staticmethod
    def backward(ctx, g_loss, _d_arg, _t_arg):
        (grad,) = ctx.saved_tensors
        return (grad * g_loss[:, None]).to(ctx.draft_dtype), None, None, None


NATIVE = True  # False: torch's passes everywhere (training/step_bench.py times both)


def forward_kl_rows(draft_logits: torch.Tensor, target_logits: torch.Tensor, lib=None,
                    target_rows: torch.Tensor | None = None):
    """(loss [N] fp32, draft argmax [N], target argmax [N]); draft [N, V] fp32 or bf16, against
    target_logits[target_rows] (read in place; all rows where None).
    `lib`: a build of the CPU kernels (native.load(march)); default this machine's."""
    if lib is None and draft_logits.device.type == "cpu" and NATIVE:
        lib = native.load()
    if lib is None or draft_logits.dtype not in (torch.float32, torch.bfloat16) or draft_logits.dim() != 2:
        return forward_kl_torch(draft_logits, target_logits, target_rows)
    return _NativeForwardKL.apply(draft_logits, target_logits, target_rows, lib)
