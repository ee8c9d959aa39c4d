"""How many split sizes make PyG's tutorial split give ranks unequal batch counts.

The tutorial (PyG 2.7.0 to 2.8.0.post1, ``examples/multi_gpu/distributed_sampling.py``) gives
rank ``r`` the chunk ``idx.split(ceil(n / world_size))[r]`` and iterates it with
``batch_size=1024, drop_last=True``. For every split size ``n`` from ``world_size`` to 300,000
this counts the sizes for which the ranks run different numbers of batches (DDP's collectives
then stop pairing up), and the sizes for which the split makes fewer chunks than ranks (the
last rank raises IndexError). Pure index arithmetic, checked against ``Tensor.split`` for small
``n``; no processes, so any rank count can be swept.

    python benchmarks/from_tutorial/uneven_sweep.py
"""
from math import ceil

import torch

BATCH_SIZE = 1024
MAX_N = 300_000
WORLD_SIZES = (2, 4, 6, 8)


def shard_sizes(n: int, ws: int) -> list[int]:
    """The tutorial's shard sizes; 0 where rank ``r`` gets no chunk (IndexError)."""
    c = ceil(n / ws)
    return [min(c, max(0, n - r * c)) for r in range(ws)]


def check_against_split(max_n: int = 3_000) -> None:
    for ws in WORLD_SIZES:
        for n in range(ws, max_n + 1):
            chunks = torch.arange(n).split(ceil(n / ws))
            expected = [len(chunks[r]) if r < len(chunks) else 0 for r in range(ws)]
            assert shard_sizes(n, ws) == expected, (n, ws)


def main() -> None:
    check_against_split()
    print(f"split sizes n = world_size..{MAX_N:,}, batch_size={BATCH_SIZE}, drop_last=True")
    for ws in WORLD_SIZES:
        uneven, missing, first = 0, [], None
        for n in range(ws, MAX_N + 1):
            sizes = shard_sizes(n, ws)
            if 0 in sizes:
                missing.append(n)
                continue
            if len({s // BATCH_SIZE for s in sizes}) > 1:
                uneven += 1
                first = first or (n, sizes)
        print(f"{ws} ranks: {uneven:>5,} sizes with unequal batch counts "
              f"(first: n={first[0]:,}, shards {first[1]}); "
              f"{len(missing)} with fewer chunks than ranks {missing[:6]}")


if __name__ == "__main__":
    main()
