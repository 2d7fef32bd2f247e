"""Medusa-1 (Cai et al., 2024): K independent heads on the frozen target's last hidden state.

Head i is a stack of residual blocks and an output layer; from h_t (the target's feature at
the last committed position t) it guesses token t + 2 + i, i.e. the i-th token after the
pending one (which the target itself chose from h_t). The heads never see drafted tokens,
so a step's k drafts come out of one parallel evaluation of k heads, and a tree's level d
is head d's top tokens whatever the path above it.

    z_i = ResBlock^B(P_i h_t)          P_i: H -> D projection (identity when D = H)
    logits_i = W_i z_i                  W_i starts as the target's LM head rows (D = H)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .base import Features, Speculator, TargetInfo
from .layers import HeadsOnLastHidden, LastHidden, OutputHeads, ResBlock, compute_dtype, maybe_proj


@dataclass
class MedusaConfig:
    n_predict: int = 4
    """Heads K = the longest draft chain; head i guesses the (i+1)-th token after the pending one."""
    num_blocks: int = 1
    """Residual blocks per head (depth)."""
    hidden_size: int = 0
    """Width of each head (0: the target's hidden size, no input projection)."""
    output: Literal["per_head", "shared"] = "per_head"
    """Each head its own output layer, or one tied across heads."""
    output_init: Literal["target_head", "random"] = "target_head"
    """Start output layers as the target's LM head rows (Medusa's init; needs width = target's)."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""


class MedusaSpeculator(HeadsOnLastHidden, Speculator):
    family = "medusa"
    Config = MedusaConfig
    shift = 1

    def __init__(self, config: MedusaConfig, target: TargetInfo):
        super().__init__(config, target)
        H = target.hidden_size
        d = config.hidden_size or H
        self.heads = nn.ModuleList(
            nn.Sequential(maybe_proj(H, d), *(ResBlock(d) for _ in range(config.num_blocks)))
            for _ in range(config.n_predict)
        )
        self.out = OutputHeads(config.n_predict, d, self.vocab.size, config.output)
        if config.output_init == "target_head" and d == H and target.lm_head_weight is not None:
            with torch.no_grad():
                for linear in self.out.linears:
                    linear.weight.copy_(self.vocab.rows(target.lm_head_weight))

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, K, T, D]
        h = feats.hidden.to(compute_dtype(self))
        return torch.stack([head(h) for head in self.heads], 1)

    # --- inference ----------------------------------------------------------------

    def max_draft_len(self) -> int:
        return self.config.n_predict

    @torch.no_grad()
    def propose(self, state: LastHidden, pending: torch.Tensor, k: int):
        assert k <= self.config.n_predict, f"medusa drafts at most {self.config.n_predict} tokens"
        h = state.hidden.to(compute_dtype(self))  # [1, H]
        logits = torch.stack([self.draft_head(i, self.heads[i](h)) for i in range(k)], 1)  # [1, k, N]
        return self.vocab.to_target(logits.argmax(-1)), logits  # [1, k], [1, k, N]

    @torch.no_grad()
    def extend(self, state: LastHidden, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        d = paths.shape[1]
        assert d < self.config.n_predict, f"medusa has {self.config.n_predict} heads; no head for depth {d + 1}"
        logits = self.draft_head(d, self.heads[d](state.hidden.to(compute_dtype(self))))  # [1, N]: no head reads the path
        return logits.expand(paths.shape[0], -1)

    def accept(self, state: LastHidden, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        state.hidden = hidden[:, -1]
