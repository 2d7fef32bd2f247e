"""Peers and the side-by-side comparison behind `speclab bench`.

Every method is a callable prompt [1, T] -> `Generation`: the project's plain and speculative
decoding, and transformers' `generate` (greedy or sampled, optionally with an assistant model
or prompt lookup). `compare` runs them all on the same prompts in one process, alternating
methods prompt by prompt (the order rotates, so none always runs first on a warm cache).

Acceptance length, comparable across engines: tokens committed per target verification pass,
pooled over prompts (metrics.tokens_per_pass): from the drafting steps for the project's
speculators; for transformers' methods, whose steps are not exposed, (new tokens - 1) /
(target passes - 1) with the passes counted by a forward hook on the target; 1 for plain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tqdm import tqdm

from speclab.speculator.target import FrozenTarget

from .engine import Generation
from .metrics import RequestRecord, acceptance_conventions, bootstrap_ci, speedups, timing, tokens_per_pass
from .paired import verdict
from .sampling import SamplingConfig

Method = Callable[[torch.Tensor], Generation]
WARMUP_TOKENS = 8


def hf_method(
    target: FrozenTarget,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    **generate_kwargs,
) -> Method:
    """transformers' `generate` as a method; generate_kwargs e.g. assistant_model=...,
    prompt_lookup_num_tokens=... . Sampled runs reseed torch's global RNG per call."""
    sampling = sampling or SamplingConfig()
    eos = sorted(target.eos_token_ids)
    if sampling.mode == "sample":
        decode = dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    else:
        decode = dict(do_sample=False)

    def run(prompt: torch.Tensor, max_new: int | None = None) -> Generation:
        prompt = prompt.to(target.device)
        if sampling.mode == "sample":
            torch.manual_seed(sampling.seed)
        with _count_calls(target.model) as calls:
            start = time.perf_counter()
            out = target.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                        max_new_tokens=max_new or max_new_tokens, eos_token_id=eos,
                                        pad_token_id=eos[0], **decode, **generate_kwargs)  # [1, T + new]
            if out.is_cuda:
                torch.cuda.synchronize(out.device)
            seconds = time.perf_counter() - start
        tokens = out[0, prompt.shape[1]:].tolist()
        return Generation(tokens, seconds, calls[0], len(tokens))

    return run


@contextmanager
def _count_calls(model: torch.nn.Module):
    calls = [0]
    handle = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        yield calls
    finally:
        handle.remove()


@dataclass
class MethodRun:
    generations: list[Generation]

    def records(self) -> list[RequestRecord]:
        return [RequestRecord(g.new_tokens, g.seconds, list(g.accepted), g.drafted_tokens, g.draft_seconds,
                              g.verify_seconds, g.steps) for g in self.generations]


def compare(
    methods: dict[str, Method],
    prompts: list[torch.Tensor],  # each [1, T]
    baseline: str = "plain",
    progress: bool = True,
) -> dict[str, MethodRun]:
    """Run every method on every prompt, rotating the order; returns each method's generations."""
    if baseline not in methods:
        raise ValueError(f"the baseline {baseline!r} must be one of the methods {sorted(methods)}")
    if not prompts:
        raise ValueError("compare needs at least one prompt")
    names = list(methods)
    for name in names:  # untimed warm-up: touch every code path once
        methods[name](prompts[0], WARMUP_TOKENS)
        # A method whose drafter remembers what it decoded (suffix's eval history) forgets the warm-up.
        getattr(methods[name], "reset", lambda: None)()
    runs = {name: MethodRun([]) for name in names}
    for i, prompt in enumerate(tqdm(prompts, desc="bench", unit="prompt", disable=not progress)):
        for name in names[i % len(names):] + names[: i % len(names)]:
            runs[name].generations.append(methods[name](prompt))
    return runs


def summarise(
    runs: dict[str, MethodRun],
    baseline: str = "plain",
    exact: bool = True,
    ks: dict[str, int] | None = None,
    indices: list[int] | None = None,
    resamples: int = 1000,
) -> dict[str, dict]:
    """Per method: tok/s, both speedups over the baseline with bootstrap CIs, acceptance
    length, efficiency, the lossless check (exact token match with the baseline when greedy),
    and for the project's speculators the timing and acceptance conventions. `indices`
    restricts to a subset of prompts (a set or a category). Of the methods other than the
    baseline, the fastest is marked `leader` and every other `tied_with_leader` where the
    paired interval of its speedup over the leader's contains 1 (eval/paired.py)."""
    pick = (lambda gens: [gens[i] for i in indices]) if indices is not None else (lambda gens: gens)
    base_gens = pick(runs[baseline].generations)
    base = MethodRun(base_gens).records()
    out = {}
    for name, run in runs.items():
        gens = pick(run.generations)
        records = MethodRun(gens).records()
        length = tokens_per_pass(records)
        speed = speedups(records, base)
        ci = bootstrap_ci(records, base, resamples=resamples)
        row = {
            "tok_s": sum(r.new_tokens for r in records) / sum(r.seconds for r in records),
            **speed,
            "speedup_ci": ci["speedup_total"],
            "acceptance_length": length,
            "efficiency": speed["speedup_total"] / length,
            "ci": ci,
            "figures": {str(i): (m.new_tokens, m.seconds, b.new_tokens, b.seconds)
                        for i, (m, b) in enumerate(zip(records, base))},
            "lossless": {"checked_prompts": len(gens) if exact else 0,
                         "mismatches": sum(g.tokens != b.tokens for g, b in zip(gens, base_gens)) if exact else 0},
            "new_tokens": sum(g.new_tokens for g in gens),
            "seconds": sum(g.seconds for g in gens),
        }
        if any(g.accepted for g in gens):
            row["timing"] = timing(records)
            row["conventions"] = acceptance_conventions(records, (ks or {}).get(name, max(max(g.accepted) for g in gens if g.accepted)))
        out[name] = row
    return mark_ties(out, baseline)


def mark_ties(rows: dict[str, dict], baseline: str) -> dict[str, dict]:
    """`leader` and `tied_with_leader` over the methods other than the baseline, each judged
    against the leader by paired prompts (all methods decoded the same prompts); the
    per-prompt `figures` they were judged by are dropped from the rows."""
    figures = {name: row.pop("figures") for name, row in rows.items()}
    contenders = [name for name in rows if name != baseline]
    top = max(contenders, key=lambda name: rows[name]["speedup_total"], default=None)
    for name, row in rows.items():
        row["leader"], row["tied_with_leader"] = name == top, False
        if name in contenders and name != top:
            found = verdict(figures[name], row["speedup_ci"], figures[top], rows[top]["speedup_ci"])
            row["tied_with_leader"] = bool(found and found["tied"])
    return rows
