"""Acceptance counters with vLLM's definitions.

Per drafting step the speculator proposes k tokens and the target accepts the leading n of
them (0 <= n <= k), then adds one token of its own. So, over all steps:

    acceptance rate        = accepted tokens / draft tokens           (in [0, 1])
    mean acceptance length = 1 + accepted tokens / drafts             (tokens per target pass, in [1, k+1])
    per-position rate[i]   = steps that accepted draft i / drafts     (non-increasing in i)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AcceptanceStats:
    k: int  # draft tokens proposed per step
    num_drafts: int = 0  # drafting steps (target verification passes)
    num_draft_tokens: int = 0  # k per step
    num_accepted_tokens: int = 0  # drafts the target agreed with, summed over steps
    # accepted_per_position[i]: steps whose draft i (0-based) was accepted; len k
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k (draft tokens per step) must be >= 1, got {self.k}")
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.k
        if len(self.accepted_per_position) != self.k:
            raise ValueError(f"accepted_per_position needs {self.k} entries, got {len(self.accepted_per_position)}")

    def update(self, n_accepted: int, drafted: int | None = None) -> None:
        """Record one drafting step in which the leading n_accepted of k drafts were accepted.

        `drafted` counts the step's draft tokens when it is not k: a tree verifies more
        candidates than its depth k (the longest acceptable run)."""
        if not 0 <= n_accepted <= self.k:
            raise ValueError(f"n_accepted must be in [0, {self.k}], got {n_accepted}")
        self.num_drafts += 1
        self.num_draft_tokens += self.k if drafted is None else drafted
        self.num_accepted_tokens += n_accepted
        for i in range(n_accepted):
            self.accepted_per_position[i] += 1

    def merge(self, other: "AcceptanceStats") -> "AcceptanceStats":
        """Add other's counts into self (in place) and return self."""
        if other.k != self.k:
            raise ValueError(f"cannot merge acceptance stats for k={other.k} into k={self.k}")
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.accepted_per_position = [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position)]
        return self

    # With no drafting step yet, nothing was accepted: rates are 0 and each target pass
    # yields its single own token (length 1), which keeps the values JSON-safe (no NaN).

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + (self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0)

    @property
    def per_position(self) -> list[float]:
        if not self.num_drafts:
            return [0.0] * self.k
        return [count / self.num_drafts for count in self.accepted_per_position]

    def to_dict(self) -> dict:
        """The `acceptance` block of result.json."""
        return {
            "k": self.k,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position": self.per_position,
        }


# --- every convention side by side, over requests (prompts) ---------------------------------
#
# Papers and engines report "acceptance length" and "speedup" under different conventions,
# which is most of why their numbers disagree. Each is computed here from per-request data:
#   pooled           sum over all requests' steps, then divide (vLLM, result.json's `acceptance`)
#   per-request mean the statistic per request, then the mean over requests (Spec-Bench style)
#   with bonus       tokens committed per target pass = 1 + accepted (the target's own token counts)
#   without bonus    accepted drafts per pass only (what the draft alone earned)
#   speedup, Spec-Bench   mean over prompts of tok/s, method over baseline
#   speedup, total        total tokens / total time, method over baseline


@dataclass
class RequestRecord:
    """One request decoded by one method: what the conventions below are computed from."""

    new_tokens: int
    seconds: float
    accepted: list[int] = field(default_factory=list)  # per drafting step
    drafted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    passes: int = 0  # target forward passes, prefill included (0: unknown)

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def acceptance_conventions(records: list[RequestRecord], k: int) -> dict:
    """Mean acceptance length pooled and per request, with and without the bonus token."""
    steps = [len(r.accepted) for r in records]
    total_steps, total_accepted = sum(steps), sum(sum(r.accepted) for r in records)
    pooled = total_accepted / total_steps if total_steps else 0.0
    per_request = [sum(r.accepted) / len(r.accepted) for r in records if r.accepted]
    mean_request = sum(per_request) / len(per_request) if per_request else 0.0
    per_position = [sum(sum(n > i for n in r.accepted) for r in records) / total_steps if total_steps else 0.0
                    for i in range(k)]
    return {
        "steps": total_steps,
        "pooled_with_bonus": 1.0 + pooled,
        "pooled_without_bonus": pooled,
        "per_request_mean_with_bonus": 1.0 + mean_request,
        "per_request_mean_without_bonus": mean_request,
        "per_position": per_position,
    }


