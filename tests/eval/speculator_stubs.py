"""Stub speculators that draft from the target's known greedy continuation.

Each is told, per prompt, the reference sequence = prompt + the target's greedy
continuation (from `generate_plain`), and proposes at draft position i (0-based) either the
reference token (right) or a different one (wrong). Which positions are right is the only
thing a subclass decides. They also assert that the engine feeds them what base.py promises
(pending token, committed tokens, aligned hidden states). Not registered: test-only families.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speclab.eval.engine import generate_plain
from speclab.speculator.base import Speculator, TargetInfo
from speclab.speculator.target import FrozenTarget


@dataclass
class ScriptConfig:
    references: list[list[int]]  # per prompt: its ids followed by the target's greedy continuation
    max_draft: int | None = None  # what max_draft_len() reports (None: unbounded)
    draft_vocab_size: int = 0  # every speculator config has one (0: full vocabulary)


@dataclass
class ScriptState:
    reference: list[int]
    position: int  # tokens in the target's cache = index of the pending token in `reference`


class ScriptedSpeculator(Speculator):
    Config = ScriptConfig
    shift = 0

    def is_right(self, i: int) -> bool:
        """Whether draft position i (0-based) proposes the target's own token."""
        raise NotImplementedError

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor, layers=None) -> ScriptState:
        assert prompt_hidden.shape[:2] == prompt_ids.shape
        ids = prompt_ids[0].tolist()
        reference = next(r for r in self.config.references if r[: len(ids)] == ids)
        return ScriptState(reference, len(ids))

    def propose(self, state: ScriptState, pending: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert pending.shape == (1, 1) and pending.item() == state.reference[state.position]
        limit = self.max_draft_len()
        assert limit is None or k <= limit
        drafts = []
        for i in range(k):
            right = state.reference[state.position + 1 + i]
            drafts.append(right if self.is_right(i) else (right + 1) % self.target_info.vocab_size)
        tokens = torch.tensor([drafts], device=pending.device)  # [1, k]
        return tokens, F.one_hot(tokens, self.target_info.vocab_size).float()  # [1, k], [1, k, V]

    def extend(self, state: ScriptState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """Logits [M, V] after each path. On the reference path the target's token and the
        wrong one (right + 1) get the top two logits, in the order `is_right` says, so a tree
        with two children per node always holds the target's token; off it, anything."""
        assert pending.shape == (1, 1) and pending.item() == state.reference[state.position]
        M, d = paths.shape
        V = self.target_info.vocab_size
        logits = torch.zeros(M, V)
        ahead = state.reference[state.position + 1 : state.position + 1 + d]
        for m, path in enumerate(paths.tolist()):
            right = state.reference[state.position + 1 + d] if path == ahead else (path[-1] if path else 0)
            best, second = (right, (right + 1) % V) if self.is_right(d) else ((right + 1) % V, right)
            logits[m, best], logits[m, second] = 3.0, 2.0
        return logits.to(pending.device)

    def accept(self, state: ScriptState, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        n_plus_1 = committed.shape[1]
        assert hidden.shape[:2] == committed.shape
        assert committed[0].tolist() == state.reference[state.position : state.position + n_plus_1]
        state.position += n_plus_1

    def max_draft_len(self) -> int | None:
        return self.config.max_draft


class OracleSpeculator(ScriptedSpeculator):
    family = "test-oracle"

    def is_right(self, i: int) -> bool:
        return True


class NeverSpeculator(ScriptedSpeculator):
    family = "test-never"

    def is_right(self, i: int) -> bool:
        return False


class SometimesSpeculator(ScriptedSpeculator):
    family = "test-sometimes"

    def is_right(self, i: int) -> bool:
        return i % 2 == 0


class TakeTurnsSpeculator(ScriptedSpeculator):
    """Two guessers taking turns being right: `propose` drafts the first one's chain, right
    at every other drafting step; `propose_chains` offers both, the second right at the
    steps the first is wrong, so a union tree holds the target's chain at every step."""

    family = "test-take-turns"
    steps = 0

    def is_right(self, i: int) -> bool:
        return self._right

    def propose(self, state: ScriptState, pending: torch.Tensor, k: int):
        self._right, self.steps = self.steps % 2 == 0, self.steps + 1
        return super().propose(state, pending, k)

    def propose_chains(self, state: ScriptState, pending: torch.Tensor, k: int) -> list[torch.Tensor]:
        first = self.propose(state, pending, k)[0]
        self._right = not self._right
        return [first, super().propose(state, pending, k)[0]]


def reference(target: FrozenTarget, prompt: torch.Tensor, length: int) -> list[int]:
    """prompt ids + `length` greedy tokens, ignoring EOS so drafts never run off the end."""
    return prompt[0].tolist() + generate_plain(target, prompt, length, eos_ids=()).tokens


def scripted(
    cls: type[ScriptedSpeculator], target: FrozenTarget, prompts: list[torch.Tensor], length: int,
    max_draft: int | None = None,
) -> ScriptedSpeculator:
    """A stub knowing `length` greedy tokens past each prompt (max_new_tokens + k suffices)."""
    config = ScriptConfig([reference(target, p, length) for p in prompts], max_draft)
    return cls(config, TargetInfo.of(target))
