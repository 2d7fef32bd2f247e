"""XPress: DFlash's block pass plus a small causal refiner over the block, resolved at
inference with parallel (Jacobi) passes.

    h_0..h_{B-1}            the block's outputs (DFlash's pass; slot 0 holds the pending token)
    g = mean_k h_k          a summary of the whole block
    x_k = in_proj [down_h h_k; down_g g; E y_k]      y_k: the token before slot k's guess
    x_k += sum_{j <= k} L[:, k, j] * x_j             a causal mix across the block (per channel)
    x_k += SwiGLU(x_k)
    logits_k = lm_head(h_k) + readout(x_k)           slots 1..B-1 draft (fill-in layout, as dflash)

y_0 is the token before the pending one, y_1 the pending token, y_k (k >= 2) slot k - 1's
draft. The refiner's input depends on drafts, but causally: the drafts are the fixed point of
"y from the last pass's argmax", which Jacobi passes reach in at most B - 1 passes, each
pass a few rank-r products for the whole block; most blocks settle in two or three. The
result equals drafting slot by slot, so `extend` (the teacher-forced refiner on a path)
returns what `propose` would after that path.

Training teacher-forces y on the real tokens (speculators' teacher-forced pass). Its
consistency rounds (free-running passes on the model's own argmax) and the base-logits
anchor term are not trained here: the loss is the family's objective on the refined logits.
`draft_states` carries [h_k; x_k], and logits are one linear map of it ([lm_head | readout]),
so the loss fuses with the objective as for a plain head.

Parameter names follow speculators' `XPressDraftModel` (`refiner_head.*`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .base import TargetInfo
from .dflash import DFlashConfig, DFlashSpeculator, DFlashState


@dataclass
class XPressConfig(DFlashConfig):
    xpress_rank: int = 256
    """Width r of the refiner (its embedding, mix and MLP live in r)."""
    xpress_mlp_ratio: int = 2
    """The refiner MLP's hidden width is r x this."""


class XPressBlock(NamedTuple):
    """What a step's calls read of one block pass: what no draft moves, computed once a step
    (each Jacobi pass then costs the refiner and its readout only, not DFlash's head again)."""

    hidden: torch.Tensor  # [block_size, d]
    base: torch.Tensor  # [P, N]: DFlash's logits of the drafting slots
    fixed: tuple[torch.Tensor, torch.Tensor]  # `refine_fixed(hidden)`


