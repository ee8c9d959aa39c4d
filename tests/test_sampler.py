"""The sampler (over the CLI's graph store) returns true neighbours, uniformly, without replacement, in PyG's order."""
import itertools
import pickle

import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.loader import NodeLoader

from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.sampling import numbering
from pyg_mgpu.sampling.sampling_graph import EDGE, NODE
from pyg_mgpu.train.loaders import make_loader
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler


def native(graph, fanouts, seed=None):
    """The sampler the CLI uses, over a graph store's own CSC."""
    return NeighborSampler(graph.loader_data(), fanouts, seed=seed)


@pytest.fixture(scope="module")
def graph():
    # Multi-edges removed so that "distinct edge" and "distinct neighbour" mean the same.
    g = make_synthetic(SyntheticSpec(num_nodes=3000, num_edges=60_000), seed=1)
    ei = torch.unique(g.edge_index(), dim=1)
    return ConvertedGraph.from_edge_index("dedup", ei, g.x, g.y, g.train_idx, g.val_idx, g.test_idx)


def check_output(graph, out, seeds, fanouts):
    node, row, col, edge = out.node, out.row, out.col, out.edge
    n_seeds = seeds.numel()
    assert torch.equal(node[:n_seeds], seeds), "seeds must come first, in input order"
    assert node.unique().numel() == node.numel(), "a node appears twice in the output"
    assert sum(out.num_sampled_nodes) == node.numel()
    assert sum(out.num_sampled_edges) == row.numel() == col.numel() == edge.numel()
    # Every sampled edge is a real in-edge of its destination, and `edge` names it.
    src, dst = node[row], node[col]
    assert torch.equal(graph.row[edge], src)
    assert ((edge >= graph.colptr[dst]) & (edge < graph.colptr[dst + 1])).all()
    deg = graph.in_degree()
    node_start = 0
    edge_start = 0
    for hop, fanout in enumerate(fanouts):
        n_front = out.num_sampled_nodes[hop]
        n_edges = out.num_sampled_edges[hop]
        hop_col = col[edge_start:edge_start + n_edges]
        hop_row = row[edge_start:edge_start + n_edges]
        hop_edge = edge[edge_start:edge_start + n_edges]
        # Destinations of hop h are exactly the nodes first reached at hop h - 1 ...
        assert ((hop_col >= node_start) & (hop_col < node_start + n_front)).all()
        assert (hop_col[1:] >= hop_col[:-1]).all(), "edges are grouped by destination"
        # ... and sources are known by the end of hop h.
        assert (hop_row < node_start + n_front + out.num_sampled_nodes[hop + 1]).all()
        frontier = node[node_start:node_start + n_front]
        counts = torch.bincount(hop_col - node_start, minlength=n_front)
        expected = deg[frontier] if fanout < 0 else deg[frontier].clamp(max=fanout)
        assert torch.equal(counts, expected), "degree <= fanout keeps all, else exactly fanout"
        pairs = hop_col * graph.num_edges + hop_edge
        assert pairs.unique().numel() == pairs.numel(), "an edge was drawn twice for one node"
        node_start += n_front
        edge_start += n_edges


@pytest.mark.parametrize("fanouts", [[5], [10, 5], [3, 3, 3], [-1, 4], [1000]])
def test_outputs_are_true_neighbours_in_pyg_order(graph, fanouts):
    sampler = native(graph, fanouts, seed=0)
    for trial in range(3):
        seeds = torch.randperm(graph.num_nodes)[:200]
        check_output(graph, sampler.sample(seeds), seeds, fanouts)


def test_lookup_is_left_clean_between_batches(graph):
    sampler = native(graph, [5, 5], seed=0)
    sampler.sample(torch.arange(100))
    assert_lookups_clean(sampler)


def assert_lookups_clean(sampler):
    assert sampler.graph.lookups, "the joint walk keeps a lookup array per node type"
    for lookup in sampler.graph.lookups.values():
        assert (lookup == torch.iinfo(lookup.dtype).max).all()


def test_uniform_without_replacement():
    # 4000 destination nodes share the same 10 in-neighbours; each draws 3 of them.
    num_dst, deg, fanout = 4000, 10, 3
    dst = torch.arange(deg, deg + num_dst).repeat_interleave(deg)
    src = torch.arange(deg).repeat(num_dst)
    n = deg + num_dst
    g = ConvertedGraph.from_edge_index("star", torch.stack([src, dst]), torch.zeros(n, 1),
                                   torch.arange(n) % 2, torch.tensor([0]),
                                   torch.tensor([1]), torch.tensor([2]))
    sampler = native(g, [fanout], seed=123)
    subsets = []
    for _ in range(5):
        out = sampler.sample(torch.arange(deg, n))
        picked = out.node[out.row].view(num_dst, fanout).sort(dim=1).values
        assert (picked[:, 1:] > picked[:, :-1]).all(), "a neighbour was drawn twice"
        subsets.append(picked)
    subsets = torch.cat(subsets)
    # Marginals: each neighbour is picked with probability 3/10.
    per_neighbour = torch.bincount(subsets.view(-1), minlength=deg).double()
    assert chisquare(per_neighbour.numpy()).pvalue > 1e-3
    # Joint: each of the C(10, 3) = 120 subsets is equally likely.
    index = {s: i for i, s in enumerate(itertools.combinations(range(deg), fanout))}
    codes = torch.tensor([index[tuple(s)] for s in subsets.tolist()])
    per_subset = torch.bincount(codes, minlength=len(index)).double()
    assert (per_subset > 0).all()
    assert chisquare(per_subset.numpy()).pvalue > 1e-3


