"""An export against the client that serves it, on the same inputs: -> (max |logit difference|,
argmax agreement) over every compared (step, position). Shared by test_export_interop.py and
serving_figures.py (the figures in docs/serving.md).

- eagle3: vLLM's own `speculators` library, `SpeculatorModel.from_pretrained(export)`, its
  training forward unrolled over 3 TTT steps (the draft logits are caught at its lm_head);
- peagle: the same, its training forward over every (anchor, depth) of the sequence;
- dflash2: the same library's `DFlash2DraftModel`, its unary logits and its selector's scores;
- dflash, dspark, xpress: the same library's `DFlashDraftModel` / `DSparkDraftModel` /
  `XPressDraftModel`, its training forward over every anchor (dspark's Markov bias and
  xpress's teacher-forced refiner bias caught beside its lm_head);
- mlp: vLLM's `MLPSpeculator` rebuilt as an oracle (vllm_mlp_oracle.py), over the full vocabulary;
- medusa: vLLM's `Medusa` rebuilt as an oracle (vllm_medusa_oracle.py);
- draft_lm: transformers' `AutoModelForCausalLM.from_pretrained(export)`.

Each comparison is held to `tolerance(scale)`: both sides compute the same function in fp32
with differently ordered sums, so their round-off grows with the size of the values. 1e-5
absolute holds logits up to a few units; at the largest logits these random drafts give
(about 19) it is 5 units in the last place, and an AVX-512 CPU without AMX measured
1.0014e-5 there (dflash2, speculators' save). So the bound is 1e-5 or 16 units in the last
place of the largest compared logit, whichever is larger: 3.6e-5 at 19. A real difference
(another eps, a wrong layer, another mask token) is 1e-3 or more at any of these scales.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from vllm_medusa_oracle import VLLMMedusa
from vllm_mlp_oracle import VLLMMLPSpeculator

from speclab.speculator.base import Features

T = 16  # tokens per compared sequence
ATOL = 1e-5  # fp32 logits of a few units (see the module's docstring)
ULPS = 16  # units in the last place of the largest logit, the bound for larger ones


class Comparison(NamedTuple):
    diff: float
    """max |logit difference| over every compared (step, position, token)"""
    agree: float
    """the share of compared rows whose argmax agrees"""
    scale: float
    """max |logit| on speclab's side (FLOOR placeholders left out): what round-off scales with"""


def tolerance(scale: float) -> float:
    return max(ATOL, ULPS * torch.finfo(torch.float32).eps * scale)


def matches(c: Comparison) -> bool:
    """The same logits up to fp32 round-off, and the same argmax everywhere."""
    return c.diff < tolerance(c.scale) and c.agree == 1.0


