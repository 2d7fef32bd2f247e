"""Distillation objectives over the vocabulary: per-row losses [N] from logits [N, V], or,
fused with the heads, from hidden states (speclab.kernels.distill_loss) without the logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speclab.kernels.distill_loss import DistillKind, distill_loss
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


@dataclass(frozen=True)
class VocabObjective:
    """An objective over the vocabulary that can also be fused with the heads.

    Called with logits it is the plain objective; `fused` computes the same per-row loss from
    hidden states and head weights in vocabulary chunks (Triton on CUDA), which
    `Speculator.loss` uses whenever the family's draft head is a bias-free linear map.
    """

    kind: DistillKind
    """"kl": forward KL to the target's distribution; "ce": cross-entropy on its argmax."""

    def __call__(self, draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
        return (forward_kl if self.kind == "kl" else ce_on_argmax)(draft_logits, target_logits)

    def fused(self, draft_hidden: torch.Tensor, draft_weight: torch.Tensor, target_hidden: torch.Tensor,
              target_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[N, D], [V, D], [N, H], [V, H] -> (loss [N], draft argmax [N], target argmax [N])."""
        return tuple(distill_loss(draft_hidden, draft_weight, target_hidden, target_weight, self.kind))


OBJECTIVES: dict[str, Objective] = {"kl": VocabObjective("kl"), "ce": VocabObjective("ce")}


def objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown training objective {name!r}; valid: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]
