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
With `branches`, a union tree also verifies runner-up continuations at the chain's drafts.

A third trie, optional (`corpus_tokens`): the target's own answers from the run's training
data (`use_training_data`), standing in for the earlier requests a serving engine's global
tree would have seen. The platform builds those answers anyway (self-distillation), so the
tree costs no generation: seconds to build, no training. It is kept in the checkpoint as a
token buffer (`corpus_ids`, `corpus_offsets`: data, never code) and rebuilt from it on load;
`reset` forgets the eval's outputs, never the corpus. With `corpus_tokens: 0` (the default,
and what the training-free baselines use) the drafter is the paper's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import hashlib
import math
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .lookup import Guess, TokenHistory, TrainingFree
from .suffix_tree import SuffixTrie, Writer, ranked_children

# Built corpus tries by content, alive while some speculator holds one: read-only once built,
# so the copies of one speculator that a bench or a pilot makes share one instead of
# rebuilding it (5 s and ~2.6 GB for 1M tokens, ~264 B per node), and any number of corpora
# stay built side by side. No bound on their number: a bench of four corpus sizes under a
# bound of two rebuilds a trie at every request, inside its timing (233 ms per drafted
# token for the 1M corpus).
_CORPUS_TRIES: "weakref.WeakValueDictionary[tuple[str, int], SuffixTrie]" = weakref.WeakValueDictionary()


class _Shared:
    """A reference that copies of its holder share: deepcopy hands it over as is (a trie is
    read-only and too big to copy), and pickling drops it (the holder rebuilds on use)."""

    def __init__(self, value=None):
        self.value = value

    def __deepcopy__(self, memo) -> "_Shared":
        return self

    def __reduce__(self):
        return (_Shared, ())


def _empty_corpus() -> dict[str, torch.Tensor]:
    """The corpus buffers of a suffix drafter without one (no ids, one offset)."""
    return {"corpus_ids": torch.zeros(0, dtype=torch.int32), "corpus_offsets": torch.zeros(1, dtype=torch.int64)}


