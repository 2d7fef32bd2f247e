"""ngram, suffix and the hybrid: their drafting rules, on stub targets (no model calls)."""

import math
import random

import pytest
import torch

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.lookup import FLOOR, TrainingFree

V, H = 11, 8


def info():
    torch.manual_seed(0)
    return TargetInfo(vocab_size=V, hidden_size=H, num_layers=2, name="stub",
                      embed_weight=torch.randn(V, H), lm_head_weight=torch.randn(V, H))


def started(spec, prompt):
    ids = torch.tensor([prompt])
    return spec.start(ids, torch.randn(1, len(prompt), H))


def brute_ngram(tokens, context, max_n, min_n):
    """The token after the latest earlier occurrence of the longest matching suffix n-gram."""
    for n in range(min(max_n, len(context)), min_n - 1, -1):
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i:i + n] == context[len(context) - n:]:
                return tokens[i + n]
    return None


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_n, min_n", [(3, 1), (4, 2)])
def test_ngram_drafts_what_followed_the_latest_longest_match(seed, max_n, min_n):
    rng = random.Random(seed)
    spec = build_speculator("ngram", {"max_n": max_n, "min_n": min_n}, info())
    tokens = [rng.randrange(4) for _ in range(rng.randint(2, 40))]
    state = started(spec, tokens)
    for _ in range(30):
        context = tokens[-max_n:] + [rng.randrange(4) for _ in range(rng.randint(1, 3))]
        guess = spec.candidates(state, context)
        expected = brute_ngram(tokens, context, max_n, min_n)
        assert (guess.ranked[0][0] if guess.ranked else None) == expected


@pytest.mark.parametrize("family", ["ngram", "suffix"])
def test_training_free_families_have_nothing_to_train(family):
    spec = build_speculator(family, {}, info())
    assert isinstance(spec, TrainingFree) and spec.num_params() == 0
    with pytest.raises(TypeError, match="training-free"):
        spec.loss(None, None, None)
    with pytest.raises(ValueError, match="draft_vocab_size must be 0"):
        build_speculator(family, {"draft_vocab_size": 5}, info())


def families():
    return [("ngram", {}), ("suffix", {"max_pattern": 5}),
            ("hybrid", {"learned": {"family": "mlp", "n_predict": 4, "inner_dim": 16}, "min_match": 2})]


@pytest.mark.parametrize("family, params", families(), ids=lambda x: x if isinstance(x, str) else "")
def test_extend_rows_equal_propose_and_leave_the_state_alone(family, params):
    spec = build_speculator(family, params, info()).eval()
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    pending = torch.tensor([[3]])
    drafts, logits = spec.propose(started(spec, prompt), pending, 4)  # [1, k'], [1, k', V], k' <= 4
    assert torch.equal(drafts[0], logits[0].argmax(-1)) and 1 <= drafts.shape[1] <= 4
    state = started(spec, prompt)
    for d in range(drafts.shape[1]):
        other = torch.randint(0, V, (2, d), generator=torch.Generator().manual_seed(d))
        rows = spec.extend(state, pending, torch.cat([drafts[:, :d], other]))  # [3, V]
        torch.testing.assert_close(rows[0], logits[0, d], rtol=0, atol=1e-6)
    again, _ = spec.propose(state, pending, 4)
    assert torch.equal(again, drafts)  # extend changed nothing


@pytest.mark.parametrize("family, params", families(), ids=lambda x: x if isinstance(x, str) else "")
def test_propose_tokens_are_proposes_drafts_on_long_and_short_matches(family, params):
    spec = build_speculator(family, params, info()).eval()
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 6, 7]
    for pending in range(V):  # long matches (3 after "1 2"), one-token ones, and none
        for k in (1, 3, 5):
            torch.manual_seed(pending)  # started() hands the learned part random features
            drafts, _ = spec.propose(started(spec, prompt), torch.tensor([[pending]]), k)
            torch.manual_seed(pending)
            tokens = spec.propose_tokens(started(spec, prompt), torch.tensor([[pending]]), k)
            assert torch.equal(tokens, drafts), (pending, k)