def target_features(target, speculator, seed: int = 0) -> Features:
    """One random sequence as the target sees it (its pre-norm layers where the family reads them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (1, T), generator=g)
    with torch.no_grad():
        hs = target.model(ids, output_hidden_states=True).hidden_states  # [0]: embeddings, [L]: after the norm
    layers = torch.stack([hs[i] for i in speculator.target_layer_ids], 2) if speculator.target_layer_ids else None
    return Features(ids, hs[-1], torch.ones(1, T, dtype=torch.bool), layers)


def _figures(got: torch.Tensor, want: torch.Tensor) -> Comparison:
    return Comparison((got - want).abs().max().item(), (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
                      want.abs().max().item())


def load_in_speculators(out: Path):
    """speculators' Eagle3DraftModel / PEagleDraftModel from the export, on its dense ("eager")
    attention: its default flex attention builds 128-token block masks that a 16-token CPU
    check cannot use. The dense mask is built from the same mask function, so it admits the
    same (query, key) pairs: only the kernel changes, not the maths."""
    import json

    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.peagle import PEagleSpeculatorConfig

    kind = json.loads((Path(out) / "config.json").read_text())["speculators_model_type"]
    config = {"eagle3": Eagle3SpeculatorConfig, "peagle": PEagleSpeculatorConfig}[kind].from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"
    return SpeculatorModel.from_pretrained(str(out), config=config).eval()


@torch.no_grad()
def eagle3_vs_speculators(speculator, out: Path, target) -> Comparison:
    model = load_in_speculators(out)
    feats = target_features(target, speculator)
    want = speculator.draft_logits(feats)[0, :, : T - 1]  # [3, T-1, N]: step p at t reads x_{t+1+p}
    caught = []
    hook = model.lm_head.register_forward_hook(lambda module, args, logits: caught.append(logits[0]))
    # speculators pairs hidden_states[t] with input_ids[t], the token after it: speclab's x_{t+1}
    model(hidden_states=feats.layers.flatten(-2)[:, : T - 1], input_ids=feats.input_ids[:, 1:],
          document_ids=torch.zeros(1, T - 1, dtype=torch.long), position_ids=torch.arange(T - 1)[None],
          ttt_steps=want.shape[0])
    hook.remove()
    return _figures(torch.stack(caught), want)


class _Caught(Exception):
    pass


@torch.no_grad()
def peagle_vs_speculators(speculator, out: Path, target) -> Comparison:
    """Every block position: speculators' training forward on every (anchor j, depth d) with
    j + d inside the sequence, against speclab's `draft_logits` [d, j].

    speculators draws the (anchor, depth) pairs at random (conditional drop-token sampling,
    `generate_cod_sample_indices`); the check hands it all of them instead. Which rows exist
    is all that function decides: the rows' inputs, positions and attention mask are still
    built by speculators' own forward from (anchor, depth), so its maths is unchanged."""
    import speculators.models.peagle.core as core

    model = load_in_speculators(out)
    feats = target_features(target, speculator)
    n = T - 1  # speculators' shifted frame: hidden_states[j] = g_j beside input_ids[j] = x_{j+1}
    depths = speculator.draft_logits(feats).shape[1]
    pairs = [(j, d) for d in range(depths) for j in range(n - d)]
    anchors, depth = (torch.tensor(column) for column in zip(*pairs))
    caught = []

    def catch(module, args, logits):  # the forward stops here: its loss is no part of the comparison
        caught.append(logits[0])
        raise _Caught

    hook = model.lm_head.register_forward_hook(catch)
    sampler = core.generate_cod_sample_indices
    core.generate_cod_sample_indices = lambda **kwargs: (anchors, depth)
    try:
        model(hidden_states=feats.layers.flatten(-2)[:, :n], input_ids=feats.input_ids[:, 1:],
              document_ids=torch.zeros(1, n, dtype=torch.long), loss_mask=torch.ones(1, n),
              verifier_last_hidden_states=feats.hidden[:, 1:], num_depths=depths)
    except _Caught:
        pass
    finally:
        core.generate_cod_sample_indices = sampler
        hook.remove()
    want = speculator.draft_logits(feats)[0][depth, anchors]  # [pairs, N]
    return _figures(caught[0], want)
def load_block_drafter_in_speculators(out: Path):
    """speculators' DFlashDraftModel from the export, on its dense ("eager") attention with the
    float mask speculators builds for it: its default flex attention compiles block masks, which
    a CPU cannot run. The mask says the same (which keys each block row sees) in another form.
    Its frozen embedding (and a full vocabulary's head) are re-read from the saved verifier."""
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"
    model = SpeculatorModel.from_pretrained(str(out), config=config)
    model.load_verifier_weights()
    refiner = getattr(model, "refiner_head", None)
    if refiner is not None:
        # speculators 0.9.0's from_pretrained builds the model on the meta device and leaves
        # XPress's non-persistent causal_tril buffer uninitialised (garbage, seen as logits of
        # 1e22); its __init__ sets it to tril(ones): restored here, as that __init__ would.
        refiner.causal_tril.copy_(torch.tril(torch.ones_like(refiner.causal_tril)))
    return model.eval()


