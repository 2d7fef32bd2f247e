"""The resumable data order: a resumed sampler continues exactly where training stopped."""

import pytest
import torch

from speclab.training.features import collate
from speclab.training.sampler import DataPosition, ResumableBatchSampler, epoch_order, positioned_loader


def ids(batches):
    return [[r.sample_id for r in b] for b in batches]


def test_each_epoch_is_a_seeded_permutation_consumed_exactly_once():
    s = ResumableBatchSampler(10, 3, seed=5, start=DataPosition())
    first, second = ids(iter(s)), ids(iter(s))
    assert sorted(sum(first, [])) == list(range(10)) and sorted(sum(second, [])) == list(range(10))
    assert sum(first, []) == epoch_order(10, 5, 0) and first != second  # a new order per epoch
    assert [len(b) for b in first] == [3, 3, 3, 1]


def test_resuming_at_every_position_yields_the_uninterrupted_remainder():
    whole = list(ResumableBatchSampler(10, 3, seed=1, start=DataPosition()))
    for k, batch in enumerate(whole[:-1]):  # after the last one: the next epoch (below)
        end = batch[-1].end
        rest = list(ResumableBatchSampler(10, 3, seed=1, start=DataPosition(0, end)))
        assert ids(rest) == ids(whole[k + 1 :])


def test_a_position_at_the_end_of_an_epoch_resumes_at_the_next():
    s = ResumableBatchSampler(10, 5, seed=1, start=DataPosition(0, 10))
    assert ids(iter(s)) == [epoch_order(10, 1, 1)[:5], epoch_order(10, 1, 1)[5:]]


def test_skipped_windows_are_stepped_over_and_count_as_consumed():
    order = epoch_order(12, 0, 0)
    s = ResumableBatchSampler(12, 4, seed=0, start=DataPosition(0, 0, [(0, 2, 6)]))
    got = list(iter(s))
    assert sum(ids(got), []) == order[:2] + order[6:]
    assert got[0][-1].end == 8  # positions 0,1 then 6,7: the cursor passed the skipped window


def test_ddp_ranks_split_every_global_batch():
    ranks = [list(ResumableBatchSampler(11, 2, seed=3, start=DataPosition(), rank=r, world_size=2)) for r in range(2)]
    merged = [a + b for a, b in zip(*[ids(r) for r in ranks])]
    assert sum(merged, []) == epoch_order(11, 3, 0)[: len(sum(merged, []))]
    assert [b[-1].end for b in ranks[0]] == [b[-1].end for b in ranks[1]]  # both ranks agree on the position


def test_loader_batches_carry_sample_ids_and_the_position_after_them():
    data = [{"input_ids": torch.tensor([i, i + 1]), "loss_mask": torch.tensor([0, 1], dtype=torch.bool)} for i in range(7)]
    batches = list(positioned_loader(data, 3, seed=2, start=DataPosition(), collate=collate))
    assert torch.cat([b["sample_ids"] for b in batches]).tolist() == epoch_order(7, 2, 0)
    assert [b["position"] for b in batches] == [(0, 3), (0, 6), (0, 7)]
    assert batches[0]["input_ids"][:, 0].tolist() == batches[0]["sample_ids"].tolist()


@pytest.mark.parametrize("n, world", [(11, 2), (10, 2), (13, 3), (7, 4)])
def test_ranks_shares_in_rank_order_are_the_one_process_batches(n, world):
    """A global batch split across ranks is, rank by rank, the batch one process with
    batch_size * world takes; no rank is ever handed an empty batch."""
    ranks = [list(ResumableBatchSampler(n, 2, seed=5, start=DataPosition(), rank=r, world_size=world)) for r in range(world)]
    single = list(ResumableBatchSampler(n, 2 * world, seed=5, start=DataPosition()))
    assert len({len(r) for r in ranks}) == 1 and all(b for r in ranks for b in r)
    merged = [sum(shares, []) for shares in zip(*[ids(r) for r in ranks])]
    whole = ids(single)
    if len(whole[-1]) < world:  # a tail shorter than the ranks is consumed untrained
        whole = whole[:-1]
    assert merged == whole
