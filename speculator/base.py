"""What every speculator family shares: the target it drafts for, the training and
inference interfaces, and saving to safetensors + JSON. The registry of families (and
building or loading one by name) is speculator/families.py, which imports this module;
this module imports no family.

Alignment convention for training. `draft_logits(features)[b, p, t]` is the draft's
guess, made from the context the target had at position t, of the target's next-token
distribution at position `t + shift + p` (i.e. of token `t + shift + p + 1`):

- a family reading the target's hidden state h_t plus the committed token x_{t+1}
  (mlp, medusa-like) has shift = 1: its step p predicts token t + 2 + p;
- an independent draft LM reading tokens x_0..x_t has shift = 0.

The target's logits are recomputed from its cached hidden states by its frozen LM head,
only at the rows the loss needs, so no [B, T, V] target tensor is ever stored.

Inference, batch size 1. After the target's prefill of the prompt, the engine calls
`start`; each decoding step then goes
    pending = the token the target chose last (committed, not yet in its KV cache)
    drafts, logits = propose(state, pending, k)
    target verifies [pending, d_1..d_k]; n drafts accepted
    accept(state, [pending, d_1..d_n], target hidden for those n+1 positions)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from safetensors.torch import save_model
from torch import nn

from .vocab import DraftVocab

# objective(draft_logits [N, V], target_logits [N, V]) -> per-row loss [N]
Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TargetInfo:
    """What a speculator may know about its frozen target."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    name: str = ""
    embed_weight: torch.Tensor | None = None  # [V, H], for optional initialisation
    lm_head_weight: torch.Tensor | None = None  # [V, H], frozen; for families drafting through it
    token_counts: torch.Tensor | None = None  # [V] assistant-token counts of the training data
    norm_weight: torch.Tensor | None = None  # [H] the final norm's, for a head that starts as the target's
    layer_state: Callable[[int], dict[str, torch.Tensor]] | None = None
    """Decoder layer i's weights by HF name (self_attn.q_proj.weight, ...), for draft layers that start as the target's."""

    @classmethod
    def of(cls, target) -> "TargetInfo":
        return cls(target.vocab_size, target.hidden_size, target.num_layers, target.name,
                   target.embed_weight.detach(), target.lm_head_weight.detach(),
                   norm_weight=target.norm_weight, layer_state=target.layer_state)

    def __deepcopy__(self, memo) -> "TargetInfo":
        # The target's own, frozen: copies of a speculator share them (and `layer_state` reads
        # the live target, which a deep copy would clone whole).
        return self

    def with_counts(self, counts: torch.Tensor) -> "TargetInfo":
        return dataclasses.replace(self, token_counts=counts)

    def to_json(self) -> dict:
        return {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "num_layers": self.num_layers, "name": self.name}


@dataclass
class Features:
    """One teacher-forced batch as the target saw it."""

    input_ids: torch.Tensor  # [B, T] long
    hidden: torch.Tensor  # [B, T, H] target's last hidden state (after the final norm)
    loss_mask: torch.Tensor  # [B, T] bool: token t+1 is an assistant token (worth predicting)
    layers: torch.Tensor | None = None  # [B, T, L, H] the target's hidden_states[i] for i in target_layer_ids