@torch.no_grad()
def dflash_vs_speculators(speculator, out: Path, target) -> Comparison:
    """Every block speculators anchors in a T-token sequence (anchors 0..T-block_size-1, all of
    them: max_anchors covers every valid position, so its random pick is all, sorted) against
    speclab's draft logits of the same block: anchor a's slot j is speclab's step j - 1 at row
    a - 1. Anchor 0 (no context) has no speclab row and is skipped."""
    model = load_block_drafter_in_speculators(out)
    feats = target_features(target, speculator)
    bs, first = speculator.config.block_size, speculator.first_slot
    caught, bias = [], []
    hook = model.lm_head.register_forward_hook(lambda module, args, logits: caught.append(logits[0]))
    head = getattr(model, "markov_head", None) or getattr(model, "refiner_head", None)
    if head is not None:  # dspark's Markov bias, xpress's refiner: added after lm_head, caught too
        block_bias = head.block_bias
        head.block_bias = lambda *args, **kw: bias.append(block_bias(*args, **kw)) or bias[-1]
    # xpress: its teacher-forced refine pass alone (consistency rounds off), the logits inference settles to
    extra = {"consistency_weight": 0.0} if speculator.family == "xpress" else {}
    model(hidden_states=feats.layers.flatten(-2), input_ids=feats.input_ids,
          loss_mask=torch.ones(1, T, dtype=torch.long), verifier_last_hidden_states=feats.hidden,
          document_ids=torch.zeros(1, T, dtype=torch.long), max_anchors=T - bs, **extra)
    hook.remove()
    got = caught[0].view(T - bs, bs, -1) + (bias[0] if bias else 0)  # [anchors, slots, N]
    got = got[1:, first:]  # anchor 0 has no speclab row; dflash's slot 0 drafts nothing
    want = speculator.draft_logits(feats)[0, :, : T - bs - 1].transpose(0, 1)  # [rows 0.., steps, N]
    return _figures(got, want)



def random_input_norm(speculator):
    """A norm over the fused target layers (norm_before_fc) whose weight is not its initial ones,
    so a missing or misplaced input_norm shows in the logits."""
    with torch.no_grad():
        speculator.input_norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))


def convolved(speculator):
    """Random convolutions (they start as the identity), so speculators' convolutions are compared too."""
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in speculator.named_parameters():
            if "_conv." in name:
                p.add_(torch.randn_like(p) * 0.1)


@torch.no_grad()
def dflash2_vs_speculators(speculator, out: Path, target) -> Comparison:
    """As dflash_vs_speculators, on both of DFlash2's outputs: the unary logits (caught at its
    lm_head) and the drafted distribution, i.e. speculators' own `candidate_selector.select` on
    the unary logits, block states and teacher-forced predecessors its training forward passes
    to the selector, placed as speclab places it (FLOOR off the K candidates)."""
    from speclab.speculator.lookup import FLOOR

    model = load_block_drafter_in_speculators(out)
    feats = target_features(target, speculator)
    bs = speculator.config.block_size
    caught, selector = [], model.candidate_selector
    score = selector.score_candidates
    selector.score_candidates = lambda unary, hidden, previous, ids: caught.append((unary, hidden, previous)) or \
        score(unary, hidden, previous, ids)
    model(hidden_states=feats.layers.flatten(-2), input_ids=feats.input_ids,
          loss_mask=torch.ones(1, T, dtype=torch.long), verifier_last_hidden_states=feats.hidden,
          document_ids=torch.zeros(1, T, dtype=torch.long), max_anchors=T - bs)
    unary, hidden, previous = caught[0]
    ids, scores = selector.select(unary, hidden, previous)
    drafted = torch.full_like(unary, FLOOR).scatter(-1, ids, scores)
    # [anchors, slots, N] -> anchor 0 (no context) has no speclab row; slot 0 drafts nothing
    got = [x.view(T - bs, bs, -1)[1:, 1:] for x in (unary, drafted)]
    states = speculator.draft_states(feats)[0, :, : T - bs - 1]  # [steps, rows, d]
    want = [speculator.lm_head(states).transpose(0, 1), speculator.draft_logits(feats)[0, :, : T - bs - 1].transpose(0, 1)]
    diff = max((g - w).abs().max().item() for g, w in zip(got, want))
    scale = max(want[0].abs().max().item(), want[1][want[1] != FLOOR].abs().max().item())
    return Comparison(diff, (got[1].argmax(-1) == want[1].argmax(-1)).float().mean().item(), scale)


