"""Sharding arithmetic, table-tested without processes."""
import pytest
import torch

from pyg_mgpu.sampling.sharding import (check_shardable, epoch_batches, epoch_permutation, eval_shard,
                               shard_bounds, steps_per_epoch)

CASES = [  # (num_items, world_size, batch_size)
    (140, 2, 1024),   # Cora: far fewer nodes than ranks x batch -> one partial batch each
    (140, 2, 64),
    (2049, 2, 1024),  # shards 1025/1024: the short shard must not lose a step
    (2048, 2, 1024),
    (10, 3, 2),
    (7, 7, 1),
    (1000, 4, 3),
    (5, 2, 2),
    (153_431, 8, 1024),  # Reddit's training split on 8 GPUs
]


@pytest.mark.parametrize("num_items,world_size,batch_size", CASES)
def test_every_item_once_and_equal_steps(num_items, world_size, batch_size):
    items = torch.arange(num_items) * 3 + 1  # not positions, to catch index mix-ups
    for epoch in (0, 1):
        per_rank = [epoch_batches(items, seed=5, epoch=epoch, rank=r, world_size=world_size,
                                  batch_size=batch_size) for r in range(world_size)]
        steps = {len(b) for b in per_rank}
        assert steps == {steps_per_epoch(num_items, world_size, batch_size)}
        flat = torch.cat([torch.cat(b) for b in per_rank])
        assert flat.numel() == num_items
        assert torch.equal(flat.sort().values, items)
        assert all(0 < b.numel() <= batch_size for bs in per_rank for b in bs)


def test_shard_bounds_cover_and_balance():
    for n, w in [(10, 3), (3, 3), (100, 7)]:
        bounds = [shard_bounds(n, w, r) for r in range(w)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        sizes = [e - s for s, e in bounds]
        assert max(sizes) - min(sizes) <= 1


def test_permutation_same_on_all_ranks_and_changes_per_epoch():
    assert torch.equal(epoch_permutation(100, 1, 3), epoch_permutation(100, 1, 3))
    assert not torch.equal(epoch_permutation(100, 1, 3), epoch_permutation(100, 1, 4))
    assert not torch.equal(epoch_permutation(100, 1, 3), epoch_permutation(100, 2, 3))


@pytest.mark.parametrize("args,message", [
    ((1, 2, 8), "at least one"),
    ((5, 2, 0), "batch size"),
    ((3, 2, 1), "batch_size=2"),
])
def test_unshardable_inputs_say_what_to_change(args, message):
    with pytest.raises(ValueError, match=message):
        check_shardable(*args)


def test_eval_shards_partition_the_split():
    split = torch.arange(11)
    parts = [eval_shard(split, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(parts), split)