@contextlib.contextmanager
def _collector_paused():
    """The cyclic garbage collector off inside the block (as it was outside it)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@functools.lru_cache(maxsize=None)
def _unfreeze_at_exit() -> None:
    """Give frozen objects back to the collector at exit, so that interpreter shutdown
    finalises them (extension types such as triton's complain about objects left alive)."""
    atexit.register(gc.unfreeze)


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
    corpus_tokens: int = 0
    """Also match the target's answers in the run's training data, up to this many tokens
    (whole answers, in data order): the earlier requests a serving engine would have seen.
    0: no corpus (the paper's drafter; the training-free baselines)."""
    min_chain_prob: float = 0.0
    """A chain stops before the draft that takes the product of its drafts' probabilities
    below this: each verified token widens the target's pass, and a draft whose chain is
    unlikely to survive to it costs more than it is expected to return. 0: off (the paper's
    rule: match length and min_prob alone)."""
    branches: int = 0
    """Union trees (eval/tree.py): besides the greedy chain, offer up to this many runner-up
    chains, each the second candidate at one of the chain's drafts (if at least min_prob
    likely; shallowest first) and the greedy chain after it. 0: the paper's single chain."""
    draft_vocab_size: int = 0
    """Always 0: the drafter proposes tokens it has seen, from the whole vocabulary."""

    def __post_init__(self) -> None:
        if self.max_pattern < 1 or self.spec_factor <= 0 or not 0 <= self.min_prob <= 1 or self.corpus_tokens < 0 \
                or self.branches < 0 or not 0 <= self.min_chain_prob <= 1:
            raise ValueError(f"suffix needs max_pattern >= 1, spec_factor > 0, 0 <= min_prob <= 1, corpus_tokens "
                             f">= 0, branches >= 0, 0 <= min_chain_prob <= 1; got {self.max_pattern}, "
                             f"{self.spec_factor}, {self.min_prob}, {self.corpus_tokens}, {self.branches}, "
                             f"{self.min_chain_prob}")


@dataclass
class SuffixState(TokenHistory):
    trie: SuffixTrie | None = None
    writer: Writer | None = None
    prompt_len: int = 0
    root: tuple[int, int, int] = (-1, -1, 0)  # (committed count, pending, match length) of the last root match
    corpus: SuffixTrie | None = None  # the training answers' trie, looked up once per request


class SuffixSpeculator(TrainingFree):
    family = "suffix"
    Config = SuffixConfig

    def __init__(self, config: SuffixConfig, target):
        super().__init__(config, target)
        self.history = SuffixTrie(config.max_pattern + 1)  # earlier outputs of this eval
        self._open: SuffixState | None = None  # the request being decoded: its output joins history next
        # The corpus: answers concatenated, answer i at [offsets[i], offsets[i + 1]).
        for name, empty in _empty_corpus().items():
            self.register_buffer(name, empty)
        self._corpus = _Shared()  # (the buffers' stamp, their trie) once built

    # --- the corpus of training answers -----------------------------------------------

    def training_data_tokens(self) -> int:
        return self.config.corpus_tokens

    def use_training_data(self, answers: Sequence[Sequence[int]]) -> None:
        """Keep whole answers, in order, while `corpus_tokens` lasts (the last one cut to fit)."""
        kept, room = [], self.config.corpus_tokens
        for answer in answers:
            if room <= 0:
                break
            if len(answer) >= 2:  # a one-token answer has no continuation to teach
                kept.append(list(answer)[:room])
                room -= len(kept[-1])
        lengths = torch.tensor([0] + [len(a) for a in kept], dtype=torch.int64)
        self.corpus_offsets = lengths.cumsum(0)
        self.corpus_ids = torch.tensor([t for a in kept for t in a], dtype=torch.int32)
        self._corpus = _Shared()

    def corpus_report(self) -> dict:
        trie = self.corpus_trie()
        return {"answers": len(self.corpus_offsets) - 1, "tokens": int(self.corpus_ids.numel()),
                "trie_nodes": trie.size if trie is not None else 0}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The corpus is as long as the checkpoint's: take its shape before the copy. A file
        # from a stranger is still only data: integer tensors, checked as soon as they load.
        for name, empty in _empty_corpus().items():
            saved = state_dict.setdefault(prefix + name, empty)  # saved before suffix had a corpus: none
            setattr(self, name, torch.empty(saved.shape, dtype=empty.dtype))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._check_corpus()
        self._corpus = _Shared()

    def _check_corpus(self) -> None:
        ids, offsets = self.corpus_ids, self.corpus_offsets
        n = int(ids.numel())
        if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1 or int(offsets[0]) != 0 or int(offsets[-1]) != n \
                or bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError("suffix corpus: corpus_offsets do not split corpus_ids into answers")
        if n and (int(ids.min()) < 0 or int(ids.max()) >= self.target_info.vocab_size):
            raise ValueError(f"suffix corpus: token ids outside the target's vocabulary ({self.target_info.vocab_size})")

    def corpus_trie(self) -> SuffixTrie | None:
        """The trie of the corpus (None without one), built on first use and shared by copies."""
        if self.corpus_ids.numel() == 0:
            return None
        # Asked once per request: the held trie answers while the buffers are the ones it was
        # built from (the same tensors, not written to since); a copy hashes once to share it.
        stamp = (self.config.max_pattern, *((t.data_ptr(), t._version) for t in (self.corpus_ids, self.corpus_offsets)))
        held = self._corpus.value
        if held is not None and held[0] == stamp:
            return held[1]
        ids, offsets = self.corpus_ids.cpu(), self.corpus_offsets.cpu()
        key = (hashlib.sha256(ids.numpy().tobytes() + offsets.numpy().tobytes()).hexdigest(), self.config.max_pattern)
        trie = _CORPUS_TRIES.get(key)
        if trie is None:
            self._check_corpus()
            trie, flat, bounds = SuffixTrie(self.config.max_pattern + 1), ids.tolist(), offsets.tolist()
            # ~10 nodes per token, none of them garbage. Left in the collector's generations,
            # every full collection walks them all: during the build, 80% of its time (6.7 of
            # 8.3 s for 300k tokens, 19.5 of 25.4 s for 1M); after it, a 1M-node trie made
            # decoding pause 2.3 s at a random step. So the collector is paused while the
            # trie grows, and then everything alive is frozen (the collector skips frozen
            # objects), without a collection first: one pass over the new trie took 8.8 s.
            with _collector_paused():
                for lo, hi in zip(bounds, bounds[1:]):
                    trie.add(flat[lo:hi])
                gc.freeze()
            _unfreeze_at_exit()
            _CORPUS_TRIES[key] = trie
        self._corpus = _Shared((stamp, trie))
        return trie

    def reset(self) -> None:
        self.history = SuffixTrie(self.config.max_pattern + 1)
        self._open = None

    def window(self) -> int:
        return self.config.max_pattern

    def new_state(self) -> SuffixState:
        if self._open is not None and self.config.global_outputs:
            self.history.add(self._open.tokens[self._open.prompt_len:])
        trie = SuffixTrie(self.config.max_pattern + 1)
        self._open = SuffixState(trie=trie, writer=trie.writer(), corpus=self.corpus_trie())
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
        """(match length, ranked candidates) of the best of the request's, the history's and
        the corpus's tries (the longest match; on a tie, the first of them in that order)."""
        length, node = state.trie.longest_match(context, self.config.max_pattern)
        others = [self.history] if self.config.global_outputs and self.history.size > 1 else []
        if state.corpus is not None:
            others.append(state.corpus)
        for trie in others:
            other, other_node = trie.longest_match(context, self.config.max_pattern)
            if other > length:
                length, node = other, other_node
        return length, ranked_children(node) if node.children else []

    def match_length(self, state: SuffixState, pending: int) -> int:
        """The match length at the pending token, kept for the step (every draft reads it)."""
        key = (len(state.tokens), pending)
        if state.root[:2] != key:
            state.root = (*key, self.match(state, self.context(state, pending, []))[0])
        return state.root[2]

    def min_chain_prob(self) -> float:
        return self.config.min_chain_prob

    def offers_chains(self) -> bool:
        return self.config.branches > 0

    def propose_chains(self, state: SuffixState, pending: torch.Tensor, k: int) -> list[torch.Tensor]:
        """The greedy chain, then up to `branches` runner-up chains (SuffixConfig.branches):
        where the chain's draft d was the top candidate, its second one, if at least min_prob
        likely, and the greedy drafts after it."""
        drafts, guesses = self._chain(state, pending, k)
        chains, tokens = [drafts], drafts[0].tolist()
        for depth, guess in enumerate(guesses):
            if len(chains) > self.config.branches:
                break
            if len(guess.ranked) > 1 and guess.ranked[1][1] >= self.config.min_prob:
                chains.append(self._chain(state, pending, k, tokens[:depth] + [guess.ranked[1][0]])[0])
        return chains

    def candidates(self, state: SuffixState, context: list[int]) -> Guess:
        depth = len(context) - 1 - min(len(state.tokens), self.window())  # drafted tokens in the context
        pending = context[-1 - depth]
        root = self.match_length(state, pending)
        length, ranked = self.match(state, context)
        if not length:  # the empty pattern's children are every token: no information
            return Guess([], confident=False)
        allowed = math.ceil(self.config.spec_factor * root)
        return Guess(ranked, confident=depth < allowed and ranked[0][1] >= self.config.min_prob)
