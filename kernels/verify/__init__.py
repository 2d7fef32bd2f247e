"""Verification of draft tokens against the target's logits, one signature for every backend.

`verify` dispatches on the acceptance mode to the pure-torch references in reference.py
(greedy, and rejection sampling whose contract is spelled out there); kernels sharing the
signature are dispatched to beside them.
"""

from __future__ import annotations

from typing import Literal

import torch

from .reference import greedy_tokens, sample_inverse_cdf, verify_greedy, verify_sample, warp_logits

VerifyMode = Literal["greedy", "sample"]
VALID_MODES: tuple[str, ...] = ("greedy", "sample")


def verify(
    draft_tokens: torch.Tensor,  # [B, k] long
    draft_probs: torch.Tensor | None,  # [B, k, V] the draft's warped distribution; unused by greedy
    target_logits: torch.Tensor,  # [B, k+1, V] at [pending, d_1..d_k]; warped for "sample"
    mode: VerifyMode = "greedy",
    randoms: torch.Tensor | None = None,  # [B, k+1] in [0, 1) for "sample"; drawn here when None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (n_accepted [B], next_token [B]): accepted draft count, then the target's token."""
    if target_logits.is_cuda and mode in VALID_MODES:
        from .triton import verify_triton  # lazily: triton is only needed (and compiled) on CUDA

        if mode == "sample" and randoms is None:
            randoms = torch.rand(draft_tokens.shape[0], draft_tokens.shape[1] + 1, device=target_logits.device)
        return verify_triton(draft_tokens, draft_probs, target_logits, mode, randoms)
    if mode == "greedy":
        return verify_greedy(draft_tokens, target_logits)
    if mode == "sample":
        if draft_probs is None:
            raise ValueError("verify(mode='sample') needs draft_probs [B, k, V]")
        if randoms is None:
            randoms = torch.rand(draft_tokens.shape[0], draft_tokens.shape[1] + 1, device=target_logits.device)
        return verify_sample(draft_tokens, draft_probs, target_logits, randoms)
    raise NotImplementedError(f"verify mode {mode!r} is not implemented; valid: {', '.join(VALID_MODES)}")


__all__ = ["VALID_MODES", "VerifyMode", "greedy_tokens", "sample_inverse_cdf", "verify", "verify_greedy", "verify_sample",
           "warp_logits"]
