"""Prompt lookup (n-gram) drafting: find the last n tokens earlier in the prompt and output,
and propose what followed them there.

The rule, per drafted token: for n = max_n down to min_n, if the context's last n tokens
occurred earlier among the committed tokens, the next draft is the token that followed
their most recent occurrence; with no match the draft is a fallback (lookup.py). Drafting
token by token (the draft itself becomes context) copies the matched span while it keeps
matching and lets a longer, more recent match take over when one appears.

The index maps each n-gram to the position after its latest occurrence, updated as tokens
are committed (O(max_n) per token), so a lookup is max_n dictionary probes, whatever the
length of the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .lookup import Guess, TokenHistory, TrainingFree


@dataclass
class NgramConfig:
    max_n: int = 3
    """Longest n-gram matched (tried first)."""
    min_n: int = 1
    """Shortest n-gram matched; below it the draft is the fallback."""
    draft_vocab_size: int = 0
    """Always 0: the drafter proposes tokens it has seen, from the whole vocabulary."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"ngram needs 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")


@dataclass
class NgramState(TokenHistory):
    # index[n - 1][ngram] = position of the token that followed ngram's latest occurrence
    index: list[dict[tuple[int, ...], int]] = field(default_factory=list)


class NgramSpeculator(TrainingFree):
    family = "ngram"
    Config = NgramConfig

    def new_state(self) -> NgramState:
        return NgramState(index=[{} for _ in range(self.config.max_n)])

    def window(self) -> int:
        return self.config.max_n

    def observe(self, state: NgramState, tokens: list[int]) -> None:
        seq = state.tokens
        for token in tokens:
            end = len(seq)  # token's position: it follows the n-grams ending just before it
            seq.append(token)
            for n in range(1, min(self.config.max_n, end) + 1):
                state.index[n - 1][tuple(seq[end - n:end])] = end

    def candidates(self, state: NgramState, context: list[int]) -> Guess:
        for n in range(min(self.config.max_n, len(context)), self.config.min_n - 1, -1):
            position = state.index[n - 1].get(tuple(context[-n:]))
            if position is not None:
                return Guess([(state.tokens[position], 1.0)], confident=True)
        return Guess([], confident=False)
