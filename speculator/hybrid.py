"""Hybrid drafting: a learned speculator and the training-free suffix drafter, step by step.

At every step the suffix drafter's match length m at the pending token decides: m >=
min_match and the step's whole draft (chain or tree) is the suffix drafter's, else the
learned family's. A long match is where copying beats any model (repeated code, quoted
prompt text: the suffix drafts long and right), and a short one is where a model that
read the target's features guesses better. Deciding once per step, from the state and the
pending token only, keeps `extend` equal to `propose` on every path.

A union-tree step (eval/tree.py, `propose_chains`) drafts with both instead: the suffix
chain, and beside it the learned part's chain of at most learned_k tokens unless the match
is long (the same rule: then suffix alone); the target verifies both in one pass and keeps
the longer accepted path. The two parts guess right on different tokens (copying against
predicting), so the union accepts more than either, for the few extra verified tokens.

The learned part takes in the target's features only when it drafts: a step the suffix
part drafts alone is queued (`HybridState.unread`), and the queue goes to the learned part
in one `accept` when it drafts next. Taking steps in one by one cost a block drafter its
context pass on every step (projection and keys/values of the new positions), which cost
the dflash2 hybrid at min_match 1 about 5% of its speed (it drafts almost nowhere); one call
over the queued positions computes the same state as the calls one at a time: every
learned family takes a step of any length (`accept` after `start`, and tree steps, commit
several tokens at once).

Training trains the learned part alone (its loss, its shift, its layers); the suffix part
has no parameters. So a hybrid is also two runs put together (`compose`, `speclab hybrid`):
a learned speculator trained alone and a suffix drafter with its corpus, no training.
Drafts are over the whole target vocabulary: a learned part with a reduced draft
vocabulary has its logits spread onto it, FLOOR off its vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .base import Features, Speculator, TargetInfo, target_device
from .drafters import DRAFTERS, config_of
from .lookup import FLOOR, TrainingFree
from .suffix import SuffixSpeculator


@dataclass
class HybridConfig:
    learned: dict = field(default_factory=lambda: {"family": "mlp"})
    """The learned family and its options: {family: <name>, <option>: <value>, ...}."""
    suffix: dict = field(default_factory=lambda: {"corpus_tokens": 300_000})
    """Options of the suffix drafter (speculator/suffix.py; the keys not given: its defaults).
    Its corpus: the target's answers in the run's training data (what a serving engine's
    earlier requests give its global tree), built in seconds from the data the learned part
    trains on; capped at 300k tokens (a Python trie of ~1.06M nodes, 268 MB, per 100k tokens)."""
    min_match: int = 4
    """The rule: a step drafts with suffix when its match at the pending token is this long."""
    learned_k: int = 2
    """Union trees: the longest chain the learned part drafts beside the suffix chain (a
    short one: its acceptance falls fast with depth while every token costs verification)."""
    draft_vocab_size: int = 0
    """Always 0: drafts are over the whole vocabulary (the learned part has its own)."""


@dataclass
class HybridState:
    learned: Any
    suffix: Any
    unread: list[tuple] = field(default_factory=list)
    """(committed, hidden, layers) of the steps since the learned part last drafted, which it
    has not taken in yet (`HybridSpeculator.caught_up`)."""
    drafting: bool = False
    """Whether the learned part drafted in this step: it then takes the step in at `accept`."""


def learned_part(config: HybridConfig) -> tuple[type[Speculator], Any]:
    """The learned family's class and its config, checked."""
    options = dict(config.learned)
    family = options.pop("family", None)
    if family and family not in DRAFTERS and family != HybridSpeculator.family:
        raise ValueError(f"unknown speculator family {family!r}; valid: {sorted([*DRAFTERS, HybridSpeculator.family])}")
    cls = DRAFTERS.get(family)
    if cls is None or issubclass(cls, TrainingFree):
        raise ValueError(f"hybrid.learned.family must be a learned family, got {family!r}")
    return cls, config_of(cls, options)


