"""Temporal sampling (``time_attr``, ``input_time``, ``temporal_strategy``) as PyG defines it for
pyg-lib: every seed grows its own tree, a neighbour is eligible when its timestamp (the node's,
or the edge's) is at most its seed's time, ``"uniform"`` draws among the eligible ones and
``"last"`` keeps the most recent; batches still name the caller's nodes and edges."""
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

import pyg_mgpu
from test_neighbor_loader import check_names_callers_edges, random_graph


def timed_graph(dtype=torch.long, seed=0):
    """The unsorted random graph with distinct node and edge timestamps."""
    data = random_graph(num_nodes=80, num_edges=400, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    data.time = torch.randperm(data.num_nodes, generator=gen)
    data.edge_time = torch.randperm(data.num_edges, generator=gen)
    return data


def reference_trees(data, seeds, seed_times, hops, node_level):
    """Per seed: the nodes and edge ids that sampling every eligible neighbour must return."""
    src, dst = data.edge_index.long()
    trees = []
    for seed, limit in zip(seeds, seed_times):
        nodes, edges, frontier = {seed}, set(), {seed}
        for _ in range(hops):
            new = set()
            for e in range(data.num_edges):
                if int(dst[e]) not in frontier:
                    continue
                stamp = data.time[src[e]] if node_level else data.edge_time[e]
                if stamp <= limit:
                    edges.add(e)
                    if int(src[e]) not in nodes:
                        new.add(int(src[e]))
            nodes |= new
            frontier = new
        trees.append((nodes, edges))
    return trees


def tree_of(out, tree, sampler):
    """Tree ``tree``'s nodes, and its edges by the caller's ids."""
    mask = out.batch == tree
    edge = out.edge[mask[out.col.long()]].long()
    if sampler.edge_permutation is not None:
        edge = sampler.edge_permutation[edge]
    return set(out.node[mask].tolist()), set(edge.tolist())


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
@pytest.mark.parametrize("time_attr", ["time", "edge_time"])
def test_every_eligible_neighbour_and_no_other(dtype, time_attr):
    data = timed_graph(dtype)
    sampler = pyg_mgpu.NeighborSampler(data, [-1, -1], time_attr=time_attr, seed=0)
    assert sampler.is_temporal and sampler.disjoint
    seeds = [0, 5, 5, 17]
    times = torch.tensor([60, 10, 79, 40])
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds), time=times))
    reference = reference_trees(data, seeds, times.tolist(), 2, time_attr == "time")
    for tree, (nodes, edges) in enumerate(reference):
        got_nodes, got_edges = tree_of(out, tree, sampler)
        assert got_nodes == nodes and got_edges == edges, tree


def test_seed_time_defaults_to_the_seed_nodes_own_time():
    data = timed_graph()
    sampler = pyg_mgpu.NeighborSampler(data, [-1, -1], time_attr="time", seed=0)
    seeds = [3, 8, 21]
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds)))
    reference = reference_trees(data, seeds, data.time[seeds].tolist(), 2, True)
    for tree, (nodes, _) in enumerate(reference):
        assert tree_of(out, tree, sampler)[0] == nodes
    with pytest.raises(ValueError, match="needs a time per seed"):
        pyg_mgpu.NeighborSampler(data, [2], time_attr="edge_time").sample(torch.tensor([0]))


def test_last_keeps_the_most_recent_eligible_neighbours():
    # Node 0's in-neighbours 1..8 have times 1..8; seed time 5: eligible 1..5, last two 4, 5.
    data = Data(num_nodes=9, time=torch.tensor([5, 1, 2, 3, 4, 5, 6, 7, 8]),
                edge_index=torch.tensor([[8, 3, 1, 5, 7, 2, 6, 4], [0] * 8]))
    sampler = pyg_mgpu.NeighborSampler(data, [2], time_attr="time", temporal_strategy="last")
    for _ in range(5):
        out = sampler.sample(torch.tensor([0]))
        assert sorted(out.node[1:].tolist()) == [4, 5]