@pytest.mark.parametrize("family, params", families()[:2], ids=["ngram", "suffix"])
def test_accept_then_propose_matches_a_fresh_start(family, params):
    spec = build_speculator(family, params, info())
    prompt, pending, nxt = [1, 2, 3, 1, 2, 4, 2, 3], torch.tensor([[1]]), torch.tensor([[2]])
    for n in range(4):
        state = started(spec, prompt)
        drafts, _ = spec.propose(state, pending, 3)
        committed = torch.cat([pending, drafts[:, :n]], 1)
        spec.accept(state, committed, torch.randn(1, n + 1, H))
        after = spec.propose(state, nxt, 3)
        fresh = spec.propose(started(spec, prompt + committed[0].tolist()), nxt, 3)
        assert torch.equal(after[0], fresh[0]) and torch.equal(after[1], fresh[1])


def test_suffix_runner_up_chains_start_at_the_second_candidate():
    # Patterns of at most 2 tokens: after "1 2" came 3 twice and 4 once; after "2 3", 5 and
    # after "2 4", 6. The greedy chain from pending 2 is 3 5 1; the runner-up takes 4 (1/3 >=
    # min_prob) and goes on greedily: 6 1. No other draft had a second candidate.
    prompt = [1, 2, 3, 5, 1, 2, 4, 6, 1, 2, 3, 5, 1]
    params = {"global_outputs": False, "max_pattern": 2, "spec_factor": 4.0}
    spec = build_speculator("suffix", {**params, "branches": 2}, info())
    chains = [c[0].tolist() for c in spec.propose_chains(started(spec, prompt), torch.tensor([[2]]), 3)]
    greedy = spec.propose_tokens(started(spec, prompt), torch.tensor([[2]]), 3)[0].tolist()
    assert chains == [[3, 5, 1], [4, 6, 1]] and greedy == [3, 5, 1]
    assert spec.offers_chains()
    single = build_speculator("suffix", params, info())
    assert not single.offers_chains()
    assert [c[0].tolist() for c in single.propose_chains(started(single, prompt), torch.tensor([[2]]), 3)] == [greedy]
    with pytest.raises(ValueError, match="branches >= 0"):
        build_speculator("suffix", {"branches": -1}, info())


def test_suffix_speculation_length_follows_the_match_length():
    # "7 8 9 1 2 3 4 5 6" then "... 7 8 9": a 3-token match, so with spec_factor 1 the first
    # 3 drafts (1 2 3) are confident (logit log 1 = 0) and the chain stops there; the 4th
    # guess (4) still ranks first in a tree's row, but low.
    spec = build_speculator("suffix", {"spec_factor": 1.0, "global_outputs": False}, info())
    state = started(spec, [7, 8, 9, 1, 2, 3, 4, 5, 6, 0, 7, 8])
    drafts, logits = spec.propose(state, torch.tensor([[9]]), 5)
    assert drafts[0].tolist() == [1, 2, 3]
    assert logits[0].max(-1).values.tolist() == [0.0, 0.0, 0.0]
    fourth = spec.extend(state, torch.tensor([[9]]), torch.tensor([[1, 2, 3]]))[0]
    assert fourth.argmax() == 4 and FLOOR < fourth.max() < FLOOR + 3
    doubled = build_speculator("suffix", {"spec_factor": 2.0, "global_outputs": False}, info())
    top2 = doubled.propose(started(doubled, [7, 8, 9, 1, 2, 3, 4, 5, 6, 0, 7, 8]), torch.tensor([[9]]), 5)[1][0].max(-1).values
    assert top2.tolist() == [0.0] * 5  # ceil(2 * 3) = 6 >= 5 confident drafts


