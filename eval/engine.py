"""Decoding, plain and speculative (chain here, tree in tree.py), batch size 1, through `FrozenTarget`.

Greedy: both loops produce the same tokens by construction: the speculative loop only commits
a draft the target's own argmax agrees with, plus the target's token after it. Sampling
(`SamplingConfig.temperature > 0`): verification is the rejection rule of kernels/verify, so
every committed token is distributed as plain sampling's (tests/kernels checks it
statistically); the outputs of the two differ token by token since they use their random
numbers differently. `score` in benchmark.py times the loops against each other.

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
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from speclab.kernels.verify import sample_inverse_cdf, verify
from speclab.speculator.base import Speculator
from speclab.speculator.target import FrozenTarget

from .metrics import AcceptanceStats
from .sampling import SamplingConfig, TokenChooser


@dataclass
class Generation:
    tokens: list[int]  # the new tokens, EOS included when it ended the generation
    seconds: float  # wall time, prefill included
    steps: int  # target forward passes, prefill included
    new_tokens: int  # len(tokens)
    accepted: list[int] = field(default_factory=list)  # per drafting step: drafts accepted
    drafted_tokens: int = 0  # draft tokens proposed (k per chain step, the node count per tree step)
    draft_seconds: float = 0.0  # in the speculator (propose / extend and accept)
    verify_seconds: float = 0.0  # in the target's verification pass and the acceptance rule


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
    sampling: SamplingConfig | None = None,
) -> Generation:
    """One target pass per token with the KV cache; greedy unless `sampling` says otherwise."""
    prompt_ids = _check_prompt(target, prompt_ids, max_new_tokens)
    stop = _stop_ids(target, eos_ids)
    chooser = TokenChooser(sampling)
    start = time.perf_counter()
    cache = target.new_cache(max_len=prompt_ids.shape[1] + max_new_tokens)
    # The prefill may run on the wide GEMM: speculative decoding prefills the same way.
    logits = target(prompt_ids, cache, logits_for="last", invariant=False).logits  # [1, 1, V]
    tokens: list[int] = []
    steps = 1
    while True:
        next_token = chooser.choose(logits[:, -1])  # [1, 1]
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
    sampling: SamplingConfig | None = None,
) -> Generation:
    """Chain speculative decoding; greedy output equals `generate_plain`'s token for token.

    k is capped at `speculator.max_draft_len()`; `stats`, when given, must be built for that
    capped k and receives one `update(n_accepted)` per drafting step. With sampling, q is
    one-hot on `propose`'s deterministic drafts, or the draft's own distribution when
    `sampling.drafts == "sample"` (sampling.py).
    """
    k = effective_draft_len(speculator, k)
    prompt_ids = _check_prompt(target, prompt_ids, max_new_tokens, headroom=k + 1)
    if stats is not None and stats.k != k:
        raise ValueError(f"stats were built for k={stats.k} but this run drafts k={k} per step")
    stop = _stop_ids(target, eos_ids)
    chooser = TokenChooser(sampling)
    gen = Generation([], 0.0, 1, 0)
    start = time.perf_counter()
    cache, layer_ids, state, pending = prefill_speculative(target, speculator, prompt_ids, chooser, gen,
                                                           max_len=prompt_ids.shape[1] + max_new_tokens + k + 1)
    tokens = [pending.item()]
    while tokens[-1] not in stop and len(tokens) < max_new_tokens:
        clock = time.perf_counter()
        drafts, q = _draft_chain(speculator, state, pending, k, chooser, target.vocab_size)  # [1, k'], [1, k', V]
        drafted_now = _check_drafts(speculator, drafts, k)  # k' <= k: a drafter may propose fewer, even none
        gen.draft_seconds += _lap(target, clock)
        clock = time.perf_counter()
        out = target(torch.cat([pending, drafts], dim=1), cache, layer_ids, logits_for="all")  # logits [1, k'+1, V]
        gen.steps += 1
        n_accepted, next_token = _verify_chain(chooser, drafts, q, out.logits)  # [1], [1]
        # The step's one host sync: n, the drafts and the next token in a single transfer.
        n, *drafted, next_id = torch.cat([n_accepted, drafts[0], next_token]).tolist()
        gen.verify_seconds += time.perf_counter() - clock
        gen.accepted.append(n)
        gen.drafted_tokens += drafted_now
        if stats is not None:
            stats.update(n, drafted=drafted_now)
        committed = drafted[:n] + [next_id]
        tokens.extend(committed)
        if len(tokens) >= max_new_tokens or not stop.isdisjoint(committed):
            break  # done: skip the cache and speculator updates nobody will read
        FrozenTarget.rollback(cache, drafted_now - n)  # the cache keeps pending, d_1..d_n
        clock = time.perf_counter()
        hidden, layers = speculator_features(speculator, out, layer_ids)
        speculator.accept(state, torch.cat([pending, drafts[:, :n]], dim=1), hidden[:, : n + 1],
                          None if layers is None else layers[:, : n + 1])
        gen.draft_seconds += _lap(target, clock)
        pending = next_token.view(1, 1)
    return finish(gen, tokens, stop, max_new_tokens, start)


def prefill_speculative(target: FrozenTarget, speculator: Speculator, prompt_ids: torch.Tensor,
                        chooser: TokenChooser, gen: Generation,
                        max_len: int) -> tuple[Any, tuple[int, ...], Any, torch.Tensor]:
    """The prompt through the target, the speculator started on its features (counted as
    draft time) and the first token chosen: (cache of max_len positions, layer ids, draft
    state, pending [1, 1]). Chain and tree decoding (tree.py) both start here."""
    cache = target.new_cache(max_len=max_len)
    layer_ids = speculator.target_layer_ids
    # As generate_plain's prefill (wide GEMM allowed); verification passes stay invariant.
    prefill = target(prompt_ids, cache, layer_ids, logits_for="last", invariant=False)  # logits [1, 1, V], hidden [1, T, H]
    clock = time.perf_counter()
    state = speculator.start(prompt_ids, *speculator_features(speculator, prefill, layer_ids))
    gen.draft_seconds += _lap(target, clock)
    return cache, layer_ids, state, chooser.choose(prefill.logits[:, -1])


def finish(gen: Generation, tokens: list[int], stop: set[int], max_new_tokens: int, start: float) -> Generation:
    """The committed tokens cut at the first stop token or the budget, and the wall time."""
    gen.tokens = _truncate(tokens, stop, max_new_tokens)
    gen.new_tokens, gen.seconds = len(gen.tokens), time.perf_counter() - start
    return gen


def _draft_chain(speculator: Speculator, state, pending: torch.Tensor, k: int, chooser: TokenChooser,
                 vocab: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """k drafts [1, k] and their distributions q [1, k, V] (None when greedy: unused)."""
    if chooser.mode == "greedy" or chooser.config.drafts == "argmax":
        drafts = speculator.propose_tokens(state, pending, k)  # [1, k]
        # Deterministic drafts: q is a point mass on each.
        return drafts, None if chooser.mode == "greedy" else F.one_hot(drafts, vocab).float()
    tokens: list[int] = []
    qs = []
    for d in range(k):
        path = torch.tensor([tokens], dtype=torch.long, device=pending.device).view(1, d)
        draft_logits = speculator.extend(state, pending, path)  # [1, N] over the draft vocabulary
        full = draft_logits.new_full((1, vocab), float("-inf"))
        full[:, speculator.vocab.ids.to(full.device)] = draft_logits.float()  # [1, V]: -inf off the draft vocabulary
        q = torch.softmax(chooser.warp(full), dim=-1)  # [1, V], warped as the target is
        tokens.append(int(sample_inverse_cdf(q, chooser.randoms(1, q.device)[:, 0])))
        qs.append(q)
    return torch.tensor([tokens], device=pending.device), torch.stack(qs, dim=1)


def _verify_chain(chooser: TokenChooser, drafts: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor):
    """drafts [1, k], q [1, k, V], target logits [1, k+1, V] -> (n_accepted [1], next_token [1]).
    With no drafts (k = 0) the step is a plain one: the target's own choice."""
    if drafts.shape[1] == 0:
        return torch.zeros(1, dtype=torch.long, device=logits.device), chooser.choose(logits[:, 0]).view(1)
    if chooser.mode == "greedy":
        return verify(drafts, None, logits)  # greedy acceptance reads no draft probabilities
    randoms = chooser.randoms(drafts.shape[1] + 1, logits.device)  # [1, k+1]
    return verify(drafts, q, chooser.warp(logits), mode="sample", randoms=randoms)