class Speculator(nn.Module):
    family: ClassVar[str]
    Config: ClassVar[type]
    shift: ClassVar[int]
    # TargetInfo tensors the family reads at inference but never saves (the target's own,
    # frozen): load_speculator hands it the live target's.
    target_tensors: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config, target: TargetInfo):
        super().__init__()
        self.config = config
        self.target_info = target
        # Every family's config has draft_vocab_size (0: the target's whole vocabulary).
        self.vocab = DraftVocab(target.vocab_size, config.draft_vocab_size, target.token_counts)

    # --- training -----------------------------------------------------------------

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, P, T, D]
        """Teacher-forced pre-head states for every draft step p and position t."""
        raise NotImplementedError

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:  # [..., D] -> [..., V]
        raise NotImplementedError

    def draft_greedily(self, pending: torch.Tensor, k: int,
                       step: Callable[[int, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """`propose` for families that draft head by head: `step(i, previous token [1])` gives
        head i's input [1, D]; each head's argmax, mapped to a target id, feeds the next step.
        -> (drafts [1, k] as target ids, draft logits [1, k, N])."""
        token, tokens, logits = pending[:, 0], [], []
        for i in range(k):
            step_logits = self.draft_head(i, step(i, token))  # [1, N]
            token = self.vocab.to_target(step_logits.argmax(-1))  # [1] target id
            tokens.append(token)
            logits.append(step_logits)
        return torch.stack(tokens, 1), torch.stack(logits, 1)

    def draft_head_weight(self, p: int) -> torch.Tensor | None:
        """[N, D] when `draft_head(p, .)` is a plain bias-free linear map, which lets the
        training loss fuse the head with the objective in vocabulary chunks; None otherwise."""
        return None

    def draft_logits(self, feats: Features) -> torch.Tensor:  # [B, P, T, V]
        states = self.draft_states(feats)
        return torch.stack([self.draft_head(p, states[:, p]) for p in range(states.shape[1])], 1)

    def loss(self, feats: Features, objective: Objective,
             target_head: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean objective over all trained (step, position) pairs, plus per-step metrics.

        Only rows whose predicted token is an assistant token reach the vocabulary-sized
        heads: the [N, V] logits dominate the cost, so prompt positions are dropped first.
        `target_head(hidden [N, H], columns)` gives the target's logits at the draft
        vocabulary's columns; with a reduced vocabulary the KL is to the target's
        distribution renormalised over it, and rows whose next token lies outside it are
        not trained (the draft could never propose that token).

        Fused path: when the objective has `fused(draft_hidden, draft_weight, target_hidden,
        target_weight) -> (loss [N], draft argmax [N], target argmax [N])`, the family's head
        is linear (`draft_head_weight`) and the target's LM head is known, head and objective
        run in vocabulary chunks and no [N, V] logits are built; the result is the same.
        """
        return self.token_loss(self.draft_states(feats), feats, objective, target_head)

    def token_loss(self, states: torch.Tensor, feats: Features, objective: Objective,
                   target_head: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor | None = None,
                   weights: list[float] | None = None,
                   target_args: dict[int, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """`loss` on already computed `draft_states` [B, P, T, D] (families adding terms reuse it).
        rows [B, T] bool: only these draft positions t are trained (a block drafter trains a
        sample of anchors); weights [P]: step p's rows weigh weights[p] in the mean. A dict
        given as target_args receives step p's target argmax per trained row, in the order of
        `step_rows(p, ...)`, for a family whose extra term needs the target's choice."""
        T = states.shape[2]
        trainable = self._trainable(feats)  # [B, T]
        columns = None if self.vocab.full else self.vocab.ids
        fused, head = getattr(objective, "fused", None), self.target_info.lm_head_weight
        fuses = getattr(objective, "fuses", lambda rows, vocab, device: True)  # plain objectives: whenever possible
        target_rows = None if head is None or columns is None else head[columns.to(head.device)]  # [N', H]
        targets = _TargetLogits(feats.hidden, trainable, self.shift, columns, target_head)
        total, count, metrics = states.new_zeros(()), 0, {}
        for p in range(states.shape[1]):
            lo = self.shift + p  # draft (p, t) guesses the target at position t + lo
            span = T - lo
            if span <= 0:
                break
            mask = self.step_rows(p, trainable, rows)  # [B, span]
            if not mask.any():
                continue
            w = 1.0 if weights is None else weights[p]
            weight = self.draft_head_weight(p)  # [V', D] or None
            picked = states[:, p, :span][mask]  # [N, D]
            if (fused is not None and weight is not None and head is not None
                    and fuses(picked.shape[0], weight.shape[0], states.device)):
                # Outside bf16 autocast: the fused loss computes the teacher's logits too, and
                # those stay fp32 (training/module.py); it upcasts the draft's rows itself.
                with torch.autocast(states.device.type, enabled=False):
                    per_row, draft_arg, target_arg = fused(
                        picked, weight, feats.hidden[:, lo:][mask], head if target_rows is None else target_rows)  # [N] each
            else:
                draft = self.draft_head(p, picked)  # [N, V]
                logits, from_lo = targets.rows_from(lo)
                if rows is not None:  # of the trainable rows at positions >= lo, those at trained draft positions
                    kept = rows[:, :span][trainable[:, lo:]]
                    from_lo = (torch.arange(kept.numel(), device=kept.device) if from_lo is None else from_lo)[kept]
                per_row, draft_arg, target_arg = _rows(objective, draft, logits, from_lo)
            if target_args is not None:
                target_args[p] = target_arg
            total = total + w * per_row.sum()
            count += w * per_row.numel()
            with torch.no_grad():
                agree = (draft_arg == target_arg).float().mean()
            metrics[f"loss_pos{p}"] = per_row.detach().mean().item()
            metrics[f"acc_pos{p}"] = agree.item()
        return total / max(count, 1), metrics

    def _trainable(self, feats: Features) -> torch.Tensor:
        """[B, T]: positions whose next token is trained (an assistant token the draft vocabulary holds)."""
        next_ids = torch.zeros_like(feats.input_ids)
        next_ids[:, :-1] = feats.input_ids[:, 1:]
        return feats.loss_mask & self.vocab.contains(next_ids)

    def step_rows(self, p: int, trainable: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T - shift - p] bool: the draft positions t whose step p `token_loss` trains (draft
        (p, t) guesses the target at position t + shift + p), from `_trainable(feats)` [B, T]."""
        mask = trainable[:, self.shift + p:]
        return mask if rows is None else mask & rows[:, : mask.shape[1]]

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        """Intermediate target layers this family reads (ids into HF `hidden_states`, 0 being
        the embedding output). Training gets them as `Features.layers`, inference as the
        `layers` argument of `start` and `accept`, stacked in this order."""
        return self.layer_ids_for(self.config, self.target_info.num_layers)

    @classmethod
    def layer_ids_for(cls, config, num_layers: int) -> tuple[int, ...]:
        """`target_layer_ids` from a config alone (features are cached before any speculator exists)."""
        return tuple(getattr(config, "target_layers", ()) or ())

    # --- inference (batch size 1) -----------------------------------------------------

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor,
              layers: torch.Tensor | None = None) -> Any:
        """prompt_ids [1, T], prompt_hidden [1, T, H], layers [1, T, L, H] or None
        -> a fresh decoding state."""
        raise NotImplementedError

    def propose(self, state: Any, pending: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """pending [1, 1] -> (draft tokens [1, k'] as target ids, draft logits [1, k', N]
        over the draft vocabulary: `self.vocab.to_target` maps their argmax to the tokens).
        k' <= k: a drafter may propose fewer tokens, or none (the step is then a plain one),
        where it has nothing worth the verification width."""
        raise NotImplementedError

    def accept(self, state: Any, committed: torch.Tensor, hidden: torch.Tensor,
               layers: torch.Tensor | None = None) -> None:
        """committed [1, n+1] = pending + accepted drafts; hidden [1, n+1, H] the target's;
        layers [1, n+1, L, H] at those positions when `target_layer_ids` is not empty."""
        raise NotImplementedError

    def extend(self, state: Any, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """Tree drafting. pending [1, 1]; paths [M, d] target ids drafted after pending (d >= 0,
        one depth for all rows) -> draft logits [M, N] for the token after each path.
        Reads `state`, never changes it; row m equals what `propose` would compute after
        drafting paths[m]."""
        raise NotImplementedError(f"{type(self).__name__} does not support tree drafting")

    def propose_tokens(self, state: Any, pending: torch.Tensor, k: int) -> torch.Tensor:
        """`propose`'s drafts [1, k'] alone, for callers that read no draft logits (greedy
        decoding, argmax drafts, union trees). A family whose logits cost real work beside its
        tokens (a vocabulary-wide row per draft) overrides it to skip them; the tokens are the same."""
        return self.propose(state, pending, k)[0]

    def propose_chains(self, state: Any, pending: torch.Tensor, k: int) -> list[torch.Tensor]:
        """Candidate chains [1, k_i] (k_i <= k) for a union-tree step (eval/tree.py): a drafter
        holding independent guesses (the hybrid: its suffix and its learned part; suffix with
        `branches`: its runner-up continuations) offers each,
        and the target verifies their trie in one pass. By default the one chain `propose`
        drafts, which makes a union tree a chain; `offers_chains` says whether a family does more."""
        return [self.propose_tokens(state, pending, k)]

    def offers_chains(self) -> bool:
        """Whether `propose_chains` can return more than one chain (a union tree is worth piloting)."""
        return type(self).propose_chains is not Speculator.propose_chains

    def max_draft_len(self) -> int | None:
        """The longest chain this speculator can propose (None: unbounded)."""
        return None

    def training_data_tokens(self) -> int:
        """How many tokens of the run's training answers `use_training_data` keeps (0: it
        takes none; a learned family learns from the data by training instead)."""
        return 0

    def use_training_data(self, answers) -> None:
        """Keep a non-parametric memory of the run's training answers (token lists: the
        target's own outputs), e.g. suffix's corpus tree. Called once the weights are final."""

    def corpus_report(self) -> dict:
        """What `use_training_data` kept (answers, tokens, ...); {} for a family that keeps none."""
        return {}

    def reset(self) -> None:
        """Forget what earlier requests taught it (suffix's eval history); a learned family
        holds nothing between requests. Called between methods scored on the same prompts."""

    # --- persistence ------------------------------------------------------------------

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save(self, out_dir: str | Path, extra: dict | None = None) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # save_model stores a tied tensor once (draft_lm shares embedding and head).
        save_model(self, str(out / "model.safetensors"))
        meta = {"family": self.family, "config": dataclasses.asdict(self.config),
                "target": self.target_info.to_json(), "params": self.num_params(), **(extra or {})}
        (out / "config.json").write_text(json.dumps(meta, indent=2))
        return out


def target_device(target: TargetInfo | None) -> torch.device:
    return target.embed_weight.device if target is not None and target.embed_weight is not None else torch.device("cpu")


class _TargetLogits:
    """The target's logits at every trained position, computed once per batch for all steps.

    Step p of a family reads the target at positions lo = shift + p and later, so each row's
    logits would otherwise be computed once per step: with 4 steps the target's head (576 x
    8,192 for SmolLM2's draft vocabulary) ran 4x, the larger part of an `mlp` training step's
    forward. Rows are in `hidden[:, lo:][trainable[:, lo:]]` order (batch, then position), so
    a step's rows are the shared rows at positions >= lo."""

    def __init__(self, hidden: torch.Tensor, trainable: torch.Tensor, shift: int, columns, target_head):
        self.hidden, self.shift, self.columns, self.target_head = hidden, shift, columns, target_head
        self.needed = trainable.clone()
        self.needed[:, :shift] = False
        self.logits: torch.Tensor | None = None  # [M, V'], built at the first step that needs it
        self.positions: torch.Tensor | None = None  # [M]: each row's position

    def rows_from(self, lo: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(all rows' logits [M, V'], the indices of those at positions >= lo, or None for all):
        read in place by a fused objective (a [500, 8192] copy per draft step was ~6% of an
        mlp training step). Every row is at a position >= shift."""
        if self.logits is None:
            with torch.no_grad():
                self.logits = self.target_head(self.hidden[self.needed], self.columns)
            B, T = self.needed.shape
            self.positions = torch.arange(T, device=self.needed.device).expand(B, T)[self.needed]
        if lo <= self.shift:
            return self.logits, None
        return self.logits, torch.nonzero(self.positions >= lo).squeeze(1)


def _rows(objective: Objective, draft: torch.Tensor, target: torch.Tensor, target_rows: torch.Tensor | None):
    """(per-row loss, draft argmax, target argmax) for draft rows against target[target_rows]
    (all of target where None): in one fused pass where the objective has one
    (training/losses.py `VocabObjective.rows`), else the objective and two argmaxes
    (max().indices: the same first maximum as argmax, 2.8x faster on a CPU)."""
    rows = getattr(objective, "rows", None)
    if rows is not None:
        return rows(draft, target, target_rows)
    target = target if target_rows is None else target[target_rows]
    return objective(draft, target), draft.detach().max(-1).indices, target.max(-1).indices
