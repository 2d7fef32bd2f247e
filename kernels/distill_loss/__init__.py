"""Fused linear + distillation loss: draft head, target head and objective in vocabulary
chunks, never building the [N, V] logits (maths and closed-form gradient: reference.py).

`distill_loss` picks the Triton kernels for CUDA tensors and the chunked torch reference
otherwise; `backend` forces one (the tests run "triton" on CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from .reference import DEFAULT_CHUNK, DistillKind, distill_loss_naive, distill_loss_reference

Backend = Literal["auto", "reference", "triton"]


class DistillOutput(NamedTuple):
    loss: torch.Tensor  # [N] fp32 per-row loss, 0 at masked rows
    draft_argmax: torch.Tensor  # [N] long, argmax of the draft logits
    target_argmax: torch.Tensor  # [N] long, argmax of the target logits


def distill_loss(
    draft_hidden: torch.Tensor,  # [N, D]
    draft_weight: torch.Tensor,  # [V, D] bias-free draft head
    target_hidden: torch.Tensor,  # [N, H]
    target_weight: torch.Tensor,  # [V, H] frozen target LM head rows, same vocabulary as the draft's
    kind: DistillKind = "kl",
    mask: torch.Tensor | None = None,  # [N] bool: rows to train (others: loss 0, no gradient)
    chunk_size: int | None = None,  # vocabulary columns per chunk; None: the backend's default
    backend: Backend = "auto",
) -> DistillOutput:
    """KL(p || q) ("kl") or cross-entropy on the target's argmax ("ce") per row."""
    if kind not in ("kl", "ce"):
        raise ValueError(f"unknown distillation loss kind {kind!r}; valid: ['ce', 'kl']")
    if draft_weight.shape[0] != target_weight.shape[0]:
        raise ValueError(f"draft head covers {draft_weight.shape[0]} tokens, target head rows "
                         f"{target_weight.shape[0]}: they must be the same vocabulary")
    target_hidden = target_hidden.to(target_weight.dtype)
    if backend == "auto":
        backend = "triton" if draft_hidden.is_cuda else "reference"
    if backend == "triton":
        from .triton import distill_loss_triton  # imported lazily: triton is optional on CPU

        out = distill_loss_triton(draft_hidden, draft_weight, target_hidden, target_weight, kind, chunk_size)
    else:
        out = distill_loss_reference(draft_hidden, draft_weight, target_hidden, target_weight, kind,
                                     chunk_size or DEFAULT_CHUNK)
    loss, arg_z, arg_t = out
    if mask is not None:
        # where(), not a product: the masked rows' gradient is exactly 0 (never 0 * inf).
        loss = torch.where(mask, loss, loss.new_zeros(()))
    return DistillOutput(loss, arg_z, arg_t)


__all__ = ["Backend", "DEFAULT_CHUNK", "DistillKind", "DistillOutput", "distill_loss", "distill_loss_naive",
           "distill_loss_reference"]
