"""What the training-free drafters (ngram, suffix) share: they read only the tokens.

A `TrainingFree` family has no parameters and no training forward; the experiment skips
training for it (sweeps/experiment.py). Its whole drafting rule is `candidates(state,
context)`: the tokens it guesses may follow `context` (the committed tokens' tail, the
pending token and any drafted path), ranked, each with a probability, plus whether the guess
is within the family's confident speculation length. Both inference paths derive from it,
so `extend` on a path equals what `propose` computes after drafting that path:

- `propose` drafts greedily: the top candidate, appended, k times;
- `extend` turns the candidates into logits over the whole vocabulary.

Logits. A confident candidate with probability p gets log p; every other token gets FLOOR,
far enough below that softmax gives it exactly 0 in fp32 (exp(-1e4) underflows), so a
sampled draft (`SamplingConfig.drafts="sample"`) never picks it and a tree's confidence
(a product of probabilities) is the candidates' own. Guesses the drafter is not confident
in (no match at all, or past its speculation length) still rank first in their row, so
greedy chains keep them, but sit just above the floor: their row is near-uniform and a tree
ranks them below any confident node. The engine needs exactly k drafts per step, so a
chain always carries them; they cost verification width, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .base import Features, Speculator

FLOOR = -1.0e4  # logit of a token the drafter does not propose (softmax: exactly 0)


@dataclass
class Guess:
    ranked: list[tuple[int, float]]  # [(token, probability)], best first; may be empty
    confident: bool  # within the drafter's match-based speculation length


@dataclass
class TokenHistory:
    """The committed tokens of one request (prompt, then every accepted token)."""

    tokens: list[int] = field(default_factory=list)


class TrainingFree(Speculator):
    shift = 0  # unused: nothing is trained

    def __init__(self, config, target):
        if config.draft_vocab_size:
            raise ValueError(f"{self.family} drafts from the tokens it has seen: draft_vocab_size must be 0")
        super().__init__(config, target)

    # --- the rule a family defines ---------------------------------------------------

    def new_state(self) -> Any:
        raise NotImplementedError

    def observe(self, state: Any, tokens: list[int]) -> None:
        """Append committed tokens to the state."""
        raise NotImplementedError

    def candidates(self, state: Any, context: list[int]) -> Guess:
        raise NotImplementedError

    def window(self) -> int:
        """How many committed tokens before the pending one `candidates` may look at."""
        raise NotImplementedError

    # --- training: nothing -----------------------------------------------------------

    def draft_states(self, feats: Features) -> torch.Tensor:
        raise TypeError(f"{self.family} is training-free: it has no training forward")

    def loss(self, *args, **kwargs):
        raise TypeError(f"{self.family} is training-free: it has nothing to train")

    # --- inference -------------------------------------------------------------------

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor, layers=None) -> Any:
        state = self.new_state()
        self.observe(state, prompt_ids[0].tolist())
        return state

    def accept(self, state: Any, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        self.observe(state, committed[0].tolist())

    def context(self, state: Any, pending: torch.Tensor | int, path: list[int]) -> list[int]:
        """The committed tokens' last `window()`, the pending token, the drafted path."""
        return state.tokens[-self.window():] + [int(pending)] + path

    def propose(self, state: Any, pending: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        context, tokens, rows = self.context(state, pending, []), [], []
        for _ in range(k):
            guess = self.guess_with_fallback(state, context)
            tokens.append(guess.ranked[0][0])
            rows.append(self.logits_row(guess))
            context.append(tokens[-1])
        drafts = torch.tensor([tokens], dtype=torch.long, device=pending.device)  # [1, k]
        return drafts, torch.stack(rows)[None].to(pending.device)  # [1, k], [1, k, V]

    def extend(self, state: Any, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """paths [M, d] -> logits [M, V]: the candidates after [pending, paths[m]]."""
        rows = [self.logits_row(self.guess_with_fallback(state, self.context(state, pending, path)))
                for path in paths.tolist()]
        return torch.stack(rows).to(pending.device) if rows else torch.empty(0, self.vocab.size, device=pending.device)

    def guess_with_fallback(self, state: Any, context: list[int]) -> Guess:
        """The family's guess; with none, repeating the last token (a cheap guess that is
        right on runs of whitespace and punctuation), not confident."""
        guess = self.candidates(state, context)
        return guess if guess.ranked else Guess([(context[-1], 1.0)], confident=False)

    def logits_row(self, guess: Guess) -> torch.Tensor:  # [V]
        row = torch.full((self.vocab.size,), FLOOR)
        tokens = torch.tensor([t for t, _ in guess.ranked], dtype=torch.long)
        probs = torch.tensor([p for _, p in guess.ranked])
        # Not confident: just above the floor, in the same order (p in (0, 1]).
        row[tokens] = probs.log() if guess.confident else FLOOR + 1.0 + probs
        return row