def test_suffix_chains_stop_where_their_probability_falls_below_min_chain_prob():
    # One-token patterns: after 5 came 6 twice and 7 twice (1/2 each, 6 first on the tie),
    # after 6 and 7 always 5. The greedy chain from pending 5 is 6 5 6 5 6 5, its
    # probability 1/2 1/2 1/4 1/4 1/8 1/8 after each draft.
    prompt = [5, 6, 5, 7, 5, 6, 5, 7]
    params = {"global_outputs": False, "max_pattern": 1, "spec_factor": 8.0}
    drafts = {}
    for floor in (0.0, 0.3, 0.2, 0.5, 0.6):
        spec = build_speculator("suffix", {**params, "min_chain_prob": floor}, info())
        drafts[floor] = spec.propose_tokens(started(spec, prompt), torch.tensor([[5]]), 6)[0].tolist()
    assert drafts == {0.0: [6, 5, 6, 5, 6, 5], 0.3: [6, 5], 0.2: [6, 5, 6, 5], 0.5: [6, 5], 0.6: []}
    with pytest.raises(ValueError, match="min_chain_prob"):
        build_speculator("suffix", {"min_chain_prob": 1.5}, info())


def test_suffix_ranks_continuations_by_frequency():
    spec = build_speculator("suffix", {"global_outputs": False}, info())
    state = started(spec, [1, 2, 1, 3, 1, 3, 1, 3, 1, 2, 0])
    row = spec.extend(state, torch.tensor([[1]]), torch.zeros(1, 0, dtype=torch.long))[0]
    probs = torch.softmax(row, -1)
    # after "0 1": no match of 2, so the pattern is "1": followed by 2 twice and 3 three times
    torch.testing.assert_close(probs[[2, 3]], torch.tensor([0.4, 0.6]))
    assert probs.sum() == pytest.approx(1.0) and probs[[0, 1, 4]].sum() == 0


def test_suffix_matches_the_outputs_of_earlier_requests():
    spec = build_speculator("suffix", {}, info())
    first = started(spec, [0, 0])
    spec.accept(first, torch.tensor([[5, 6, 7, 8, 9]]), torch.randn(1, 5, H))
    second = started(spec, [4, 5, 6])  # the first request's output joins the history now
    drafts, logits = spec.propose(second, torch.tensor([[7]]), 2)
    assert drafts[0].tolist() == [8, 9] and logits[0, 0].max() == 0.0
    alone = build_speculator("suffix", {"global_outputs": False}, info())
    started(alone, [0, 0])
    drafts, _ = alone.propose(started(alone, [4, 5, 6]), torch.tensor([[7]]), 2)
    assert drafts[0].tolist() != [8, 9]


def test_hybrid_drafts_with_suffix_on_a_long_match_else_with_its_learned_part():
    spec = build_speculator("hybrid", {"learned": {"family": "mlp", "n_predict": 3, "inner_dim": 16},
                                       "min_match": 3, "suffix": {"global_outputs": False}}, info()).eval()
    prompt = [4, 5, 6, 7, 8, 9, 10, 1, 4, 5]
    hidden = torch.randn(1, len(prompt), H)
    state = spec.start(torch.tensor([prompt]), hidden)
    long_match, _ = spec.propose(state, torch.tensor([[6]]), 3)  # "4 5 6": a 3-token match
    assert long_match[0].tolist() == [7, 8, 9]
    learned_state = spec.learned.start(torch.tensor([prompt]), hidden)
    short, logits = spec.propose(state, torch.tensor([[9]]), 3)  # "5 9": 1-token match only
    expected, expected_logits = spec.learned.propose(learned_state, torch.tensor([[9]]), 3)
    assert torch.equal(short, expected) and torch.equal(logits, expected_logits)
    assert spec.num_params() == spec.learned.num_params() > 0


def test_hybrid_chains_run_past_the_learned_heads_only_where_suffix_drafts():
    spec = build_speculator("hybrid", {"learned": {"family": "mlp", "n_predict": 2, "inner_dim": 16},
                                       "min_match": 3, "suffix": {"global_outputs": False}}, info()).eval()
    assert spec.max_draft_len() is None  # suffix is unbounded: k is not capped at the mlp's 2 heads
    prompt = [4, 5, 6, 7, 8, 9, 10, 11, 1, 4, 5]
    hidden = torch.randn(1, len(prompt), H)
    state = spec.start(torch.tensor([prompt]), hidden)
    long_match, _ = spec.propose(state, torch.tensor([[6]]), 5)  # suffix: as long as its match allows
    assert long_match[0].tolist()[:3] == [7, 8, 9] and long_match.shape[1] > 2
    short, logits = spec.propose(state, torch.tensor([[9]]), 5)  # the learned part: its 2 heads at most
    assert short.shape == (1, 2) and logits.shape[:2] == (1, 2)
    deeper = spec.extend(state, torch.tensor([[9]]), torch.tensor([[3, 4]]))  # past its last head: no guess
    assert (deeper == FLOOR).all()


