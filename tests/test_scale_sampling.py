"""What weighted and temporal samplers build from a graph at scale: built once per graph and
shared (as its CSC is), and weighted draws exact for light nodes after heavy ones."""
import contextlib
import pickle

import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NodeSamplerInput

from pyg_mgpu.data.csc import CSC, csc_of
from pyg_mgpu.distributed.launch import spawn
from pyg_mgpu.gpu_path import counting_gpu_path
from pyg_mgpu.sampling import temporal, weighted
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.sampling.sampling_graph import EDGE, share_sampling


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


@pytest.mark.parametrize("gpu_path", [False, True])
def test_inverse_cdf_lands_where_the_running_sum_first_exceeds_the_draw(gpu_path):
    # Every node of a small graph, fanout large enough to reach each edge: compared with
    # searchsorted over each node's own running sum, for the same uniforms. The GPU's form
    # searches as many steps as the graph's longest run needs, the CPU's the nodes' own.
    from pyg_mgpu.sampling.draws import _inverse_cdf
    gen = torch.Generator().manual_seed(1)
    degree = torch.randint(1, 40, (100,), generator=gen)
    degree[50] = 300  # the graph's longest run, not drawn from
    colptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
    weight = torch.rand(int(colptr[-1]), generator=gen)
    weight[torch.rand(weight.numel(), generator=gen) < 0.3] = 0
    weight[colptr[1:] - 1] += 0.5  # every node has a positive weight
    weights = weighted.edge_weights(weight, colptr, replace=True)
    nodes = torch.cat([torch.arange(50), torch.arange(51, 100)])  # all but the longest run
    start, k = colptr.index_select(0, nodes), 50
    with counting_gpu_path() if gpu_path else contextlib.nullcontext():
        drawn = _inverse_cdf(weights, start, degree.index_select(0, nodes), k,
                             torch.Generator().manual_seed(2))
    u = torch.rand(k, 99, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for i, v in enumerate(nodes.tolist()):
        cum = weights.cum_weight[colptr[v]:colptr[v + 1]]
        expected = torch.searchsorted(cum, u[:, i] * cum[-1], right=True)
        assert torch.equal(drawn[:, i], expected), v
        assert bool((weight[colptr[v] + drawn[:, i]] > 0).all()), v


def test_time_order_and_weights_are_built_once_per_graph():
    data = random_graph()
    train = NeighborSampler(data, [5, 5], time_attr="t")
    evaluate = NeighborSampler(data, [-1], time_attr="t")
    assert train.graph.by_time[EDGE] is evaluate.graph.by_time[EDGE]
    by_edge = NeighborSampler(data, [3], time_attr="edge_t")
    assert by_edge.graph.by_time[EDGE] is not train.graph.by_time[EDGE]
    assert NeighborSampler(data, [3], time_attr="t").graph.by_time[EDGE] is \
        train.graph.by_time[EDGE], "another time attribute's order replaced the first"
    for replace in (False, True):
        a = NeighborSampler(data, [5, 5], weight_attr="w", replace=replace)
        b = NeighborSampler(data, [2], weight_attr="w", replace=replace)
        assert a.weights is b.weights
    assert NeighborSampler(data, [2], weight_attr="w").weights is not b.weights


def test_hetero_time_order_and_weights_are_built_once_per_edge_type():
    data = HeteroData()
    data["a"].num_nodes, data["b"].num_nodes = 30, 20
    data["a"].t, data["b"].t = torch.arange(30), torch.arange(20)
    gen = torch.Generator().manual_seed(0)
    data["a", "x", "b"].edge_index = torch.stack([torch.randint(30, (200,), generator=gen),
                                                  torch.randint(20, (200,), generator=gen)])
    data["a", "x", "b"].w = torch.rand(200, generator=gen)
    first, second = (NeighborSampler(data, [3, 2], time_attr="t") for _ in range(2))
    assert first.graph.by_time[("a", "x", "b")] is second.graph.by_time[("a", "x", "b")]
    first, second = (NeighborSampler(data, [3], weight_attr="w") for _ in range(2))
    assert first.graph.weights[("a", "x", "b")] is second.graph.weights[("a", "x", "b")]


def test_replaced_times_weights_and_edges_are_built_again():
    data = random_graph()
    old_order = NeighborSampler(data, [3], time_attr="t").graph.by_time[EDGE]
    old_weights = NeighborSampler(data, [3], weight_attr="w", replace=True).weights
    data.t = torch.full_like(data.t, 1000)  # every neighbour later than every seed's own time
    data.t[:10] = 0
    data.w = torch.zeros_like(data.w)
    data.w[data.edge_index[0] == 3] = 1.0  # only node 3's out-edges weigh
    sampler = NeighborSampler(data, [3], time_attr="t")
    assert sampler.graph.by_time[EDGE] is not old_order
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.arange(10)))
    assert bool((out.node < 10).all()), "the old timestamps were used"
    sampler = NeighborSampler(data, [3], weight_attr="w", replace=True)
    assert sampler.weights is not old_weights
    has_node_3 = torch.unique(data.edge_index[1, data.edge_index[0] == 3])
    out = sampler.sample(has_node_3)
    assert set(out.node[out.row].tolist()) == {3}, "the old weights were used"
    data.edge_index = data.edge_index.flip(0)
    assert NeighborSampler(data, [3], time_attr="t").graph.by_time[EDGE] is not \
        sampler.graph.by_time.get(EDGE)
    assert NeighborSampler(data, [3], weight_attr="w", replace=True).weights is not \
        sampler.weights


