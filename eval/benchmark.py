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

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from speclab.speculator.base import Speculator
from speclab.speculator.fast_linear import drafting_ops, native_drafting
from speclab.speculator.target import FrozenTarget

from .engine import Generation, effective_draft_len, generate_plain, generate_speculative
from .lossless import classify, tie_tolerance
from .metrics import AcceptanceStats, RequestRecord, acceptance_conventions, bootstrap_ci, speedups, timing
from .paired import figures_of, prompt_key, speedup, speedup_interval
from .sampling import SamplingConfig
from .tree import TreeConfig, generate_tree

WARMUP_TOKENS = 8  # an untimed warm-up only needs to touch every code path once
DEFAULT_CATEGORY = "uncategorized"  # a prompt whose item names no category


@dataclass
class PromptResult:
    prompt_tokens: int
    plain: Generation
    speculative: Generation
    acceptance: AcceptanceStats
    peer: tuple[int, float] | None = None  # transformers' generate: (new tokens, seconds)

    exact: bool = True  # greedy: outputs must match token for token; sampling: they may differ
    divergence: dict | None = None  # greedy outputs that differ: lossless.classify's verdict
    index: int = 0  # the prompt's place in the scored set
    category: str = DEFAULT_CATEGORY  # the kind of task (eval/task_sets.py)
    key: str = ""  # a digest of the prompt's ids, which pairs it across runs (eval/paired.py)

    @property
    def lossless(self) -> bool | None:
        """Greedy: True when equal or a numerical tie (lossless.py); None when sampling."""
        if not self.exact:
            return None
        return self.divergence is None or self.divergence["verdict"] == "tie"

    def to_dict(self) -> dict:
        # The tokens and seconds of both methods are what paired comparisons resample (eval/paired.py).
        return {
            "index": self.index,
            "category": self.category,
            "key": self.key,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.plain.new_tokens,
            "plain_seconds": self.plain.seconds,
            "spec_new_tokens": self.speculative.new_tokens,
            "spec_seconds": self.speculative.seconds,
            "baseline_tok_s": self.plain.new_tokens / self.plain.seconds,
            "spec_tok_s": self.speculative.new_tokens / self.speculative.seconds,
            "mean_acceptance_length": self.acceptance.mean_acceptance_length,
            "lossless": self.lossless,
            **({"divergence": self.divergence} if self.divergence else {}),
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
    sampling: SamplingConfig | None = None,
    tree: TreeConfig | None = None,
    categories: list[str] | None = None,
) -> dict:
    """The acceptance, throughput and lossless blocks of result.json, plus per-prompt rows,
    and the `timing`, `conventions` and `ci` blocks (metrics.py).

    With `peer`, transformers' own greedy `generate` joins the rotation on every prompt, and
    throughput gains `hf_generate_tok_s` and `plain_vs_hf` (the project's plain decoding
    over transformers'). `sampling` decodes both methods by seeded sampling (then the
    lossless check cannot compare tokens: it reports checked_prompts 0); `tree` drafts a
    tree of that shape instead of a chain of k (k becomes the tree's depth). `categories`
    names each prompt's kind of task (per-prompt records and `by_category`).
    """
    if not prompts:
        raise ValueError("score needs at least one prompt")
    if categories is not None and len(categories) != len(prompts):
        raise ValueError(f"score got {len(categories)} categories for {len(prompts)} prompts")
    k = effective_draft_len(speculator, tree.depth if tree else k)
    if tree is not None:
        tree = TreeConfig(tree.shape, k, tree.top_k, tree.budget)
    run = _Runner(target, speculator, max_new_tokens, k, sampling, tree)
    # Drafting through the native GEMM where it builds, its weights in the target's dtype
    # (speculator/fast_linear.py).
    with _eval_mode(speculator), native_drafting(speculator, target.dtype) as routed:
        ops = drafting_ops(speculator)
        _warm_up(run, prompts[0], peer)
        results = [
            _score_prompt(run, prompt, rotation=i, peer=peer)
            for i, prompt in enumerate(tqdm(prompts, desc="score", unit="prompt", disable=not progress))
        ]
    for i, (result, prompt) in enumerate(zip(results, prompts)):
        result.index, result.key = i, prompt_key(prompt[0].tolist())
        result.category = (categories[i] if categories else None) or DEFAULT_CATEGORY
    summary = _summarise(results, k, tie_tolerance(target))
    # How the drafts ran, which their timings depend on: linears on the native GEMM, packed in the
    # dtype the drafting ops chose (fast_linear.DraftingOps), else as the speculator holds them.
    packed = routed and ops.weight_dtype is not None  # DraftingOps packs as bf16 or not at all
    summary["drafting"] = {"native_linears": routed, "weights": "bf16" if packed else "as loaded"}
    return summary


