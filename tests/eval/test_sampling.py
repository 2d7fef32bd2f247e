"""Sampled decoding on the tiny target: seeded determinism, forced acceptance, and a
statistical check that speculative sampling's first token follows the warped target."""

import pytest
import torch

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.metrics import AcceptanceStats
from speclab.eval.sampling import SamplingConfig, TokenChooser
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from parallel_drafters import PARALLEL_DRAFTERS
from speculator_stubs import NeverSpeculator, OracleSpeculator, SometimesSpeculator, scripted

MAX_NEW = 12


@pytest.fixture(scope="module")
def mlp(target):
    return build_speculator("mlp", {"n_predict": 3, "inner_dim": 32}, TargetInfo.of(target)).eval()


def test_seeded_plain_and_speculative_sampling_repeat(target, prompt, mlp):
    def plain(seed):
        return generate_plain(target, prompt, MAX_NEW, eos_ids=(), sampling=SamplingConfig(1.0, seed=seed)).tokens

    def spec(seed):
        return generate_speculative(target, mlp, prompt, MAX_NEW, 3, eos_ids=(),
                                    sampling=SamplingConfig(1.0, top_p=0.95, seed=seed)).tokens

    assert plain(1) == plain(1) != plain(2)
    assert spec(1) == spec(1) != spec(2)


@pytest.mark.parametrize("cls, accepted", [(OracleSpeculator, 3), (NeverSpeculator, 0), (SometimesSpeculator, 1)])
def test_point_mass_target_forces_acceptance(target, prompt, cls, accepted):
    # top_k = 1 warps the target to its argmax: p(d) is 1 for the right draft and 0 for a wrong
    # one, so the oracle is always accepted, the never-stub never, and sampling equals greedy.
    speculator = scripted(cls, target, [prompt], MAX_NEW + 3)
    stats = AcceptanceStats(3)
    gen = generate_speculative(target, speculator, prompt, MAX_NEW, 3, eos_ids=(), stats=stats,
                               sampling=SamplingConfig(0.9, top_k=1, seed=0))
    assert gen.tokens == generate_plain(target, prompt, MAX_NEW, eos_ids=()).tokens
    full_steps = [n for n in gen.accepted[:-1]]  # the last step may be cut by max_new_tokens
    assert all(n == accepted for n in full_steps)


def test_engine_verifies_warped_logits_against_one_hot_drafts(target, prompt, mlp, monkeypatch):
    # The rule itself is checked statistically in tests/kernels/test_verify.py; here, that the
    # engine hands it the right operands: the warped target (top-k: -inf outside the 5 best),
    # point-mass draft distributions on the proposed tokens, and k + 1 uniforms.
    import speclab.eval.engine as engine

    calls = []
    real = engine.verify

    def spy(drafts, probs, logits, mode="greedy", randoms=None):
        calls.append((drafts, probs, logits, mode, randoms))
        return real(drafts, probs, logits, mode=mode, randoms=randoms)

    monkeypatch.setattr(engine, "verify", spy)
    generate_speculative(target, mlp, prompt, 6, 3, eos_ids=(), sampling=SamplingConfig(0.8, top_k=5, seed=0))
    assert calls
    for drafts, probs, logits, mode, randoms in calls:
        assert mode == "sample" and randoms.shape == (1, 4)
        assert torch.equal(probs.argmax(-1), drafts) and torch.equal(probs.sum(-1), torch.ones(1, 3))
        assert (torch.isfinite(logits).sum(-1) == 5).all()


@pytest.mark.parametrize("family, params", [
    ("mlp", {"n_predict": 3, "inner_dim": 32, "draft_vocab_size": 64}),
    ("draft_lm", {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}),
    *PARALLEL_DRAFTERS,
])
def test_sampled_drafts_are_seeded_and_lossless_on_a_point_mass_target(target, prompt, family, params):
    # drafts="sample" draws each draft from the draft's warped distribution (q is that
    # distribution, not one-hot). With top_k = 1 the target is a point mass on its argmax, so
    # the output must still be plain greedy decoding's; with top_k = 0 seeds must repeat.
    speculator = build_speculator(family, params, TargetInfo.of(target)).eval()

    def run(**kw):
        return generate_speculative(target, speculator, prompt, MAX_NEW, 3, eos_ids=(),
                                    sampling=SamplingConfig(drafts="sample", **kw)).tokens

    assert run(temperature=0.9, top_k=1) == generate_plain(target, prompt, MAX_NEW, eos_ids=()).tokens
    assert run(temperature=1.0, seed=4) == run(temperature=1.0, seed=4) != run(temperature=1.0, seed=5)
