"""The samplers that tell Lightning a data module's loaders are sharded already.

Under a distributed strategy Lightning re-creates every ``DataLoader`` whose ``sampler`` is not a
``DistributedSampler`` with one of its own, which pads each rank's share with repeated seeds
(and cannot take a batch sampler that is not PyTorch's ``BatchSampler`` at all). It leaves a
loader alone whose ``sampler`` is a ``DistributedSampler``, and at the start of every epoch it
calls that sampler's ``set_epoch``. These two are ``DistributedSampler`` subclasses for that
reason, and describe exactly what their loader draws, without padding:

- :class:`TrainShard`: the seeds of this rank's training batches in the current epoch (the
  loader's :class:`~pyg_mgpu.sampling.neighbor_loader.EpochBatchSampler` makes the batches;
  ``set_epoch`` reaches it through here);
- :class:`EvalShard`: this rank's contiguous slice of an evaluation split
  (:func:`~pyg_mgpu.sampling.sharding.shard_bounds`), every seed on exactly one rank.
"""
from __future__ import annotations

from typing import Iterator

from torch.utils.data import DistributedSampler

from pyg_mgpu.sampling.neighbor_loader import EpochBatchSampler
from pyg_mgpu.sampling.sharding import shard_bounds


class TrainShard(DistributedSampler):
    """The positions (into the training seeds) that this rank's batches hold this epoch, in
    the order the batches take them.

    DataLoader never iterates it (its batches come from ``batches``, the loader's batch
    sampler); it is the loader's ``sampler`` so that Lightning keeps the loader as it is and
    forwards each epoch number to :meth:`set_epoch`.
    """

    # DistributedSampler.__init__ is not called: it wants a dataset and pads the shards.
    def __init__(self, batches: EpochBatchSampler):  # noqa: D107
        self.batches = batches
        self.num_replicas, self.rank = batches.world_size, batches.rank
        self.shuffle, self.seed, self.drop_last = batches.shuffle, batches.seed, False

    @property
    def epoch(self) -> int:
        return self.batches.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.batches.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation of the training seeds (the same on every rank)."""
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches:
            yield from batch

    def __len__(self) -> int:
        return sum(len(batch) for batch in self.batches)


class EvalShard(DistributedSampler):
    """Rank ``rank``'s contiguous slice of ``num_items`` evaluation seeds, in order: over the
    ranks every seed once, none padded or dropped, so that sums over ranks are exact."""

    def __init__(self, num_items: int, rank: int, world_size: int):  # noqa: D107
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size}).")
        self.num_items = num_items
        self.num_replicas, self.rank = world_size, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = False, 0, False, 0
        self.start, self.end = shard_bounds(num_items, world_size, rank)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))

    def __len__(self) -> int:
        return self.end - self.start