def test_hybrid_spreads_a_reduced_learned_vocabulary_onto_the_whole_one():
    counts = torch.arange(V, 0, -1)  # the draft vocabulary: the 4 lowest ids
    spec = build_speculator("hybrid", {"learned": {"family": "mlp", "n_predict": 2, "inner_dim": 16,
                                                   "draft_vocab_size": 4}, "min_match": 99},
                            info().with_counts(counts)).eval()
    state = spec.start(torch.tensor([[1, 2, 3]]), torch.randn(1, 3, H))
    drafts, logits = spec.propose(state, torch.tensor([[3]]), 2)
    assert logits.shape == (1, 2, V) and (logits[..., 4:] == FLOOR).all()
    assert torch.equal(drafts, logits.argmax(-1)) and (drafts < 4).all()


def test_hybrid_needs_a_learned_family():
    for family in ("suffix", "hybrid", "nope"):
        with pytest.raises(ValueError):
            build_speculator("hybrid", {"learned": {"family": family}}, info())
    assert math.isfinite(FLOOR)


@pytest.mark.parametrize("family", ["ngram", "suffix"])
def test_a_saved_training_free_speculator_is_its_config(family, tmp_path):
    from speclab.speculator.families import load_speculator

    spec = build_speculator(family, {"max_n": 4} if family == "ngram" else {"max_pattern": 7}, info())
    spec.save(tmp_path / "ckpt")
    loaded = load_speculator(tmp_path / "ckpt", info())
    assert loaded.family == family and loaded.config == spec.config and loaded.num_params() == 0


# --- suffix's corpus of training answers ------------------------------------------------------


def test_suffix_drafts_from_a_corpus_of_training_answers_and_keeps_it_across_resets():
    spec = build_speculator("suffix", {"corpus_tokens": 100}, info())
    unseeded = build_speculator("suffix", {}, info())
    spec.use_training_data([[5, 6, 7, 8, 9], [1], [2, 3, 4]])  # a one-token answer teaches nothing
    assert spec.corpus_report() == {"answers": 2, "tokens": 8, "trie_nodes": spec.corpus_trie().size}
    import gc
    assert gc.get_freeze_count() >= spec.corpus_trie().size  # full collections skip its nodes
    for _ in range(2):
        drafts, logits = spec.propose(started(spec, [4, 5, 6]), torch.tensor([[7]]), 2)
        assert drafts[0].tolist() == [8, 9] and logits[0, 0].max() == 0.0  # a new request: only the corpus knows
        spec.reset()  # forgets the eval's outputs, never the corpus
    drafts, _ = unseeded.propose(started(unseeded, [4, 5, 6]), torch.tensor([[7]]), 2)
    assert drafts[0].tolist() != [8, 9]


def test_a_corpus_trie_is_built_without_the_collector_and_leaves_it_as_it_was():
    import gc
    for seed, enabled in ((3, True), (4, False)):  # distinct answers: each call builds its own trie
        answers = torch.randint(0, V, (40, 100), generator=torch.Generator().manual_seed(seed)).tolist()
        spec = build_speculator("suffix", {"corpus_tokens": 4000}, info())
        spec.use_training_data(answers)
        collections = []
        (gc.enable if enabled else gc.disable)()
        gc.callbacks.append(collect := lambda phase, stats: collections.append(stats["generation"]))
        try:
            trie = spec.corpus_trie()  # ~10 nodes a token: far past the youngest generation's 700
            assert gc.isenabled() == enabled  # the caller's collector is left as it was
        finally:
            gc.callbacks.remove(collect)
            gc.enable()
        assert collections == [] and trie.size > 4000  # not one pass of the collector over the growing trie
        assert gc.get_freeze_count() >= trie.size


