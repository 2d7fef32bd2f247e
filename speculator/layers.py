"""Blocks the speculator families share: Medusa's residual block, Llama-style decoder layers
with an explicit KV cache and training-time-test attention, and the target's frozen tensors.

Attention keys come in two groups (EAGLE-3's training-time test, "TTT"):
- a prefix every query may see under a mask [S, N] (the KV cache at inference; step 0's
  keys of every position, causally masked, in training);
- a chain private to each query row [B, h, S, R, dh]: the keys the same draft chain
  wrote at its earlier steps. In training, step p at position t sees step 0's keys at
  positions <= t plus steps 1..p's keys at t only; at inference the chain is exactly the
  tokens drafted in this step. One code path serves both, so they compute the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values [B, h_kv, N, dh] (prefix) or [B, h_kv, S, R, dh] (chain)


class ResBlock(nn.Module):
    """Medusa's block, x + SiLU(W x + b); W starts at zero so a fresh block is the identity
    and a head starts as its output layer on the target's own feature."""

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype the draft computes in (fp32 unless moved, e.g. `.to(target.dtype)` on a GPU):
    the target's features are cast to it on the way in."""
    return next(module.parameters()).dtype


def maybe_proj(d_in: int, d_out: int) -> nn.Module:
    """A bias-free projection between widths, the identity when they match."""
    return nn.Identity() if d_in == d_out else nn.Linear(d_in, d_out, bias=False)


class FrozenTargetTensor(nn.Module):
    """One of the target's frozen tensors ([V, H] embedding or LM head), held by reference:
    a non-persistent buffer, so checkpoints never copy it and `.to()` still moves it."""

    def __init__(self, weight: torch.Tensor | None, what: str, family: str):
        super().__init__()
        if weight is None:
            raise ValueError(f"the {family} speculator reads its target's frozen {what}: build it from "
                             f"TargetInfo.of(target) (or load_speculator(path, TargetInfo.of(target)))")
        self.register_buffer("weight", weight.detach().float(), persistent=False)
        self._rows: tuple | None = None  # (ids' identity, weight[ids])

    def rows(self, ids: torch.Tensor | None) -> torch.Tensor:  # [N, H]
        """weight[ids], memoised per ids tensor version: a loaded checkpoint overwrites the
        draft vocabulary's ids in place, which bumps the version and refreshes the gather."""
        if ids is None:
            return self.weight
        key = (ids.data_ptr(), ids._version, ids.device, self.weight.data_ptr())
        if self._rows is None or self._rows[0] != key:
            self._rows = (key, self.weight[ids])
        return self._rows[1]


def embedding_from_target(target_embed: torch.Tensor, d: int, seed: int = 0) -> torch.Tensor:  # [V, H] -> [V, d]
    """The target's embedding at width d: itself when widths match, else through a fixed
    random Gaussian map (Johnson-Lindenstrauss: token geometry survives approximately)."""
    if target_embed.shape[1] == d:
        return target_embed.float().clone()
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(target_embed.shape[1], d, generator=g) / math.sqrt(d)
    return target_embed.float() @ proj.to(target_embed.device)


