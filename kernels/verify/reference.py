"""Greedy verification in plain torch: the reference the Triton kernel will be checked against.

The target has just run one forward pass over [pending, d_1..d_k]. Its logits at position i
are its distribution for the token after that position, so target_logits[:, i] judges d_{i+1}
and target_logits[:, k] gives a free "bonus" token when every draft is accepted.

Greedy acceptance rule: accept d_{i+1} while it equals argmax(target_logits[:, i]); the first
disagreement ends the run, and the target's own argmax at that position replaces the rejected
draft. The committed tokens are then exactly what greedy plain decoding would have produced.
"""

from __future__ import annotations

import torch


def verify_greedy(
    draft_tokens: torch.Tensor,  # [B, k] long
    target_logits: torch.Tensor,  # [B, k+1, V]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (n_accepted [B] long, next_token [B] long); no host sync, no model call."""
    if draft_tokens.dim() != 2 or target_logits.dim() != 3:
        raise ValueError(
            f"expected draft_tokens [B, k] and target_logits [B, k+1, V]; got "
            f"{tuple(draft_tokens.shape)} and {tuple(target_logits.shape)}"
        )
    batch, k = draft_tokens.shape
    if target_logits.shape[:2] != (batch, k + 1):
        raise ValueError(
            f"target_logits must be [B, k+1, V] = [{batch}, {k + 1}, V] for draft_tokens "
            f"{tuple(draft_tokens.shape)}; got {tuple(target_logits.shape)}"
        )
    target_choice = target_logits.argmax(dim=-1)  # [B, k+1]
    agrees = target_choice[:, :k] == draft_tokens  # [B, k]
    # cumprod turns [1, 1, 0, 1] into [1, 1, 0, 0]: only the leading run of agreements survives.
    n_accepted = agrees.long().cumprod(dim=1).sum(dim=1)  # [B]
    # The target's choice right after the accepted run: the correction, or the bonus if n == k.
    next_token = target_choice.gather(1, n_accepted.unsqueeze(1)).squeeze(1)  # [B]
    return n_accepted, next_token