class XPressSpeculator(DFlashSpeculator):
    family = "xpress"
    Config = XPressConfig
    first_slot = 1

    def __init__(self, config: XPressConfig, target: TargetInfo):
        super().__init__(config, target)
        r, d, bs = config.xpress_rank, target.hidden_size, config.block_size
        if r < 1 or config.xpress_mlp_ratio < 1:
            raise ValueError(f"xpress_rank {r} and xpress_mlp_ratio {config.xpress_mlp_ratio} must be at least 1")
        head = self.refiner_head = nn.Module()
        head.token_embed = nn.Embedding(target.vocab_size, r)
        head.down_h = nn.Linear(d, r, bias=False)
        head.down_g = nn.Linear(d, r, bias=False)
        head.in_proj = nn.Linear(3 * r, r, bias=False)
        head.mix_l = nn.Parameter(torch.zeros(r, bs, bs))  # zero: the refiner starts as no mix
        head.mlp_gate = nn.Linear(r, r * config.xpress_mlp_ratio, bias=False)
        head.mlp_up = nn.Linear(r, r * config.xpress_mlp_ratio, bias=False)
        head.mlp_down = nn.Linear(r * config.xpress_mlp_ratio, r, bias=False)
        head.readout = nn.Linear(r, self.vocab.size, bias=False)
        for module in head.children():  # XPress's recipe: every matrix at std 0.02
            nn.init.normal_(module.weight, std=0.02)
        self.register_buffer("causal", torch.tril(torch.ones(bs, bs)), persistent=False)

    @property
    def width(self) -> int:
        return self.target_info.hidden_size

    def refine_fixed(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The refiner's inputs that read no token: h [..., B, d] -> its own and the block
        summary's projections, [..., B, r] each."""
        head = self.refiner_head
        return head.down_h(h), head.down_g(h.mean(-2, keepdim=True).expand_as(h))

    def refine(self, h: torch.Tensor, previous: torch.Tensor, fixed=None) -> torch.Tensor:
        """h [..., B, d] a block's outputs, previous [..., B] the token before each slot's guess
        (target ids) -> the refiner's features [..., B, r]. `fixed`: `refine_fixed(h)` where
        the caller kept it (h [B, d] then, read by every row of previous [M, B])."""
        head = self.refiner_head
        down_h, down_g = self.refine_fixed(h) if fixed is None else fixed
        e = head.token_embed(previous).to(h.dtype)
        x = head.in_proj(torch.cat([down_h.expand_as(e), down_g.expand_as(e), e], -1))
        mix = head.mix_l * self.causal.to(head.mix_l.dtype)  # [r, B, B]: slot k reads slots j <= k
        x = x + torch.einsum("ckj,...jc->...kc", mix, x)
        return x + head.mlp_down(F.silu(head.mlp_gate(x)) * head.mlp_up(x))

    def slot_states(self, out: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        bs = out.shape[2]
        padded = F.pad(ids, (0, bs))  # slots past the sequence's end read 0 (their rows are never trained)
        previous = padded.gather(1, (starts[..., None] - 1 + torch.arange(bs, device=ids.device)).flatten(1))
        x = self.refine(out, previous.view(*out.shape[:3]))
        return torch.cat([out, x], -1)[:, :, self.first_slot:]  # [B, A, P, d + r]

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(states[..., : self.width]) + self.refiner_head.readout(states[..., self.width :])

    def draft_head_weight(self, p: int) -> torch.Tensor:
        return torch.cat([self.lm_head.weight, self.refiner_head.readout.weight], 1)  # [N, d + r]

    # --- inference: one block pass, then Jacobi passes of the refiner -----------------------

    def block_output(self, out: torch.Tensor) -> XPressBlock:
        return XPressBlock(out, self.lm_head(out[self.first_slot:]), self.refine_fixed(out))

    def _refined(self, block: XPressBlock, previous: torch.Tensor, slots: int | None = None) -> torch.Tensor:
        """previous [M, B] -> logits [M, slots, N] at the first `slots` drafting slots (default
        all P): `draft_head` on [hidden; refined], its DFlash half read from the block."""
        x = self.refine(block.hidden, previous, block.fixed)
        stop = None if slots is None else self.first_slot + slots
        return block.base[:slots] + self.refiner_head.readout(x[:, self.first_slot:stop])

    def _previous(self, state: DFlashState, pending: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """[M, block_size]: the token before each slot's guess, given drafts [M, <= P] (the rest 0)."""
        M = drafts.shape[0]
        head = torch.tensor([state.last_token, int(pending.reshape(-1)[0])], device=drafts.device).expand(M, 2)
        rest = F.pad(drafts, (0, self.config.block_size - 2 - drafts.shape[1]))[:, : self.config.block_size - 2]
        return torch.cat([head, rest], 1)

    @torch.no_grad()
    def propose(self, state: DFlashState, pending: torch.Tensor, k: int):
        block = self._block_logits(state, pending)
        # Slot j's refined logits read the drafts before it only (the mix is causal), so the k
        # asked for settle on their own: k slots' logits a pass and at most k + 1 passes, not the
        # block's P (a chain of 2 from a block of 8: 6.4 ms of drafting a step against 13.8).
        n = max(1, min(k, self.max_draft_len()))
        drafts = self.vocab.to_target(block.base[:n].argmax(-1))[None]
        for _ in range(n + 1):  # pass 0 above; each pass settles at least one more slot
            logits = self._refined(block, self._previous(state, pending, drafts), n)  # [1, n, N]
            settled = self.vocab.to_target(logits.argmax(-1))
            if torch.equal(settled, drafts):
                break
            drafts = settled
        k = max(0, min(k, n))
        return drafts[:, :k], logits[:, :k]

    @torch.no_grad()
    def extend(self, state: DFlashState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        d = paths.shape[1]
        self._check_depth(d)
        block = self._block_logits(state, pending)
        return self._refined(block, self._previous(state, pending, paths))[:, d]
