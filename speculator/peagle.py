"""P-EAGLE (parallel EAGLE-3): EAGLE-3's draft, drafting a whole block in one pass.

EAGLE-3 feeds each drafted position its own previous output, so a block of k drafts costs k
sequential passes. P-EAGLE fills the positions after the last committed one with a learned
stand-in instead, a mask token's embedding beside a learned "mask hidden" feature, and reads
all k positions in one causal pass:

    depth 0 at position j:  [E x_{j+1}; fc g_j]        (g_j: the target's fused layers, as EAGLE-3)
    depth d >= 1 (at j + d): [E m;       fc h_mask]     (m = mask_token_id, h_mask learned [L * H])
    o = Layers(rows), logits = lm_head(norm(o))         depth d guesses token x_{j+2+d}

A depth-d row attends to the committed positions up to its anchor j and to the block's rows
at depths 0..d of the same anchor: exactly EAGLE-3's training-time-test pattern (layers.py's
prefix plus a private chain), so `draft_states` computes every (depth, anchor) of a sequence
with the shared layers, and at inference the block is `k` new rows, causal among
themselves, after the cache (the native steps of lean_draft.py compute that as they are).

Training (speculators' "conditional drop-token" sampling): depth 0 trains every position;
depth d trains only a fraction max(r^d, r_min) of the anchors (r = `down_sample_ratio`),
drawn among those whose depth d - 1 was kept and whose depth-d token is trainable, so the
cost of the deeper depths shrinks geometrically while each kept row still sees its whole
chain. Drafts never depend on the drafted tokens, so a tree's rows at one depth share one
distribution (`extend`).

Parameter names are speculators' `PEagleDraftModel` (EAGLE-3's plus `mask_hidden` [1, 1, L * H]),
so export is a renaming, as for eagle3.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .base import Features, Objective, TargetInfo, _rows
from .eagle3 import Eagle3Speculator, FusedInputNorm, TargetStart
from .feature_ar import FeatureARState
from .layers import KV, causal_mask, compute_dtype, run_layers


@dataclass
class PEagleConfig(TargetStart, FusedInputNorm):
    block_size: int = 8
    """Positions drafted in one pass, and the depths trained (speculators' num_depths)."""
    num_layers: int = 1
    """Decoder layers."""
    hidden_size: int = 576
    """Width D; fc maps the fused target layers (len(target_layers) x H) to it."""
    num_heads: int = 9
    """Attention heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 3
    """Key/value heads (grouped-query attention; divides num_heads)."""
    intermediate_size: int = 1536
    """MLP width per layer."""
    target_layers: list[int] = field(default_factory=list)
    """Target hidden_states ids fused by fc (0 = embeddings); empty: EAGLE-3's low/mid/high from the target's depth."""
    embedding: Literal["frozen", "trained"] = "trained"
    """The token embedding (initialised from the target's): trained, as P-EAGLE does (the mask token's row learns its role), or frozen."""
    mask_token_id: int = -1
    """The token whose embedding fills the parallel positions (-1: the vocabulary's last id); best a token the data never holds."""
    max_anchors: int = 0
    """Anchors per training sequence that run the parallel depths (0: every trainable one)."""
    down_sample_ratio: float = 0.7
    """Conditional drop-token sampling: depth d keeps a fraction max(r^d, r_min) of the anchors (1: keep all)."""
    down_sample_ratio_min: float = 0.2
    """r_min, the floor of that fraction."""
    rope_theta: float = 10000.0
    """Rotary base."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all)."""


class PEagleSpeculator(Eagle3Speculator):
    family = "peagle"
    Config = PEagleConfig

    def __init__(self, config: PEagleConfig, target: TargetInfo):
        if config.block_size < 1:
            raise ValueError(f"peagle block_size must be at least 1, got {config.block_size}")
        if not 0 < config.down_sample_ratio <= 1 or not 0 <= config.down_sample_ratio_min <= 1:
            raise ValueError("peagle down_sample_ratio must lie in (0, 1] and down_sample_ratio_min in [0, 1]")
        super().__init__(config, target)
        mask_id = config.mask_token_id if config.mask_token_id >= 0 else target.vocab_size - 1
        if mask_id >= target.vocab_size:
            raise ValueError(f"peagle mask_token_id {mask_id} is outside the target's vocabulary ({target.vocab_size})")
        self.mask_token_id = mask_id
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, len(self.target_layer_ids) * target.hidden_size))

    @property
    def unroll_steps(self) -> int:
        return self.config.block_size

    def mask_input(self) -> torch.Tensor:  # [1, 1, 2D]
        """The first layer's input at a parallel position."""
        token = torch.full((1, 1), self.mask_token_id, device=self.mask_hidden.device)
        return self.step_input(self.lift(self.mask_hidden.to(compute_dtype(self))), token)

    # --- training -------------------------------------------------------------------

    def _depth0(self, feats: Features) -> tuple[torch.Tensor, list[KV], torch.Tensor]:
        """Every position at depth 0 (EAGLE-3's step 0) -> (out [B, T, D], its keys/values,
        `mask_input()`). Both inputs come from one embedding lookup: each lookup of a trained
        embedding costs backward a dense [V, D] gradient, freshly allocated (on a CPU its page
        faults alone cost 0.2 s at SmolLM2's vocabulary), so the mask token rides with the tokens."""
        ids = feats.input_ids
        B, T = ids.shape
        tokens = torch.cat([F.pad(ids[:, 1:], (0, 1)).flatten(), ids.new_full((1,), self.mask_token_id)])
        carried = torch.cat([self._features(feats.hidden, feats.layers).flatten(0, 1),
                             self.mask_hidden[0].to(compute_dtype(self))])
        inputs = self.step_input(self.lift(carried), tokens)  # [B * T + 1, 2D]
        out, kv = run_layers(self.layers, inputs[:-1].view(B, T, -1), torch.arange(T, device=ids.device),
                             self.config.rope_theta, None, causal_mask(T, 0, ids.device), None, "prefix")
        return out, kv, inputs[-1:][None]

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, P, T, D]
        """Every anchor t at every depth p (row (p, t) sits at position t + p), no sampling."""
        B, T = feats.input_ids.shape
        out, base, masked = self._depth0(feats)
        states, chain = [self.head_states(out)], None
        positions, mask = torch.arange(T, device=out.device), causal_mask(T, 0, out.device)
        rows = masked.expand(B, T, -1)
        for p in range(1, max(1, min(self.config.block_size, T - 1))):
            out, chain = run_layers(self.layers, rows, positions + p, self.config.rope_theta, base, mask, chain, "chain")
            states.append(self.head_states(out))
        return torch.stack(states, 1)

    def loss(self, feats: Features, objective: Objective, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective over depth 0 at every trainable position and the sampled deeper rows
        (`sample_chains`); mean over all trained rows, per-depth metrics."""
        ids = feats.input_ids
        B, T = ids.shape
        next_ids = F.pad(ids[:, 1:], (0, 1))
        trainable = feats.loss_mask & self.vocab.contains(next_ids)  # [B, T]: the target at t is trained
        out, base, masked = self._depth0(feats)
        first = trainable[:, 1:]  # [B, T-1]: depth 0 at anchor t guesses the target at t + 1
        depth_rows = {0: ([out[:, : T - 1][first]], [feats.hidden[:, 1:][first]])}
        for b in range(B):
            kv = [(k[b : b + 1], v[b : b + 1]) for k, v in base]
            for d, (states, at) in self._chains(kv, trainable[b], T, masked).items():
                draft, target = depth_rows.setdefault(d, ([], []))
                draft.append(states)
                target.append(feats.hidden[b, at])
        columns = None if self.vocab.full else self.vocab.ids
        total, count, metrics = out.new_zeros(()), 0, {}
        for d, (draft, target) in sorted(depth_rows.items()):
            rows = torch.cat(draft)
            if not rows.shape[0]:
                continue
            with torch.no_grad():
                teacher = target_head(torch.cat(target), columns)  # [N, V']
            per_row, draft_arg, target_arg = _rows(objective, self.draft_head(d, self.head_states(rows)), teacher, None)
            total, count = total + per_row.sum(), count + per_row.numel()
            metrics[f"loss_pos{d}"] = per_row.detach().mean().item()
            metrics[f"acc_pos{d}"] = (draft_arg == target_arg).float().mean().item()
        return total / max(count, 1), metrics

    def sample_chains(self, trainable: torch.Tensor, T: int) -> list[torch.Tensor]:
        """Conditional drop-token sampling for one sequence: trainable [T] (the target at t is
        trained) -> the anchors kept at depths 1, 2, ... (ascending, each a subset of the one
        before). Depth d's row at anchor a guesses the target at a + 1 + d."""
        c = self.config
        anchors = torch.arange(T, device=trainable.device)
        at = lambda a, d: trainable[(a + 1 + d).clamp(max=T - 1)] & (a + 1 + d < T)  # noqa: E731
        seeds = anchors[at(anchors, 1)]
        if c.max_anchors and seeds.numel() > c.max_anchors:
            seeds = seeds[torch.randperm(seeds.numel(), device=seeds.device)[: c.max_anchors]].sort().values
        kept, pool = [], seeds
        for d in range(1, c.block_size):
            pool = pool[at(pool, d)]
            n = min(int(seeds.numel() * max(c.down_sample_ratio ** d, c.down_sample_ratio_min)), pool.numel())
            if n <= 0:
                break
            if n < pool.numel():
                pool = pool[torch.randperm(pool.numel(), device=pool.device)[:n].sort().values]
            kept.append(pool)
        return kept

    def _chains(self, kv: list[KV], trainable: torch.Tensor, T: int,
                masked: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The sampled rows of one sequence, depth by depth: each depth's rows read the keys of
        their anchor's kept rows at the depths before (its chain, gathered from the last depth's);
        `masked` is `mask_input()`. -> depth -> (outputs [n, D], the positions whose target they guess [n])."""
        rows, chain, previous = {}, None, None
        positions = torch.arange(T, device=trainable.device)
        for d, anchors in enumerate(self.sample_chains(trainable, T), start=1):
            if chain is not None:  # keep the chains of the anchors still drawn
                keep = torch.searchsorted(previous, anchors)
                chain = [(k[:, :, keep], v[:, :, keep]) for k, v in chain]
            x = masked.expand(1, anchors.numel(), -1)
            mask = positions[None, :] <= anchors[:, None]  # [n, T]: the committed prefix up to the anchor
            out, chain = run_layers(self.layers, x, anchors + d, self.config.rope_theta, kv, mask, chain, "chain")
            rows[d] = (out[0], anchors + 1 + d)
            previous = anchors
        return rows

    # --- inference ------------------------------------------------------------------

    def _block(self, state: FeatureARState, pending: torch.Tensor, n: int) -> torch.Tensor:
        """The pending position and n - 1 parallel ones in one causal pass after the cache
        -> their draft logits [n, N]. The block's keys are scratch: the native cache's slots
        past the committed ones, which committed positions overwrite later."""
        first = self.step_input(self.lift(state.last), pending)  # [1, 1, 2D]
        x = torch.cat([first, self.mask_input().to(first.dtype).expand(1, n - 1, -1)], 1)
        if state.lean is not None:
            out = state.feed(x[0]).to(x.dtype)[None]
        else:
            prefix = state.prefix(x.dtype)
            positions = torch.arange(state.length, state.length + n, device=x.device)
            out, _ = run_layers(self.layers, x, positions, self.config.rope_theta, prefix,
                                causal_mask(n, state.length, x.device), None, "prefix")
        return self.draft_head(0, self.head_states(out))[0]

    @torch.no_grad()
    def propose(self, state: FeatureARState, pending: torch.Tensor, k: int):
        n = min(k, self.config.block_size)
        if n <= 0:
            return pending.new_zeros(1, 0), state.last.new_zeros(1, 0, self.vocab.size)
        logits = self._block(state, pending, n)  # [n, N]
        return self.vocab.to_target(logits.argmax(-1))[None], logits[None]  # [1, n], [1, n, N]

    @torch.no_grad()
    def extend(self, state: FeatureARState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        # Depth d reads no drafted token: every path of one depth has the same next distribution.
        M, d = paths.shape
        if d >= self.config.block_size:
            raise ValueError(f"peagle drafts blocks of {self.config.block_size}; a tree of depth {d + 1} is deeper")
        return self._block(state, pending, d + 1)[d].expand(M, -1)

    def max_draft_len(self) -> int:
        return self.config.block_size
