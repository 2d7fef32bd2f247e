"""A data order that can be resumed exactly: epoch + cursor into a seeded permutation.

The order of epoch e is `randperm(n, seed + e)`, so the whole order of a run is a
function of the seed alone. The state is (epoch, cursor): `cursor` positions of epoch
`epoch`'s permutation were consumed. A resumed loader starts there and yields the same
batches the uninterrupted run would have. Skipped windows (the data before a loss spike,
see watchdog.py) are ranges of positions the sampler steps over.

The DataLoader prefetches, so the sampler's own progress is ahead of training. Each
sample therefore carries its position (`Ref`), `collate_positioned` puts the position
after the batch into the batch, and the training loop records what it actually trained
on: that, not the sampler, is what a checkpoint stores.

Under DDP every rank walks the same permutation; a global batch is `batch_size *
world_size` positions and rank r takes its r-th contiguous share, so the ranks' shares in
rank order are the batch one process with `batch_size * world_size` would take. An epoch's
last positions, when fewer than the ranks, are consumed untrained (each rank needs a sample).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

import torch


class Ref(NamedTuple):
    """One sample as the sampler hands it to the dataset."""

    sample_id: int  # index into the dataset
    epoch: int
    end: int  # cursor (positions of this epoch consumed) once this sample's batch is done


@dataclass
class DataPosition:
    """Which samples were consumed: the part of a checkpoint that says where the data is."""

    epoch: int = 0
    cursor: int = 0
    skips: list[tuple[int, int, int]] = field(default_factory=list)
    """(epoch, start, end): positions start..end-1 of that epoch are skipped (spike windows)."""

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "skips": [list(s) for s in self.skips]}

    @classmethod
    def from_state(cls, state: dict) -> "DataPosition":
        return cls(state["epoch"], state["cursor"], [tuple(s) for s in state["skips"]])


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


class ResumableBatchSampler:
    """Yields lists of `Ref`s: the rest of the current epoch per `iter()`, then the next epoch.

    It has no `__len__` on purpose: a resumed first epoch is shorter than the next ones,
    and Lightning would cut every epoch to the length it read first. Unsized, Lightning
    ends each epoch at StopIteration and still finds the last batch (for gradient
    accumulation) by prefetching one batch.
    """

    def __init__(self, n: int, batch_size: int, seed: int, start: DataPosition,
                 rank: int = 0, world_size: int = 1):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.cursor = start.epoch, start.cursor
        if self.cursor >= n:  # saved right at an epoch's end: an empty first iter() would end Lightning's epoch loop oddly
            self.epoch, self.cursor = self.epoch + 1, 0
        self.skips = list(start.skips)

    def _skipped(self, epoch: int, pos: int) -> bool:
        return any(e == epoch and lo <= pos < hi for e, lo, hi in self.skips)

    def __iter__(self) -> Iterator[list[Ref]]:
        epoch, order = self.epoch, epoch_order(self.n, self.seed, self.epoch)
        positions = [p for p in range(self.cursor, self.n) if not self._skipped(epoch, p)]
        step = self.batch_size * self.world_size
        for lo in range(0, len(positions), step):
            group = positions[lo : lo + step]  # one global batch
            end = group[-1] + 1 if lo + step < len(positions) else self.n  # skipped tail counts as consumed
            if len(group) < self.world_size:  # an epoch's tail too short to give every rank a sample
                break
            yield [Ref(order[p], epoch, end) for p in self._share(group)]
        self.epoch, self.cursor = epoch + 1, 0  # the next iter() is the next epoch

    def _share(self, group: list[int]) -> list[int]:
        """This rank's contiguous share of a global batch: batch_size each when the batch is
        full; a short last batch is split as evenly as it goes, the first ranks one more."""
        base, extra = divmod(len(group), self.world_size)
        lo = self.rank * base + min(self.rank, extra)
        return group[lo : lo + base + (self.rank < extra)]

    def batches_per_epoch(self) -> int:
        """Optimiser micro-batches in a full epoch without skips (for the step budget)."""
        step = self.batch_size * self.world_size
        return -(-self.n // step)


class PositionedDataset(torch.utils.data.Dataset):
    """Wraps a dataset so that items keep the `Ref` they were fetched by."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, ref: Ref) -> tuple[Ref, dict]:
        return ref, self.dataset[ref.sample_id]


def collate_positioned(collate: Callable[[list[dict]], dict]) -> Callable[[list], dict]:
    """A collate that adds `sample_ids` [B] and the data position after the batch."""

    def _collate(items: list[tuple[Ref, dict]]) -> dict:
        refs = [ref for ref, _ in items]
        batch = collate([item for _, item in items])
        batch["sample_ids"] = torch.tensor([r.sample_id for r in refs], dtype=torch.long)
        batch["position"] = (refs[-1].epoch, refs[-1].end)
        return batch

    return _collate


def positioned_loader(dataset, batch_size: int, seed: int, start: DataPosition, collate,
                      rank: int = 0, world_size: int = 1) -> torch.utils.data.DataLoader:
    sampler = ResumableBatchSampler(len(dataset), batch_size, seed, start, rank, world_size)
    # Its own generator: DataLoader draws a base seed on every iter(), and a resumed run
    # calls iter() at a point the uninterrupted run did not; the global RNG must not see it.
    return torch.utils.data.DataLoader(PositionedDataset(dataset), batch_sampler=sampler,
                                       collate_fn=collate_positioned(collate),
                                       generator=torch.Generator().manual_seed(seed))