def test_large_degree_stays_uniform():
    # A hub with 100k in-neighbours: draws must reach the whole range, not just its start.
    deg = 100_000
    src = torch.arange(1, deg + 1)
    dst = torch.zeros(deg, dtype=torch.long)
    n = deg + 1
    g = ConvertedGraph.from_edge_index("hub", torch.stack([src, dst]), torch.zeros(n, 1),
                                   torch.arange(n) % 2, torch.tensor([0]),
                                   torch.tensor([1]), torch.tensor([2]))
    sampler = native(g, [25], seed=0)
    draws = torch.cat([sampler.sample(torch.tensor([0])).node[1:] for _ in range(400)])
    deciles = torch.bincount((draws - 1) * 10 // deg, minlength=10).double()
    assert chisquare(deciles.numpy()).pvalue > 1e-3


def test_same_seed_same_sample(graph):
    seeds = torch.arange(50)
    a = native(graph, [5, 5], seed=7).sample(seeds)
    b = native(graph, [5, 5], seed=7).sample(seeds)
    assert torch.equal(a.node, b.node) and torch.equal(a.row, b.row)


def test_int32_and_int64_rows_sample_the_same(graph):
    # Graphs store `row` as int32 when node ids fit; the sample must not depend on it.
    assert graph.row.dtype == torch.int32
    seeds = torch.arange(0, 3000, 7)
    a = native(graph, [10, 5], seed=7)
    b = native(ConvertedGraph(**{**graph.__dict__, "row": graph.row.long()}), [10, 5], seed=7)
    # Likewise the lookup (int32 below 2^30 nodes) and Floyd's offsets (int32 below 2^31 edges).
    assert a.graph.lookup_type == {NODE: torch.int32}
    assert a.graph.offset_type == {EDGE: torch.int32}
    b.graph.lookup_type, b.graph.offset_type = {NODE: torch.int64}, {EDGE: torch.int64}
    a, b = a.sample(seeds), b.sample(seeds)
    for name in ("node", "row", "col", "edge"):
        assert getattr(a, name).dtype == torch.long
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    check_output(graph, a, seeds, [10, 5])


def test_pickles_for_workers_without_scratch(graph):
    sampler = native(graph, [5], seed=0)
    sampler.sample(torch.arange(10))
    clone = pickle.loads(pickle.dumps(sampler))
    assert sampler.graph.lookups and clone.graph.lookups == {}
    assert torch.equal(clone.sample(torch.arange(10)).node, sampler.sample(torch.arange(10)).node)


def test_plugs_into_pyg_node_loader(graph):
    loader = make_loader(graph, graph.train_idx[:300], fanout=[5, 3], sampler="native", seed=0,
                         batch_size=128)
    assert isinstance(loader, NodeLoader)
    batches = list(loader)
    assert [b.batch_size for b in batches] == [128, 128, 44]
    for b in batches:
        assert torch.equal(b.x, graph.x[b.n_id]) and torch.equal(b.y, graph.y[b.n_id])
        assert b.edge_index.size(1) == sum(b.num_sampled_edges)
    assert torch.equal(torch.cat([b.n_id[:b.batch_size] for b in batches]), graph.train_idx[:300])


def test_zero_fanout_draws_nothing(graph):
    out = native(graph, [5, 0], seed=0).sample(torch.arange(10))
    assert out.num_sampled_edges[1] == 0 and out.num_sampled_nodes[2] == 0


@pytest.mark.gpu
def test_runs_on_cuda_tensors(graph):
    cuda_graph = ConvertedGraph(**{k: v.cuda() if isinstance(v, torch.Tensor) else v
                               for k, v in graph.__dict__.items()})
    sampler = native(cuda_graph, [10, 5], seed=0)
    seeds = torch.randperm(graph.num_nodes)[:300]
    out = sampler.sample(seeds.cuda())
    assert out.node.is_cuda
    out_cpu = type(out)(node=out.node.cpu(), row=out.row.cpu(), col=out.col.cpu(),
                        edge=out.edge.cpu(), num_sampled_nodes=out.num_sampled_nodes,
                        num_sampled_edges=out.num_sampled_edges)
    check_output(graph, out_cpu, seeds, [10, 5])


def test_same_sample_whatever_the_thread_count():
    # Relabelling must not depend on which duplicate a parallel write keeps: that would reorder
    # the next hop's frontier and hand its random draws to other nodes. (Large enough that
    # torch parallelizes the writes.)
    g = make_synthetic(SyntheticSpec(num_nodes=50_000, num_edges=1_000_000, num_features=1),
                       seed=0)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2, 1, 2):
            torch.set_num_threads(n)
            sampler = native(g, [25, 10, 5], seed=3)
            runs.append([sampler.sample(torch.randperm(50_000, generator=torch.Generator()
                                                       .manual_seed(i))[:512])
                         for i in range(3)])
    finally:
        torch.set_num_threads(threads)
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a.node, b.node) and torch.equal(a.edge, b.edge)


