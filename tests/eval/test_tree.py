"""Tree drafting on the tiny target: shapes, greedy equality, sampled acceptance, extend."""

import pytest
import torch

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.metrics import AcceptanceStats
from speclab.eval.sampling import SamplingConfig, TokenChooser
from speclab.eval.tree import (DraftTree, TreeConfig, draft_tree, generate_tree, static_rank_paths, union_tree,
                               walk_greedy, walk_sample)
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from stat_checks import chi2_pvalue
from parallel_drafters import PARALLEL_DRAFTERS
from speculator_stubs import NeverSpeculator, OracleSpeculator, SometimesSpeculator, TakeTurnsSpeculator, scripted

MAX_NEW = 16
STUBS = [OracleSpeculator, NeverSpeculator, SometimesSpeculator]
SHAPES = [TreeConfig("static", depth=3, top_k=2, budget=6), TreeConfig("dynamic", depth=3, top_k=2, budget=6)]
UNION = TreeConfig("union", depth=3, budget=6)


@pytest.fixture(scope="module")
def plain(target, prompt):
    return generate_plain(target, prompt, MAX_NEW, eos_ids=())


def test_static_shape_is_ancestor_closed_and_sized_by_budget():
    paths = static_rank_paths(TreeConfig("static", depth=4, top_k=3, budget=9))
    assert len(paths) == 9 and len(set(paths)) == 9
    assert all(p[:-1] in paths for p in paths if len(p) > 1)
    assert paths[:4] == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]  # the greedy chain first


@pytest.mark.parametrize("cfg", SHAPES, ids=lambda c: c.shape)
@pytest.mark.parametrize("cls", STUBS, ids=lambda c: c.family)
def test_tree_greedy_output_equals_plain(target, prompt, plain, cls, cfg):
    speculator = scripted(cls, target, [prompt], MAX_NEW + cfg.depth + 1)
    stats = AcceptanceStats(cfg.depth)
    gen = generate_tree(target, speculator, prompt, MAX_NEW, cfg, eos_ids=(), stats=stats)
    assert gen.tokens == plain.tokens
    # Both depth-1 candidates are always verified and one is the target's token, so every
    # stub, even one whose top draft is always wrong, gets at least one token per step.
    assert stats.num_accepted_tokens == sum(gen.accepted) and min(gen.accepted) >= 1
    assert stats.num_draft_tokens == gen.drafted_tokens <= cfg.budget * stats.num_drafts


def test_union_tree_is_the_trie_of_the_chains_within_the_budget():
    tree = union_tree(9, [[1, 2, 3], [1, 2, 4], [5]], budget=5)
    assert tree.tokens == [9, 1, 2, 3, 4, 5] and tree.parents == [-1, 0, 1, 2, 2, 0]
    assert tree.depths == [0, 1, 2, 3, 3, 1]  # the shared prefix 1, 2 is verified once
    cut = union_tree(9, [[1, 2, 3], [7, 8]], budget=4)
    assert cut.tokens == [9, 1, 2, 3, 7] and cut.size == 4  # chains in order while the budget lasts
    assert union_tree(9, [[], [4]], budget=3).tokens == [9, 4]  # an empty chain adds nothing
    # the walk follows whichever chain the target agrees with
    logits = torch.zeros(6, 10)
    for node, choice in enumerate([1, 2, 4, 0, 6, 0]):
        logits[node, choice] = 1.0
    assert walk_greedy(tree, logits) == ([0, 1, 2, 4], 6)


@pytest.mark.parametrize("cls", [TakeTurnsSpeculator, OracleSpeculator, NeverSpeculator], ids=lambda c: c.family)
def test_union_tree_greedy_output_equals_plain(target, prompt, plain, cls):
    speculator = scripted(cls, target, [prompt], MAX_NEW + UNION.depth + 1)
    stats = AcceptanceStats(UNION.depth)
    gen = generate_tree(target, speculator, prompt, MAX_NEW, UNION, eos_ids=(), stats=stats)
    assert gen.tokens == plain.tokens
    expected = {"test-never": 0, "test-oracle": UNION.depth, "test-take-turns": UNION.depth}[cls.family]
    assert gen.accepted[:-1] == [expected] * (len(gen.accepted) - 1)  # the last step may be cut by the budget


