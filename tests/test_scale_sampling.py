"""What weighted and temporal samplers build from a graph at scale: weighted draws exact for
light nodes after heavy ones, the time order sorted a few runs at a time."""
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data

from pyg_mgpu.data.csc import CSC
from pyg_mgpu.sampling import temporal, weighted
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.sampling.sampling_graph import EDGE


def random_graph(num_nodes=300, num_edges=3000, seed=0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(num_nodes, (2, num_edges), generator=gen)
    return Data(edge_index=edge_index, num_nodes=num_nodes,
                w=torch.rand(num_edges, generator=gen),
                t=torch.randint(100, (num_nodes,), generator=gen),
                edge_t=torch.randint(100, (num_edges,), generator=gen))


def heavy_then_light(light_weights: list[float]) -> Data:
    """Node 0 has 1,024 in-edges of weight 1.5e6 (a running total of ~1.5e9, as a graph of
    ~1.6B edges reaches), node 1 then ``light_weights``; edges sorted by destination, so
    edge ids are CSC positions."""
    heavy = 1024
    src = torch.arange(heavy + len(light_weights)) % 7 + 2
    dst = torch.cat([torch.zeros(heavy, dtype=torch.long),
                     torch.ones(len(light_weights), dtype=torch.long)])
    weight = torch.cat([torch.full((heavy,), 1.5e6), torch.tensor(light_weights)])
    return Data(edge_index=torch.stack([src, dst]), num_nodes=9, w=weight)


@pytest.mark.parametrize("light", [[1e-8, 1e-8, 0.0, 2e-8], [1e-8, 1e-8, 0.0, 1e-6]])
def test_weighted_draws_with_replacement_keep_a_light_nodes_weights(light):
    # Against a graph-wide float64 running sum, node 1's weights are below the rounding of
    # the total before them: they vanish (all of them, or all but the largest).
    data = heavy_then_light(light)
    draws = 20000
    sampler = NeighborSampler(data, [draws], weight_attr="w", replace=True, seed=0)
    out = sampler.sample(torch.tensor([1]))
    picked = out.edge - 1024
    assert picked.min() >= 0 and picked.numel() == draws
    counts = torch.bincount(picked, minlength=len(light)).double()
    assert counts[2] == 0, "a weight-0 edge was drawn"
    light = torch.tensor(light, dtype=torch.float64)
    positive = light > 0
    expected = light[positive] / light.sum() * draws
    assert chisquare(counts[positive].numpy(), expected.numpy()).pvalue > 1e-3


def test_run_cumsum_restarts_at_every_node(monkeypatch):
    # Runs of 0 to 70 edges (the last one ends the graph, one much longer), several steps of
    # each width, zero weights, a heavy run before light ones.
    monkeypatch.setattr(weighted, "_RUN_CUMSUM_CELLS", 64)
    gen = torch.Generator().manual_seed(0)
    degree = torch.randint(0, 71, (300,), generator=gen)
    degree[[0, 7, -1]] = torch.tensor([0, 700, 33])
    colptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
    weight = torch.rand(int(colptr[-1]), generator=gen)
    weight[torch.rand(weight.numel(), generator=gen) < 0.2] = 0
    weight[colptr[7]:colptr[8]] *= 1e9
    cum = weighted.run_cumsum(weight, colptr)
    for v in range(300):
        start, end = int(colptr[v]), int(colptr[v + 1])
        own = torch.cumsum(weight[start:end].double(), 0)
        assert torch.allclose(cum[start:end], own, rtol=1e-12, atol=0), v


def test_inverse_cdf_lands_where_the_running_sum_first_exceeds_the_draw():
    # Every node of a small graph, fanout large enough to reach each edge: compared with
    # searchsorted over each node's own running sum, for the same uniforms.
    from pyg_mgpu.sampling.draws import _inverse_cdf
    gen = torch.Generator().manual_seed(1)
    degree = torch.randint(1, 40, (100,), generator=gen)
    colptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
    weight = torch.rand(int(colptr[-1]), generator=gen)
    weight[torch.rand(weight.numel(), generator=gen) < 0.3] = 0
    weight[colptr[1:] - 1] += 0.5  # every node has a positive weight
    weights = weighted.edge_weights(weight, colptr, replace=True)
    start, k = colptr[:-1], 50
    drawn = _inverse_cdf(weights, start, degree, k, torch.Generator().manual_seed(2))
    u = torch.rand(k, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for v in range(100):
        cum = weights.cum_weight[colptr[v]:colptr[v + 1]]
        expected = torch.searchsorted(cum, u[:, v] * cum[-1], right=True)
        assert torch.equal(drawn[:, v], expected), v
        assert bool((weight[colptr[v] + drawn[:, v]] > 0).all()), v


def test_time_order_sorted_a_few_runs_at_a_time_is_the_same(monkeypatch):
    # Runs of 0 to 30 edges and one of 200 (longer than a step), tied timestamps.
    gen = torch.Generator().manual_seed(0)
    degree = torch.randint(0, 31, (100,), generator=gen)
    degree[[0, 40, -1]] = torch.tensor([0, 200, 0])
    colptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
    num_edges = int(colptr[-1])
    csc = CSC(colptr=colptr, row=torch.randint(50, (num_edges,), generator=gen,
                                               dtype=torch.int32),
              perm=torch.randperm(num_edges, generator=gen).int())
    node_time = torch.randint(0, 10, (50,), generator=gen)
    edge_time = torch.randint(0, 10, (num_edges,), generator=gen).float()
    whole = [temporal.sort_by_time(csc, node_time, None),
             temporal.sort_by_time(csc, None, edge_time)]
    monkeypatch.setattr(temporal, "SORT_CHUNK_EDGES", 16)
    stepped = [temporal.sort_by_time(csc, node_time, None),
               temporal.sort_by_time(csc, None, edge_time)]
    for a, b in zip(whole, stepped):
        assert a.search_steps == b.search_steps == 8
        assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors()))
    for v in range(100):  # each run sorted by time, ties in CSC order
        lo, hi = int(colptr[v]), int(colptr[v + 1])
        key = node_time[csc.row[lo:hi].long()] * num_edges + torch.arange(hi - lo)
        order = torch.argsort(key)
        assert torch.equal(stepped[0].row[lo:hi], csc.row[lo:hi][order])
        assert torch.equal(stepped[0].perm[lo:hi], csc.perm[lo:hi][order])


def test_time_order_of_a_sorted_graph_takes_four_bytes_per_edge_id():
    # edge_index sorted by destination: the CSC keeps no permutation, the time order does.
    data = Data(edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]), num_nodes=4,
                t=torch.tensor([3, 1, 2, 0]))
    by_time = NeighborSampler(data, [2], time_attr="t").graph.by_time[EDGE]
    assert by_time.perm.tolist() == [2, 0, 1, 3]
    assert [t.element_size() for t in by_time.tensors()] == [4, 4, 8]  # row, perm, end_time


def test_weights_for_draws_with_replacement_take_eight_bytes_per_edge():
    data = random_graph()
    weights = NeighborSampler(data, [3], weight_attr="w", replace=True).weights
    assert [(t.dtype, t.numel()) for t in weights.tensors()] == [(torch.float64, 3000)]
