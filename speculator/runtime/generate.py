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
                   rule: SamplingRule | None = None, hidden: list | None = None) -> list[list[int]]:
    """The new tokens of every prompt (through its first stop token, at most max_new_tokens).

    `hidden`: a list that receives, per prompt, the target's final hidden state (after the
    final norm, fp32, [len(prompt) + len(reply), D]) at every token of the prompt and of its
    reply: what a teacher-forced pass over prompt + reply computes, so a feature cache of
    self-distilled data needs no second pass. A reply's last token is fed once more for it,
    in the next step's batch (its logits are not used). A row whose last token would run
    past the model's context gets one row fewer.
    """
    rule = rule or SamplingRule()
    if not prompts:
        return []
    keep = hidden is not None
    cache = decoder.new_cache(rows=len(prompts), max_len=max(len(p) for p in prompts) + max_new_tokens + keep)
    device = decoder.device
    pieces: list[list[torch.Tensor]] = [[] for _ in prompts]  # hidden rows per prompt, in order
    pending = []
    for row, prompt in enumerate(prompts):
        out = decoder.forward(torch.tensor([prompt], device=device), cache, rows=[row], logits_for="last",
                              invariant=False)
        pending.append(out.logits[0, -1])
        if keep:
            pieces[row].append(out.hidden[0])
    tokens = choose(torch.stack(pending), rule).tolist()
    replies: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    while True:
        still, ended = [], []
        for row, token in zip(active, tokens):
            replies[row].append(token)
            if token not in stop_ids and len(replies[row]) < max_new_tokens:
                still.append(row)
            elif keep and cache.lens[row] < cache.max_len:
                ended.append(row)  # fed once more: the hidden state at its last token
        if not still and not ended:
            break
        fed = still + ended  # rows still going first: the step's first logits are theirs
        ids = torch.tensor([[replies[r][-1]] for r in fed], device=device)  # [B', 1]
        out = decoder.forward(ids, cache, rows=fed, logits_for="last", invariant=False)
        if keep:
            for n, r in enumerate(fed):
                pieces[r].append(out.hidden[n])
        if not still:
            break
        active = still
        tokens = choose(out.logits[: len(still), -1], rule).tolist()  # [B'] for the rows still going
    if keep:
        hidden.extend(torch.cat(p) for p in pieces)
    return replies