def test_union_tree_accepts_what_either_chain_gets_right(target, prompt, plain):
    # each chain alone is right every other step; their union every step
    chain = AcceptanceStats(3)
    generate_speculative(target, scripted(TakeTurnsSpeculator, target, [prompt], MAX_NEW + 4), prompt, MAX_NEW, 3,
                         eos_ids=(), stats=chain)
    union = AcceptanceStats(3)
    generate_tree(target, scripted(TakeTurnsSpeculator, target, [prompt], MAX_NEW + 4), prompt, MAX_NEW, UNION,
                  eos_ids=(), stats=union)
    assert union.mean_acceptance_length > chain.mean_acceptance_length + 1
    assert scripted(TakeTurnsSpeculator, target, [prompt], 4).offers_chains()
    assert not scripted(OracleSpeculator, target, [prompt], 4).offers_chains()


def test_tree_beats_chain_at_equal_verified_tokens(target, prompt):
    # A draft whose second choice is the right one: a chain of 4 gets nothing accepted; the
    # static 4-node tree (0), (0, 0), (0, 0, 0), (1) verifies as many tokens and gets (1).
    cfg = TreeConfig("static", depth=3, top_k=2, budget=4)
    chain_stats, tree_stats = AcceptanceStats(4), AcceptanceStats(3)
    generate_speculative(target, scripted(NeverSpeculator, target, [prompt], MAX_NEW + 5), prompt, MAX_NEW, 4,
                         eos_ids=(), stats=chain_stats)
    generate_tree(target, scripted(NeverSpeculator, target, [prompt], MAX_NEW + 4), prompt, MAX_NEW, cfg,
                  eos_ids=(), stats=tree_stats)
    assert chain_stats.mean_acceptance_length == 1.0
    assert tree_stats.mean_acceptance_length == 2.0


@pytest.mark.parametrize("cfg", SHAPES, ids=lambda c: c.shape)
@pytest.mark.parametrize("family, params", [
    ("mlp", {"n_predict": 3, "inner_dim": 32}),
    ("draft_lm", {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}),
    ("mlp", {"n_predict": 3, "inner_dim": 32, "draft_vocab_size": 64}),
    *PARALLEL_DRAFTERS,
])
def test_real_families_tree_greedy_equals_plain(target, prompt, plain, family, params, cfg):
    speculator = build_speculator(family, params, TargetInfo.of(target)).eval()
    gen = generate_tree(target, speculator, prompt, MAX_NEW, cfg, eos_ids=())
    assert gen.tokens == plain.tokens
    assert gen.draft_seconds > 0 and gen.verify_seconds > 0


@pytest.mark.parametrize("family, params", [
    ("mlp", {"n_predict": 3, "inner_dim": 32, "draft_vocab_size": 64}),
    ("draft_lm", {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}),
])
def test_extend_rows_equal_propose(target, prompt, family, params):
    speculator = build_speculator(family, params, TargetInfo.of(target)).eval()
    hidden = target(prompt, target.new_cache()).hidden
    pending = torch.tensor([[7]])
    drafts, logits = speculator.propose(speculator.start(prompt, hidden), pending, 3)
    state = speculator.start(prompt, hidden)
    for d in range(3):
        other = torch.randint(0, target.vocab_size, (2, d), generator=torch.Generator().manual_seed(d))
        rows = speculator.extend(state, pending, torch.cat([drafts[:, :d], other]))  # [3, N]
        # Same float32 ops in a different batch shape: equal to rounding (measured ~2e-7).
        torch.testing.assert_close(rows[0], logits[0, d], rtol=0, atol=1e-5)


