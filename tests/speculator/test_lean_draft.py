"""The feature-autoregressive drafts' native steps (speculator/lean_draft.py; peagle's one-pass
blocks too) compute what the eager layers compute: drafts, logits, the state after an
acceptance, tree steps read from the native cache, past the cache's first capacity; and they
engage only where they apply."""

from __future__ import annotations

import copy

import pytest
import torch

from speclab.kernels import native
from speclab.speculator import lean_draft
from speclab.speculator.families import build_speculator
from speclab.speculator.fast_linear import DraftingOps, native_drafting
from speclab.speculator.target.profile import kernel_choices

from test_families import SMALL, random_layers, target_info

pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler")

FAMILIES = [(family, size) for family in ("eagle", "eagle3", "peagle") for size in (0, 1)]
# fp32: the native GEMM and attention sum in another order than torch: a few ulps of the logits.
FP32 = dict(rtol=1e-5, atol=1e-5)


def _speculator(family, size, info):
    """A small draft whose norms are not all ones, so mixing two of them up shows."""
    spec = build_speculator(family, SMALL[family][size], info).eval()
    torch.manual_seed(7)
    with torch.no_grad():
        for module in spec.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return spec


def _decode(spec, info, prompt_len=6, seed=2):
    """Start, propose 3, accept 2 of them, propose again, extend 4 paths of depth 2: every
    output, and the final state."""
    torch.manual_seed(seed)
    total = prompt_len + 6
    prompt = torch.randint(0, info.vocab_size, (1, prompt_len))
    hidden = torch.randn(1, total, info.hidden_size)
    layers = random_layers(spec, total, info.hidden_size)
    span = lambda lo, hi: None if layers is None else layers[:, lo:hi]  # noqa: E731
    pending, nxt = torch.randint(0, info.vocab_size, (1, 1)), torch.tensor([[5]])
    paths = torch.randint(0, info.vocab_size, (4, 2))
    with torch.no_grad():
        state = spec.start(prompt, hidden[:, :prompt_len], span(0, prompt_len))
        drafts, first = spec.propose(state, pending, 3)
        end = prompt_len + 3
        spec.accept(state, torch.cat([pending, drafts[:, :2]], 1), hidden[:, prompt_len:end], span(prompt_len, end))
        again_drafts, again = spec.propose(state, nxt, 3)
        tree = spec.extend(state, nxt, paths)
    return state, (drafts, first, again_drafts, again, tree)


def _native_matches_eager(spec, info, decode, **options):
    """`decode` eagerly, then inside native_drafting: token ids equal, the rest to fp32
    rounding. -> (the eager state, the native state)."""
    eager_state, eager = decode(spec, info, **options)
    with native_drafting(spec):
        state, got = decode(spec, info, **options)
    for g, w in zip(got, eager):
        if w.dtype == torch.int64:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g.float(), w.float(), **FP32)
    return eager_state, state


@pytest.mark.parametrize("family, size", FAMILIES)
def test_native_steps_draft_what_the_eager_layers_draft(family, size):
    info = target_info()
    eager_state, state = _native_matches_eager(_speculator(family, size, info), info, _decode)
    assert eager_state.lean is None and isinstance(state.lean, lean_draft.LeanDraftCache)
    assert state.cache is None and state.length == eager_state.length


def _accept_twice_then_extend(spec, info, prompt_len=5):
    """Two accepts with no propose between them, then a tree step, then a chain: the rows
    a native state queues must be fed by whichever call reads the state next."""
    torch.manual_seed(3)
    total = prompt_len + 3
    prompt = torch.randint(0, info.vocab_size, (1, prompt_len))
    hidden = torch.randn(1, total, info.hidden_size)
    layers = random_layers(spec, total, info.hidden_size)
    span = lambda lo, hi: None if layers is None else layers[:, lo:hi]  # noqa: E731
    committed = torch.randint(0, info.vocab_size, (1, 3))
    with torch.no_grad():
        state = spec.start(prompt, hidden[:, :prompt_len], span(0, prompt_len))
        spec.accept(state, committed[:, :2], hidden[:, prompt_len:prompt_len + 2], span(prompt_len, prompt_len + 2))
        spec.accept(state, committed[:, 2:], hidden[:, prompt_len + 2:], span(prompt_len + 2, total))
        tree = spec.extend(state, torch.tensor([[7]]), torch.randint(0, info.vocab_size, (3, 2)))
        drafts, logits = spec.propose(state, torch.tensor([[7]]), 2)
    return state, (tree, drafts, logits)