# --- rotary positions ---------------------------------------------------------------------


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [S] -> cos, sin [S, head_dim] (Llama's rotate-half layout)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv[None]  # [S, dh/2]
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


_ROPE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_rows(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope`'s rows read from a table built once per (width, base, device) and doubled when a
    position passes its end: a draft step then gathers two rows instead of rebuilding its
    angles in a dozen small ops. Positions are integers, so each row is `rope`'s own.
    Off the CPU it computes the rows directly: sizing the table would read the positions back
    to the host, a sync per forward that costs more there than the ops it saves."""
    if positions.device.type != "cpu":
        return rope(positions, head_dim, theta)
    key = (head_dim, theta, positions.device)
    table = _ROPE_TABLES.get(key)
    end = int(positions.max()) + 1 if positions.numel() else 0
    if table is None or table[0].shape[0] < end:
        size = max(1024, 1 << (end - 1).bit_length())
        table = _ROPE_TABLES[key] = rope(torch.arange(size, device=positions.device), head_dim, theta)
    return table[0][positions], table[1][positions]


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # x [B, h, S, dh]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    # The angles are fp32; the result stays in x's dtype (the speculator's own).
    return (x * cos + rotated * sin).to(x.dtype)


# --- attention with a prefix and per-row chains ---------------------------------------------


def attend(q: torch.Tensor, prefix: KV | None, mask: torch.Tensor | None, chain: KV | None,
           groups: int = 1) -> torch.Tensor:
    """q [B, h, S, dh]; prefix keys/values [B or 1, h_kv, N, dh] under mask [S, N] (True:
    visible); chain keys/values [B, h_kv, S, R, dh] -> [B, h, S, dh]. One softmax over both
    groups. Query head i reads key head i // groups (h = h_kv * groups): the queries are
    folded onto their key head instead of the keys being copied out to every query head."""
    B, h, S, dh = q.shape
    kv = h // groups
    scale = dh ** -0.5
    q5 = q.reshape(B, kv, groups, S, dh)
    scores, n = [], 0
    if prefix is not None:
        s = (q5.reshape(B, kv, groups * S, dh) @ prefix[0].transpose(-1, -2)) * scale  # [B, kv, g S, N]
        s = s.view(B, kv, groups, S, -1)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        scores.append(s)
        n = s.shape[-1]
    if chain is not None:
        scores.append(torch.einsum("bkgsd,bksrd->bkgsr", q5, chain[0]) * scale)  # [B, kv, g, S, R]
    probs = torch.cat(scores, -1).softmax(-1)
    out = 0
    if prefix is not None:
        out = (probs[..., :n].reshape(B, kv, groups * S, n) @ prefix[1]).view(B, kv, groups, S, dh)
    if chain is not None:
        out = out + torch.einsum("bkgsr,bksrd->bkgsd", probs[..., n:], chain[1])
    return out.reshape(B, h, S, dh)


class Attention(nn.Module):
    """Llama attention (q/k/v/o projections, rotary, grouped KV heads) whose input may be
    wider than its output (EAGLE-3's first layer reads [embedding, hidden], 2x wide)."""

    def __init__(self, d_in: int, d: int, heads: int, kv_heads: int):
        super().__init__()
        if d % heads or heads % kv_heads or (d // heads) % 2:
            raise ValueError(f"width {d} must divide by num_heads {heads} into an even head dim (rotary "
                             f"pairs), and num_heads by num_kv_heads {kv_heads}")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d_in, d, bias=False)
        self.k_proj = nn.Linear(d_in, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_in, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: KV | None,
                mask: torch.Tensor | None, chain: KV | None, grow: Literal["prefix", "chain"]):
        """x [B, S, d_in] -> (out [B, S, d], the grown prefix or chain). grow="prefix": the new
        keys join the prefix (mask covers past + new); "chain": they extend each row's chain."""
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.heads, self.head_dim).transpose(1, 2)  # [B, h, S, dh]
        k = self.k_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, h_kv, S, dh]
        v = self.v_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if grow == "prefix":
            if past is not None:
                k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            grown = prefix = (k, v)
        else:
            k, v = k.unsqueeze(3), v.unsqueeze(3)  # [B, h_kv, S, 1, dh]
            if chain is not None:
                k, v = torch.cat([chain[0], k], 3), torch.cat([chain[1], v], 3)
            grown, prefix = (k, v), past
        out = attend(q, prefix, mask, grown if grow == "chain" else None, self.heads // self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1)), grown


class SwiGLU(nn.Module):
    """Llama's MLP: down(SiLU(gate x) * up x)."""

    def __init__(self, d: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A pre-norm Llama decoder layer (HF parameter names) on the prefix/chain attention."""

    def __init__(self, d: int, heads: int, kv_heads: int, inner: int, eps: float = 1e-6, d_in: int | None = None):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.self_attn = Attention(d_in or d, d, heads, kv_heads)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, inner)

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (what attention reads, the residual stream)."""
        return self.input_layernorm(x), x

    def forward(self, x: torch.Tensor, cos, sin, past: KV | None, mask, chain: KV | None, grow) -> tuple[torch.Tensor, KV]:
        attn_in, residual = self.attention_input(x)
        attn, grown = self.self_attn(attn_in, cos, sin, past, mask, chain, grow)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), grown


class FusedInputLayer(DecoderLayer):
    """EAGLE-3's first layer: x = [token embedding, hidden] (2d wide); attention reads both,
    each under its own norm, and the residual stream is the hidden part (vLLM speculators'
    `Eagle3DecoderLayer` with norm_before_residual=False)."""

    def __init__(self, d: int, heads: int, kv_heads: int, inner: int, eps: float = 1e-6):
        super().__init__(d, heads, kv_heads, inner, eps, d_in=2 * d)
        self.hidden_norm = nn.RMSNorm(d, eps=eps)

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, hidden = x.chunk(2, -1)
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1), hidden


_READS_THE_INPUT = {f"self_attn.{p}_proj.weight" for p in "qkv"}


def start_as_target_layer(layer: DecoderLayer, state: dict[str, torch.Tensor]) -> None:
    """Copy a target decoder layer's weights (HF names, `TargetInfo.layer_state`) into a draft
    layer of its shape: training then starts from a layer that already reads the target's
    residual stream. EAGLE-3's first layer reads [embedding; carried] (2d wide): the target's
    q/k/v go to the carried half and its input norm to `hidden_norm`; the embedding half keeps
    its random start."""
    ours = layer.state_dict()
    fused = isinstance(layer, FusedInputLayer)
    with torch.no_grad():
        for name, weight in state.items():
            if fused and name == "input_layernorm.weight":
                name = "hidden_norm.weight"
            if name not in ours:
                raise ValueError(f"the target's layer has {name!r}, which the draft layer has not")
            mine = ours[name]
            if fused and name in _READS_THE_INPUT:
                mine = mine[:, -weight.shape[1]:]  # the carried half
            if mine.shape != weight.shape:
                raise ValueError(f"{name}: the target's is {tuple(weight.shape)}, the draft's {tuple(mine.shape)}; "
                                 f"a draft layer starts as the target's only at the target's sizes")
            mine.copy_(weight)


def run_layers(layers: nn.ModuleList, x: torch.Tensor, positions: torch.Tensor, theta: float,
               past: list[KV] | None, mask: torch.Tensor | None, chain: list[KV] | None,
               grow: Literal["prefix", "chain"]) -> tuple[torch.Tensor, list[KV]]:
    """x [B, S, d] at positions [S] through every layer -> (out [B, S, d], per-layer grown KV)."""
    cos, sin = rope_rows(positions, layers[0].self_attn.head_dim, theta)
    grown = []
    for i, layer in enumerate(layers):
        x, kv = layer(x, cos, sin, past[i] if past else None, mask, chain[i] if chain else None, grow)
        grown.append(kv)
    return x, grown


def causal_mask(new: int, past: int, device=None) -> torch.Tensor:  # [new, past + new] bool
    """Row i (at position past + i) sees every earlier position and itself."""
    return torch.arange(past + new, device=device)[None, :] <= (past + torch.arange(new, device=device))[:, None]


# --- heads and states of the head-style families (medusa, hydra, lstm) ------------------------


class OutputHeads(nn.Module):
    """Bias-free output layers [N, D], one per draft step or one shared by all (weight tying)."""

    def __init__(self, steps: int, d: int, vocab_size: int, mode: Literal["per_head", "shared"]):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(d, vocab_size, bias=False) for _ in range(1 if mode == "shared" else steps))

    def weight(self, p: int) -> torch.Tensor:  # [N, D]
        return self.linears[min(p, len(self.linears) - 1)].weight

    def forward(self, p: int, x: torch.Tensor) -> torch.Tensor:  # [..., D] -> [..., N]
        return self.linears[min(p, len(self.linears) - 1)](x)  # the module, so native_drafting can route it


@dataclass
class LastHidden:
    """Inference state of families that read only the target's latest feature."""

    hidden: torch.Tensor  # [1, H] the target's last hidden state at the last committed position


class HeadsOnLastHidden:
    """Mixin for families whose step p ends in `self.out` (OutputHeads) and whose decoding state
    is the target's last feature (medusa, hydra, lstm): one definition of what they share."""

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self.out(p, states)

    def draft_head_weight(self, p: int) -> torch.Tensor:
        return self.out.weight(p)

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor, layers=None) -> LastHidden:
        return LastHidden(hidden=prompt_hidden[:, -1])
