"""Distillation objectives over the vocabulary: per-row losses [N] from logits [N, V], or,
fused with the heads, from hidden states (speclab.kernels.distill_loss) without the logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from speclab.kernels.distill_loss import DistillKind, distill_loss
from speclab.kernels.forward_kl import forward_kl_rows
from speclab.speculator.base import Objective


def forward_kl(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_v p_v (log p_v - log q_v), p the target's, q the draft's.

    Forward KL is mass-covering: it trains the draft to put probability wherever the
    target does, which is what acceptance under both greedy and sampled verification
    rewards. Its gradient w.r.t. the draft logits is simply q - p.
    """
    log_q = F.log_softmax(draft_logits.float(), -1)  # [N, V]
    log_p = F.log_softmax(target_logits.float(), -1)  # [N, V]
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def ce_on_argmax(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the target's greedy token: what greedy verification checks."""
    return F.cross_entropy(draft_logits.float(), target_logits.argmax(-1), reduction="none")


FUSE_MIN_LOGITS = 1 << 26  # [N, V] fp32 logits of 256 MB (e.g. N=1,366 at V=49,152): fuse on CPU from here


@dataclass(frozen=True)
class VocabObjective:
    """An objective over the vocabulary that can also be fused with the heads.

    Called with logits it is the plain objective; `fused` computes the same per-row loss from
    hidden states and head weights in vocabulary chunks (Triton on CUDA), which
    `Speculator.loss` uses whenever the family's draft head is a bias-free linear map.
    """

    kind: DistillKind
    """"kl": forward KL to the target's distribution; "ce": cross-entropy on its argmax."""
    fuse: Literal["auto", "always", "never"] = "auto"
    """When `Speculator.loss` takes the fused path: "auto" (see `fuses`), "always", "never"."""

    def fuses(self, rows: int, vocab: int, device: torch.device) -> bool:
        """Whether the fused path pays for `rows` x `vocab` logits on `device`.

        On CUDA the Triton kernel is as fast as the unfused path and never builds the
        logits. The CPU path is the chunked torch reference, which recomputes each chunk in
        the backward pass: 1.25x the unfused time at N=512, V=8,192 (speclab.kernels.bench).
        So on CPU it is taken only where the logits would be big enough for memory to matter.
        """
        if self.fuse != "auto":
            return self.fuse == "always"
        return device.type == "cuda" or rows * vocab >= FUSE_MIN_LOGITS

    def __call__(self, draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
        return (forward_kl if self.kind == "kl" else ce_on_argmax)(draft_logits, target_logits)

    def rows(self, draft_logits: torch.Tensor, target_logits: torch.Tensor, target_rows: torch.Tensor | None = None):
        """(loss [N], draft argmax [N], target argmax [N]) from logits, draft row n against
        target row target_rows[n] (n where None). "kl" in one native pass per row on the CPU
        (speclab.kernels.forward_kl: 4.4x torch's passes at [508, 8192])."""
        if self.kind == "kl":
            return forward_kl_rows(draft_logits, target_logits, target_rows=target_rows)
        if target_rows is not None:
            target_logits = target_logits[target_rows]
        target_arg = target_logits.max(-1).indices
        loss = F.cross_entropy(draft_logits.float(), target_arg, reduction="none")
        return loss, draft_logits.detach().max(-1).indices, target_arg

    def fused(self, draft_hidden: torch.Tensor, draft_weight: torch.Tensor, target_hidden: torch.Tensor,
              target_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[N, D], [V, D], [N, H], [V, H] -> (loss [N], draft argmax [N], target argmax [N])."""
        return tuple(distill_loss(draft_hidden, draft_weight, target_hidden, target_weight, self.kind))


OBJECTIVES = ("ce", "kl")
FUSE_CHOICES = ("always", "auto", "never")


def objective(name: str, fuse: str = "auto") -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown training objective {name!r}; valid: {list(OBJECTIVES)}")
    if fuse not in FUSE_CHOICES:
        raise ValueError(f"unknown training.fused_loss {fuse!r}; valid: {list(FUSE_CHOICES)}")
    return VocabObjective(name, fuse)
