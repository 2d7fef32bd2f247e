"""The `mlp` speculator's native chain (speculator/mlp_chain.py) drafts what its eager stages
draft: the same tokens, and states whose logits agree to fp32 rounding; it engages only
inside `native_drafting`, follows changed weights and bf16 packs, and serves the hybrid."""

from __future__ import annotations

import copy

import pytest
import torch

from speclab.kernels import native
from speclab.speculator.base import Speculator
from speclab.speculator.families import build_speculator
from speclab.speculator.fast_linear import native_drafting
from speclab.speculator.mlp_chain import NativeMLPChain

from test_families import SMALL, target_info

pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler")

FP32 = dict(rtol=1e-5, atol=1e-5)  # the native GEMM and LayerNorm sum in another order than torch


def _speculator(size: int, info, seed: int = 7):
    """A small `mlp` whose norms are neither ones nor zeros, so a wrong stage's norm shows."""
    spec = build_speculator("mlp", SMALL["mlp"][size], info).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for norm in spec.norm:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return spec


def _inputs(info, seed: int):
    torch.manual_seed(seed)
    prompt = torch.randint(0, info.vocab_size, (1, 4))
    hidden = 3 * torch.randn(1, 4, info.hidden_size)  # spread, so the heads' maxima are clear
    return prompt, hidden, torch.randint(0, info.vocab_size, (1, 1))


def _native_chain(spec, info, seed: int, k: int, weight_dtype=None):
    """(drafts [1, k], the draft logits of each stage's state [1, k, N]) through the native chain."""
    prompt, hidden, pending = _inputs(info, seed)
    with native_drafting(spec, weight_dtype), torch.no_grad():
        state = spec.start(prompt, hidden)
        assert isinstance(state.native, NativeMLPChain)
        drafts, states = state.native.propose(state.hidden, int(pending), k, states=True)
        assert torch.equal(spec.propose_tokens(state, pending, k), drafts)
        logits = torch.stack([spec.draft_head(i, states[i:i + 1].to(spec.proj[0].weight.dtype)) for i in range(k)], 1)
    return drafts, logits


def _eager_chain(spec, info, seed: int, k: int):
    prompt, hidden, pending = _inputs(info, seed)
    with torch.no_grad():
        state = spec.start(prompt, hidden)
        assert state.native is None
        return spec.propose(state, pending, k)


@pytest.mark.parametrize("size", [0, 1])  # tied stages and the whole vocabulary; untied and a reduced one
def test_the_native_chain_drafts_what_the_eager_stages_draft(size):
    info = target_info()
    spec = _speculator(size, info)
    k = spec.config.n_predict
    for seed in range(20):
        drafts, logits = _native_chain(spec, info, seed, k)
        want_drafts, want_logits = _eager_chain(spec, info, seed, k)
        assert torch.equal(drafts, want_drafts)
        torch.testing.assert_close(logits, want_logits, **FP32)
    assert spec.vocab.full == (size == 0)  # size 1 exercises the reduced vocabulary's map to target ids


def test_a_chain_shorter_than_the_stages_and_a_bad_length():
    info = target_info()
    spec = _speculator(0, info)
    drafts, _ = _native_chain(spec, info, 3, 1)
    assert torch.equal(drafts, _eager_chain(spec, info, 3, 1)[0])
    with native_drafting(spec), torch.no_grad():
        state = spec.start(*_inputs(info, 3)[:2])
        assert state.native.propose(state.hidden, 1, 0).shape == (1, 0)
        with pytest.raises(ValueError, match="drafts 0..3 tokens"):
            state.native.propose(state.hidden, 1, 4)


def test_the_native_chain_engages_only_inside_native_drafting_and_without_gradients():
    info = target_info()
    spec = _speculator(0, info)
    prompt, hidden, _ = _inputs(info, 0)
    with native_drafting(spec):
        assert spec.start(prompt, hidden).native is None  # gradients on: training, eager
        with torch.no_grad():
            assert spec.start(prompt, hidden).native is not None
    with torch.no_grad():
        assert spec.start(prompt, hidden).native is None


def test_changed_weights_are_repacked():
    info = target_info()
    spec = _speculator(1, info)
    with native_drafting(spec), torch.no_grad():
        ops = spec._native_drafting_ops
        packed = NativeMLPChain.of(spec, ops)
        assert NativeMLPChain.of(spec, ops) is packed
        spec.head[-1].weight.mul_(-1)  # every later stage's choice changes
        assert NativeMLPChain.of(spec, ops) is not packed
    for seed in range(5):
        assert torch.equal(_native_chain(spec, info, seed, 4)[0], _eager_chain(spec, info, seed, 4)[0])


def test_bf16_packs_draft_what_bf16_rounded_weights_draft():
    """native_drafting(spec, bf16), as scoring against a bf16 target runs an fp32 draft: the
    projections and heads read bf16 weights (embeddings and norms stay fp32)."""
    info = target_info()
    spec = _speculator(0, info)
    rounded = copy.deepcopy(spec)
    with torch.no_grad():
        for module in rounded.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(module.weight.bfloat16().float())
    changed = 0
    for seed in range(10):
        got, got_logits = _native_chain(spec, info, seed, 3, torch.bfloat16)
        want, want_logits = _eager_chain(rounded, info, seed, 3)
        assert torch.equal(got, want)
        changed += int(not torch.allclose(want_logits, _eager_chain(spec, info, seed, 3)[1], **FP32))
    assert changed  # the rounding shows in the logits: the packs were bf16


def test_a_bf16_draft_stays_within_bf16_rounding_of_its_eager_stages():
    """A bf16 module: the eager stages round every activation to bf16, the native chain keeps
    fp32 activations over the same weights and its bf16 embedding table."""
    info = target_info()
    spec = _speculator(0, info).to(torch.bfloat16)
    _, got = _native_chain(spec, info, 1, 1)
    _, want = _eager_chain(spec, info, 1, 1)
    scale = float(want.float().abs().max())
    assert float((got.float() - want.float()).abs().max()) <= 0.05 * scale


def test_the_hybrids_learned_part_drafts_on_the_native_chain():
    info = target_info()
    hybrid = build_speculator("hybrid", SMALL["hybrid"][0], info).eval()
    prompt, hidden, pending = _inputs(info, 4)
    with torch.no_grad():
        want = Speculator.propose_tokens(hybrid, hybrid.start(prompt, hidden), pending, 3)
        with native_drafting(hybrid):
            state = hybrid.start(prompt, hidden)
            assert state.learned.native is not None
            assert torch.equal(hybrid.propose_tokens(state, pending, 3), want)
