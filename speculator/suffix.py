"""SuffixDecoding (Oliaro et al., 2024): drafting from suffix trees of the request and of
earlier outputs, no model at all.

Two tries (suffix_tree.py) are matched against the context: one per request, over its
prompt and everything committed since, and one over the outputs of the earlier requests of
the same eval (the speculator object lives for the whole eval; a request's output joins it
when the next request starts). Per drafted token the longer of the two matches wins (the
request's own on a tie); its node's children, ranked by how often each followed the
pattern, are the candidates, with their empirical probabilities.

Speculation length adapts to the match: at each step the match length m at the pending
token allows ceil(spec_factor * m) confident drafts (a long match predicts a long shared
continuation; a one-token match barely one token), and a candidate less likely than
min_prob is not confident either. Past that, drafts are still the best guesses but ranked
as not confident (lookup.py), which is what a tree's budget and the hybrid's rule read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .lookup import Guess, TokenHistory, TrainingFree
from .suffix_tree import SuffixTrie, Writer, ranked_children


@dataclass
class SuffixConfig:
    max_pattern: int = 16
    """Longest suffix of the context matched (the tries hold substrings up to this + 1 tokens)."""
    spec_factor: float = 1.0
    """Confident drafts per step = ceil(spec_factor * match length at the pending token)."""
    min_prob: float = 0.1
    """A candidate below this empirical probability is not confident."""
    global_outputs: bool = True
    """Also match the outputs of the eval's earlier requests (SuffixDecoding's global tree)."""
    draft_vocab_size: int = 0
    """Always 0: the drafter proposes tokens it has seen, from the whole vocabulary."""

    def __post_init__(self) -> None:
        if self.max_pattern < 1 or self.spec_factor <= 0 or not 0 <= self.min_prob <= 1:
            raise ValueError(f"suffix needs max_pattern >= 1, spec_factor > 0, 0 <= min_prob <= 1; got "
                             f"{self.max_pattern}, {self.spec_factor}, {self.min_prob}")


@dataclass
class SuffixState(TokenHistory):
    trie: SuffixTrie | None = None
    writer: Writer | None = None
    prompt_len: int = 0
    root: tuple[int, int, int] = (-1, -1, 0)  # (committed count, pending, match length) of the last root match


class SuffixSpeculator(TrainingFree):
    family = "suffix"
    Config = SuffixConfig

    def __init__(self, config: SuffixConfig, target):
        super().__init__(config, target)
        self.history = SuffixTrie(config.max_pattern + 1)  # earlier outputs of this eval
        self._open: SuffixState | None = None  # the request being decoded: its output joins history next

    def reset(self) -> None:
        self.history = SuffixTrie(self.config.max_pattern + 1)
        self._open = None

    def window(self) -> int:
        return self.config.max_pattern

    def new_state(self) -> SuffixState:
        if self._open is not None and self.config.global_outputs:
            self.history.add(self._open.tokens[self._open.prompt_len:])
        trie = SuffixTrie(self.config.max_pattern + 1)
        self._open = SuffixState(trie=trie, writer=trie.writer())
        return self._open

    def start(self, prompt_ids, prompt_hidden, layers=None) -> SuffixState:
        state = super().start(prompt_ids, prompt_hidden, layers)
        state.prompt_len = len(state.tokens)
        return state

    def observe(self, state: SuffixState, tokens: list[int]) -> None:
        for token in tokens:
            state.tokens.append(token)
            state.writer.append(token)

    def match(self, state: SuffixState, context: list[int]) -> tuple[int, list[tuple[int, float]]]:
        """(match length, ranked candidates) of the better of the request's and the history's tries."""
        length, node = state.trie.longest_match(context, self.config.max_pattern)
        if self.config.global_outputs and self.history.size > 1:
            other, other_node = self.history.longest_match(context, self.config.max_pattern)
            if other > length:
                length, node = other, other_node
        return length, ranked_children(node) if node.children else []

    def match_length(self, state: SuffixState, pending: int) -> int:
        """The match length at the pending token, kept for the step (every draft reads it)."""
        key = (len(state.tokens), pending)
        if state.root[:2] != key:
            state.root = (*key, self.match(state, self.context(state, pending, []))[0])
        return state.root[2]

    def candidates(self, state: SuffixState, context: list[int]) -> Guess:
        depth = len(context) - 1 - min(len(state.tokens), self.window())  # drafted tokens in the context
        pending = context[-1 - depth]
        root = self.match_length(state, pending)
        length, ranked = self.match(state, context)
        if not length:  # the empty pattern's children are every token: no information
            return Guess([], confident=False)
        allowed = math.ceil(self.config.spec_factor * root)
        return Guess(ranked, confident=depth < allowed and ranked[0][1] >= self.config.min_prob)
