"""Acceptance counters with vLLM's definitions.

Per drafting step the speculator proposes k tokens and the target accepts the leading n of
them (0 <= n <= k), then adds one token of its own. So, over all steps:

    acceptance rate        = accepted tokens / draft tokens           (in [0, 1])
    mean acceptance length = 1 + accepted tokens / drafts             (tokens per target pass, in [1, k+1])
    per-position rate[i]   = steps that accepted draft i / drafts     (non-increasing in i)
"""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def update(self, n_accepted: int) -> None:
        """Record one drafting step in which the leading n_accepted of k drafts were accepted."""
        if not 0 <= n_accepted <= self.k:
            raise ValueError(f"n_accepted must be in [0, {self.k}], got {n_accepted}")
        self.num_drafts += 1
        self.num_draft_tokens += self.k
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
