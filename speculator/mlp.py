"""IBM's MLP speculator (fms-extras `MLPSpeculator`): n_predict small stages in a chain.

Stage i reads the previous stage's state (the target's last hidden state h_t for i = 0)
and the embedding of the previous token, and predicts one more token:

    s_0 = h_t                                   # [B, H]
    s_{i+1} = GELU(LN_i(W_i s_i * a + E_i[x_{t+1+i}] * b))
    logits_i = head_i(s_{i+1})                  # guess of token t + 2 + i

a and b keep the state's scale fixed along the chain: a = 0.5 ** (0.5 / n_predict)
shrinks the carried state a little per stage, b = sqrt((1 - a^2) * inner_dim / 2) sizes
the fresh token signal so the sum keeps unit variance after the norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import Features, Speculator, TargetInfo
from .fast_linear import drafting_ops
from .mlp_chain import NativeMLPChain


@dataclass
class MLPConfig:
    n_predict: int = 4
    """Number of stages, i.e. the longest draft chain."""
    inner_dim: int = 256
    """Width of each stage's state (projected from the target's hidden size)."""
    tie_weights: bool = True
    """Share embedding, norm, head and (after the first) projection across stages."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""


@dataclass
class MLPState:
    hidden: torch.Tensor  # [1, H] target hidden state of the last committed position
    native: NativeMLPChain | None = None  # drafting on the lean kernels (speculator/mlp_chain.py)


class MLPSpeculator(Speculator):
    family = "mlp"
    Config = MLPConfig
    shift = 1

    def __init__(self, config: MLPConfig, target: TargetInfo):
        super().__init__(config, target)
        n, d, V, H = config.n_predict, config.inner_dim, target.vocab_size, target.hidden_size
        shared = 1 if config.tie_weights else n
        self.emb = nn.ModuleList(nn.Embedding(V, d) for _ in range(shared))
        first = nn.Linear(H, d, bias=False)
        later = [nn.Linear(d, d, bias=False) for _ in range(1 if config.tie_weights else n - 1)]
        self.proj = nn.ModuleList([first, *later])
        self.norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(shared))
        self.head = nn.ModuleList(nn.Linear(d, self.vocab.size, bias=False) for _ in range(shared))
        self.state_weight = 0.5 ** (0.5 / n)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * d / 2)
        for e in self.emb:
            nn.init.normal_(e.weight, std=1 / math.sqrt(d))

    def _pick(self, modules: nn.ModuleList, i: int) -> nn.Module:
        return modules[min(i, len(modules) - 1)]

    def _stage(self, i: int, state: torch.Tensor, token: torch.Tensor, embedded: torch.Tensor | None = None) -> torch.Tensor:
        """Stage i on `token`, or on its embedding where the caller looked it up already."""
        proj = self.proj[0] if i == 0 else self._pick(self.proj, i)
        embedded = self._pick(self.emb, i)(token) if embedded is None else embedded
        mixed = proj(state) * self.state_weight + embedded * self.emb_weight
        return F.gelu(self._pick(self.norm, i)(mixed))

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self._pick(self.head, p)(states)

    def draft_head_weight(self, p: int) -> torch.Tensor:  # [N, d]: the head is a bias-free Linear
        return self._pick(self.head, p).weight

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, P, T, d]
        ids, state = feats.input_ids, feats.hidden.float()  # [B, T], [B, T, H]
        B, T = ids.shape
        out = state.new_zeros(B, self.config.n_predict, T, self.config.inner_dim)
        # Tied stages share one table [V, d]: look the tokens up once, so its backward builds
        # one dense [V, d] gradient a step, not one per stage (each a 50 MB fill and add for
        # SmolLM2's vocabulary: 4 of them were ~20% of an mlp training step).
        shared = self.emb[0](ids) if len(self.emb) == 1 else None  # [B, T, d]
        for i in range(min(self.config.n_predict, T - 1)):
            # stage i at position t reads token x_{t+1+i}; valid for t < T - 1 - i
            span = T - 1 - i
            state = self._stage(i, state[:, :span], ids[:, 1 + i :],
                                None if shared is None else shared[:, 1 + i :])  # [B, span, d]
            out[:, i, :span] = state
        return out

    # --- inference ----------------------------------------------------------------

    def max_draft_len(self) -> int:
        return self.config.n_predict

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor, layers=None) -> MLPState:
        ops = drafting_ops(self)  # decoding on the lean kernels; training (gradients on) stays eager
        eager = ops is None or torch.is_grad_enabled() or prompt_hidden.device.type != "cpu"
        native = None if eager else NativeMLPChain.of(self, ops)
        return MLPState(hidden=prompt_hidden[:, -1], native=native)

    @torch.no_grad()
    def propose(self, state: MLPState, pending: torch.Tensor, k: int):
        assert k <= self.config.n_predict, f"mlp speculator drafts at most {self.config.n_predict}"
        s = state.hidden.to(self.proj[0].weight.dtype)  # the dtype the speculator was handed

        def step(i: int, token: torch.Tensor) -> torch.Tensor:
            nonlocal s
            s = self._stage(i, s, token)  # [1, d]
            return s

        return self.draft_greedily(pending, k, step)

    @torch.no_grad()
    def propose_tokens(self, state: MLPState, pending: torch.Tensor, k: int) -> torch.Tensor:
        """`propose`'s drafts, in one native call where the state drafts on the lean kernels."""
        if state.native is None:
            return super().propose_tokens(state, pending, k)
        return state.native.propose(state.hidden, int(pending[0, 0]), k)

    @torch.no_grad()
    def extend(self, state: MLPState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """paths [M, d] -> logits [M, N]: stages 0..d over [pending, paths[m]], as `propose` runs them."""
        M, d = paths.shape
        assert d < self.config.n_predict, f"mlp speculator drafts at most {self.config.n_predict}"
        s, token = state.hidden.to(self.proj[0].weight.dtype).expand(M, -1), pending[:, 0].expand(M)  # [M, H], [M]
        for i in range(d + 1):
            s = self._stage(i, s, token)  # [M, d_inner]
            token = paths[:, i] if i < d else token
        return self.draft_head(d, s)  # [M, N]

    def accept(self, state: MLPState, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        state.hidden = hidden[:, -1]
