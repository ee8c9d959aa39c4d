"""The kernels that split a walk into its batches (:mod:`pyg_mgpu.sampling.batches`) against
the plain formulas: keys filled hop by hop against ``repeat_interleave`` of hop ids, counts
from run ends against ``bincount`` and ``index_add_``, on random inputs with empty hops,
batches absent from a hop and a single batch."""
import pytest
import torch

from pyg_mgpu.gpu_path import host_ints
from pyg_mgpu.sampling.batches import BatchCounts, _ends, _keys, _run_lengths
from pyg_mgpu.sampling.walk_state import PendingHop


def keys_by_repeated_hop_ids(batch, hop_sizes, levels):
    hop = torch.repeat_interleave(torch.arange(len(hop_sizes), dtype=batch.dtype),
                                  torch.tensor(hop_sizes, dtype=torch.long))
    return batch * levels + hop


@pytest.mark.parametrize("hop_sizes", [[5, 0, 7, 3], [0, 0, 0], [9], [0, 4, 0, 0], [], [3, 2]])
@pytest.mark.parametrize("num_batches", [1, 5])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_keys_fill_each_hop_as_repeated_hop_ids_do(hop_sizes, num_batches, dtype):
    gen = torch.Generator().manual_seed(len(hop_sizes) * 10 + num_batches)
    batch = torch.randint(num_batches, (sum(hop_sizes),), generator=gen, dtype=dtype)
    before = batch.clone()
    levels = len(hop_sizes) + 1
    keys = _keys(batch, hop_sizes, levels)
    assert keys.dtype == dtype
    assert torch.equal(keys, keys_by_repeated_hop_ids(batch, hop_sizes, levels))
    assert torch.equal(batch, before)  # filled in a tensor of its own


@pytest.mark.parametrize("size,n,low,high", [(1, 0, 0, 1), (1, 6, 0, 1), (12, 0, 0, 12),
                                             (12, 40, 0, 12), (12, 40, 3, 9), (32, 500, 0, 32)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_run_ends_count_as_bincount_does(size, n, low, high, dtype):
    keys = torch.randint(low, high, (n,), generator=torch.Generator().manual_seed(n),
                         dtype=dtype)
    out = torch.empty(size, dtype=torch.long)
    ends = _ends(keys.sort().values, size, out)
    assert ends.data_ptr() == out.data_ptr()
    assert _run_lengths(ends.tolist()) == torch.bincount(keys.long(), minlength=size).tolist()


def counts_by_atomics(tree, last_trees, first, col, settled, edge_sizes, num_batches):
    """Every batch's per-hop node counts, then edge counts, by adding ones into bins."""
    hops = len(edge_sizes)
    nodes = torch.bincount(keys_by_repeated_hop_ids(tree, settled, hops + 1),
                           minlength=num_batches * (hops + 1))
    nodes.index_add_(0, last_trees * (hops + 1) + hops, first.long())
    edges = torch.bincount(keys_by_repeated_hop_ids(tree[col], edge_sizes, hops),
                           minlength=num_batches * hops)
    return nodes.tolist() + edges.tolist()


@pytest.mark.parametrize("settled,last,edge_sizes", [([6, 0, 9], 11, [14, 0, 20]),
                                                     ([3], 0, [0]), ([4, 5], 7, [0, 8]),
                                                     ([2, 30], 60, [9, 70])])
@pytest.mark.parametrize("num_batches", [1, 4])
def test_batch_counts_count_as_atomics_do(settled, last, edge_sizes, num_batches):
    gen = torch.Generator().manual_seed(sum(settled) + last + num_batches)

    def by_batch(n):  # a hop's batches, batch by batch as a walk lays them out
        return torch.randint(num_batches, (n,), generator=gen).sort().values

    tree = torch.cat([by_batch(n) for n in settled])
    last_trees = by_batch(last)
    first = torch.rand(last, generator=gen) < 0.6
    cols = []
    for m in edge_sizes:  # each hop's edges grouped by their destination's batch
        col = torch.randint(tree.numel(), (m,), generator=gen)
        cols.append(col[tree[col].argsort(stable=True)])
    col = torch.cat(cols)
    node, edge = "n", ("n", "to", "n")
    counts = BatchCounts(num_batches, num_hops=len(edge_sizes))
    pending = {node: PendingHop(torch.zeros(last, dtype=torch.long), last_trees, first)}
    counts.receive(host_ints(counts.request({node: tree}, pending, {edge: col},
                                            {node: settled}, {edge: edge_sizes})))
    assert counts.values == counts_by_atomics(tree, last_trees, first, col, settled,
                                              edge_sizes, num_batches)
