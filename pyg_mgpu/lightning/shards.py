"""The samplers that tell Lightning a data module's loaders are sharded already.

Under a distributed strategy Lightning re-creates every ``DataLoader`` whose ``sampler`` is not a
``DistributedSampler`` with one of its own, which pads each rank's share with repeated seeds
(and cannot take a batch sampler that is not PyTorch's ``BatchSampler`` at all). It leaves a
loader alone whose ``sampler`` is a ``DistributedSampler``, and at the start of every epoch it
calls that sampler's ``set_epoch``. These two are ``DistributedSampler`` subclasses for that
reason, and describe exactly what their loader draws, without padding:

- :class:`TrainShard`: the seeds of this rank's training batches in the current epoch (the
  loader's :class:`~pyg_mgpu.sampling.neighbor_loader.EpochBatchSampler` makes the batches;
  ``set_epoch`` reaches it through here), and the loader's place in the epoch;
- :class:`EvalShard`: this rank's contiguous slice of an evaluation split
  (:func:`~pyg_mgpu.sampling.sharding.shard_bounds`), every seed on exactly one rank.

:class:`ResumableEpochs` makes a training loader one that Lightning checkpoints in the middle of
an epoch and resumes at the batch after the checkpoint's.
"""
from __future__ import annotations

from typing import Iterator, Optional

from torch.utils.data import DistributedSampler

from pyg_mgpu.sampling.neighbor_loader import EpochBatchSampler
from pyg_mgpu.sampling.sharding import shard_bounds


class TrainShard(DistributedSampler):
    """The positions (into the training seeds) that this rank's batches hold this epoch, in
    the order the batches take them, and how many of the epoch's batches the training loop has
    taken (what a checkpoint records of the loader: :meth:`state_dict`).

    DataLoader never iterates it (its batches come from ``batches``, the loader's batch
    sampler); it is the loader's ``sampler`` so that Lightning keeps the loader as it is and
    forwards each epoch number to :meth:`set_epoch`.
    """

    # DistributedSampler.__init__ is not called: it wants a dataset and pads the shards.
    def __init__(self, batches: EpochBatchSampler):  # noqa: D107
        self.batches = batches
        self.num_replicas, self.rank = batches.world_size, batches.rank
        self.shuffle, self.seed, self.drop_last = batches.shuffle, batches.seed, False
        # Batches of the current epoch the training loop has taken, counted from the epoch's
        # first: a resumed epoch counts on from its checkpoint's step.
        self.step = 0
        # The (epoch, step) load_state_dict restored, until a pass over the loader starts from
        # it: Lightning sets the epoch again after restoring it (and, without DataLoader
        # workers, before the batch sampler reads it), and that call must keep the step.
        self.restored: Optional[tuple[int, int]] = None

    @property
    def epoch(self) -> int:
        return self.batches.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation of the training seeds (the same on every rank), from
        the epoch's first batch, or from the step :meth:`load_state_dict` restored in it."""
        restored = self.restored is not None and self.restored[0] == epoch
        start = self.restored[1] if restored else 0
        self.batches.set_epoch(epoch, start)
        self.step = start

    def counted(self, batches: Iterator) -> Iterator:
        """One pass of the loader, ``batches`` (its DataLoader iterator), counted into
        :attr:`step` as the training loop takes them. The batch sampler cannot count them:
        DataLoader workers draw its batches ahead of the loop."""
        # Set at the first batch, when a loader without workers reads its batch sampler.
        self.restored = None
        self.step = self.batches.start_step
        for batch in batches:
            self.step += 1  # before the loop has the batch: a checkpoint in its step counts it
            yield batch

    def state_dict(self) -> dict[str, int]:
        """The loader's place: the epoch, and the batches of it the training loop has taken
        (``step``) of the ``steps_per_epoch`` each rank runs."""
        return {"epoch": self.batches.epoch, "step": self.step,
                "steps_per_epoch": self.batches.steps_per_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continues from ``state`` (:meth:`state_dict`'s): the next batch is the one after its
        step, the next epoch's first where its epoch was over."""
        epoch, step, steps = state["epoch"], state["step"], state["steps_per_epoch"]
        if steps != self.batches.steps_per_epoch:
            raise ValueError(
                f"The checkpoint's training loader ran {steps} batches per epoch on each rank, "
                f"this one runs {self.batches.steps_per_epoch}: its step {step} names another "
                "batch here. Resume with the training split, batch_size and number of devices "
                "the checkpoint was written with.")
        if step == steps:
            epoch, step = epoch + 1, 0
        self.restored = (epoch, step)
        self.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches:
            yield from batch

    def __len__(self) -> int:
        return sum(len(batch) for batch in self.batches)


class ResumableEpochs:
    """Makes a distributed :class:`pyg_mgpu.NeighborLoader` or
    :class:`pyg_mgpu.LinkNeighborLoader` (``distributed=True``, listed first among the bases)
    the training loader of a data module: its ``sampler`` is a :class:`TrainShard`, and
    ``state_dict`` / ``load_state_dict`` are Lightning's resumable-loader protocol.

    Lightning saves the loader's state with each checkpoint and, resuming from one written in
    the middle of an epoch, restores it before it iterates the loader: the resumed epoch then
    yields the batches after the checkpoint's step, in the epoch's order. ``len`` counts the
    whole epoch's batches, as Lightning's batch index does, which continues from the
    checkpoint's step (a pass from step k yields ``len - k`` batches).
    """

    sampler: TrainShard
    epoch_sampler: EpochBatchSampler

    def __init__(self, *args, **kwargs):  # noqa: D107
        super().__init__(*args, **kwargs)
        # DataLoader refuses a new sampler once built, hence object's setattr.
        object.__setattr__(self, "sampler", TrainShard(self.epoch_sampler))

    def __iter__(self) -> Iterator:
        return self.sampler.counted(super().__iter__())

    def __len__(self) -> int:
        return self.epoch_sampler.steps_per_epoch

    def state_dict(self) -> dict[str, int]:
        """The loader's place in the epoch (:meth:`TrainShard.state_dict`)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continues from a checkpoint's place (:meth:`TrainShard.load_state_dict`)."""
        self.sampler.load_state_dict(state)


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
