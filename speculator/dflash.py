"""DFlash (arXiv 2602.06036): a block drafter that proposes a whole block in one pass,
conditioned on the target's hidden states.

    c_j = hidden_norm(fc [l^a_j; l^b_j; ...])       the target's layers at target_layers, per context position j
    block = [x_a, m, m, ..., m]                      the pending token, then block_size - 1 mask tokens,
                                                     at positions a .. a + block_size - 1
    each layer:  q, k, v of the block (after input_layernorm); k, v of the context from c
                 (the same c feeds every layer: no per-layer context state to carry);
                 every block row sees all context j < a and the whole block (non-causal)
    logits = lm_head(norm(block output)) at slots 1 .. block_size - 1

Slot s of the block anchored at a guesses token a + s, from context up to a - 1 and the
pending token x_a alone: the drafts of a block never read one another, so one pass drafts
them all, and the target verifies them as a chain, or as a tree of each slot's top
candidates (`extend` returns a slot's logits whatever path led there).

In speclab's training convention (speculator/base.py) the block anchored at a = t + 1 is
row t, and its slot p + 1 is step p: it guesses the target's distribution at t + 1 + p
(shift = 1). Training reads `anchors` blocks per sequence (all positions when 0), each
with its own context mask, and weighs step p by exp(-p / loss_decay) as DFlash does.

Parameter names follow vLLM speculators' `DFlashDraftModel` (Qwen3 layers with q/k norms),
so export is a renaming; the token embedding is the target's, frozen and never saved (as
speculators reloads it from the verifier), and the mask token is one of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar
import math

import torch
from torch import nn

from .base import Features, Speculator, TargetInfo
from .eagle3 import default_layer_ids
from .layers import FrozenTargetTensor, SwiGLU, _apply_rope, attend, compute_dtype, rope_rows

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class DFlashConfig:
    block_size: int = 8
    """Rows per draft pass: the pending token plus block_size - 1 drafted tokens."""
    num_layers: int = 1
    """Draft decoder layers."""
    num_heads: int = 9
    """Attention heads."""
    num_kv_heads: int = 3
    """Key/value heads (grouped-query attention; divides num_heads)."""
    head_dim: int = 64
    """Width of one head (the draft's hidden width is the target's, as speculators' DFlash fixes it)."""
    intermediate_size: int = 1536
    """MLP width per layer."""
    target_layers: list[int] = field(default_factory=list)
    """Target hidden_states ids fused by fc (0 = embeddings); empty: EAGLE-3's low/mid/high choice."""
    mask_token: int = -1
    """Target token id whose (frozen) embedding fills the slots to draft; -1: the vocabulary's last id."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all)."""
    anchors: int = 64
    """Blocks trained per sequence, at random assistant positions (0: one at every position).
    Every position costs block_size rows through the layers: on the demo's data (about 230
    tokens a sequence) all of them trained at 0.62 steps/s on 2 cores, 20 minutes for its two
    epochs; speculators samples 512 anchors of sequences several thousand tokens long."""
    loss_decay: float = 4.0
    """Step p's loss weight is exp(-p / loss_decay) (DFlash's gamma; 0: all steps weigh 1)."""
    head: str = "frozen"
    """The output layer, initialised from the target's LM head rows: frozen (as speculators keeps it) or trained."""
    rope_theta: float = 10000.0
    """Rotary base."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon of every norm."""


@dataclass
class DFlashState:
    cache: list[KV]  # per layer, the context's keys/values [1, h_kv, n, dh]
    length: int  # context positions held (0..length-1); the pending token sits at `length`
    last_token: int  # the token at position length - 1 (xpress's refiner reads it)
    block: tuple[int, int, torch.Tensor] | None = None  # (length, pending id, logits [block_size - 1, N]) of the last pass


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose keys and values also come from the target's context."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, inner: int, eps: float):
        super().__init__()
        if heads % kv_heads or head_dim % 2:
            raise ValueError(f"num_heads {heads} must divide by num_kv_heads {kv_heads}, and head_dim {head_dim} be even (rotary pairs)")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(heads * head_dim, d, bias=False)
        self.self_attn.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.self_attn.k_norm = nn.RMSNorm(head_dim, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, inner)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """x [B, S, d] at rotary rows cos/sin [S, dh] -> keys (normed, rotated), values [B, h_kv, S, dh]."""
        B, S, _ = x.shape
        a = self.self_attn
        k = a.k_norm(a.k_proj(x).view(B, S, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = a.v_proj(x).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
        return _apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, context: KV, mask: torch.Tensor | None, cos, sin, block_size: int) -> torch.Tensor:
        """x [B, S, d]: S = blocks x block_size rows at rotary rows cos/sin [S, dh]; context keys and
        values [B, h_kv, N, dh] under mask [B or 1, 1, 1, S, N] (None: all visible). Each row also
        sees every row of its own block."""
        x = x + self.attention(self.input_layernorm(x), context, mask, cos, sin, block_size)
        return x + self.mlp(self.post_attention_layernorm(x))

    def attention(self, h: torch.Tensor, context: KV, mask: torch.Tensor | None, cos, sin, block_size: int) -> torch.Tensor:
        """The attention sublayer on normed rows h [B, S, d] (forward's arguments) -> o_proj's output."""
        B, S, _ = h.shape
        a = self.self_attn
        q = a.q_norm(a.q_proj(h).view(B, S, self.heads, self.head_dim)).transpose(1, 2)
        q = _apply_rope(q, cos, sin)
        k, v = self.keys_values(h, cos, sin)  # [B, h_kv, S, dh]
        # Each row's own block as its private key group: [B, h_kv, S, block_size, dh].
        blocks = S // block_size

        def own_block(t: torch.Tensor) -> torch.Tensor:
            t = t.view(B, self.kv_heads, blocks, 1, block_size, self.head_dim)
            return t.expand(-1, -1, -1, block_size, -1, -1).reshape(B, self.kv_heads, S, block_size, self.head_dim)

        out = attend(q, context, mask, (own_block(k), own_block(v)), self.heads // self.kv_heads)
        return a.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class DFlashSpeculator(Speculator):
    family = "dflash"
    Config = DFlashConfig
    shift = 1
    target_tensors = ("embed_weight",)
    # The first block slot that drafts: DFlash's slot 0 holds the pending token and guesses
    # nothing (speculators' sample_from_anchor=False); DSpark's guesses the token after it.
    first_slot: ClassVar[int] = 1

    def __init__(self, config: DFlashConfig, target: TargetInfo):
        super().__init__(config, target)
        if config.block_size - self.first_slot < 1:
            raise ValueError(f"{self.family} block_size {config.block_size} drafts nothing")
        if config.head not in ("frozen", "trained"):
            raise ValueError(f"{self.family} head {config.head!r}: frozen or trained")
        d = target.hidden_size
        self.embed = FrozenTargetTensor(target.embed_weight, "input embedding", self.family)
        self.fc = nn.Linear(len(self.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = nn.RMSNorm(d, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(self.make_layer(d) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(d, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(d, self.vocab.size, bias=False)
        if target.lm_head_weight is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(self.vocab.rows(target.lm_head_weight))
        self.lm_head.weight.requires_grad_(config.head == "trained")

    def make_layer(self, d: int) -> DFlashLayer:
        """One draft decoder layer of width d (dflash2's wraps its sublayers in convolutions)."""
        c = self.config
        return DFlashLayer(d, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps)

    @classmethod
    def layer_ids_for(cls, config: DFlashConfig, num_layers: int) -> tuple[int, ...]:
        ids = tuple(config.target_layers) or default_layer_ids(num_layers)
        bad = [i for i in ids if not 0 <= i <= num_layers]
        if bad:
            raise ValueError(f"{cls.family} target_layers {bad} outside 0..{num_layers} (0 = embeddings)")
        return ids

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token if self.config.mask_token >= 0 else self.target_info.vocab_size - 1

    def max_draft_len(self) -> int:
        return self.config.block_size - self.first_slot

    def step_weights(self) -> list[float]:
        gamma = self.config.loss_decay
        return [math.exp(-p / gamma) if gamma > 0 else 1.0 for p in range(self.max_draft_len())]

    # --- the shared pass ------------------------------------------------------------

    def context(self, layers: torch.Tensor) -> torch.Tensor:
        """The target's layers [B, T, L, H] -> the context every draft layer reads [B, T, d]."""
        return self.hidden_norm(self.fc(layers.to(compute_dtype(self)).flatten(-2)))

    def blocks(self, pending: torch.Tensor, starts: torch.Tensor, context: list[KV], mask: torch.Tensor | None) -> torch.Tensor:
        """pending [B, A] tokens opening A blocks at positions starts [B, A] -> the blocks' normed
        outputs [B, A, block_size, d]."""
        B, A = pending.shape
        bs, dtype = self.config.block_size, compute_dtype(self)
        tokens = torch.full((B, A, bs), self.mask_token_id, dtype=torch.long, device=pending.device)
        tokens[..., 0] = pending
        x = self.embed.weight[tokens.flatten(1)].to(dtype)  # [B, A bs, d]
        positions = (starts[..., None] + torch.arange(bs, device=starts.device)).flatten()  # [B A bs]
        cos, sin = rope_rows(positions, self.config.head_dim, self.config.rope_theta)
        if B > 1:  # per-sequence rows: [B, 1, A bs, dh] against q [B, h, A bs, dh]
            cos, sin = cos.view(B, 1, A * bs, -1), sin.view(B, 1, A * bs, -1)
        for layer, kv in zip(self.layers, context):
            x = layer(x, kv, mask, cos, sin, bs)
        return self.norm(x).view(B, A, bs, -1)

    def context_kv(self, context: torch.Tensor, start: int) -> list[KV]:
        """Every layer's keys/values of context rows [B, n, d] at positions start..start+n-1."""
        positions = torch.arange(start, start + context.shape[1], device=context.device)
        cos, sin = rope_rows(positions, self.config.head_dim, self.config.rope_theta)
        return [layer.keys_values(context, cos, sin) for layer in self.layers]

    # --- training -------------------------------------------------------------------

    def anchor_rows(self, feats: Features) -> torch.Tensor:
        """[B, A] rows t (block anchored at t + 1) trained in each sequence: every row when
        `anchors` is 0 or covers them, else `anchors` rows drawn among those whose first draft
        is a trainable token (an assistant token the draft vocabulary holds), from a generator seeded by the batch's tokens (a resumed run
        draws the same rows)."""
        B, T = feats.input_ids.shape
        rows = T - 1
        A = self.config.anchors
        if A <= 0 or A >= rows:
            return torch.arange(rows, device=feats.input_ids.device).expand(B, rows)
        g = torch.Generator().manual_seed(int(feats.input_ids.sum()) % (2 ** 31))
        ids = feats.input_ids
        wanted = torch.zeros(B, rows, dtype=torch.bool)  # row t's step 0 guesses token t + 2, from position t + 1
        wanted[:, : rows - 1] = (feats.loss_mask[:, 1:-1] & self.vocab.contains(ids[:, 2:])).cpu()
        picks = []
        for b in range(B):
            score = torch.rand(rows, generator=g) + wanted[b].float()  # assistant rows first, in random order
            picks.append(score.topk(A).indices.sort().values)
        return torch.stack(picks).to(feats.input_ids.device)

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, P, T, d]
        """Every row's block (the loss trains a sample of them: `loss`)."""
        B, T = feats.input_ids.shape
        return self._states(feats, torch.arange(T - 1, device=feats.input_ids.device).expand(B, T - 1))

    def _states(self, feats: Features, rows: torch.Tensor) -> torch.Tensor:
        if feats.layers is None:
            raise ValueError(f"dflash reads the target's layers {self.target_layer_ids}; none were given")
        ids = feats.input_ids
        B, T = ids.shape
        context = self.context(feats.layers)  # [B, T, d]
        starts = rows + 1  # the block anchored at a = t + 1 opens with x_a
        mask = (torch.arange(T, device=ids.device) < starts[..., None])  # [B, A, T]: context j < a
        mask = mask.repeat_interleave(self.config.block_size, 1)[:, None, None]  # [B, 1, 1, A bs, T]
        out = self.blocks(ids.gather(1, starts), starts, self.context_kv(context, 0), mask)  # [B, A, bs, d]
        out = self.slot_states(out, ids, starts)  # [B, A, P, D]
        states = out.new_zeros(B, out.shape[2], T, out.shape[-1])
        index = rows[:, None, :, None].expand(B, states.shape[1], rows.shape[1], out.shape[-1])
        return states.scatter(2, index, out.transpose(1, 2))

    def slot_states(self, out: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The blocks' outputs [B, A, block_size, d] -> what `draft_head` reads at the drafting
        slots [B, A, P, D] (a family with a head on the previous tokens appends its features
        here, teacher-forced from ids [B, T])."""
        return out[:, :, self.first_slot:]

    def loss(self, feats: Features, objective, target_head):
        rows = self.anchor_rows(feats)
        trained = torch.zeros_like(feats.loss_mask).scatter(1, rows, True)  # [B, T] rows holding a block
        return self.token_loss(self._states(feats, rows), feats, objective, target_head,
                               rows=trained, weights=self.step_weights())

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(states)

    def draft_head_weight(self, p: int) -> torch.Tensor:
        return self.lm_head.weight

    # --- inference ------------------------------------------------------------------

    @torch.no_grad()
    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor, layers: torch.Tensor | None = None) -> DFlashState:
        if layers is None:
            raise ValueError(f"dflash reads the target's layers {self.target_layer_ids}; none were given")
        return DFlashState(self.context_kv(self.context(layers), 0), prompt_ids.shape[1], int(prompt_ids[0, -1]))

    @torch.no_grad()
    def accept(self, state: DFlashState, committed: torch.Tensor, hidden: torch.Tensor, layers: torch.Tensor | None = None) -> None:
        new = self.context_kv(self.context(layers), state.length)
        state.cache = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(state.cache, new)]
        state.length += committed.shape[1]
        state.last_token = int(committed[0, -1])
        state.block = None

    def _block_logits(self, state: DFlashState, pending: torch.Tensor) -> torch.Tensor:  # [block_size - 1, N]
        """One pass over the block opened by `pending`, kept for the step's later calls (`extend`)."""
        token = int(pending.reshape(-1)[0])
        if state.block is None or state.block[:2] != (state.length, token):
            starts = torch.tensor([[state.length]], device=pending.device)
            out = self.blocks(pending.reshape(1, 1), starts, state.cache, None)[0, 0]  # [block_size, d]
            state.block = (state.length, token, self.block_output(out))
        return state.block[2]

    def block_output(self, out: torch.Tensor) -> torch.Tensor:
        """A pass's output [block_size, d] -> what the step's calls read: DFlash's logits [P, N]."""
        return self.lm_head(out[self.first_slot:])

    @torch.no_grad()
    def propose(self, state: DFlashState, pending: torch.Tensor, k: int):
        logits = self._block_logits(state, pending)[: max(0, min(k, self.max_draft_len()))]  # [k', N]
        return self.vocab.to_target(logits.argmax(-1))[None], logits[None]

    @torch.no_grad()
    def extend(self, state: DFlashState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        M, d = paths.shape
        self._check_depth(d)
        # A slot's guess reads the pending token and the context only: the same for every path.
        return self._block_logits(state, pending)[d].expand(M, -1)

    def _check_depth(self, d: int) -> None:
        if d >= self.max_draft_len():
            raise ValueError(f"{self.family} drafts {self.max_draft_len()} tokens a block; a tree of depth {d + 1} is deeper")

    # --- families whose slot reads the token before its guess (dspark, dflash2) --------------

    def chained_propose(self, pending: torch.Tensor, k: int, slot_logits):
        """`propose` slot by slot: slot_logits(slot, previous [M] target ids) -> [M, N], each
        slot after the previous slot's draft (the first after the pending token)."""
        previous, tokens, logits = pending.reshape(1), [], []
        for slot in range(max(0, min(k, self.max_draft_len()))):
            row = slot_logits(slot, previous)  # [1, N]
            previous = self.vocab.to_target(row.argmax(-1))
            tokens.append(previous)
            logits.append(row)
        if not tokens:
            return pending.new_zeros(1, 0), torch.zeros(1, 0, self.vocab.size, device=pending.device)
        return torch.stack(tokens, 1), torch.stack(logits, 1)

    def headed_propose(self, state: DFlashState, pending: torch.Tensor, k: int, slot_logits):
        """`chained_propose` for a family whose slot logits build on DFlash's head (dspark,
        dflash2): slot_logits(h [d], unary [N], previous [M]) -> [M, N]. The head reads no
        draft, so one product for the k' slots streams it once a step, not once a slot."""
        hidden = self._block_logits(state, pending)[: max(0, min(k, self.max_draft_len()))]  # [k', d]
        unary = self.lm_head(hidden)  # [k', N]
        return self.chained_propose(pending, k, lambda slot, previous: slot_logits(hidden[slot], unary[slot], previous))

    def headed_extend(self, state: DFlashState, pending: torch.Tensor, paths: torch.Tensor, slot_logits) -> torch.Tensor:
        """`chained_extend` with `headed_propose`'s slot_logits."""
        hidden = self._block_logits(state, pending)
        return self.chained_extend(pending, paths, lambda slot, previous: slot_logits(
            hidden[slot], self.lm_head(hidden[slot]), previous))

    def chained_extend(self, pending: torch.Tensor, paths: torch.Tensor, slot_logits) -> torch.Tensor:
        """`extend` for such a family: slot d's logits after each path's last token."""
        M, d = paths.shape
        self._check_depth(d)
        return slot_logits(d, paths[:, -1] if d else pending.reshape(1).expand(M))