def test_lookup_is_left_clean_after_an_error_mid_hop(graph, monkeypatch):
    sampler = native(graph, [5, 5], seed=0)
    calls = []

    def fail_on_second_hop(nbr, lookup, num_ids):  # after hop 1 is recorded, mid-update of hop 2
        calls.append(1)
        if len(calls) == 2:
            lookup.scatter_reduce_(0, nbr, torch.zeros_like(nbr, dtype=lookup.dtype), reduce="amin")
            raise RuntimeError("injected")
        return original(nbr, lookup, num_ids)
    original = numbering.first_occurrences
    monkeypatch.setattr(numbering, "first_occurrences", fail_on_second_hop)
    with pytest.raises(RuntimeError, match="injected"):
        sampler.sample(torch.arange(100))
    assert_lookups_clean(sampler)
    monkeypatch.undo()
    seeds = torch.arange(100, 150)
    check_output(graph, sampler.sample(seeds), seeds, [5, 5])


def test_dataloader_workers_draw_different_random_streams():
    # 40 nodes with the same 100 in-neighbours; the same 10 seeds form batch 0 and batch 1, which
    # two workers sample. Replaying one random stream, they would draw identical neighbours.
    num_dst, deg = 40, 100
    colptr = torch.cat([torch.arange(0, (num_dst + 1) * deg, deg),  # the sources have no
                        torch.full((deg,), num_dst * deg)])              # in-edges themselves
    row = (torch.arange(num_dst * deg) % deg + num_dst).int()
    graph = ConvertedGraph(name="star", num_classes=2, colptr=colptr, row=row,
                       x=torch.zeros(num_dst + deg, 1), y=torch.zeros(num_dst + deg,
                                                                    dtype=torch.long),
                       train_idx=torch.arange(10), val_idx=torch.arange(10, 20),
                       test_idx=torch.arange(20, 30))
    seeds = torch.cat([torch.arange(10), torch.arange(10)])
    runs = []
    for _ in range(2):
        loader = make_loader(graph, seeds, fanout=[5], sampler="native", seed=0, batch_size=10,
                             num_workers=2)
        runs.append([batch.n_id[batch.edge_index[0]] for batch in loader])
        loader._iterator._shutdown_workers()  # persistent workers: stop them now, not at exit
    first, second = runs[0]
    assert not torch.equal(first, second), "both workers drew the same neighbours"
    assert all(torch.equal(a, b) for a, b in zip(*runs)), "worker streams not reproducible"


@pytest.mark.parametrize("offset_type", [torch.int32, torch.int64])
def test_floyds_steps_resolved_at_once_pick_what_the_loop_picks(offset_type):
    # The GPU's form (pointer doubling over the steps' chains, from 8 steps up) must choose
    # exactly the loop's offsets from the same draws, including the most colliding case of a
    # degree one above the fanout.
    from pyg_mgpu.gpu_path import counting_gpu_path
    from pyg_mgpu.sampling.draws import _floyd
    gen = torch.Generator().manual_seed(0)
    for trial in range(60):
        k = int(torch.randint(8, 33, (1,), generator=gen))
        n = int(torch.randint(1, 100, (1,), generator=gen))
        deg = (torch.full((n,), k + 1) if trial % 3 == 0 else
               torch.randint(k + 1, 4 * k, (n,), generator=gen))
        loop = _floyd(deg, k, torch.Generator().manual_seed(trial), offset_type)
        with counting_gpu_path():
            at_once = _floyd(deg, k, torch.Generator().manual_seed(trial), offset_type)
        assert torch.equal(loop, at_once)
        assert (at_once.sort(0).values.diff(dim=0) > 0).all()  # k distinct offsets per node
        assert (at_once >= 0).all() and (at_once < deg).all()


def test_floyds_steps_at_once_follow_the_longest_chains():
    # Step i draws j[i - 1] (= i with a degree of k + 1) and so repeats exactly when step
    # i - 1 did: a chain back to step 1, which repeats step 0's draw. Every step from 1 on
    # repeats, which the doubling must find for chains as long as k - 1 steps.
    from pyg_mgpu.sampling.draws import _floyd_repeats
    for k in (8, 9, 16, 17, 33):
        j = torch.arange(k).add_(1).unsqueeze(1)  # degree k + 1: j[i] = 1 + i
        t = torch.arange(k).unsqueeze(1)
        t[1] = 0
        expected = torch.ones(k, 1, dtype=torch.bool)
        expected[0] = False
        assert torch.equal(_floyd_repeats(t, j), expected), k