@torch.no_grad()
def mlp_vs_vllm_oracle(speculator, out: Path, target) -> Comparison:
    """The difference at the drafted tokens' logits; the argmax over all V target tokens (the
    others' logits are MASKED, see masked_logits_ceiling)."""
    got, want = _mlp_logits(speculator, out, target)
    return drafted_figures(got, want, speculator.vocab.ids)


def drafted_figures(got: torch.Tensor, want: torch.Tensor, ids: torch.Tensor) -> Comparison:
    """A client's logits over all V against speclab's over its N drafted tokens (`ids`): compared
    at those tokens, the argmax taken over all V."""
    return Comparison((got[..., ids] - want).abs().max().item(),
                      (got.argmax(-1) == ids[want.argmax(-1)]).float().mean().item(), want.abs().max().item())


@torch.no_grad()
def masked_logits_ceiling(speculator, out: Path, target) -> float:
    """The largest logit vLLM's maths gives a token outside the draft vocabulary."""
    got, _ = _mlp_logits(speculator, out, target)
    return got[..., ~speculator.vocab.t2d()].max().item()


def _mlp_logits(speculator, out: Path, target) -> tuple[torch.Tensor, torch.Tensor]:
    """(the oracle's [t, n, V], speclab's [t, n, N]) at every position where each stage has its token."""
    oracle = VLLMMLPSpeculator.from_export(out)
    feats = target_features(target, speculator)
    n = speculator.config.n_predict
    positions = list(range(T - n))  # stage i at t reads x_{t+1+i}
    want = speculator.draft_logits(feats)[0][:, positions].transpose(0, 1)  # [t, n, N]
    tokens = torch.stack([feats.input_ids[0, t + 1 : t + 1 + n] for t in positions])  # [t, n]
    return oracle.stage_logits(feats.hidden[0, positions], tokens), want


@torch.no_grad()
def medusa_vs_vllm_oracle(speculator, out: Path, target) -> Comparison:
    """At the drafted tokens' logits; the argmax over all V (vLLM gives the others -inf)."""
    feats = target_features(target, speculator)
    got = VLLMMedusa.from_export(out).logits(feats.hidden[0])  # [T, K, V]
    want = speculator.draft_logits(feats)[0].transpose(0, 1)  # [T, K, N]
    return drafted_figures(got, want, speculator.vocab.ids)


@torch.no_grad()
def draft_lm_vs_transformers(speculator, out: Path, target) -> Comparison:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    feats = target_features(target, speculator)
    return _figures(model(feats.input_ids).logits[0], speculator.draft_logits(feats)[0, 0])


COMPARE = {"eagle3": eagle3_vs_speculators, "peagle": peagle_vs_speculators, "dflash": dflash_vs_speculators,
           "dflash2": dflash2_vs_speculators,
           "dspark": dflash_vs_speculators, "xpress": dflash_vs_speculators, "mlp": mlp_vs_vllm_oracle,
           "medusa": medusa_vs_vllm_oracle, "draft_lm": draft_lm_vs_transformers}
CLIENT = {**{family: "speculators 0.9.0 `SpeculatorModel.from_pretrained`" for family in ("eagle3", "peagle", "dflash", "dflash2", "dspark", "xpress")},
          "mlp": "vLLM `MLPSpeculator` oracle (rebuilt from vLLM's source)",
          "medusa": "vLLM `Medusa` oracle (rebuilt from vLLM's source)",
          "draft_lm": "transformers `AutoModelForCausalLM.from_pretrained`"}
