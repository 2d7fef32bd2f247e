"""ngram, suffix and the hybrid in the real decoding loops on the tiny target: greedy chain and
tree output equal plain decoding's; sampled output is seeded, exact on a point-mass target,
and follows the target's distribution (chi-squared)."""

from collections import Counter

import pytest
import torch

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.sampling import SamplingConfig, TokenChooser
from speclab.eval.tree import TreeConfig, generate_tree
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from stat_checks import chi2_pvalue

MAX_NEW = 24
FAMILIES = [("ngram", {}), ("suffix", {}), ("suffix", {"branches": 2}),
            ("hybrid", {"learned": {"family": "mlp", "n_predict": 4, "inner_dim": 32}, "min_match": 2})]
IDS = [f + ("-branches" if p.get("branches") else "") for f, p in FAMILIES]
SHAPES = [TreeConfig("static", depth=3, top_k=2, budget=6), TreeConfig("dynamic", depth=4, top_k=3, budget=8),
          TreeConfig("union", depth=4, budget=6)]


@pytest.fixture(scope="module")
def plain(target, prompt):
    return generate_plain(target, prompt, MAX_NEW, eos_ids=())


def new(target, family, params):
    torch.manual_seed(0)  # the hybrid's learned part: equal weights for equal calls
    return build_speculator(family, params, TargetInfo.of(target)).eval()


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("family, params", FAMILIES, ids=IDS)
def test_chain_greedy_output_equals_plain(target, prompt, plain, family, params, k):
    speculator = new(target, family, params)
    first = generate_speculative(target, speculator, prompt, MAX_NEW, k, eos_ids=())
    assert first.tokens == plain.tokens
    # Decoding the prompt again: suffix (and the hybrid through it) now holds the first
    # output in its eval history, so its drafts are accepted, and the output is still exact.
    again = generate_speculative(target, speculator, prompt, MAX_NEW, k, eos_ids=())
    assert again.tokens == plain.tokens
    if family != "ngram":
        assert sum(again.accepted) > sum(first.accepted)


@pytest.mark.parametrize("cfg", SHAPES, ids=lambda c: c.shape)
@pytest.mark.parametrize("family, params", FAMILIES, ids=IDS)
def test_tree_greedy_output_equals_plain(target, prompt, plain, family, params, cfg):
    speculator = new(target, family, params)
    assert generate_tree(target, speculator, prompt, MAX_NEW, cfg, eos_ids=()).tokens == plain.tokens
    assert generate_tree(target, speculator, prompt, MAX_NEW, cfg, eos_ids=()).tokens == plain.tokens


@pytest.mark.parametrize("drafts", ["argmax", "sample"])
@pytest.mark.parametrize("family, params", FAMILIES, ids=IDS)
def test_sampling_is_seeded_and_exact_on_a_point_mass_target(target, prompt, plain, family, params, drafts):
    # top_k = 1 makes the warped target a point mass on its argmax: sampled speculative
    # decoding must then reproduce greedy decoding, whatever the drafts and their q.
    def run(speculator, tree=None, **kw):
        sampling = SamplingConfig(drafts=drafts, **kw)
        if tree is not None:
            return generate_tree(target, speculator, prompt, MAX_NEW, tree, eos_ids=(), sampling=sampling).tokens
        return generate_speculative(target, speculator, prompt, MAX_NEW, 3, eos_ids=(), sampling=sampling).tokens

    speculator = new(target, family, params)
    assert run(speculator, temperature=0.9, top_k=1) == plain.tokens
    assert run(speculator, temperature=0.9, top_k=1) == plain.tokens  # with an eval history
    if drafts == "argmax":
        assert run(speculator, SHAPES[1], temperature=0.9, top_k=1) == plain.tokens
        assert run(speculator, SHAPES[2], temperature=0.9, top_k=1) == plain.tokens
    seeded = [run(new(target, family, params), temperature=1.0, seed=s) for s in (4, 4, 5)]
    assert seeded[0] == seeded[1] != seeded[2]


@pytest.mark.parametrize("drafts", ["argmax", "sample"])
@pytest.mark.parametrize("family, params", [
    ("suffix", {}),
    # min_match 1: the untrained learned part drafts until the history holds a match, suffix after
    ("hybrid", {"learned": {"family": "mlp", "n_predict": 4, "inner_dim": 32}, "min_match": 1}),
], ids=["suffix", "hybrid"])
def test_sampled_second_token_follows_the_target_distribution(target, prompt, family, params, drafts):
    """The second token is the first one verification decides. One speculator decodes the
    prompt over and over with fresh seeds, so its eval history holds earlier samples: its
    drafts are often right and often wrong, and both paths of the rejection rule are taken.
    Given the modal first token x1, the second must follow p(. | prompt, x1) warped."""
    sampling = dict(temperature=1.0, top_k=4, drafts=drafts)
    speculator = new(target, family, params)
    pairs, accepted = [], Counter()
    for seed in range(400):
        gen = generate_speculative(target, speculator, prompt, 6, 2, eos_ids=(),
                                   sampling=SamplingConfig(seed=seed, **sampling))
        pairs.append(tuple(gen.tokens[:2]))
        accepted[gen.accepted[0] > 0] += 1
    assert accepted[True] > 40 and accepted[False] > 40  # both outcomes well represented
    x1, _ = Counter(a for a, _ in pairs).most_common(1)[0]
    seconds = torch.tensor([b for a, b in pairs if a == x1])
    logits = target(torch.cat([prompt, torch.tensor([[x1]])], 1), target.new_cache()).logits[0, -1]
    p = torch.softmax(TokenChooser(SamplingConfig(**sampling)).warp(logits[None]), -1)[0]  # [V]
    # A wrong rule (accepting every draft, or resampling from p instead of the residual)
    # moves mass onto the drafted token: with ~100+ samples over 4 tokens chi-squared then
    # rejects it; the right rule passes p > 1e-4 with probability 0.9999.
    assert chi2_pvalue(seconds, p) > 1e-4
