"""dflash2's own parts: the local convolution against a slot-by-slot reference, the identity it
starts as, its trained convolutions read by inference as by training, and the selector's
training term (test_families and test_zoo hold it to every family's contracts)."""

import pytest
import torch

from speclab.speculator.base import Features
from speclab.speculator.dflash2 import grouped_causal_conv
from speclab.speculator.families import build_speculator

from test_families import SMALL, TOL, random_layers, target_info


def reference_conv(h, delta, base, block_size):
    """Slot by slot, channel by channel: out[s, c] = sum_j h[s - j, c] (base[j, c] + delta[s, j, c // g])
    over taps j that stay inside slot s's block."""
    S, d = h.shape
    taps, groups = delta.shape[-2:]
    out = torch.zeros_like(h)
    for s in range(S):
        for j in range(taps):
            if s % block_size >= j:
                for c in range(d):
                    out[s, c] += h[s - j, c] * (base[j, c] + delta[s, j, c // (d // groups)])
    return out


def test_convolution_matches_the_slot_by_slot_reference():
    torch.manual_seed(0)
    block_size, taps, d, groups = 4, 3, 6, 2
    h, delta, base = torch.randn(3 * block_size, d), torch.randn(3 * block_size, taps, groups), torch.randn(taps, d)
    torch.testing.assert_close(grouped_causal_conv(h, delta, base, block_size),
                               reference_conv(h, delta, base, block_size), **TOL)


def perturbed(spec):
    """Every convolution weight random: the convolutions no longer the identity they start as."""
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in spec.named_parameters():
            if "_conv." in name:
                p.copy_(torch.randn_like(p) * 0.3 + (p if "base_kernel" in name else 0))
    return spec


def test_untrained_dflash2_unary_logits_are_dflash_with_the_same_weights():
    info = target_info()
    options = dict(SMALL["dflash2"][0])
    dflash2 = build_speculator("dflash2", options, info).eval()
    dflash_options = {k: v for k, v in options.items() if not k.startswith(("conv_", "selector_"))}
    dflash = build_speculator("dflash", dict(dflash_options, draft_vocab_size=0), info).eval()
    missing, unexpected = dflash.load_state_dict(dflash2.state_dict(), strict=False)
    assert not missing and all(k.startswith(("candidate_selector.", "layers.0.attention_conv", "layers.0.mlp_conv"))
                               for k in unexpected)
    torch.manual_seed(1)
    ids = torch.randint(0, info.vocab_size, (2, 11))
    feats = Features(ids, torch.randn(2, 11, info.hidden_size), torch.ones_like(ids, dtype=torch.bool),
                     random_layers(dflash, 11, info.hidden_size).expand(2, -1, -1, -1))
    with torch.no_grad():
        want = dflash.draft_states(feats)
        torch.testing.assert_close(dflash2.draft_states(feats), want, **TOL)
        assert not torch.allclose(perturbed(dflash2).draft_states(feats), want, atol=1e-3)


@pytest.mark.parametrize("size", [0, 1])
def test_trained_convolutions_draft_as_they_train(size):
    """With random convolutions, a proposal's logits equal the teacher-forced ones on the path it drafted."""
    info = target_info()
    spec = perturbed(build_speculator("dflash2", SMALL["dflash2"][size], info)).eval()
    torch.manual_seed(2)
    T0, k = 7, 3
    prompt, pending = torch.randint(0, info.vocab_size, (1, T0)), torch.randint(0, info.vocab_size, (1, 1))
    hidden, layers = torch.randn(1, T0 + k + 1, info.hidden_size), random_layers(spec, T0 + k + 1, info.hidden_size)
    drafts, logits = spec.propose(spec.start(prompt, hidden[:, :T0], layers[:, :T0]), pending, k)
    seq = torch.cat([prompt, pending, drafts], 1)
    feats = Features(seq, hidden, torch.ones_like(seq, dtype=torch.bool), layers)
    with torch.no_grad():
        tf = spec.draft_logits(feats)
    for i in range(k):  # draft i: step i at row T0 - 1 (the block anchored at the pending token)
        torch.testing.assert_close(tf[0, i, T0 - 1], logits[0, i], **TOL)


@pytest.mark.parametrize("size", [0, 1])  # the whole vocabulary, a reduced one
def test_drafts_are_the_selectors_choice_among_the_unary_top_k(size):
    info = target_info()
    spec = build_speculator("dflash2", SMALL["dflash2"][size], info).eval()
    with torch.no_grad():  # a selector strong enough to overrule the unary order
        for p in spec.candidate_selector.parameters():
            p.mul_(100)
    torch.manual_seed(3)
    prompt = torch.randint(0, info.vocab_size, (1, 6))
    state = spec.start(prompt, torch.randn(1, 6, info.hidden_size), random_layers(spec, 6, info.hidden_size))
    pending = torch.randint(0, info.vocab_size, (1, 1))
    drafts, logits = spec.propose(state, pending, 3)
    unary = spec.lm_head(spec._block_logits(state, pending))
    K = spec.config.selector_top_k
    overruled = 0
    for i in range(3):
        top = set(spec.vocab.to_target(unary[i].topk(K).indices).tolist())  # target ids
        assert int(drafts[0, i]) in top
        assert (logits[0, i] > -1e3).sum() == K  # only candidates carry a score
        overruled += int(drafts[0, i]) != int(spec.vocab.to_target(unary[i].argmax()))
    assert overruled  # the selector changed at least one draft (else it would be untested here)


def cross_entropy(draft, target):  # a per-row objective, as the training module's are
    return torch.nn.functional.cross_entropy(draft, target.argmax(-1), reduction="none")


def test_selector_term_trains_the_selector_and_reports_recall():
    info = target_info()
    spec = build_speculator("dflash2", SMALL["dflash2"][0], info)
    torch.manual_seed(4)
    ids = torch.randint(0, info.vocab_size, (2, 12))
    feats = Features(ids, torch.randn(2, 12, info.hidden_size), torch.ones_like(ids, dtype=torch.bool),
                     random_layers(spec, 12, info.hidden_size).expand(2, -1, -1, -1))
    head = lambda h, columns=None: h @ info.lm_head_weight.T  # noqa: E731
    loss, metrics = spec.loss(feats, cross_entropy, head)
    assert metrics["selector_loss"] > 0 and 0 <= metrics["recall_at_5"] <= 1
    loss.backward()
    selector = spec.candidate_selector
    for p in (selector.predecessor_codebook, selector.successor_codebook, selector.hidden_projection.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    spec.zero_grad()
    unary_only = build_speculator("dflash2", dict(SMALL["dflash2"][0], selector_weight=0.0), info)
    unary_only.load_state_dict(spec.state_dict())
    unary_loss, _ = unary_only.loss(feats, cross_entropy, head)
    assert loss.item() == pytest.approx(unary_loss.item() + metrics["selector_loss"], rel=1e-5)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="conv_group_size 7 must divide"):
        build_speculator("dflash2", dict(SMALL["dflash2"][0], conv_group_size=7), target_info())
    with pytest.raises(ValueError, match="conv_kernel_size 5"):
        build_speculator("dflash2", dict(SMALL["dflash2"][0], conv_kernel_size=5), target_info())
    with pytest.raises(ValueError, match="selector_top_k 20 must be 1..19"):  # more candidates than the draft vocabulary
        build_speculator("dflash2", dict(SMALL["dflash2"][1], selector_top_k=20), target_info())
