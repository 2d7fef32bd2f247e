"""Scoring a speculator: acceptance, tokens/s against plain decoding, and the lossless check.

Plain and speculative decoding run in the same process, alternating prompt by prompt, so a
noisy machine slows both alike; which method goes first also alternates, so neither always
inherits the other's warm caches.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from speclab.speculator.base import Speculator
from speclab.speculator.target import FrozenTarget

from .engine import Generation, effective_draft_len, generate_plain, generate_speculative
from .metrics import AcceptanceStats

WARMUP_TOKENS = 8  # an untimed warm-up only needs to touch every code path once


@dataclass
class PromptResult:
    prompt_tokens: int
    plain: Generation
    speculative: Generation
    acceptance: AcceptanceStats
    peer: tuple[int, float] | None = None  # transformers' generate: (new tokens, seconds)

    @property
    def lossless(self) -> bool:
        return self.speculative.tokens == self.plain.tokens

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.plain.new_tokens,
            "baseline_tok_s": self.plain.new_tokens / self.plain.seconds,
            "spec_tok_s": self.speculative.new_tokens / self.speculative.seconds,
            "mean_acceptance_length": self.acceptance.mean_acceptance_length,
            "lossless": self.lossless,
            **({"hf_generate_tok_s": self.peer[0] / self.peer[1]} if self.peer else {}),
        }


def score(
    target: FrozenTarget,
    speculator: Speculator,
    prompts: list[torch.Tensor],  # each [1, T]
    max_new_tokens: int,
    k: int,
    progress: bool = True,
    peer: bool = False,
) -> dict:
    """The acceptance, throughput and lossless blocks of result.json, plus per-prompt rows.

    With `peer`, transformers' own greedy `generate` joins the rotation on every prompt, and
    throughput gains `hf_generate_tok_s` and `plain_vs_hf` (the project's plain decoding
    over transformers').
    """
    if not prompts:
        raise ValueError("score needs at least one prompt")
    k = effective_draft_len(speculator, k)
    with _eval_mode(speculator):
        _warm_up(target, speculator, prompts[0], min(max_new_tokens, WARMUP_TOKENS), k, peer)
        results = [
            _score_prompt(target, speculator, prompt, max_new_tokens, k, rotation=i, peer=peer)
            for i, prompt in enumerate(tqdm(prompts, desc="score", unit="prompt", disable=not progress))
        ]
    return _summarise(results, k)


def hf_generate_tok_s(
    target: FrozenTarget,
    prompts: list[torch.Tensor],  # each [1, T]
    max_new_tokens: int,
    progress: bool = False,
) -> float:
    """Tokens/s of transformers' own greedy `generate` over the same prompts (the peer)."""
    if not prompts:
        raise ValueError("hf_generate_tok_s needs at least one prompt")
    _hf_generate(target, prompts[0], min(max_new_tokens, WARMUP_TOKENS))  # untimed warm-up
    new_tokens, seconds = 0, 0.0
    for prompt in tqdm(prompts, desc="hf generate", unit="prompt", disable=not progress):
        n, s = _hf_generate(target, prompt, max_new_tokens)
        new_tokens, seconds = new_tokens + n, seconds + s
    return new_tokens / seconds


def _score_prompt(
    target: FrozenTarget, speculator: Speculator, prompt: torch.Tensor, max_new_tokens: int, k: int,
    rotation: int, peer: bool = False,
) -> PromptResult:
    """Runs every method once on the prompt, the order rotating from prompt to prompt."""
    stats = AcceptanceStats(k)
    methods = {
        "plain": lambda: generate_plain(target, prompt, max_new_tokens),
        "speculative": lambda: generate_speculative(target, speculator, prompt, max_new_tokens, k, stats=stats),
    }
    if peer:
        methods["peer"] = lambda: _hf_generate(target, prompt, max_new_tokens)
    names = list(methods)
    order = names[rotation % len(names):] + names[: rotation % len(names)]
    out = {name: methods[name]() for name in order}
    return PromptResult(prompt.shape[-1], out["plain"], out["speculative"], stats, out.get("peer"))


def _summarise(results: list[PromptResult], k: int) -> dict:
    acceptance = AcceptanceStats(k)
    for result in results:
        acceptance.merge(result.acceptance)
    baseline = sum(r.plain.new_tokens for r in results) / sum(r.plain.seconds for r in results)
    spec = sum(r.speculative.new_tokens for r in results) / sum(r.speculative.seconds for r in results)
    throughput = {"baseline_tok_s": baseline, "spec_tok_s": spec, "speedup": spec / baseline}
    if all(r.peer for r in results):
        hf = sum(r.peer[0] for r in results) / sum(r.peer[1] for r in results)
        throughput.update(hf_generate_tok_s=hf, plain_vs_hf=baseline / hf)
    return {
        "acceptance": acceptance.to_dict(),
        "throughput": throughput,
        "lossless": {"checked_prompts": len(results), "mismatches": sum(not r.lossless for r in results)},
        "per_prompt": [r.to_dict() for r in results],
    }


def _warm_up(target: FrozenTarget, speculator: Speculator, prompt: torch.Tensor, max_new_tokens: int, k: int,
             peer: bool = False) -> None:
    generate_plain(target, prompt, max_new_tokens)
    generate_speculative(target, speculator, prompt, max_new_tokens, k)
    if peer:
        _hf_generate(target, prompt, max_new_tokens)


def _hf_generate(target: FrozenTarget, prompt: torch.Tensor, max_new_tokens: int) -> tuple[int, float]:
    """(new tokens, seconds) of one greedy `generate` call, stopping on the target's EOS ids."""
    prompt = prompt.to(target.device)
    eos = sorted(target.eos_token_ids)
    start = time.perf_counter()
    out = target.model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )  # [1, T + new]
    if out.is_cuda:
        torch.cuda.synchronize(out.device)  # the clock must include queued GPU work
    return out.shape[1] - prompt.shape[1], time.perf_counter() - start


@contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration, then the caller's mode back."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)