def test_a_rank_reads_the_time_order_and_weights_it_received():
    data = random_graph()
    share_sampling(data, time_attr="t")
    share_sampling(data, weight_attr="w", replace=True)
    clone = pickle.loads(pickle.dumps(data))  # as a rank receives it

    def refuse(*args, **kwargs):
        raise AssertionError("built again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(temporal, "sort_by_time", refuse)
        patch.setattr(weighted, "run_cumsum", refuse)
        patch.setattr("pyg_mgpu.sampling.sampling_graph.edge_weights", refuse)
        NeighborSampler(clone, [3], time_attr="t")
        NeighborSampler(clone, [3], weight_attr="w", replace=True)
    batch = NeighborSampler(data, [3], time_attr="t", seed=0).sample_from_nodes(
        NodeSamplerInput(None, torch.arange(20)))
    again = NeighborSampler(clone, [3], time_attr="t", seed=0).sample_from_nodes(
        NodeSamplerInput(None, torch.arange(20)))
    assert torch.equal(batch.node, again.node) and torch.equal(batch.edge, again.edge)


def test_share_sampling_moves_what_samplers_read_to_shared_memory():
    data = random_graph()
    share_sampling(data, time_attr="t")
    share_sampling(data, weight_attr="w", replace=False)
    share_sampling(data, weight_attr="w", replace=True, sample_direction="backward")
    tensors = [*NeighborSampler(data, [3], time_attr="t").graph.by_time[EDGE].tensors(),
               *NeighborSampler(data, [3], weight_attr="w").weights.tensors(),
               *NeighborSampler(data, [3], weight_attr="w", replace=True,
                                sample_direction="backward").weights.tensors()]
    assert len(tensors) == 6 and all(t.is_shared() for t in tensors)
    assert data.t.is_shared() and csc_of(data).is_shared()


def check_received_sampling_forms(ctx, data, result):
    """Records whether a rank's samplers read the parent's shared time order and weights
    (what a rank builds itself is in its private memory)."""
    with pytest.MonkeyPatch.context() as patch:
        def refuse(*args, **kwargs):
            raise AssertionError("built again in a rank")
        patch.setattr(temporal, "sort_by_time", refuse)
        patch.setattr("pyg_mgpu.sampling.sampling_graph.edge_weights", refuse)
        by_time = NeighborSampler(data, [3], time_attr="t").graph.by_time[EDGE]
        weights = NeighborSampler(data, [3], weight_attr="w", replace=True).weights
    result[ctx.rank] = torch.tensor([all(t.is_shared() for t in by_time.tensors()),
                                     all(t.is_shared() for t in weights.tensors())])


@pytest.mark.slow
def test_spawned_ranks_map_the_time_order_and_weights_built_in_the_parent():
    data = random_graph()
    NeighborSampler(data, [3], time_attr="t")  # a loader built in the parent builds them
    share_sampling(data, weight_attr="w", replace=True)
    result = torch.zeros(2, 2, dtype=torch.bool)
    spawn(check_received_sampling_forms, args=(data, result), devices="cpu", nprocs=2)
    assert result.all(), f"(time order shared, weights shared) per rank: {result.tolist()}"


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
