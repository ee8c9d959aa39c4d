"""Splitting the training nodes across ranks: pure arithmetic, tested without processes.

Every rank must run the same number of optimizer steps per epoch, or DDP's gradient all-reduce
hangs (a rank waits for a peer that has finished). Per epoch, all ranks draw the same permutation
from ``(seed, epoch)``, cut it into equal contiguous shards (sizes differ by at most one), and
split each shard into the same number of batches, none larger than ``batch_size``. Every training
node is visited exactly once per epoch, and a tiny split still gives at least one batch per rank.
"""
from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

from pyg_mgpu.errors import ArgumentError


def steps_per_epoch(num_items: int, world_size: int, batch_size: int,
                    items: str = "training nodes") -> int:
    """Batches each rank runs per epoch: enough for the largest shard."""
    check_shardable(num_items, world_size, batch_size, items,
                    fewer_ranks=f"shard them over at most {num_items} ranks")
    largest_shard = math.ceil(num_items / world_size)
    return math.ceil(largest_shard / batch_size)


def check_count(name: str, value) -> int:
    """``value`` as a positive int (a Python or numpy integer); a float, a string or a count
    below 1 is refused by ``name``."""
    try:
        count = operator.index(value)
    except TypeError:
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return count


def check_shardable(num_items: int, world_size: int, batch_size: int,
                    items: str = "training nodes",
                    fewer_ranks: str = "use fewer ranks ({nprocs} / {devices})") -> None:
    """Refuses what cannot give every rank the same number of batches; ``items`` names what
    is sharded, ``fewer_ranks`` how to run fewer ranks (in :class:`ArgumentError`'s terms)."""
    check_count("batch size", batch_size)
    check_count("world size", world_size)
    if num_items == 0:
        raise ValueError(f"there are no {items} to shard over the ranks (an empty split?).")
    if num_items < world_size:
        raise ArgumentError(f"cannot give each of {world_size} ranks at least one of "
                            f"{num_items} {items}; {fewer_ranks}.")
    if batch_size == 1 and num_items % world_size:
        # The smaller shards would be one batch short, and DDP needs equal step counts.
        raise ArgumentError(f"batch size 1 with {num_items} {items} on {world_size} "
                            "ranks leaves a rank one batch short; use {batch_size=2} or more.")


def epoch_permutation(num_items: int, seed: int, epoch: int) -> Tensor:
    """The same permutation on every rank, different for each epoch."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_items, generator=gen)


def shard_bounds(num_items: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of ``rank``'s contiguous shard; shard sizes differ by at most one."""
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def epoch_batches(items: Tensor, *, seed: int, epoch: int, rank: int, world_size: int,
                  batch_size: int, shuffle: bool = True) -> list[Tensor]:
    """This rank's batches of ``items`` for one epoch.

    All ranks get ``steps_per_epoch(len(items), world_size, batch_size)`` batches; their union
    over ranks is ``items``, each element exactly once.
    """
    num_steps = steps_per_epoch(items.numel(), world_size, batch_size)
    order = epoch_permutation(items.numel(), seed, epoch) if shuffle else None
    start, end = shard_bounds(items.numel(), world_size, rank)
    shard = items[order[start:end]] if order is not None else items[start:end]
    # Near-equal pieces, never empty: check_shardable guarantees len(shard) >= num_steps.
    batches = list(torch.tensor_split(shard, num_steps))
    assert all(b.numel() > 0 for b in batches), "empty batch: sharding arithmetic is broken"
    return batches


def eval_shard(items: Tensor, rank: int, world_size: int) -> Tensor:
    """This rank's slice of an evaluation split (no padding, no drops: sums are exact)."""
    start, end = shard_bounds(items.numel(), world_size, rank)
    return items[start:end]
