"""A loader's batches drawn several per walk of the sampler (``sample_batches``).

The loader's batch sampler yields each walk's batches as one entry (:class:`Batches` hands
them to ``collate_fn`` whole), ``collate_fn`` samples them in one walk
(:meth:`~pyg_mgpu.NeighborSampler.sample_batches`), and :class:`WalkBatches` hands them out one
by one, remembering the sampler's state from before the walk for checkpoints.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler


class Batches:
    """The dataset of a loader whose batch sampler yields lists of batches: item = batch."""

    def __init__(self, num_inputs: int):
        self.num_inputs = num_inputs

    def __len__(self) -> int:
        return self.num_inputs

    def __getitem__(self, batch: list) -> list:
        return batch


class WalkBatches:
    """Hands out the batches of each walk one by one: ``walks`` yields lists of sampler
    outputs (or finished batches), ``filter_fn`` makes each a batch where the loader's workers
    did not; the first ``skip`` batches of the first walk are dropped (an epoch resumed
    mid-walk). With ``generator`` (the sampler's, in this process), :attr:`state_before` is its
    state from before the walk that is being handed out."""

    def __init__(self, walks, filter_fn: Optional[Callable], *, skip: int,
                 generator: Optional[torch.Generator]):
        self.walks, self.filter_fn = walks, filter_fn
        self.skip, self.generator = skip, generator
        self.buffer: list = []
        self.state_before: Optional[Tensor] = None

    @property
    def pending(self) -> bool:
        """Whether batches of the current walk are still to be handed out."""
        return bool(self.buffer)

    def __iter__(self) -> "WalkBatches":
        return self

    def __next__(self):
        while not self.buffer:
            if self.generator is not None:
                self.state_before = self.generator.get_state()
            self.buffer = list(next(self.walks))[self.skip:]
            self.skip = 0
            self.buffer.reverse()  # handed out from the end
        out = self.buffer.pop()
        return out if self.filter_fn is None else self.filter_fn(out)

    def __len__(self) -> int:
        return len(self.walks)

    def _reset(self, loader, first_iter: bool = False) -> None:  # persistent workers
        self.walks._reset(loader, first_iter)
        self.buffer = []
        self.skip = loader.epoch_sampler.skip


def check_sample_batches(sample_batches: int, distributed: bool, sampler) -> int:
    """``sample_batches`` if the loader can walk that many batches at once, else an error that
    says why."""
    if not isinstance(sample_batches, int) or sample_batches < 1:
        raise ValueError(f"sample_batches={sample_batches!r} must be a positive whole number "
                         "of batches per walk (1: one batch per walk).")
    if sample_batches == 1:
        return 1
    if not distributed:
        raise ValueError(f"sample_batches={sample_batches} needs distributed=True (its epochs "
                         "are what batches are grouped into walks by).")
    if not isinstance(sampler, NeighborSampler) or not sampler.samples_batches_together:
        raise ValueError(f"sample_batches={sample_batches} walks pyg_mgpu's NeighborSampler over "
                         "a homogeneous graph, without time_attr or subgraph_type='induced'; "
                         "use sample_batches=1 here.")
    return sample_batches