def _lap(target: FrozenTarget, since: float) -> float:
    """Seconds since `since`, after queued GPU work is done (the clock must include it)."""
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    return time.perf_counter() - since


def stack_layers(out, layer_ids: tuple[int, ...]) -> torch.Tensor | None:
    """The requested intermediate layers as one tensor [B, T, L, H] (None when none)."""
    return torch.stack([out.layers[i] for i in layer_ids], dim=2) if layer_ids else None


def speculator_features(speculator: Speculator, out, layer_ids: tuple[int, ...]):
    """(hidden [B, T, H], layers [B, T, L, H] or None) of a target pass, in the speculator's
    own dtype: the speculator runs in the dtype it was handed, whatever the target computes in."""
    dtype = next((p.dtype for p in speculator.parameters()), out.hidden.dtype)
    layers = stack_layers(out, layer_ids)
    return out.hidden.to(dtype), None if layers is None else layers.to(dtype)


def _check_prompt(target: FrozenTarget, prompt_ids: torch.Tensor, max_new_tokens: int,
                  headroom: int = 0) -> torch.Tensor:
    """A [1, T] prompt that fits the target's context with max_new_tokens (and `headroom`
    draft positions) after it; anything else is refused, naming the limit."""
    # Batch size 1 only: the loops commit a different number of tokens per step per row.
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] == 0:
        raise ValueError(f"decoding takes one prompt, prompt_ids [1, T] with T >= 1; got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    need, context = prompt_ids.shape[1] + max_new_tokens + headroom, target.context_length
    if need > context:
        raise ValueError(f"prompt of {prompt_ids.shape[1]} tokens + {max_new_tokens} new tokens"
                         f"{f' + {headroom} draft positions' if headroom else ''} exceeds {target.name}'s "
                         f"context of {context} tokens; shorten the prompt or lower max_new_tokens")
    return prompt_ids.to(device=target.device, dtype=torch.long)


def _check_drafts(speculator: Speculator, drafts: torch.Tensor, k: int) -> int:
    """The number of drafts, 0..k (a drafter with nothing worth verifying proposes fewer)."""
    if drafts.dim() != 2 or drafts.shape[0] != 1 or drafts.shape[1] > k:
        raise ValueError(
            f"{type(speculator).__name__}.propose returned drafts {tuple(drafts.shape)}; expected [1, k'] with k' <= {k}"
        )
    return drafts.shape[1]


def _stop_ids(target: FrozenTarget, eos_ids: Iterable[int] | None) -> frozenset[int]:
    return frozenset(target.eos_token_ids if eos_ids is None else eos_ids)


def _truncate(tokens: list[int], stop: frozenset[int], max_new_tokens: int) -> list[int]:
    """Cut at the first stop token (kept) and at max_new_tokens."""
    tokens = tokens[:max_new_tokens]
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[: i + 1]
    return tokens
