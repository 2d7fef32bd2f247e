"""Reduced draft vocabularies: a speculator may draft only the N most frequent tokens.

The vocabulary-sized output layer dominates a small draft's cost, in training and at every
drafted token; on a 49,152-token target the 8,192 most frequent assistant tokens cover
nearly all of what it writes. Mappings follow vLLM's speculators format:
    d2t[i] = target_id(i) - i        (draft id -> target id offset)
    t2d[v] = v is in the draft vocabulary   (bool over the target vocabulary)
"""

from __future__ import annotations

import torch
from torch import nn


def most_frequent(counts: torch.Tensor, n: int) -> torch.Tensor:  # [V] -> [n] ascending target ids
    """The n most frequent ids (ties to the lower id), in ascending id order."""
    order = torch.argsort(counts, descending=True, stable=True)
    return order[:n].sort().values


class DraftVocab(nn.Module):
    """Which target tokens the draft can propose; the identity when it keeps them all."""

    def __init__(self, target_vocab: int, size: int = 0, counts: torch.Tensor | None = None):
        super().__init__()
        self.target_vocab = target_vocab
        self.full = size <= 0 or size >= target_vocab
        self.size = target_vocab if self.full else size
        ids = torch.arange(self.size)
        if not self.full and counts is not None:
            if counts.shape != (target_vocab,):
                raise ValueError(f"token counts {tuple(counts.shape)} do not match the target vocabulary {target_vocab}")
            ids = most_frequent(counts, size)
        # Saved with the weights: a loaded speculator drafts the vocabulary it was trained on.
        self.register_buffer("ids", ids, persistent=not self.full)  # [N] target ids, ascending

    def rows(self, weight: torch.Tensor) -> torch.Tensor:  # [V, ...] -> [N, ...]
        """The rows of a target tensor at the draft tokens (its head over the draft vocabulary)."""
        return weight[self.ids.to(weight.device)]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.full else self.ids[draft_ids]

    def contains(self, target_ids: torch.Tensor) -> torch.Tensor:  # bool, same shape
        if self.full:
            return torch.ones_like(target_ids, dtype=torch.bool)
        return self.t2d()[target_ids]

    def d2t(self) -> torch.Tensor:  # [N] offsets
        return self.ids - torch.arange(self.size, device=self.ids.device)

    def t2d(self) -> torch.Tensor:  # [V] bool
        mask = torch.zeros(self.target_vocab, dtype=torch.bool, device=self.ids.device)
        mask[self.ids] = True
        return mask
