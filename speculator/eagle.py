"""EAGLE-1/2 (Li et al., 2024): autoregression at the feature level.

Decoder layers read, at position j, the target's feature f_j (its last hidden state, the
LM head's input) and the embedding of token x_{j+1}, and predict the feature f_{j+1}; the
target's own frozen LM head turns a predicted feature into a token. Drafting feeds the
predicted features back (feature_ar.py has the shared machinery):

    c_j = f_j (committed) or f^_j (drafted)
    o_j = Layers(fc [c_j; E x_{j+1}])                 fc: 2H -> D, E the target's embedding
    f^_{j+1} = P o_j                                  P: D -> H (identity when D = H)
    logits = W_target f^_{j+1}                        the target's LM head, frozen

Loss (EAGLE): SmoothL1(f^, f) + token_weight * objective(logits, the target's logits).
Embedding and LM head are the target's, never saved: load with the live target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import Features, Objective, TargetInfo
from .feature_ar import FeatureAutoregressive
from .layers import DecoderLayer, FrozenTargetTensor, maybe_proj


@dataclass
class EagleConfig:
    num_layers: int = 1
    """Decoder layers (EAGLE uses one)."""
    hidden_size: int = 576
    """Width D of the layers; fc and an output projection map from/to the target's hidden size."""
    num_heads: int = 9
    """Attention heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 3
    """Key/value heads (grouped-query attention; divides num_heads)."""
    intermediate_size: int = 1536
    """MLP width per layer."""
    unroll_steps: int = 1
    """Training steps unrolled on its own predicted features (1: EAGLE-1/2's teacher forcing)."""
    token_weight: float = 0.1
    """Weight of the token objective next to the feature regression (EAGLE: 0.1)."""
    rope_theta: float = 10000.0
    """Rotary base."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""


class EagleSpeculator(FeatureAutoregressive):
    family = "eagle"
    Config = EagleConfig
    target_tensors = ("embed_weight", "lm_head_weight")

    def __init__(self, config: EagleConfig, target: TargetInfo):
        super().__init__(config, target)
        H, d = target.hidden_size, config.hidden_size
        self.embed = FrozenTargetTensor(target.embed_weight, "input embedding", self.family)
        self.head = FrozenTargetTensor(target.lm_head_weight, "LM head", self.family)
        self.fc = nn.Linear(2 * H, d)
        self.layers = nn.ModuleList(
            DecoderLayer(d, config.num_heads, config.num_kv_heads, config.intermediate_size)
            for _ in range(config.num_layers)
        )
        self.out_proj = maybe_proj(d, H)

    @property
    def unroll_steps(self) -> int:
        return self.config.unroll_steps

    def target_features(self, hidden, layers):
        return hidden

    def lift(self, features):
        return features

    def carry(self, out):
        return self.out_proj(out)  # the predicted next feature

    def step_input(self, carried, tokens):
        return self.fc(torch.cat([carried, F.embedding(tokens, self.embed.weight)], -1))

    def head_states(self, out):
        return self.out_proj(out)

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return F.linear(states, self.draft_head_weight(p))

    def draft_head_weight(self, p: int) -> torch.Tensor:  # [N, H], frozen (the target's)
        return self.head.rows(None if self.vocab.full else self.vocab.ids)

    def loss(self, feats: Features, objective: Objective, target_head):
        states = self.draft_states(feats)  # [B, P, T, H] predicted features
        token, metrics = self.token_loss(states, feats, objective, target_head)
        T, total, count = states.shape[2], states.new_zeros(()), 0
        for p in range(states.shape[1]):
            lo = self.shift + p  # state (p, t) predicts the target's feature at t + lo
            mask = feats.loss_mask[:, lo:]  # [B, T - lo]: the predicted token is worth predicting
            if T <= lo or not mask.any():
                continue
            per_row = F.smooth_l1_loss(states[:, p, : T - lo][mask].float(), feats.hidden[:, lo:][mask].float(),
                                       reduction="none").mean(-1)  # [N]
            total, count = total + per_row.sum(), count + per_row.numel()
            metrics[f"feature_loss_pos{p}"] = per_row.detach().mean().item()
        return total / max(count, 1) + self.config.token_weight * token, metrics
