"""DFlash2: DFlash's block pass with local convolutions inside each layer, and a candidate
selector that reranks each slot's top candidates by the token before it.

    each layer:  h = input_layernorm(x)
                 h', k_out = conv_in(h)                  a causal convolution along the block's slots
                 x = x + conv_out(attention(h'), k_out)  (DFlash's attention, unchanged)
                 the same around the MLP
    conv(h)_s = sum_{j < kernel, j <= s} h_{s-j} * (base_j + delta_j(h_s))
                                                         delta: one kernel per group of channels, from
                                                         the slot's own normed input (both convolutions'
                                                         kernels come from that one projection)
    unary_s = lm_head(norm(block output))_s               DFlash's logits at drafting slot s
    C_s = top-K of unary_s
    score_s(c) = unary_s(c) + <P[y_s] * W h_s, S[c]>     for c in C_s; y_s: the token before slot s's guess

The convolutions start as the identity (base tap 0 = 1, every other weight 0), so an
untrained DFlash2 drafts as DFlash. A slot's draft is its best-scoring candidate; the selector
reads the previous slot's draft, so a block costs one pass plus block_size small K-way
products, as dspark's Markov bias does. As a distribution (sampling, trees) a slot's logits
are its candidates' scores and FLOOR elsewhere: only candidates are ever drafted.

Training: the unary logits learn the family's objective as dflash's do; the selector learns
a K-way cross-entropy towards the target's argmax among the unary top-K, with the target put
in place of the K-th candidate where the top-K misses it (speculators' teacher-forced
selector loss), each step weighed as the unary loss weighs it, added at `selector_weight`.

Parameter names follow speculators' `DFlash2DraftModel` (`layers.i.attention_conv.*`,
`layers.i.mlp_conv.*`, `candidate_selector.*`). speculators' DFlash2 drafts over the verifier's
whole vocabulary (draft_vocab_size 0 here); speclab's also takes a reduced one, like every
family's default (the predecessor codebook still covers every target token, the successor
codebook the draft's), because on a CPU a step's cost is mostly streaming the vocabulary head:
SmolLM2's whole-vocabulary head (49,152 x 576, 57 MB in bf16) made a demo step draft in
about 5 ms, against 3 ms over 8,192 tokens, for the same acceptance (docs/results.md). Such a
draft is exported in speclab's own layout, with that reason (engine_layouts.refusals).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import Features, TargetInfo
from .dflash import KV, DFlashConfig, DFlashLayer, DFlashSpeculator, DFlashState
from .lookup import FLOOR


@dataclass
class DFlash2Config(DFlashConfig):
    conv_kernel_size: int = 2
    """Causal taps of each local convolution along the block (at most block_size)."""
    conv_group_size: int = 16
    """Hidden channels sharing one dynamic kernel (divides the target's hidden size)."""
    selector_rank: int = 256
    """Rank r of the candidate selector's codebooks."""
    selector_top_k: int = 16
    """Candidates K per slot that the selector reranks."""
    selector_weight: float = 1.0
    """The selector's loss beside the unary loss (speculators' selector_loss_alpha)."""


def grouped_causal_conv(h: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """h [..., S, d] rows of whole blocks, delta [..., S, taps, groups], base [taps, d] ->
    [..., S, d]: slot s of each block mixes slots s, s-1, .. of its own block, tap j weighing
    channel c by base[j, c] + delta[s, j, c // group]."""
    *lead, S, d = h.shape
    taps, groups = delta.shape[-2:]
    blocks = h.reshape(*lead, S // block_size, block_size, groups, d // groups)
    kernel = delta.reshape(*lead, S // block_size, block_size, taps, groups, 1)
    out = torch.zeros_like(blocks)
    for j in range(taps):  # the shift pads with zeros: a tap never reaches into the block before
        shifted = F.pad(blocks, (0, 0, 0, 0, j, 0))[..., : block_size, :, :] if j else blocks
        out = out + shifted * (base[j].to(h.dtype).view(groups, d // groups) + kernel[..., j, :, :].to(h.dtype))
    return out.reshape(h.shape)


class LocalConv(nn.Module):
    """The input- and output-side convolutions around one sublayer, both driven by the
    sublayer's normed input (speculators' GroupedDynamicCausalConv)."""

    def __init__(self, d: int, block_size: int, taps: int, group: int):
        super().__init__()
        if d % group:
            raise ValueError(f"dflash2 conv_group_size {group} must divide the hidden size {d}")
        if not 1 <= taps <= block_size:
            raise ValueError(f"dflash2 conv_kernel_size {taps}: between 1 and block_size {block_size}")
        self.block_size, self.taps, self.groups = block_size, taps, d // group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, d))
        self.kernel_projection = nn.Linear(d, 2 * taps * self.groups, bias=False)
        with torch.no_grad():  # the identity: an untrained DFlash2 computes DFlash
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def around(self, sublayer, h: torch.Tensor) -> torch.Tensor:
        """sublayer's output on h [..., S, d], convolved before and after."""
        kernels = self.kernel_projection(h).view(*h.shape[:-1], 2, self.taps, self.groups)
        inner = sublayer(grouped_causal_conv(h, kernels[..., 0, :, :], self.base_kernel[0], self.block_size))
        return grouped_causal_conv(inner, kernels[..., 1, :, :], self.base_kernel[1], self.block_size)


class DFlash2Layer(DFlashLayer):
    """dflash's layer with a LocalConv around its attention and around its MLP."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, inner: int, eps: float,
                 block_size: int, taps: int, group: int):
        super().__init__(d, heads, kv_heads, head_dim, inner, eps)
        self.attention_conv = LocalConv(d, block_size, taps, group)
        self.mlp_conv = LocalConv(d, block_size, taps, group)

    def forward(self, x: torch.Tensor, context: KV, mask: torch.Tensor | None, cos, sin, block_size: int) -> torch.Tensor:
        attend = lambda h: self.attention(h, context, mask, cos, sin, block_size)  # noqa: E731
        x = x + self.attention_conv.around(attend, self.input_layernorm(x))
        return x + self.mlp_conv.around(self.mlp, self.post_attention_layernorm(x))


class DFlash2Speculator(DFlashSpeculator):
    family = "dflash2"
    Config = DFlash2Config
    first_slot = 1

    def __init__(self, config: DFlash2Config, target: TargetInfo):
        super().__init__(config, target)
        if not 1 <= config.selector_top_k <= self.vocab.size or config.selector_rank < 1:
            raise ValueError(f"dflash2 selector_top_k {config.selector_top_k} must be 1..{self.vocab.size} (the draft "
                             f"vocabulary) and selector_rank {config.selector_rank} at least 1")
        d, r = target.hidden_size, config.selector_rank
        selector = self.candidate_selector = nn.Module()
        selector.predecessor_codebook = nn.Parameter(torch.randn(target.vocab_size, r) * 0.02)  # by target id
        selector.successor_codebook = nn.Parameter(torch.randn(self.vocab.size, r) * 0.02)  # by draft id
        selector.hidden_projection = nn.Linear(d, r, bias=False)
        nn.init.normal_(selector.hidden_projection.weight, std=0.02)

    def make_layer(self, d: int) -> DFlashLayer:
        c = self.config
        return DFlash2Layer(d, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps,
                            c.block_size, c.conv_kernel_size, c.conv_group_size)

    # --- the selector --------------------------------------------------------------------

    def transition(self, h: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """h [M, d] slot states, previous [M] the tokens before their guesses (target ids),
        candidates [M, K] (draft ids) -> the selector's bilinear scores [M, K]."""
        s = self.candidate_selector
        context = s.predecessor_codebook[previous] * s.hidden_projection(h).to(s.predecessor_codebook.dtype)
        return torch.einsum("mr,mkr->mk", context, s.successor_codebook[candidates])

    def selected(self, h: torch.Tensor, unary: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """h [M, d], unary [M, N], previous [M] -> the drafted distribution's logits [M, N]: each
        row's top-K candidates at their selector scores, FLOOR elsewhere."""
        candidates = unary.topk(self.config.selector_top_k, dim=-1).indices
        scores = unary.gather(-1, candidates) + self.transition(h, previous, candidates).to(unary.dtype)
        return unary.new_full(unary.shape, FLOOR).scatter(-1, candidates, scores)

    # --- training ------------------------------------------------------------------------

    def draft_logits(self, feats: Features) -> torch.Tensor:  # [B, P, T, N]
        """Teacher-forced: step p at row t reranks with the real token before its guess, x_{t+1+p}."""
        states = self.draft_states(feats)  # [B, P, T, d]
        B, P, T, d = states.shape
        previous = F.pad(feats.input_ids, (0, P + self.shift))  # rows past the end read 0 (never drafted from)
        previous = torch.stack([previous[:, self.shift + p: self.shift + p + T] for p in range(P)], 1)  # [B, P, T]
        unary = self.lm_head(states)
        return self.selected(states.reshape(-1, d), unary.reshape(-1, unary.shape[-1]),
                             previous.reshape(-1)).view(unary.shape)

    def loss(self, feats: Features, objective, target_head):
        rows = self.anchor_rows(feats)
        trained = torch.zeros_like(feats.loss_mask).scatter(1, rows, True)
        states = self._states(feats, rows)  # [B, P, T, d]
        weights, target_args = self.step_weights(), {}
        unary, metrics = self.token_loss(states, feats, objective, target_head, rows=trained, weights=weights,
                                         target_args=target_args)
        total, count, found, trainable = states.new_zeros((), dtype=torch.float32), 0.0, [], self._trainable(feats)
        for p, target in target_args.items():
            mask = self.step_rows(p, trainable, trained)
            h = states[:, p, : mask.shape[1]][mask]  # [N, d], the rows token_loss trained at step p
            previous = feats.input_ids[:, self.shift + p:][mask]  # the token before each guess, teacher-forced
            # target: the target's argmax among the draft vocabulary's columns (token_loss)
            with torch.no_grad():
                candidates = self._top_candidates(h)  # [N, K]
                hit = candidates.eq(target[:, None])
                candidates[:, -1] = torch.where(hit.any(-1), candidates[:, -1], target)
                label = torch.where(hit.any(-1), hit.long().argmax(-1), candidates.shape[1] - 1)
            unary_rows = torch.einsum("nd,nkd->nk", h.float(), self.lm_head.weight[candidates].float())
            scores = unary_rows + self.transition(h, previous, candidates).float()
            total = total + weights[p] * F.cross_entropy(scores, label, reduction="sum")
            count += weights[p] * h.shape[0]
            found.append(hit.any(-1).float().mean().item())
        selector = total / max(count, 1.0)
        metrics["selector_loss"] = selector.detach().item()
        if found:
            metrics[f"recall_at_{self.config.selector_top_k}"] = sum(found) / len(found)
        return unary + self.config.selector_weight * selector, metrics

    @torch.no_grad()
    def _top_candidates(self, h: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        """The unary top-K of rows h [N, d], a chunk of rows at a time (N x vocabulary logits at once is large)."""
        K = self.config.selector_top_k
        out = [self.lm_head(h[i: i + chunk]).topk(K, dim=-1).indices for i in range(0, h.shape[0], chunk)]
        return torch.cat(out) if out else h.new_zeros(0, K, dtype=torch.long)

    # --- inference: one block pass, then the selector slot by slot ------------------------

    def block_output(self, out: torch.Tensor) -> torch.Tensor:
        # The slots' states [P, d]: their vocabulary logits are computed only for the slots a
        # step drafts (streaming the head once per step, not once per slot).
        return out[self.first_slot:]

    def _slot_logits(self, h: torch.Tensor, unary: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """One slot's state h [d] and unary logits [N], after previous [M] target ids -> [M, N] (`selected`)."""
        M = previous.shape[0]
        return self.selected(h.expand(M, -1), unary.expand(M, -1), previous)

    @torch.no_grad()
    def propose(self, state: DFlashState, pending: torch.Tensor, k: int):
        return self.headed_propose(state, pending, k, self._slot_logits)

    @torch.no_grad()
    def extend(self, state: DFlashState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        return self.headed_extend(state, pending, paths, self._slot_logits)