def timing(records: list[RequestRecord]) -> dict:
    """Draft and verify time per step, and draft cost per proposed token (ms, measured)."""
    steps = sum(len(r.accepted) for r in records)
    drafted = sum(r.drafted_tokens for r in records)
    draft_s, verify_s = sum(r.draft_seconds for r in records), sum(r.verify_seconds for r in records)
    return {
        "draft_ms_per_step": 1e3 * draft_s / steps if steps else None,
        "verify_ms_per_step": 1e3 * verify_s / steps if steps else None,
        "draft_ms_per_token": 1e3 * draft_s / drafted if drafted else None,
        "draft_seconds": draft_s,
        "verify_seconds": verify_s,
    }


def speedups(method: list[RequestRecord], baseline: list[RequestRecord]) -> dict:
    """Both speedup conventions of `method` over `baseline` (same prompts, same order)."""
    return {"speedup_specbench": _specbench(method, baseline, range(len(method))),
            "speedup_total": _total(method, baseline, range(len(method)))}


def bootstrap_ci(
    method: list[RequestRecord],
    baseline: list[RequestRecord] | None,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict:
    """Percentile bootstrap intervals over prompts (resampled with replacement, paired with
    the baseline's same prompts): pooled acceptance length (`tokens_per_pass`), tok/s, and both speedups when a
    baseline is given. Each entry is [low, high]."""
    if not method:
        raise ValueError("bootstrap_ci needs at least one request")
    gen = torch.Generator().manual_seed(seed)
    n = len(method)
    draws = torch.randint(0, n, (resamples, n), generator=gen).tolist()
    stats: dict[str, list[float]] = {"acceptance_length": [], "tok_s": []}
    if baseline is not None:
        stats.update(speedup_specbench=[], speedup_total=[])
    for idx in draws:
        stats["acceptance_length"].append(tokens_per_pass([method[i] for i in idx]))
        stats["tok_s"].append(sum(method[i].new_tokens for i in idx) / sum(method[i].seconds for i in idx))
        if baseline is not None:
            stats["speedup_specbench"].append(_specbench(method, baseline, idx))
            stats["speedup_total"].append(_total(method, baseline, idx))
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    return {name: [_quantile(values, lo), _quantile(values, hi)] for name, values in stats.items()}


def tokens_per_pass(records: list[RequestRecord]) -> float:
    """Mean acceptance length (bonus included), pooled: from the drafting steps when recorded,
    else from the target's pass count as (new tokens - 1) / (passes - 1) (a peer engine whose
    steps are only counted), else 1 (plain decoding)."""
    steps = sum(len(r.accepted) for r in records)
    if steps:
        return 1.0 + sum(sum(r.accepted) for r in records) / steps
    passes = sum(r.passes - 1 for r in records if r.passes > 1)
    return sum(r.new_tokens - 1 for r in records if r.passes > 1) / passes if passes else 1.0


def _specbench(method, baseline, idx) -> float:
    idx = list(idx)
    base = sum(baseline[i].tok_s for i in idx)
    return sum(method[i].tok_s for i in idx) / base if base else 0.0


def _total(method, baseline, idx) -> float:
    idx = list(idx)
    m = sum(method[i].new_tokens for i in idx) / sum(method[i].seconds for i in idx)
    b = sum(baseline[i].new_tokens for i in idx) / sum(baseline[i].seconds for i in idx)
    return m / b


def _quantile(values: list[float], q: float) -> float:
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), q))
