"""DSpark: DFlash's block pass plus a Markov logit-bias head on the previous token.

    block = [x_p, m, ..., m]                 as DFlash, but every slot drafts: slot k guesses
                                             token p + k + 1 (speculators' sample_from_anchor=True)
    logits_k = lm_head(h_k) + W2 e_k         e_k = W1[x_{p+k}], the token before the guessed one
    (gated: W2 (sigmoid(G [h_k; e_k] + b) * e_k))

The layers run once per block, as DFlash's; only the rank-r bias follows the block's own
drafts, slot by slot (x_{p+k} is the draft of slot k - 1), so a block costs one pass plus
block_size small products. Training teacher-forces the bias on the real tokens.

In speclab's convention the block anchored at p = t + 1 is row t and slot k is step k (it
guesses the target's distribution at t + 1 + k). `draft_states` carries [h_k; e_k] for each
step, and the vanilla head is one linear map of it ([lm_head | W2]), so the training loss
fuses it with the objective in vocabulary chunks as it does for a plain head.

Parameter names follow speculators' `DSparkDraftModel` (`markov_head.markov_w1`,
`markov_head.markov_w2`, `markov_head.gate_proj`). Its confidence head (a per-slot
acceptance estimate) is not built here: speclab's engine verifies every drafted slot, and
the export says `enable_confidence_head: false`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import TargetInfo
from .dflash import DFlashConfig, DFlashSpeculator, DFlashState


@dataclass
class DSparkConfig(DFlashConfig):
    markov_rank: int = 256
    """Rank r of the previous-token logit bias W2 W1 (W1: [V, r], W2: [N, r])."""
    markov_head: str = "vanilla"
    """vanilla: W2 W1[x] | gated: the bias gated by the slot's hidden state."""


class DSparkSpeculator(DFlashSpeculator):
    family = "dspark"
    Config = DSparkConfig
    first_slot = 0

    def __init__(self, config: DSparkConfig, target: TargetInfo):
        super().__init__(config, target)
        if config.markov_rank < 1:
            raise ValueError(f"dspark markov_rank {config.markov_rank}: at least 1 (markov_rank 0 is dflash's drafting)")
        if config.markov_head not in ("vanilla", "gated"):
            raise ValueError(f"dspark markov_head {config.markov_head!r}: vanilla or gated")
        d, r = target.hidden_size, config.markov_rank
        self.markov_head = nn.Module()
        self.markov_head.markov_w1 = nn.Embedding(target.vocab_size, r)
        self.markov_head.markov_w2 = nn.Linear(r, self.vocab.size, bias=False)
        nn.init.normal_(self.markov_head.markov_w1.weight, std=0.01)
        nn.init.normal_(self.markov_head.markov_w2.weight, std=0.02)
        if config.markov_head == "gated":
            self.markov_head.gate_proj = nn.Linear(d + r, r)

    @property
    def width(self) -> int:
        return self.target_info.hidden_size

    def slot_states(self, out: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        P = out.shape[2]  # every slot drafts
        padded = F.pad(ids, (0, P))  # slots past the sequence's end read 0 (their rows are never trained)
        previous = padded.gather(1, (starts[..., None] + torch.arange(P, device=ids.device)).flatten(1))  # x_{p+k}
        e = self.markov_head.markov_w1(previous).view(*out.shape[:3], -1).to(out.dtype)
        return torch.cat([out, e], -1)  # [B, A, P, d + r]

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(states[..., : self.width]) + self.markov_bias(states)

    def markov_bias(self, states: torch.Tensor) -> torch.Tensor:
        """The Markov head's logit bias of states [..., d + r] (`draft_head` less DFlash's head)."""
        e = states[..., self.width :]
        if self.config.markov_head == "gated":
            e = torch.sigmoid(self.markov_head.gate_proj(states)) * e
        return self.markov_head.markov_w2(e)

    def draft_head_weight(self, p: int) -> torch.Tensor | None:
        if self.config.markov_head == "gated":
            return None
        return torch.cat([self.lm_head.weight, self.markov_head.markov_w2.weight], 1)  # [N, d + r]

    # --- inference: one block pass, then the bias slot by slot ----------------------------

    def block_output(self, out: torch.Tensor) -> torch.Tensor:
        return out  # the slots' hidden states [block_size = P, d]: the bias needs each slot's previous token first

    def _slot_logits(self, h: torch.Tensor, unary: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """h [d] one slot's state, unary [N] DFlash's logits of it, previous [M] target ids -> [M, N]."""
        e = self.markov_head.markov_w1(previous).to(h.dtype)  # [M, r]
        return unary + self.markov_bias(torch.cat([h.expand(e.shape[0], -1), e], -1))

    @torch.no_grad()
    def propose(self, state: DFlashState, pending: torch.Tensor, k: int):
        return self.headed_propose(state, pending, k, self._slot_logits)

    @torch.no_grad()
    def extend(self, state: DFlashState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        return self.headed_extend(state, pending, paths, self._slot_logits)
