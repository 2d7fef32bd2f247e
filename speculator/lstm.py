"""Arctic's LSTM speculator (Snowflake ArcticInference): the MLP speculator's chain of
stages with an LSTM cell, so each stage can keep or overwrite what the chain carries.

Stage i reads the carried state s_i (the target's feature h_t for i = 0), the cell c_i
(0 for i = 0) and the token x_{t+1+i}, and guesses token t + 2 + i:

    z = W_i s_i * a + U_i E_i[x_{t+1+i}] * b          [4D]: forget, input, output, candidate
    c_{i+1} = sigmoid(f) c_i + sigmoid(in) tanh(g)
    s_{i+1} = sigmoid(o) tanh(LN_i(c_{i+1}))
    logits_i = head_i(s_{i+1})

a and b balance state and token signal as in mlp.py (a = 0.5 ** (0.5 / n_predict)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .base import Features, Speculator, TargetInfo
from .layers import HeadsOnLastHidden, LastHidden, OutputHeads, compute_dtype


@dataclass
class LSTMConfig:
    n_predict: int = 4
    """Stages = the longest draft chain."""
    inner_dim: int = 256
    """Width D of the state and the cell."""
    tie_weights: bool = True
    """Share embedding, gate map, norm and head across stages (the first stage's input map
    always reads the target's width); false: one set per stage (as mlp's `tie_weights`)."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""


class LSTMSpeculator(HeadsOnLastHidden, Speculator):
    family = "lstm"
    Config = LSTMConfig
    shift = 1

    def __init__(self, config: LSTMConfig, target: TargetInfo):
        super().__init__(config, target)
        n, d, H = config.n_predict, config.inner_dim, target.hidden_size
        shared = 1 if config.tie_weights else n
        self.emb = nn.ModuleList(nn.Embedding(target.vocab_size, d) for _ in range(shared))
        self.token_gates = nn.ModuleList(nn.Linear(d, 4 * d, bias=False) for _ in range(shared))
        later = [nn.Linear(d, 4 * d) for _ in range(1 if shared == 1 else n - 1)]
        self.state_gates = nn.ModuleList([nn.Linear(H, 4 * d), *later])
        self.norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(shared))
        self.out = OutputHeads(n, d, self.vocab.size, "shared" if shared == 1 else "per_head")
        self.state_weight = 0.5 ** (0.5 / n)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) / 2)
        for e in self.emb:
            nn.init.normal_(e.weight, std=1 / math.sqrt(d))

    def _stage(self, i: int, s: torch.Tensor, c: torch.Tensor | None, token: torch.Tensor):
        pick = lambda mods: mods[min(i, len(mods) - 1)]  # noqa: E731
        # state_gates[0] reads the target's width; later stages share [1] or own [i]
        z = pick(self.state_gates)(s) * self.state_weight
        z = z + pick(self.token_gates)(pick(self.emb)(token)) * self.emb_weight
        f, g_in, o, cand = z.chunk(4, -1)
        c = torch.sigmoid(g_in) * torch.tanh(cand) + (0 if c is None else torch.sigmoid(f) * c)
        return torch.sigmoid(o) * torch.tanh(pick(self.norm)(c)), c

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, P, T, D]
        ids, s = feats.input_ids, feats.hidden.to(compute_dtype(self))
        B, T = ids.shape
        out = s.new_zeros(B, self.config.n_predict, T, self.config.inner_dim)
        c = None
        for i in range(min(self.config.n_predict, T - 1)):
            span = T - 1 - i  # stage i at position t reads x_{t+1+i}: t < T - 1 - i
            s, c = self._stage(i, s[:, :span], None if c is None else c[:, :span], ids[:, 1 + i :])
            out[:, i, :span] = s
        return out

    # --- inference ----------------------------------------------------------------

    def max_draft_len(self) -> int:
        return self.config.n_predict

    @torch.no_grad()
    def propose(self, state: LastHidden, pending: torch.Tensor, k: int):
        assert k <= self.config.n_predict, f"lstm speculator drafts at most {self.config.n_predict}"
        s, c = state.hidden.to(compute_dtype(self)), None

        def step(i: int, token: torch.Tensor) -> torch.Tensor:
            nonlocal s, c
            s, c = self._stage(i, s, c, token)  # [1, D]
            return s

        return self.draft_greedily(pending, k, step)

    @torch.no_grad()
    def extend(self, state: LastHidden, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        M, d = paths.shape
        assert d < self.config.n_predict, f"lstm speculator has {self.config.n_predict} stages; none for depth {d + 1}"
        seq = torch.cat([pending.expand(M, 1), paths], 1)  # [M, d + 1]
        s, c = state.hidden.to(compute_dtype(self)).expand(M, -1), None
        for i in range(d + 1):
            s, c = self._stage(i, s, c, seq[:, i])
        return self.draft_head(d, s)  # [M, N]

    def accept(self, state: LastHidden, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        state.hidden = hidden[:, -1]
