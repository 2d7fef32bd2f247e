import pytest
import torch

from speclab.speculator.vocab import DraftVocab, most_frequent


def test_most_frequent_picks_top_counts_ties_to_lower_id():
    counts = torch.tensor([5, 1, 9, 5, 0, 7])
    assert most_frequent(counts, 3).tolist() == [0, 2, 5]
    assert most_frequent(counts, 4).tolist() == [0, 2, 3, 5]


def test_d2t_t2d_round_trip():
    counts = torch.randint(0, 100, (1000,), generator=torch.Generator().manual_seed(0))
    vocab = DraftVocab(1000, 64, counts)
    draft_ids = torch.arange(64)
    target_ids = vocab.to_target(draft_ids)
    assert torch.equal(target_ids, draft_ids + vocab.d2t())  # vLLM: target = i + d2t[i]
    t2d = vocab.t2d()
    assert t2d.sum() == 64 and t2d[target_ids].all()
    assert torch.equal(t2d.nonzero()[:, 0], target_ids)  # and back: the mask marks exactly those ids
    assert counts[target_ids].min() >= counts[~t2d].max()


def test_full_vocabulary_is_the_identity():
    vocab = DraftVocab(50, 0)
    assert vocab.full and vocab.size == 50
    x = torch.tensor([3, 49])
    assert torch.equal(vocab.to_target(x), x) and vocab.contains(x).all()
    assert DraftVocab(50, 80).full  # asking for more than the target has keeps it all


def test_counts_must_match_the_target_vocabulary():
    with pytest.raises(ValueError, match="do not match"):
        DraftVocab(50, 10, torch.ones(49))
