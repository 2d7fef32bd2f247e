"""Greedy decoding, plain and speculative, batch size 1, through `FrozenTarget`.

Both loops produce the same tokens by construction: the speculative loop only commits a draft
the target's own argmax agrees with, plus the target's token after it. `score` in
benchmark.py times the two against each other and checks they agree.

The speculative loop (see speculator/base.py):
    prefill the prompt; pending = the target's first token (committed, not yet cached)
    each step:
        d_1..d_k = speculator.propose(state, pending, k)
        target forward on [pending, d_1..d_k] with the cache       -> logits [1, k+1, V]
        verify -> n accepted, next token (correction or bonus)
        commit d_1..d_n, next; drop the k - n rejected drafts from the cache
        speculator.accept(state, [pending, d_1..d_n], target hidden there)
        pending = next
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from speclab.kernels.verify import verify
from speclab.speculator.base import Speculator
from speclab.speculator.target import FrozenTarget

from .metrics import AcceptanceStats


@dataclass
class Generation:
    tokens: list[int]  # the new tokens, EOS included when it ended the generation
    seconds: float  # wall time, prefill included
    steps: int  # target forward passes, prefill included
    new_tokens: int  # len(tokens)


def effective_draft_len(speculator: Speculator, k: int) -> int:
    """k capped at the longest chain the speculator can draft."""
    if k < 1:
        raise ValueError(f"k (draft tokens per step) must be >= 1, got {k}")
    limit = speculator.max_draft_len()
    return k if limit is None else min(k, limit)


@torch.no_grad()
def generate_plain(
    target: FrozenTarget,
    prompt_ids: torch.Tensor,  # [1, T]
    max_new_tokens: int,
    eos_ids: Iterable[int] | None = None,
) -> Generation:
    """Greedy decoding, one target pass per token with the KV cache."""
    prompt_ids = _check_prompt(target, prompt_ids, max_new_tokens)
    stop = _stop_ids(target, eos_ids)
    start = time.perf_counter()
    cache = target.new_cache()
    logits = target(prompt_ids, cache, logits_for="last").logits  # [1, 1, V]
    tokens: list[int] = []
    steps = 1
    while True:
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # [1, 1]
        tokens.append(next_token.item())
        if tokens[-1] in stop or len(tokens) >= max_new_tokens:
            break
        logits = target(next_token, cache, logits_for="last").logits  # [1, 1, V]
        steps += 1
    return Generation(tokens, time.perf_counter() - start, steps, len(tokens))


@torch.no_grad()
def generate_speculative(
    target: FrozenTarget,
    speculator: Speculator,
    prompt_ids: torch.Tensor,  # [1, T]
    max_new_tokens: int,
    k: int,
    eos_ids: Iterable[int] | None = None,
    stats: AcceptanceStats | None = None,
) -> Generation:
    """Greedy speculative decoding; its tokens equal `generate_plain`'s token for token.

    k is capped at `speculator.max_draft_len()`; `stats`, when given, must be built for that
    capped k and receives one `update(n_accepted)` per drafting step.
    """
    prompt_ids = _check_prompt(target, prompt_ids, max_new_tokens)
    k = effective_draft_len(speculator, k)
    if stats is not None and stats.k != k:
        raise ValueError(f"stats were built for k={stats.k} but this run drafts k={k} per step")
    stop = _stop_ids(target, eos_ids)
    start = time.perf_counter()
    cache = target.new_cache()
    layer_ids = speculator.target_layer_ids
    prefill = target(prompt_ids, cache, layer_ids, logits_for="last")  # logits [1, 1, V], hidden [1, T, H]
    state = speculator.start(prompt_ids, prefill.hidden, stack_layers(prefill, layer_ids))
    pending = prefill.logits[:, -1].argmax(dim=-1, keepdim=True)  # [1, 1]
    tokens = [pending.item()]
    steps = 1
    while tokens[-1] not in stop and len(tokens) < max_new_tokens:
        drafts, _ = speculator.propose(state, pending, k)  # [1, k]
        _check_drafts(speculator, drafts, k)
        out = target(torch.cat([pending, drafts], dim=1), cache, layer_ids, logits_for="all")  # logits [1, k+1, V]
        steps += 1
        # Greedy acceptance reads no draft probabilities.
        n_accepted, next_token = verify(drafts, None, out.logits)  # [1], [1]
        # The step's one host sync: n, the drafts and the next token in a single transfer.
        n, *drafted, next_id = torch.cat([n_accepted, drafts[0], next_token]).tolist()
        if stats is not None:
            stats.update(n)
        committed = drafted[:n] + [next_id]
        tokens.extend(committed)
        if len(tokens) >= max_new_tokens or not stop.isdisjoint(committed):
            break  # done: skip the cache and speculator updates nobody will read
        FrozenTarget.rollback(cache, k - n)  # the cache keeps pending, d_1..d_n
        layers = stack_layers(out, layer_ids)
        speculator.accept(state, torch.cat([pending, drafts[:, :n]], dim=1), out.hidden[:, : n + 1],
                          None if layers is None else layers[:, : n + 1])
        pending = next_token.view(1, 1)
    tokens = _truncate(tokens, stop, max_new_tokens)
    return Generation(tokens, time.perf_counter() - start, steps, len(tokens))


def stack_layers(out, layer_ids: tuple[int, ...]) -> torch.Tensor | None:
    """The requested intermediate layers as one tensor [B, T, L, H] (None when none)."""
    return torch.stack([out.layers[i] for i in layer_ids], dim=2) if layer_ids else None


def _check_prompt(target: FrozenTarget, prompt_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    # Batch size 1 only: the loops commit a different number of tokens per step per row.
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] == 0:
        raise ValueError(f"decoding takes one prompt, prompt_ids [1, T] with T >= 1; got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return prompt_ids.to(device=target.device, dtype=torch.long)


def _check_drafts(speculator: Speculator, drafts: torch.Tensor, k: int) -> None:
    if drafts.shape != (1, k):
        raise ValueError(
            f"{type(speculator).__name__}.propose returned drafts {tuple(drafts.shape)}; expected [1, {k}]"
        )


def _stop_ids(target: FrozenTarget, eos_ids: Iterable[int] | None) -> frozenset[int]:
    return frozenset(target.eos_token_ids if eos_ids is None else eos_ids)


def _truncate(tokens: list[int], stop: frozenset[int], max_new_tokens: int) -> list[int]:
    """Cut at the first stop token (kept) and at max_new_tokens."""
    tokens = tokens[:max_new_tokens]
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[: i + 1]
    return tokens