def test_last_with_replace_draws_the_fanout_from_the_most_recent_with_repeats():
    # pyg-lib narrows to the last 3 eligible in-edges (sources 3, 4, 5) and draws 3 times from
    # them with replacement: repeats are common (all distinct with chance 3!/27).
    data = Data(num_nodes=9, time=torch.tensor([5, 1, 2, 3, 4, 5, 6, 7, 8]),
                edge_index=torch.tensor([[8, 3, 1, 5, 7, 2, 6, 4], [0] * 8]))
    loader = pyg_mgpu.NeighborLoader(data, [3], input_nodes=torch.tensor([0]), batch_size=1,
                                     time_attr="time", temporal_strategy="last", replace=True,
                                     seed=0)
    counts, repeated = torch.zeros(9), 0
    for _ in range(600):
        e_id = next(iter(loader)).e_id
        sources = data.edge_index[0, e_id]
        assert e_id.numel() == 3 and set(sources.tolist()) <= {3, 4, 5}
        counts[sources] += 1
        repeated += int(e_id.unique().numel() < 3)
    assert 0.6 < repeated / 600 < 0.95  # 1 - 6/27 = 0.78 expected
    assert chisquare(counts[3:6]).pvalue > 1e-3


@pytest.mark.parametrize("time_attr", ["time", None])
def test_an_unknown_strategy_is_refused_with_or_without_timestamps(time_attr):
    data = Data(num_nodes=3, time=torch.tensor([2, 1, 0]),
                edge_index=torch.tensor([[1, 2], [0, 0]]))
    with pytest.raises(ValueError, match="temporal_strategy must be one of .* got 'recent'"):
        pyg_mgpu.NeighborLoader(data, [2], batch_size=1, time_attr=time_attr,
                                temporal_strategy="recent")


def test_uniform_draws_evenly_among_the_eligible_neighbours():
    data = Data(num_nodes=9, time=torch.tensor([4, 0, 1, 2, 3, 4, 5, 6, 7]),
                edge_index=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [0] * 8]))
    sampler = pyg_mgpu.NeighborSampler(data, [2], time_attr="time", seed=0)
    counts = torch.zeros(9)
    for _ in range(2000):
        picked = sampler.sample(torch.tensor([0])).node[1:]
        assert picked.numel() == 2 and bool((data.time[picked] <= 4).all())
        counts[picked] += 1
    eligible = counts[1:6]
    assert counts[6:].sum() == 0
    assert chisquare(eligible.numpy()).pvalue > 1e-3  # each of the 5 equally often


def test_loader_batches_name_the_callers_edges_and_keep_their_seed_times():
    data = timed_graph()
    data.x = torch.arange(data.num_nodes)
    input_nodes = torch.tensor([4, 9, 9, 30, 2, 11])
    input_time = torch.tensor([20, 50, 5, 79, 0, 33])
    loader = pyg_mgpu.NeighborLoader(data, [3, 2], input_nodes=input_nodes,
                                     input_time=input_time, time_attr="edge_time",
                                     batch_size=4, seed=0)
    for batch in loader:
        check_names_callers_edges(data, batch)
        seeds = batch.n_id[:batch.batch_size]
        assert torch.equal(seeds, input_nodes[batch.input_id])
        assert torch.equal(batch.seed_time, input_time[batch.input_id])
        tree_time = batch.seed_time[batch.batch[batch.edge_index[1]]]
        assert bool((batch.edge_time <= tree_time).all())


