"""Verification of draft tokens against the target's logits, one signature for every backend.

`verify` dispatches on the acceptance mode; today only greedy exists, with its pure-torch
reference (a Triton kernel sharing the signature comes later).
"""

from __future__ import annotations

from typing import Literal

import torch

from .reference import verify_greedy

VerifyMode = Literal["greedy"]
VALID_MODES: tuple[str, ...] = ("greedy",)


def verify(
    draft_tokens: torch.Tensor,  # [B, k] long
    draft_probs: torch.Tensor | None,  # [B, k, V]; unused by greedy acceptance
    target_logits: torch.Tensor,  # [B, k+1, V] at [pending, d_1..d_k]
    mode: VerifyMode = "greedy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (n_accepted [B], next_token [B]): accepted draft count, then the target's token."""
    if mode == "greedy":
        return verify_greedy(draft_tokens, target_logits)
    raise NotImplementedError(f"verify mode {mode!r} is not implemented; valid: {', '.join(VALID_MODES)}")


__all__ = ["VALID_MODES", "VerifyMode", "verify", "verify_greedy"]
