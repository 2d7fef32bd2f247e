"""Batched generation on the lean decoder: many prompts at once, each at its own length.

Each prompt is prefilled into its own cache row (no padding: rows hold different lengths),
then every step feeds one token per unfinished row in a single pass; a row that ends (an
end token or its budget) leaves the batch, so finished rows stop costing compute. The
kernels are batch-invariant, so a row's tokens are exactly what decoding it alone gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import LeanDecoder


@dataclass
class SamplingRule:
    """Greedy when do_sample is False; else temperature, then top-k (0: off), then top-p."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


def choose(logits: torch.Tensor, rule: SamplingRule) -> torch.Tensor:
    """logits [B, V] -> tokens [B] (the global torch RNG when sampling: seed it to repeat)."""
    if not rule.do_sample:
        return logits.argmax(-1)
    scores = logits.float() / max(rule.temperature, 1e-6)
    if rule.top_k > 0:
        kth = scores.topk(min(rule.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if rule.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_scores.softmax(-1) > rule.top_p  # keep the smallest set reaching top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
    return torch.multinomial(scores.softmax(-1), 1)[:, 0]


@torch.no_grad()
def generate_batch(decoder: LeanDecoder, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int],
                   rule: SamplingRule | None = None) -> list[list[int]]:
    """The new tokens of every prompt (through its first stop token, at most max_new_tokens)."""
    rule = rule or SamplingRule()
    if not prompts:
        return []
    cache = decoder.new_cache(rows=len(prompts), max_len=max(len(p) for p in prompts) + max_new_tokens)
    device = decoder.device
    pending = []
    for row, prompt in enumerate(prompts):
        out = decoder.forward(torch.tensor([prompt], device=device), cache, rows=[row], logits_for="last")
        pending.append(out.logits[0, -1])
    tokens = choose(torch.stack(pending), rule).tolist()
    replies: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    while True:
        still = []
        for row, token in zip(active, tokens):
            replies[row].append(token)
            if token not in stop_ids and len(replies[row]) < max_new_tokens:
                still.append(row)
        if not still:
            return replies
        active = still
        ids = torch.tensor([[replies[r][-1]] for r in active], device=device)  # [B', 1]
        logits = decoder.forward(ids, cache, rows=active, logits_for="last").logits[:, -1]  # [B', V]
        tokens = choose(logits, rule).tolist()