def test_dynamic_tree_keeps_the_most_confident_nodes(target, prompt):
    speculator = scripted(SometimesSpeculator, target, [prompt], MAX_NEW + 4)
    state = speculator.start(prompt, target(prompt, target.new_cache()).hidden)
    pending = torch.tensor([[state.reference[state.position]]])
    tree = draft_tree(speculator, state, pending, TreeConfig("dynamic", depth=3, top_k=2, budget=5))
    assert tree.size == 5 and tree.parents[0] == -1
    assert all(tree.depths[i] == tree.depths[p] + 1 for i, p in enumerate(tree.parents) if p >= 0)
    # Stub logits: 3 and 2 for the top two, 0 for the other 382 tokens, so each level costs a
    # path log(e^3 / Z) ~ -3 (top) or ~ -4 (second): both depth-1 nodes (-3, -4) and the three
    # best depth-2 nodes (-6, -7, -7) beat every depth-3 node (<= -9).
    assert tree.depths == [0, 1, 1, 2, 2, 2]
    assert tree.tokens[1] == state.reference[state.position + 1]  # Sometimes: right at position 0


# --- sampling -------------------------------------------------------------------------------


def test_tree_sampling_with_top_k_1_is_greedy(target, prompt, plain):
    # top_k = 1 warps the target to a point mass on its argmax: sampling must reproduce greedy.
    speculator = scripted(SometimesSpeculator, target, [prompt], MAX_NEW + 4)
    gen = generate_tree(target, speculator, prompt, MAX_NEW, SHAPES[1], eos_ids=(),
                        sampling=SamplingConfig(temperature=0.8, top_k=1, seed=3))
    greedy = generate_tree(target, speculator, prompt, MAX_NEW, SHAPES[1], eos_ids=())
    assert gen.tokens == plain.tokens and gen.accepted == greedy.accepted


@pytest.mark.parametrize("cfg", SHAPES, ids=lambda c: c.shape)
def test_tree_sampling_is_seeded(target, prompt, cfg):
    # A real (random) draft: sampled text leaves the stubs' scripted continuation.
    speculator = build_speculator("mlp", {"n_predict": 3, "inner_dim": 32}, TargetInfo.of(target)).eval()
    runs = [generate_tree(target, speculator, prompt, MAX_NEW, cfg, eos_ids=(),
                          sampling=SamplingConfig(temperature=1.0, seed=seed)).tokens for seed in (5, 5, 6)]
    assert runs[0] == runs[1] != runs[2]


def test_tree_sampling_walk_follows_the_target_distribution():
    # Root with children tokens 2, 0, 4 (node 1 has children 1, 2), over a 6-token vocabulary.
    tree = DraftTree(tokens=[9, 2, 0, 4, 1, 2], parents=[-1, 0, 0, 0, 1, 1], depths=[0, 1, 1, 1, 2, 2])
    logits = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    logits[0, 5] = float("-inf")  # a token the target never produces at the root
    chooser = TokenChooser(SamplingConfig(temperature=1.0, seed=11))
    first, second = [], []
    for _ in range(10_000):
        path, next_id = walk_sample(tree, logits, chooser)
        tokens = [tree.tokens[i] for i in path[1:]] + [next_id]
        first.append(tokens[0])
        if len(path) > 1 and path[1] == 1:
            second.append(tokens[1])
    p_root, p_node1 = torch.softmax(logits[0], -1), torch.softmax(logits[1], -1)
    # 10k draws: resampling from p instead of the residual moves some root probability by
    # >= 0.05 here (chi-squared > 100); the correct walk passes p > 1e-4 with probability
    # 0.9999, and the seed is fixed, so the outcome is reproducible.
    assert chi2_pvalue(torch.tensor(first), p_root) > 1e-4
    assert chi2_pvalue(torch.tensor(second), p_node1) > 1e-4
