"""``NeighborSampler.sample_batches``: several batches in one walk, each the batch a lone walk
over its seeds gives (exactly, where nothing is random; in distribution otherwise), for the
walk's kernels once."""
import itertools

import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data

from pyg_mgpu import NeighborSampler
from pyg_mgpu.tools.step_costs import STAGES, OpCounter
from test_sampler import check_output, graph, native  # noqa: F401 (graph: a fixture)

SEEDS = [torch.tensor([1, 5, 7]), torch.tensor([5, 9]), torch.tensor([3, 3, 4]),
         torch.tensor([], dtype=torch.long)]


def random_data(dtype=torch.long):
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(300, (2, 3000), generator=gen)
    return Data(edge_index=edge_index.to(dtype), num_nodes=300)


def same(a, b, disjoint=False):
    fields = ("node", "row", "col", "edge") + (("batch",) if disjoint else ())
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields) and \
        a.num_sampled_nodes == b.num_sampled_nodes and \
        a.num_sampled_edges == b.num_sampled_edges


@pytest.mark.parametrize("options", [{}, {"disjoint": True}, {"sample_direction": "backward"},
                                     {"subgraph_type": "bidirectional"}])
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_every_neighbour_gives_each_batch_exactly_its_lone_walk(options, dtype):
    # With every neighbour drawn nothing is random: each batch must be the lone batch,
    # repeated and empty seed lists included.
    sampler = NeighborSampler(random_data(dtype), [-1, -1], seed=0, **options)
    batches = sampler.sample_batches(SEEDS)
    assert len(batches) == len(SEEDS)
    for seeds, batch in zip(SEEDS, batches):
        assert same(sampler.sample(seeds), batch, disjoint=options.get("disjoint", False))
        assert batch.node.dtype == dtype


def test_each_batch_is_a_valid_sample(graph):
    fanouts = [10, 5]
    sampler = native(graph, fanouts, seed=3)
    seeds = [torch.randperm(graph.num_nodes)[:150] for _ in range(6)]
    for seed, batch in zip(seeds, sampler.sample_batches(seeds)):
        check_output(graph, batch, seed, fanouts)


def test_draws_stay_uniform_without_replacement():
    # 8 batches of destination nodes that share the same 10 in-neighbours, each drawing 3 of
    # them: every 3-subset equally likely, in whichever batch.
    deg, per_batch, num_batches, fanout = 10, 300, 8, 3
    n = deg + per_batch * num_batches
    dst = torch.arange(deg, n).repeat_interleave(deg)
    src = torch.arange(deg).repeat(n - deg)
    sampler = NeighborSampler(Data(edge_index=torch.stack([src, dst]), num_nodes=n), [fanout],
                              seed=11)
    seeds = list(torch.arange(deg, n).split(per_batch))
    index = {s: i for i, s in enumerate(itertools.combinations(range(deg), fanout))}
    codes = []
    for _ in range(2):
        for batch in sampler.sample_batches(seeds):
            picked = batch.node[batch.row].view(per_batch, fanout).sort(dim=1).values
            assert (picked[:, 1:] > picked[:, :-1]).all(), "a neighbour was drawn twice"
            codes += [index[tuple(s)] for s in picked.tolist()]
    per_subset = torch.bincount(torch.tensor(codes), minlength=len(index)).double()
    assert chisquare(per_subset.numpy()).pvalue > 1e-3


def test_one_walk_issues_fewer_ops_per_batch(graph):
    sampler = native(graph, [10, 5], seed=0)
    seeds = [torch.randperm(graph.num_nodes)[:128] for _ in range(8)]
    alone, together = OpCounter(), OpCounter()
    with alone:
        for seed in seeds:
            sampler.sample(seed)
    with together:
        sampler.sample_batches(seeds)
    ops_alone = alone.costs[STAGES[0]].kernels
    ops_together = together.costs[STAGES[0]].kernels
    assert ops_together * 3 < ops_alone, (ops_together, ops_alone)
    assert together.costs[STAGES[0]].syncs * 3 < alone.costs[STAGES[0]].syncs


def test_refuses_what_one_walk_cannot_split():
    data = random_data()
    data.time = torch.arange(300)
    for options in ({"time_attr": "time"}, {"subgraph_type": "induced"}):
        with pytest.raises(NotImplementedError, match="sample_batches"):
            NeighborSampler(data, [2], **options).sample_batches(SEEDS[:2])
