"""What the training-free drafters (ngram, suffix) share: they read only the tokens.

A `TrainingFree` family has no parameters and no training forward; the experiment skips
training for it (sweeps/experiment.py). Its whole drafting rule is `candidates(state,
context)`: the tokens it guesses may follow `context` (the committed tokens' tail, the
pending token and any drafted path), ranked, each with a probability, plus whether the guess
is within the family's confident speculation length. Both inference paths derive from it,
so `extend` on a path equals what `propose` computes after drafting that path:

- `propose` drafts greedily: the top candidate, appended, while the guess is confident
  (at most k; none when the first guess is not: the step is then a plain decoding step, as
  a serving engine skips speculation on a lookup miss);
- `extend` turns the candidates into logits over the whole vocabulary.

Logits. A confident candidate with probability p gets log p; every other token gets FLOOR,
far enough below that softmax gives it exactly 0 in fp32 (exp(-1e4) underflows), so a
sampled draft (`SamplingConfig.drafts="sample"`) never picks it and a tree's confidence
(a product of probabilities) is the candidates' own. Guesses the drafter is not confident
in (no match at all, or past its speculation length) still rank first in their row, so
`extend` keeps them, but sit just above the floor: their row is near-uniform and a tree
ranks them below any confident node. A chain stops before them: on the lean runtime every
verified token costs width (5 tokens cost ~1.8x one in bf16), so guesses the drafter does
not believe in are not worth verifying.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

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
        drafts, guesses = self._chain(state, pending, k)
        return drafts, self.logits(guesses, pending.device)[None]  # [1, k'], [1, k', V]

    def propose_tokens(self, state: Any, pending: torch.Tensor, k: int) -> torch.Tensor:
        # Without the [k', V] logits: building them cost ~0.25 ms a step (cache-cold after the
        # target's pass), about a third of a suffix drafter's whole step.
        return self._chain(state, pending, k)[0]

    def _chain(self, state: Any, pending: torch.Tensor, k: int,
               path: Sequence[int] = ()) -> tuple[torch.Tensor, list[Guess]]:
        """The greedy chain after `path` (drafted tokens it starts with): drafts [1, k'] (path
        included, k' <= k) and the guess behind each draft after the path."""
        context, guesses = self.context(state, pending, list(path)), []
        chance, floor = 1.0, self.min_chain_prob()
        for _ in range(k - len(path)):
            guess = self.candidates(state, context)
            if not guess.ranked or not guess.confident:
                break  # the chain ends where the drafter stops believing in its guesses
            chance *= guess.ranked[0][1]
            if chance < floor:
                break  # every draft past here is likelier rejected than paid for (min_chain_prob)
            guesses.append(guess)
            context.append(guess.ranked[0][0])
        n = len(path) + len(guesses)
        drafts = torch.tensor([context[len(context) - n:] if n else []], dtype=torch.long,
                              device=pending.device).view(1, n)  # [1, k'], k' <= k
        return drafts, guesses

    def min_chain_prob(self) -> float:
        """A chain stops before the draft that takes the product of its drafts' probabilities
        below this (0: never). Families with such a knob read it from their config."""
        return 0.0

    def extend(self, state: Any, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """paths [M, d] -> logits [M, V]: the candidates after [pending, paths[m]]."""
        guesses = [self.guess_with_fallback(state, self.context(state, pending, path)) for path in paths.tolist()]
        return self.logits(guesses, pending.device)

    def guess_with_fallback(self, state: Any, context: list[int]) -> Guess:
        """The family's guess; with none, repeating the last token (a cheap guess that is
        right on runs of whitespace and punctuation), not confident."""
        guess = self.candidates(state, context)
        return guess if guess.ranked else Guess([(context[-1], 1.0)], confident=False)

    def logits(self, guesses: list[Guess], device: torch.device) -> torch.Tensor:  # [n, V]
        """One row per guess, built with one allocation (the rows are vocabulary-wide)."""
        rows, tokens, values = [], [], []
        for i, guess in enumerate(guesses):
            for token, p in guess.ranked:
                rows.append(i)
                tokens.append(token)
                # Not confident: just above the floor, in the same order (p in (0, 1]).
                values.append(math.log(p) if guess.confident else FLOOR + 1.0 + p)
        out = torch.full((len(guesses), self.vocab.size), FLOOR)
        out[rows, tokens] = torch.tensor(values)
        return out.to(device)
