"""Hydra heads (Ankner et al., 2024): Medusa-style heads made sequentially dependent.

Head i reads the target's feature h_t and the (frozen, the target's own) embeddings of
every token between t and the one it guesses: the pending token x_{t+1} and the drafts
before it. So it guesses token t + 2 + i from the prefix (h_t, x_{t+1}, ..., x_{t+1+i}):

    z_i = ResBlock^B(W_in,i [h_t; E x_{t+1}; ...; E x_{t+1+i}])    input (i + 2) H -> D
    logits_i = W_out,i z_i

Unlike Medusa, a head's guess follows the path drafted above it, which is what makes
Hydra's tree levels consistent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .base import Features, Speculator, TargetInfo
from .layers import HeadsOnLastHidden, FrozenTargetTensor, LastHidden, OutputHeads, ResBlock, compute_dtype


@dataclass
class HydraConfig:
    n_predict: int = 4
    """Heads K = the longest draft chain."""
    hidden_size: int = 576
    """Width D of each head (its input projection maps (i + 2) x the target's hidden to it)."""
    num_blocks: int = 1
    """Residual blocks per head after its input projection (depth)."""
    output: Literal["per_head", "shared"] = "per_head"
    """Each head its own output layer, or one tied across heads."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""


class HydraSpeculator(HeadsOnLastHidden, Speculator):
    family = "hydra"
    Config = HydraConfig
    shift = 1
    target_tensors = ("embed_weight",)

    def __init__(self, config: HydraConfig, target: TargetInfo):
        super().__init__(config, target)
        H, d = target.hidden_size, config.hidden_size
        self.embed = FrozenTargetTensor(target.embed_weight, "input embedding", self.family)
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear((i + 2) * H, d), *(ResBlock(d) for _ in range(config.num_blocks)))
            for i in range(config.n_predict)
        )
        self.out = OutputHeads(config.n_predict, d, self.vocab.size, config.output)

    def _head(self, i: int, h: torch.Tensor, embeds: list[torch.Tensor]) -> torch.Tensor:
        return self.heads[i](torch.cat([h, *embeds], -1))

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, K, T, D]
        ids, h = feats.input_ids, feats.hidden.to(compute_dtype(self))
        B, T = ids.shape
        e = F.embedding(ids, self.embed.weight)  # [B, T, H]
        out = h.new_zeros(B, self.config.n_predict, T, self.config.hidden_size)
        for i in range(min(self.config.n_predict, T - 1)):
            span = T - 1 - i  # head i at position t reads x_{t+1}..x_{t+1+i}: t < T - 1 - i
            out[:, i, :span] = self._head(i, h[:, :span], [e[:, 1 + j : 1 + j + span] for j in range(i + 1)])
        return out

    # --- inference ----------------------------------------------------------------

    def max_draft_len(self) -> int:
        return self.config.n_predict

    @torch.no_grad()
    def propose(self, state: LastHidden, pending: torch.Tensor, k: int):
        assert k <= self.config.n_predict, f"hydra drafts at most {self.config.n_predict} tokens"
        h, embeds = state.hidden.to(compute_dtype(self)), []

        def step(i: int, token: torch.Tensor) -> torch.Tensor:
            embeds.append(F.embedding(token, self.embed.weight))  # [1, H]: head i sees every draft so far
            return self._head(i, h, embeds)

        return self.draft_greedily(pending, k, step)

    @torch.no_grad()
    def extend(self, state: LastHidden, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        M, d = paths.shape
        assert d < self.config.n_predict, f"hydra has {self.config.n_predict} heads; no head for depth {d + 1}"
        seq = torch.cat([pending.expand(M, 1), paths], 1)  # [M, d + 1]
        embeds = list(F.embedding(seq, self.embed.weight).unbind(1))  # d + 1 x [M, H]
        return self.draft_head(d, self._head(d, state.hidden.to(compute_dtype(self)).expand(M, -1), embeds))  # [M, N]

    def accept(self, state: LastHidden, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        state.hidden = hidden[:, -1]