@pytest.mark.parametrize("family, size", FAMILIES[::2])
def test_queued_rows_are_fed_by_the_next_reader(family, size):
    info = target_info()
    eager_state, state = _native_matches_eager(_speculator(family, size, info), info, _accept_twice_then_extend)
    assert state.queued is None and state.length == eager_state.length


@pytest.mark.parametrize("family, size", FAMILIES[1::2])
def test_the_native_cache_grows_past_its_capacity(family, size):
    info = target_info()
    _, state = _native_matches_eager(_speculator(family, size, info), info, _decode, prompt_len=300)
    assert state.lean.capacity >= 300 + 6


@pytest.mark.parametrize("family", ["eagle3", "mlp"])
def test_weights_packed_as_bf16_draft_what_bf16_rounded_weights_draft(family):
    """native_drafting(spec, bf16), as scoring against a bf16 target runs an fp32 draft:
    every projection reads its weight rounded to bf16 (the norms and embeddings stay fp32).
    Where this machine's bf16 path (its machine profile's) multiplies bf16 pairs (vdpbf16ps, AMX
    tiles), each projection's input rows are rounded to bf16 too; the reference does the
    same, so the test asserts what the path the machine chose computes."""
    info = target_info()
    spec = _speculator(family, 0, info)
    rounded = copy.deepcopy(spec)
    rounds_input = DraftingOps(native.load(), torch.bfloat16, kernel_choices(native.load()).bf16_path).bf16_dot
    with torch.no_grad():
        for module in rounded.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(module.weight.bfloat16().float())
                if rounds_input:
                    module.register_forward_pre_hook(lambda _, args: (args[0].bfloat16().float(),))
    _, want = _decode(rounded, info)
    with native_drafting(spec):  # packed in fp32 first: the bf16 block must not reuse those packs
        _, fp32 = _decode(spec, info)
    with native_drafting(spec, torch.bfloat16):
        _, got = _decode(spec, info)
    for g, w in zip(got[1::2], want[1::2]):  # the logits
        torch.testing.assert_close(g, w, **FP32)
    assert not torch.allclose(got[-1], fp32[-1], **FP32)  # the weights' rounding shows


def test_bf16_native_steps_stay_within_bf16_rounding_of_the_eager_ones():
    """A bf16 draft: the eager layers round every activation to bf16, the native ones keep
    fp32 activations over the same weights; the logits agree to bf16's resolution."""
    info = target_info()
    spec = _speculator("eagle3", 0, info).to(torch.bfloat16)
    _, eager = _decode(spec, info)
    with native_drafting(spec):
        _, got = _decode(spec, info)
    for g, w in zip(got[1::2], eager[1::2]):  # the logits
        scale = float(w.float().abs().max())
        assert float((g.float() - w.float()).abs().max()) <= 0.05 * scale


def test_native_steps_engage_only_inside_native_drafting_and_without_gradients():
    info = target_info()
    spec = _speculator("eagle3", 0, info)
    prompt, hidden = torch.randint(0, info.vocab_size, (1, 4)), torch.randn(1, 4, info.hidden_size)
    layers = random_layers(spec, 4, info.hidden_size)
    with native_drafting(spec):
        with torch.no_grad():
            assert spec.start(prompt, hidden, layers).lean is not None
        assert spec._lean_cache(torch.device("cpu")) is None  # gradients on: training, eager
    with torch.no_grad():
        assert spec.start(prompt, hidden, layers).lean is None
    assert "_native_drafting_ops" not in vars(spec) and "_native_drafting_ops" not in vars(spec.layers)


def test_changed_weights_are_repacked():
    info = target_info()
    spec = _speculator("eagle3", 0, info)
    with native_drafting(spec), torch.no_grad():
        ops = spec._native_drafting_ops
        packed = lean_draft.LeanDraftLayers.of(spec.layers, spec.config.rope_theta, ops)
        assert lean_draft.LeanDraftLayers.of(spec.layers, spec.config.rope_theta, ops) is packed
        spec.layers[0].mlp.down_proj.weight.mul_(2)
        assert lean_draft.LeanDraftLayers.of(spec.layers, spec.config.rope_theta, ops) is not packed
        _, got = _decode(spec, info)
    _, want = _decode(spec, info)
    torch.testing.assert_close(got[1], want[1], **FP32)


def test_layers_of_another_structure_stay_eager():
    info = target_info()
    spec = _speculator("eagle3", 0, info)
    assert lean_draft.supports(spec.layers)
    spec.layers.append(torch.nn.Linear(2, 2))
    assert not lean_draft.supports(spec.layers)