@dataclass
class _Runner:
    """The decoding settings of one `score` call, so each method is one call on a prompt."""

    target: FrozenTarget
    speculator: Speculator
    max_new_tokens: int
    k: int
    sampling: SamplingConfig | None = None
    tree: TreeConfig | None = None

    def plain(self, prompt: torch.Tensor, max_new: int | None = None) -> Generation:
        return generate_plain(self.target, prompt, max_new or self.max_new_tokens, sampling=self.sampling)

    def speculative(self, prompt: torch.Tensor, stats: AcceptanceStats | None = None,
                    max_new: int | None = None) -> Generation:
        max_new = max_new or self.max_new_tokens
        if self.tree is not None:
            return generate_tree(self.target, self.speculator, prompt, max_new, self.tree, stats=stats,
                                 sampling=self.sampling)
        # Looked up at call time so tests can swap in a corrupted engine.
        return generate_speculative(self.target, self.speculator, prompt, max_new, self.k, stats=stats,
                                    sampling=self.sampling)

    @property
    def exact(self) -> bool:
        return self.sampling is None or self.sampling.mode == "greedy"


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


def _score_prompt(run: _Runner, prompt: torch.Tensor, rotation: int, peer: bool = False) -> PromptResult:
    """Runs every method once on the prompt, the order rotating from prompt to prompt."""
    stats = AcceptanceStats(run.k)
    methods = {
        "plain": lambda: run.plain(prompt),
        "speculative": lambda: run.speculative(prompt, stats),
    }
    if peer:
        methods["peer"] = lambda: _hf_generate(run.target, prompt, run.max_new_tokens)
    names = list(methods)
    order = names[rotation % len(names):] + names[: rotation % len(names)]
    out = {name: methods[name]() for name in order}
    divergence = None
    if run.exact and out["plain"].tokens != out["speculative"].tokens:
        divergence = classify(run.target, prompt, out["plain"].tokens, out["speculative"].tokens)
    return PromptResult(prompt.shape[-1], out["plain"], out["speculative"], stats, out.get("peer"), run.exact,
                        divergence)


def record(gen: Generation) -> RequestRecord:
    return RequestRecord(gen.new_tokens, gen.seconds, list(gen.accepted), gen.drafted_tokens,
                         gen.draft_seconds, gen.verify_seconds, gen.steps)


def _summarise(results: list[PromptResult], k: int, tolerance: float) -> dict:
    acceptance = AcceptanceStats(k)
    for result in results:
        acceptance.merge(result.acceptance)
    baseline = sum(r.plain.new_tokens for r in results) / sum(r.plain.seconds for r in results)
    spec = sum(r.speculative.new_tokens for r in results) / sum(r.speculative.seconds for r in results)
    throughput = {"baseline_tok_s": baseline, "spec_tok_s": spec, "speedup": spec / baseline}
    if all(r.peer for r in results):
        hf = sum(r.peer[0] for r in results) / sum(r.peer[1] for r in results)
        throughput.update(hf_generate_tok_s=hf, plain_vs_hf=baseline / hf)
    spec_records, plain_records = [record(r.speculative) for r in results], [record(r.plain) for r in results]
    throughput.update(speedups(spec_records, plain_records))
    checked = [r for r in results if r.lossless is not None]
    return {
        "acceptance": acceptance.to_dict(),
        "throughput": throughput,
        "lossless": {"checked_prompts": len(checked), "mismatches": sum(not r.lossless for r in checked),
                     "ties": sum(r.divergence is not None and r.lossless for r in checked),
                     "tie_tolerance": tolerance},
        "timing": timing(spec_records),
        "conventions": acceptance_conventions(spec_records, k),
        "ci": bootstrap_ci(spec_records, plain_records),
        "per_prompt": [r.to_dict() for r in results],
        "by_category": by_category(results, k),
        "outputs": [r.plain.tokens for r in results],  # plain decoding's tokens per prompt (contamination.py)
    }


def by_category(results: list[PromptResult], k: int) -> dict:
    """Per kind of task: prompts, speedup with its interval over the category's prompts
    (eval/paired.py), acceptance length and rate: result.json's `by_category`."""
    groups: dict[str, list[PromptResult]] = {}
    for result in results:
        groups.setdefault(result.category, []).append(result)
    out = {}
    for category, members in groups.items():
        acceptance = AcceptanceStats(k)
        for result in members:
            acceptance.merge(result.acceptance)
        figures = [f for f in (figures_of(r.to_dict()) for r in members) if f is not None]  # timed prompts
        out[category] = {"prompts": len(members),
                         "speedup": float(speedup(np.asarray(figures))) if figures else None,
                         "speedup_ci": speedup_interval(figures),
                         "acceptance_length": acceptance.mean_acceptance_length,
                         "acceptance_rate": acceptance.acceptance_rate}
    return out


def _warm_up(run: _Runner, prompt: torch.Tensor, peer: bool = False) -> None:
    max_new = min(run.max_new_tokens, WARMUP_TOKENS)
    run.plain(prompt, max_new)
    run.speculative(prompt, max_new=max_new)
    run.speculator.reset()  # a drafter remembering outputs (suffix) must not score on the warm-up's
    if peer:
        _hf_generate(run.target, prompt, max_new)


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