class HybridSpeculator(Speculator):
    family = "hybrid"
    Config = HybridConfig
    # The union of what any learned family reads from the live target (load_speculator).
    target_tensors = ("embed_weight", "lm_head_weight")

    def __init__(self, config: HybridConfig, target: TargetInfo):
        super().__init__(config, target)
        cls, learned_config = learned_part(config)
        self.learned = cls(learned_config, target)
        self.suffix = SuffixSpeculator(config_of(SuffixSpeculator, config.suffix), target)

    @property
    def shift(self) -> int:
        return self.learned.shift

    @classmethod
    def layer_ids_for(cls, config: HybridConfig, num_layers: int) -> tuple[int, ...]:
        learned_cls, learned_config = learned_part(config)
        return learned_cls.layer_ids_for(learned_config, num_layers)

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.learned.target_layer_ids

    # --- training: the learned part's --------------------------------------------------

    def loss(self, feats: Features, objective, target_head):
        return self.learned.loss(feats, objective, target_head)

    def draft_logits(self, feats: Features) -> torch.Tensor:  # [B, P, T, V]
        return self.widen(self.learned.draft_logits(feats))

    # --- inference ---------------------------------------------------------------------

    def max_draft_len(self) -> int | None:
        # The longer of the parts' (suffix: unbounded): a step the suffix part drafts may run
        # past the learned part's heads, which is where long matches pay; a step the learned
        # part drafts stops at its own limit (a shorter chain, which the engine accepts).
        limits = (self.learned.max_draft_len(), self.suffix.max_draft_len())
        return None if None in limits else max(limits)

    def learned_limit(self) -> float:
        """The longest chain the learned part drafts (inf: unbounded)."""
        limit = self.learned.max_draft_len()
        return float("inf") if limit is None else limit

    def reset(self) -> None:
        self.learned.reset()
        self.suffix.reset()

    def training_data_tokens(self) -> int:
        return self.learned.training_data_tokens() + self.suffix.training_data_tokens()

    def use_training_data(self, answers) -> None:
        self.learned.use_training_data(answers)
        self.suffix.use_training_data(answers)

    def corpus_report(self) -> dict:
        return {**self.learned.corpus_report(), **self.suffix.corpus_report()}

    def start(self, prompt_ids, prompt_hidden, layers=None) -> HybridState:
        return HybridState(self.learned.start(prompt_ids, prompt_hidden, layers),
                           self.suffix.start(prompt_ids, prompt_hidden))

    def uses_suffix(self, state: HybridState, pending: torch.Tensor) -> bool:
        return self.suffix.match_length(state.suffix, int(pending)) >= self.config.min_match

    def propose(self, state: HybridState, pending: torch.Tensor, k: int):
        if self.uses_suffix(state, pending):
            return self.suffix.propose(state.suffix, pending, k)
        return self.propose_learned(state, pending, k)

    def propose_tokens(self, state: HybridState, pending: torch.Tensor, k: int) -> torch.Tensor:
        if self.uses_suffix(state, pending):
            return self.suffix.propose_tokens(state.suffix, pending, k)
        return self.learned.propose_tokens(self.caught_up(state), pending, self.learned_len(k))

    def propose_chains(self, state: HybridState, pending: torch.Tensor, k: int) -> list[torch.Tensor]:
        # The suffix part's chain first, then the learned chain where the match is short, then
        # suffix's runner-up chains (its `branches`), which the budget cuts first.
        first, *runners_up = self.suffix.propose_chains(state.suffix, pending, k)
        learned = [] if self.uses_suffix(state, pending) else [
            self.learned.propose_tokens(self.caught_up(state), pending, self.learned_len(min(k, self.config.learned_k)))]
        return [first, *learned, *runners_up]

    def learned_len(self, k: int) -> int:
        """k capped at the learned part's heads."""
        return min(k, self.learned_limit())

    def propose_learned(self, state: HybridState, pending: torch.Tensor, k: int):
        """The learned part's chain, at most its heads long, over the whole vocabulary."""
        drafts, logits = self.learned.propose(self.caught_up(state), pending, self.learned_len(k))
        return drafts, self.widen(logits)

    def extend(self, state: HybridState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        if self.uses_suffix(state, pending):
            return self.suffix.extend(state.suffix, pending, paths)
        if paths.shape[1] >= self.learned_limit():  # past the learned part's last head: no guess
            return torch.full((paths.shape[0], self.learned.vocab.target_vocab), FLOOR)
        return self.widen(self.learned.extend(self.caught_up(state), pending, paths))

    def accept(self, state: HybridState, committed, hidden, layers=None) -> None:
        self.suffix.accept(state.suffix, committed, hidden)
        if state.drafting:  # its drafts are in this step: it reads the step as it reads its own
            self.learned.accept(state.learned, committed, hidden, layers)
            state.drafting = False
        else:  # copies: the engine may reuse the buffers these views are of
            state.unread.append((committed.clone(), hidden.clone(), None if layers is None else layers.clone()))

    def caught_up(self, state: HybridState):
        """The learned part's state, once it has taken in the queued steps (one `accept` over
        their positions), marked as drafting in this step."""
        if state.unread:
            committed, hidden, layers = zip(*state.unread)
            state.unread.clear()
            self.learned.accept(state.learned, torch.cat(committed, 1), torch.cat(hidden, 1),
                                None if layers[0] is None else torch.cat(layers, 1))
        state.drafting = True
        return state.learned

    def widen(self, logits: torch.Tensor) -> torch.Tensor:  # [..., N] -> [..., V]
        """The learned part's logits over its draft vocabulary, placed on the whole vocabulary."""
        vocab = self.learned.vocab
        if vocab.full:
            return logits
        out = logits.new_full((*logits.shape[:-1], vocab.target_vocab), FLOOR)
        out[..., vocab.ids] = logits
        return out


def compose(learned: Speculator, suffix: Speculator, min_match: int = HybridConfig.min_match,
            learned_k: int = HybridConfig.learned_k) -> HybridSpeculator:
    """The hybrid of a learned speculator and a suffix drafter trained apart, as they are.

    A hybrid's training trains its learned part alone, on that part's own loss, and builds
    the suffix part's corpus from the same answers: a learned run and a suffix_corpus run on
    the same data are the two halves of the hybrid that data would have trained. Composing
    them costs no training, so a learned part that took half an hour is tried beside the
    corpus without another half hour."""
    if not isinstance(suffix, SuffixSpeculator):
        raise ValueError(f"a hybrid's suffix part must be a suffix drafter (suffix_corpus: with its corpus of "
                         f"training answers), got a {suffix.family!r} speculator")
    if min_match < 1 or learned_k < 1:
        raise ValueError(f"a hybrid needs min_match >= 1 and learned_k >= 1, got {min_match} and {learned_k}")
    ours, theirs = learned.target_info, suffix.target_info
    if (ours.vocab_size, ours.hidden_size) != (theirs.vocab_size, theirs.hidden_size):
        raise ValueError(f"the learned part was trained for target {ours.name!r} (vocab {ours.vocab_size}) and "
                         f"the suffix part for {theirs.name!r} (vocab {theirs.vocab_size}): not one target")
    config = HybridConfig(learned={"family": learned.family, **asdict(learned.config)},
                          suffix=asdict(suffix.config), min_match=min_match, learned_k=learned_k)
    hybrid = HybridSpeculator(config, ours)  # refuses a learned part that is not a learned family
    hybrid.learned.load_state_dict(learned.state_dict())
    hybrid.suffix.load_state_dict(suffix.state_dict())
    return hybrid.to(target_device(ours)).eval()