def test_corpora_stay_built_side_by_side_shared_by_copies_and_freed_with_their_holders():
    import copy
    import gc
    import weakref

    # A bench of corpus sizes alternates requests across speculators with different corpora:
    # each keeps its trie (no rebuild inside a timed request), and copies share it.
    specs = [build_speculator("suffix", {"corpus_tokens": 100}, info()) for _ in range(4)]
    for i, spec in enumerate(specs):
        spec.use_training_data([[5 + i, 6, 7, 8], [2, 3, 4 + i]])
    built = [spec.corpus_trie() for spec in specs]
    assert len({id(trie) for trie in built}) == 4
    for _ in range(2):
        for spec, trie in zip(specs, built):
            assert started(spec, [1, 2]).corpus is trie
    twin = copy.deepcopy(specs[0])
    assert twin.corpus_trie() is built[0]
    specs[0].use_training_data([[9, 9, 8]])  # a new corpus is a new trie; the twin keeps the old one
    assert specs[0].corpus_trie() is not built[0] and twin.corpus_trie() is built[0]
    released = weakref.ref(built[1])
    del specs[1], built
    gc.collect()
    assert released() is None  # no speculator holds it any more: its memory is back


def test_suffix_corpus_keeps_whole_answers_in_order_within_its_budget():
    spec = build_speculator("suffix", {"corpus_tokens": 6}, info())
    spec.use_training_data([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]])
    assert spec.corpus_ids.tolist() == [1, 2, 3, 4, 5, 6] and spec.corpus_offsets.tolist() == [0, 4, 6]
    off = build_speculator("suffix", {}, info())
    off.use_training_data([[1, 2, 3]])
    assert off.corpus_report()["tokens"] == 0 and off.corpus_trie() is None
    with pytest.raises(ValueError, match="corpus_tokens"):
        build_speculator("suffix", {"corpus_tokens": -1}, info())


def test_a_saved_corpus_loads_back_and_a_damaged_one_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from speclab.speculator.families import load_speculator

    spec = build_speculator("hybrid", {"learned": {"family": "mlp", "n_predict": 2, "inner_dim": 16},
                                       "suffix": {"corpus_tokens": 50}}, info())
    spec.use_training_data([[5, 6, 7, 8, 9], [2, 3, 4]])
    spec.save(tmp_path / "ckpt")
    loaded = load_speculator(tmp_path / "ckpt", info())
    assert torch.equal(loaded.suffix.corpus_ids, spec.suffix.corpus_ids)
    assert loaded.suffix.corpus_trie().size == spec.suffix.corpus_trie().size
    tensors = load_file(tmp_path / "ckpt" / "model.safetensors")
    tensors["suffix.corpus_ids"] = torch.tensor([5, 6, 7, 8, V + 3, 2, 3, 4], dtype=torch.int32)  # not a token of V
    save_file(tensors, tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(ValueError, match="corrupt speculator checkpoint.*outside the target's vocabulary"):
        load_speculator(tmp_path / "ckpt", info())
    tensors["suffix.corpus_ids"] = spec.suffix.corpus_ids
    tensors["suffix.corpus_offsets"] = torch.tensor([0, 5, 99])  # past the end of the ids
    save_file(tensors, tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(ValueError, match="do not split corpus_ids"):
        load_speculator(tmp_path / "ckpt", info())


def test_a_suffix_saved_before_the_corpus_existed_loads_with_none(tmp_path):
    from safetensors.torch import save_file

    from speclab.speculator.families import load_speculator

    spec = build_speculator("suffix", {}, info())
    spec.save(tmp_path / "old")
    save_file({}, tmp_path / "old" / "model.safetensors")  # what an earlier version wrote: no tensors
    loaded = load_speculator(tmp_path / "old", info())
    assert loaded.corpus_report() == {"answers": 0, "tokens": 0, "trie_nodes": 0}


def test_answer_spans_are_the_runs_of_loss_tokens():
    from speclab.training.features import answer_spans

    assert answer_spans([1, 2, 3, 4, 5, 6, 7], [0, 1, 1, 0, 0, 1, 1]) == [[2, 3], [6, 7]]
    assert answer_spans([1, 2], [0, 0]) == []
