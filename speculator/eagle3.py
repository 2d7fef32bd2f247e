"""EAGLE-3 (Li et al., 2025): fused low/mid/high target features, direct token prediction,
trained with training-time test (TTT).

    g_j = fc [l^a_j; l^b_j; l^c_j]                the target's hidden_states at target_layers
    o_j = Layers([E x_{j+1}; c_j])                c_j = g_j (committed) or o_{j-1} (drafted)
    logits = lm_head(norm(o_j))                   over the draft vocabulary

EAGLE-3.1 (`norm_output`, speculators' name for it) carries c_j = norm(o_{j-1}) instead: the
raw output of a residual stack grows in magnitude with every step it is fed back, while the
committed features it stands in for are the target's, so deeper drafts read inputs of a scale
the first never saw. The normed output is what the head reads already, so the carried
feature and the head's input become one tensor.

`norm_before_fc` (speculators' name) puts one RMSNorm over the fused target layers before fc:
g_j = fc norm([l^a_j; l^b_j; l^c_j]). The target's residual stream grows with depth, so unnormed
the deepest layer dominates fc's input by its scale alone; speculators' trainer turns it on for
eagle3 with norm_output.

The first layer reads [embedding; carried] (2D wide, `FusedInputLayer`), later ones are
plain Llama layers. Training unrolls `ttt_steps` in which the draft consumes its own
previous outputs (feature_ar.py). The embedding starts as the target's (EAGLE-3 freezes it).

Parameter names follow vLLM speculators' `Eagle3Speculator`, so export is a renaming:
    embed_tokens.weight                     -> embed_tokens.weight  [V, D]
    fc.weight                               -> fc.weight            [D, 3H] (3 target layers)
    layers.0.{input_layernorm, hidden_norm, post_attention_layernorm}.weight,
    layers.0.self_attn.{q,k,v,o}_proj.weight (q/k/v read 2D), layers.0.mlp.{gate,up,down}_proj.weight
                                            -> same names (layers.i >= 1: a LlamaDecoderLayer)
    norm.weight                             -> norm.weight
    lm_head.weight                          -> lm_head.weight       [N, D]
    vocab.ids [N] (target ids, ascending)   -> d2t = vocab.d2t() [N], t2d = vocab.t2d() [V] (buffers)
    input_norm.weight [3H] (norm_before_fc only) -> input_norm.weight
Its config: norm_output = `norm_output`, norm_before_fc = `norm_before_fc`; transformer_layer_config = a LlamaConfig(hidden_size=D, num_attention_heads,
num_key_value_heads, intermediate_size, rope_theta, rms_norm_eps=1e-6, vocab_size=V),
draft_vocab_size = N, target_hidden_size = H, norm_before_residual = False; the target
layer ids for vLLM's eagle_aux_hidden_state_layer_ids are `target_layer_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from .base import TargetInfo
from .feature_ar import FeatureAutoregressive
from .layers import DecoderLayer, FusedInputLayer, embedding_from_target, start_as_target_layer


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high choice, as SpecForge and vLLM make it: the inputs of decoder
    layers 2, L // 2 and L - 3, i.e. HF hidden_states[2], [L // 2], [L - 3] (30 layers:
    2, 15, 27). Those three are distinct only from 7 layers on (6 gives 2, 3, 3), so shallower
    targets get L // 4, L // 2, L - 1: three distinct ids whenever L >= 3, which is what every
    engine's EAGLE-3 reads (its fc is 3 x target_hidden_size wide); 2 layers get [0, 1].

    Never L: vLLM hands the draft the residual stream entering decoder layer i (pre-norm),
    which is HF hidden_states[i] only for i < L; hidden_states[L] is after the final norm."""
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    return tuple(sorted({num_layers // 4, num_layers // 2, num_layers - 1}))


@dataclass
class TargetStart:
    """Where an EAGLE-style drafter's weights start (eagle3, peagle): its own random draws, or
    the target's. Its head, norm and decoder layer have the target's shapes at SmolLM2's sizes."""

    head_init: Literal["random", "target"] = "random"
    """How the output layer and final norm start: random (EAGLE-3's), or as the target's head rows
    over the draft vocabulary and its final norm (the draft's guesses start as the target's reading
    of the draft's state)."""
    layer_init: Literal["random", "target"] = "random"
    """How the decoder layers start: random, or as the target's decoder layers after the deepest one
    fc reads (fc then starts by passing that layer through): a start that already reads the target's
    residual stream. Needs the target's sizes (hidden_size, heads, intermediate_size)."""


@dataclass
class FusedInputNorm:
    """Whether an EAGLE-style drafter (eagle3, peagle) norms the target layers fc reads."""

    norm_before_fc: bool = False
    """One RMSNorm over the concatenated target layers before fc (speculators' option of that name;
    its trainer's default for eagle3, with norm_output). With layer_init=target, fc's pass-through
    then carries the deepest layer scaled by that norm, not the layer as the target holds it."""


@dataclass
class Eagle3Config(TargetStart, FusedInputNorm):
    num_layers: int = 1
    """Decoder layers (EAGLE-3 uses one)."""
    hidden_size: int = 576
    """Width D; fc maps the fused target layers (len(target_layers) x H) to it."""
    num_heads: int = 9
    """Attention heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 3
    """Key/value heads (grouped-query attention; divides num_heads)."""
    intermediate_size: int = 1536
    """MLP width per layer."""
    target_layers: list[int] = field(default_factory=list)
    """Target hidden_states ids fused by fc (0 = embeddings); empty: low/mid/high from the target's depth.
    vLLM serves ids 0..L-1 (pre-norm); L is the post-norm final state, which no engine hands the draft."""
    ttt_steps: int = 3
    """Training-time-test steps unrolled on the draft's own outputs."""
    embedding: Literal["frozen", "trained"] = "frozen"
    """The token embedding (initialised from the target's): kept frozen as EAGLE-3 does, or trained."""
    rope_theta: float = 10000.0
    """Rotary base."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""
    norm_output: bool = False
    """EAGLE-3.1: feed the final norm's output, not the raw layer output, to the next drafted
    step (against magnitude drift across speculation depths); speculators' option of that name."""


class Eagle3Speculator(FeatureAutoregressive):
    family = "eagle3"
    Config = Eagle3Config

    def __init__(self, config: Eagle3Config, target: TargetInfo):
        super().__init__(config, target)
        H, d = target.hidden_size, config.hidden_size
        n_layers = len(self.target_layer_ids)
        self.embed_tokens = nn.Embedding(target.vocab_size, d)
        if target.embed_weight is not None:
            with torch.no_grad():
                self.embed_tokens.weight.copy_(embedding_from_target(target.embed_weight, d))
        self.embed_tokens.weight.requires_grad_(config.embedding == "trained")
        self.input_norm = nn.RMSNorm(n_layers * H, eps=1e-6) if config.norm_before_fc else None
        self.fc = nn.Linear(n_layers * H, d, bias=False)
        args = (d, config.num_heads, config.num_kv_heads, config.intermediate_size)
        self.layers = nn.ModuleList([FusedInputLayer(*args), *(DecoderLayer(*args) for _ in range(config.num_layers - 1))])
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.lm_head = nn.Linear(d, self.vocab.size, bias=False)
        self.start_as_target(config, target)

    def start_as_target(self, config: Eagle3Config, target: TargetInfo) -> None:
        """head_init / layer_init = target: copy the target's head, final norm and decoder layers in."""
        for knob in ("head_init", "layer_init"):
            if getattr(config, knob) not in ("random", "target"):
                raise ValueError(f"{self.family} {knob} {getattr(config, knob)!r}: random or target")
        from_target = [knob for knob in ("head_init", "layer_init") if getattr(config, knob) == "target"]
        if from_target and config.hidden_size != target.hidden_size:
            raise ValueError(f"{self.family} {'/'.join(from_target)}=target needs hidden_size = the target's ({target.hidden_size})")
        if config.head_init == "target" and target.lm_head_weight is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(self.vocab.rows(target.lm_head_weight))
                if target.norm_weight is not None:
                    self.norm.weight.copy_(target.norm_weight)
        if config.layer_init == "target" and target.layer_state is not None:
            H, deepest = target.hidden_size, max(self.target_layer_ids)
            for j, layer in enumerate(self.layers):
                start_as_target_layer(layer, target.layer_state(min(deepest + j, target.num_layers - 1)))
            with torch.no_grad():  # fc passes the deepest layer it reads through
                self.fc.weight.zero_()
                slot = self.target_layer_ids.index(deepest)
                self.fc.weight[:, slot * H:(slot + 1) * H] = torch.eye(H)

    @classmethod
    def layer_ids_for(cls, config: Eagle3Config, num_layers: int) -> tuple[int, ...]:
        ids = tuple(config.target_layers) or default_layer_ids(num_layers)
        bad = [i for i in ids if not 0 <= i <= num_layers]
        if bad:
            raise ValueError(f"{cls.family} target_layers {bad} outside 0..{num_layers} (0 = embeddings)")
        return ids

    @property
    def unroll_steps(self) -> int:
        return self.config.ttt_steps

    def target_features(self, hidden, layers):
        if layers is None:
            raise ValueError(f"eagle3 reads the target's layers {self.target_layer_ids}; none were given")
        return layers.flatten(-2)  # [B, T, L * H]

    def lift(self, features):
        return self.fc(features if self.input_norm is None else self.input_norm(features))

    def carry(self, out):
        # Computed eagerly by feature_ar.py on both paths, so the native steps draft 3.1 as well.
        return self.norm(out) if self.config.norm_output else out

    def step_input(self, carried, tokens):
        return torch.cat([self.embed_tokens(tokens), carried], -1)

    def head_states(self, out):
        return self.norm(out)

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(states)

    def draft_head_weight(self, p: int) -> torch.Tensor:
        return self.lm_head.weight

    def max_draft_len(self) -> None:
        return None
