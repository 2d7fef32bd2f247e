"""How the next token is chosen: greedy, or seeded sampling from the warped target distribution.

Every random number a decoding run uses comes from one `torch.Generator` seeded from
`SamplingConfig.seed`, drawn on the CPU in a fixed order, so a seeded run repeats exactly
whatever the device. Warping (temperature, top-k, top-p) is the kernels' `warp_logits`, the
definition the verification kernels share.

Speculative sampling with the project's speculators: by default (`drafts="argmax"`)
`propose` and the tree drafter pick their candidates deterministically (argmax / top-k of
the draft logits), so the draft distribution q is a point mass on each drafted token. The
rejection rule with that q, accept d with probability min(1, p(d)/1) and otherwise resample
from max(0, p - onehot(d)), is still exactly lossless; it only gives up the extra acceptance
a draft sampled from its own softened distribution can earn, which `drafts="sample"` buys
for chains (q = the draft's warped distribution, warped like the target's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from speclab.kernels.verify import greedy_tokens, sample_inverse_cdf, warp_logits


@dataclass
class SamplingConfig:
    """Decoding settings shared by every method of a run."""

    temperature: float = 0.0
    """0: greedy decoding; > 0: sample from softmax(logits / temperature)."""
    top_k: int = 0
    """Sample only among the k most likely tokens (0: no limit)."""
    top_p: float = 1.0
    """Sample only within the smallest most-likely set holding this much mass (1: no limit)."""
    seed: int = 0
    """Seed of the run's random stream: equal seeds give equal outputs."""
    drafts: Literal["argmax", "sample"] = "argmax"
    """How a chain's drafts are chosen when sampling. argmax: `propose`'s fast path, q one-hot
    on each draft; sample: each draft drawn from the draft's own warped distribution, which is
    then q (one `extend` call per position; families without `extend` cannot)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1; got top_k={self.top_k}, top_p={self.top_p}")

    @property
    def mode(self) -> Literal["greedy", "sample"]:
        return "greedy" if self.temperature == 0 else "sample"


GREEDY = SamplingConfig()


class TokenChooser:
    """One decoding run's token choices and random stream (module docstring)."""

    def __init__(self, config: SamplingConfig | None = None):
        self.config = config or GREEDY
        self.generator = torch.Generator().manual_seed(self.config.seed)

    @property
    def mode(self) -> Literal["greedy", "sample"]:
        return self.config.mode

    def warp(self, logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., V] float32
        c = self.config
        return warp_logits(logits, c.temperature, c.top_k, c.top_p)

    def randoms(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """n uniforms in [0, 1) as [1, n], the next n of the run's stream."""
        return torch.rand(1, n, generator=self.generator).to(device)

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [1, V] -> the next token [1, 1]: the argmax, or a sample of the warped distribution."""
        if self.mode == "greedy":
            return greedy_tokens(logits).unsqueeze(-1)
        probs = torch.softmax(self.warp(logits), dim=-1)  # [1, V]
        return sample_inverse_cdf(probs, self.randoms(1, logits.device)[:, 0]).view(1, 1)
