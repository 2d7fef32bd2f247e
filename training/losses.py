"""Distillation objectives over the vocabulary: per-row losses [N] from logits [N, V]."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


OBJECTIVES: dict[str, Objective] = {"kl": forward_kl, "ce": ce_on_argmax}


def objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown training objective {name!r}; valid: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]
