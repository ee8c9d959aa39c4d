"""Shard sizes, batch counts and dropped nodes of PyG's multi-GPU tutorial split, without processes.

PyG's ``examples/multi_gpu/distributed_sampling.py`` (2.7.0 to 2.8.0.post1) gives each rank
``idx.split(ceil(n / world_size))[rank]`` and iterates it with ``batch_size=1024,
drop_last=True``. This applies exactly that (``Tensor.split`` and a
``DataLoader(..., drop_last=True)``) to index tensors of the published split sizes, so Reddit
and ogbn-products need not be downloaded. It prints, per split and rank count, the shard sizes,
the batches per rank and the nodes no rank ever uses in an epoch; then the releases 2.3.0-2.6.1
``n // world_size`` split and the Cora splits at batch sizes 1,024 and 64.

    python benchmarks/from_tutorial/tutorial_split.py
"""
from math import ceil

import torch
from torch.utils.data import DataLoader

# Published split sizes. The tutorial's test loader takes val_mask (see section (c) of
# docs/from_pyg_tutorial.md), so the test splits play no part here.
SPLITS = {
    "Reddit train": 153_431,
    "Reddit val": 23_831,
    "ogbn-products train": 196_615,
    "Cora train": 140,
    "Cora val": 500,
}


def tutorial_shards(n: int, world_size: int) -> list[int]:
    """The tutorial's shard sizes: ``torch.arange(n).split(ceil(n / world_size))[rank]``.

    A rank without a chunk (fewer chunks than ranks) gets -1: the tutorial raises IndexError there.
    """
    chunks = torch.arange(n).split(ceil(n / world_size))
    return [chunks[r].numel() if r < len(chunks) else -1 for r in range(world_size)]


def batches_with_drop_last(shard: int, batch_size: int) -> tuple[int, int]:
    """Batches a ``DataLoader(range(shard), batch_size, drop_last=True)`` yields, and seeds used."""
    loader = DataLoader(range(shard), batch_size=batch_size, drop_last=True)
    return len(loader), sum(len(b) for b in loader)


def compact(sizes: list[int]) -> str:
    """``[38358, 38358, 38358, 38357]`` -> ``38,358 x 3 / 38,357``."""
    groups: list[list[int]] = []
    for s in sizes:
        if groups and groups[-1][0] == s:
            groups[-1][1] += 1
        else:
            groups.append([s, 1])
    return " / ".join(f"{s:,}" + (f" x {k}" if k > 1 else "") for s, k in groups)


def row(name: str, n: int, world_size: int, batch_size: int = 1024) -> None:
    shards = tutorial_shards(n, world_size)
    if min(shards) < 0:
        print(f"{name:21s} {n:>8,} {world_size:>2}  {compact(shards):32s} "
              "IndexError on the last rank")
        return
    counts = [batches_with_drop_last(s, batch_size) for s in shards]
    used = sum(u for _, u in counts)
    batches = compact([b for b, _ in counts])
    print(f"{name:21s} {n:>8,} {world_size:>2}  {compact(shards):32s} {batches:12s} "
          f"{n - used:>6,} ({100 * (n - used) / n:.2f} %)")


def main() -> None:
    header = (f"{'split':21s} {'nodes':>8s} {'ws':>2s}  {'shard sizes':32s} {'batches':12s} "
              "never used")
    print(f"tutorial split (ceil), batch_size=1024, drop_last=True\n{header}")
    for name in ("Reddit train", "Reddit val"):
        for world_size in (2, 4, 8):
            row(name, SPLITS[name], world_size)
    for world_size in (4, 6, 8):
        row("ogbn-products train", SPLITS["ogbn-products train"], world_size)
    for name in ("Cora train", "Cora val"):
        row(name, SPLITS[name], 2)

    print("\nCora, 2 ranks, batch_size=64, drop_last=True")
    for name in ("Cora train", "Cora val"):
        row(name, SPLITS[name], 2, batch_size=64)

    print("\nreleases 2.3.0-2.6.1: idx.split(n // world_size)[rank], remainder never trained")
    for world_size in (2, 4, 8):
        n = SPLITS["Reddit train"]
        shard = n // world_size
        batches, used = batches_with_drop_last(shard, 1024)
        print(f"Reddit train, {world_size} ranks: shards of {shard:,}, remainder {n % world_size}, "
              f"{batches} batches, never used {n - world_size * used:,} "
              f"({100 * (n - world_size * used) / n:.2f} %)")


if __name__ == "__main__":
    main()