def test_pygs_edge_level_temporal_loader():
    # PyG's test_edge_level_temporal_homo_neighbor_loader, which needs pyg-lib for PyG's own.
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]])
    data = Data(edge_index=edge_index, edge_time=torch.arange(8), num_nodes=5)
    loader = pyg_mgpu.NeighborLoader(data, num_neighbors=[-1, -1], time_attr="edge_time",
                                     input_time=torch.tensor([4, 4, 4, 4, 4]), batch_size=1)
    sizes = []
    for batch in loader:
        assert batch.edge_time.numel() == batch.num_edges
        assert batch.edge_time.numel() == 0 or batch.edge_time.max() <= 4
        sizes.append(batch.num_edges)
    assert sizes == [3, 4, 3, 2, 0]  # worked out by hand from the edge times


def test_distributed_shards_keep_each_seeds_time():
    data = timed_graph()
    input_time = torch.arange(data.num_nodes) % 7 * 10
    seen = {}
    for rank in range(2):
        loader = pyg_mgpu.NeighborLoader(data, [2], input_time=input_time, time_attr="time",
                                         batch_size=8, shuffle=True, distributed=True,
                                         rank=rank, world_size=2, seed=3)
        loader.set_epoch(1)
        for batch in loader:
            for node, when in zip(batch.n_id[:batch.batch_size].tolist(),
                                  batch.seed_time.tolist()):
                seen[node] = seen.get(node, 0) + 1
                assert when == input_time[node]
    assert sorted(seen) == list(range(data.num_nodes))


def test_refuses_what_it_cannot_do():
    data = timed_graph()
    data.weight = torch.rand(data.num_edges)
    with pytest.raises(ValueError, match="weighted temporal"):
        pyg_mgpu.NeighborSampler(data, [2], time_attr="time", weight_attr="weight")
    with pytest.raises(ValueError, match="induced"):
        pyg_mgpu.NeighborSampler(data, [2], time_attr="time", subgraph_type="induced")
    with pytest.raises(ValueError, match="temporal_strategy"):
        pyg_mgpu.NeighborSampler(data, [2], time_attr="time", temporal_strategy="first")
    with pytest.raises(ValueError, match="one timestamp per node"):
        data.bad = torch.arange(3)
        pyg_mgpu.NeighborSampler(data, [2], time_attr="bad")
    with pytest.raises(NotImplementedError, match="backward"):
        pyg_mgpu.NeighborSampler(data, [2], time_attr="time", sample_direction="backward")
    with pytest.raises(ValueError, match="input_time"):
        pyg_mgpu.NeighborLoader(data, [2], input_time=torch.zeros(80))  # PyG's own check
    with pytest.raises(ValueError, match="no time_attr"):
        pyg_mgpu.NeighborSampler(data, [2]).sample_from_nodes(
            NodeSamplerInput(None, torch.tensor([0]), time=torch.tensor([1])))


@pytest.mark.parametrize("time_dtype", [torch.long, torch.float])
def test_eligible_ends_match_counting_every_run(time_dtype):
    # Runs of 0 to 40 edges (the last one ends the graph), tied timestamps, limits below,
    # within and above each run's times.
    from pyg_mgpu.data.csc import CSC
    from pyg_mgpu.sampling.temporal import eligible_ends, sort_by_time
    gen = torch.Generator().manual_seed(0)
    degree = torch.randint(0, 41, (200,), generator=gen)
    degree[-1] = 40
    colptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
    num_edges = int(colptr[-1])
    edge_time = torch.randint(0, 20, (num_edges,), generator=gen).to(time_dtype)
    csc = CSC(colptr=colptr, row=torch.zeros(num_edges, dtype=torch.long), perm=None)
    by_time = sort_by_time(csc, None, edge_time)
    dst = torch.cat([torch.arange(200), torch.randint(200, (300,), generator=gen)])
    limit = torch.randint(-2, 23, (dst.numel(),), generator=gen).to(time_dtype)
    ends = eligible_ends(colptr, by_time, dst, limit)
    for v, lim, end in zip(dst.tolist(), limit.tolist(), ends.tolist()):
        start = int(colptr[v])
        times = edge_time[start:int(colptr[v + 1])]
        assert end == start + int((times <= lim).sum()), (v, lim)
