"""Batched generation on the lean decoder: many prompts at once, each at its own length.

Each distinct prompt is prefilled into its own cache row (no padding: rows hold different
lengths); a prompt that repeats one already prefilled gets a copy of that row (sampling
user turns feeds the same few chat prefixes to every row: one prefill each, not one per
row). Then every step feeds one token per unfinished row in a single pass; a row that ends (an
end token or its budget) leaves the batch, so finished rows stop costing compute. The
kernels are batch-invariant, so a row's tokens are exactly what generating it alone gives
(where wide passes are off: `invariant=False` lets a wide step take torch's bf16 GEMM).
A bf16 target generates over a bf16 cache (generation_cache_dtype), so its tokens can part
from plain decoding's, over an fp32 cache, at near ties.
"""

from __future__ import annotations

from typing import Callable

import torch

from .model import LeanDecoder


# Chooses each step's tokens from the rows' last logits: logits [B, V] -> tokens [B].
Chooser = Callable[[torch.Tensor], torch.Tensor]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    # argmax's first index, by `max`: its CPU reduction is vectorised where argmax's is not
    # (2.3 against 10.8 ms over 128 rows of 49,152 bf16 logits; as kernels.verify.greedy_tokens).
    return logits.max(-1).indices


def generation_cache_dtype(decoder: LeanDecoder) -> torch.dtype:
    """The KV cache of batched generation: bf16 for a bf16 target, the precision transformers
    keeps its cache in. At 128 rows with ~200 cached tokens each, the attention reading an
    fp32 cache was half of a step (59 of 123 ms on an AMX Xeon); bf16 halves what it reads.
    Decoding and verification keep fp32 caches: their outputs are unchanged by this."""
    return torch.bfloat16 if decoder.dtype == torch.bfloat16 else torch.float32


@torch.no_grad()
def generate_batch(decoder: LeanDecoder, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int],
                   choose: Chooser = greedy, hidden: list | None = None) -> list[list[int]]:
    """The new tokens of every prompt (through its first stop token, at most max_new_tokens).

    `hidden`: a list that receives, per prompt, the target's final hidden state (after the
    final norm, fp32, [len(prompt) + len(reply), D]) at every token of the prompt and of its
    reply: what a teacher-forced pass over prompt + reply computes, so a feature cache of
    self-distilled data needs no second pass. A reply's last token is fed once more for it,
    in the next step's batch (its logits are not used). A row whose last token would run
    past the model's context gets one row fewer.
    """
    if not prompts:
        return []
    keep = hidden is not None
    cache = decoder.new_cache(rows=len(prompts), max_len=max(len(p) for p in prompts) + max_new_tokens + keep,
                              dtype=generation_cache_dtype(decoder))
    device = decoder.device
    pieces: list[list[torch.Tensor]] = [[] for _ in prompts]  # hidden rows per prompt, in order
    pending = []
    first_row: dict[tuple[int, ...], int] = {}  # each distinct prompt's prefilled row
    for row, prompt in enumerate(prompts):
        twin = first_row.setdefault(tuple(prompt), row)
        if twin != row:  # the same tokens: the same cache, logits and hidden states
            cache.copy_row(twin, row)
            pending.append(pending[twin])
            if keep:
                pieces[row].append(pieces[twin][0])
            continue
        out = decoder.forward(torch.tensor([prompt], device=device), cache, rows=[row], logits_for="last",
                              invariant=False)
        pending.append(out.logits[0, -1])
        if keep:
            pieces[row].append(out.hidden[0])
    tokens = choose(torch.stack(pending)).tolist()
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
        tokens = choose(out.logits[: len(still), -1]).tolist()  # [B'] for the rows still going
    if keep:
        hidden.extend(torch.cat(p) for p in pieces)
    return replies
