"""``pyg_mgpu.BidirectionalNeighborSampler``: every hop draws in- and out-neighbours of the
frontier, the edges are true edges named by the caller's ids (also those drawn backwards, which
PyG's own class names through the wrong permutation), each edge is in a batch once, and the
fanout bounds each direction's draws."""
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.sampler import NodeSamplerInput

import pyg_mgpu
from test_neighbor_loader import check_names_callers_edges, global_edges, random_graph


def sample(sampler, seeds):
    return sampler.sample_from_nodes(NodeSamplerInput(None, torch.as_tensor(seeds)))


def undirected_reach(data, seeds, hops):
    """Nodes within ``hops`` of ``seeds`` with edges followed either way, and the edges that
    touch the nodes within ``hops - 1`` (every edge the all-neighbour sampler must return)."""
    src, dst = data.edge_index.long()
    reached = frontier_set = set(int(s) for s in seeds)
    inner = set()
    for _ in range(hops):
        inner |= frontier_set
        touching = torch.tensor([int(a) in frontier_set or int(b) in frontier_set
                                 for a, b in zip(src, dst)])
        new = set(src[touching].tolist()) | set(dst[touching].tolist())
        frontier_set = new - reached
        reached = reached | new
    edges = {i for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist()))
             if a in inner or b in inner}
    return reached, edges


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_all_neighbours_both_ways_is_the_undirected_neighbourhood(dtype):
    data = random_graph(num_nodes=60, num_edges=150, dtype=dtype)
    sampler = pyg_mgpu.BidirectionalNeighborSampler(data, [-1, -1], seed=0)
    for seeds in ([0], [3, 17], [5, 6, 7]):
        out = sample(sampler, seeds)
        nodes, edges = undirected_reach(data, seeds, hops=2)
        assert out.node[:len(seeds)].tolist() == seeds  # the seeds come first
        assert set(out.node.tolist()) == nodes
        assert len(out.node) == len(nodes)  # each node once
        assert sorted(out.edge.tolist()) == sorted(edges)  # each edge once, by its own id
        ei = data.edge_index.long()
        assert torch.equal(out.node[out.row.long()], ei[0, out.edge.long()])
        assert torch.equal(out.node[out.col.long()], ei[1, out.edge.long()])


def test_a_node_with_only_out_edges_reaches_its_out_neighbours():
    data = Data(num_nodes=5, edge_index=torch.tensor([[0, 0, 0, 4], [1, 2, 3, 1]]))
    forward_only = pyg_mgpu.NeighborSampler(data, [-1], seed=0)
    assert sample(forward_only, [0]).node.tolist() == [0]
    both = sample(pyg_mgpu.BidirectionalNeighborSampler(data, [-1], seed=0), [0])
    assert sorted(both.node.tolist()) == [0, 1, 2, 3]
    assert sorted(both.edge.tolist()) == [0, 1, 2]


def test_fanout_bounds_each_direction():
    # Node 0: 10 in-edges (from 1..10) and 10 out-edges (to 11..20).
    src = torch.cat([torch.arange(1, 11), torch.zeros(10, dtype=torch.long)])
    dst = torch.cat([torch.zeros(10, dtype=torch.long), torch.arange(11, 21)])
    data = Data(num_nodes=21, edge_index=torch.stack([src, dst]))
    sampler = pyg_mgpu.BidirectionalNeighborSampler(data, [3], seed=0)
    for _ in range(20):
        out = sample(sampler, [0])
        incoming = (out.col == 0).sum().item()
        outgoing = (out.row == 0).sum().item()
        assert incoming == 3 and outgoing == 3


@pytest.mark.parametrize("options", [{}, {"replace": True}, {"disjoint": True}])
def test_loader_batches_name_the_callers_nodes_and_edges(options):
    data = random_graph()
    fanout = [4, 3]
    sampler = pyg_mgpu.BidirectionalNeighborSampler(data, fanout, seed=0, **options)
    loader = pyg_mgpu.NeighborLoader(data, fanout, batch_size=16, neighbor_sampler=sampler)
    for batch in loader:
        check_names_callers_edges(data, batch)
        if not options.get("replace"):
            if options.get("disjoint"):
                pairs = torch.stack([batch.batch[batch.edge_index[1]], batch.e_id])
                assert pairs.unique(dim=1).size(1) == pairs.size(1)
            else:
                assert batch.e_id.unique().numel() == batch.e_id.numel()
        src, dst = global_edges(batch)
        assert len(src) == len(dst)


def test_same_seed_same_samples():
    data = random_graph()
    first = sample(pyg_mgpu.BidirectionalNeighborSampler(data, [4, 3], seed=5), [1, 2, 3])
    again = sample(pyg_mgpu.BidirectionalNeighborSampler(data, [4, 3], seed=5), [1, 2, 3])
    assert torch.equal(first.node, again.node) and torch.equal(first.edge, again.edge)


def test_refuses_what_pyg_refuses():
    data = random_graph()
    with pytest.raises(RuntimeError, match="dict per edge type"):
        pyg_mgpu.BidirectionalNeighborSampler(data, {("n", "e", "n"): [2]})
    with pytest.raises(ValueError, match="temporal"):
        pyg_mgpu.BidirectionalNeighborSampler(data, [2], time_attr="time")


def test_repeated_seeds_are_refused_where_the_merge_would_shift_them():
    # PyG's merge keeps one copy of a repeated seed, and the next node took its place among
    # the batch's seeds; one tree per seed position keeps them all.
    data = random_graph()
    with pytest.raises(ValueError, match="disjoint=False needs distinct seeds"):
        sample(pyg_mgpu.BidirectionalNeighborSampler(data, [-1, -1], seed=0), [0, 7, 7, 21])
    out = sample(pyg_mgpu.BidirectionalNeighborSampler(data, [-1, -1], seed=0, disjoint=True),
                 [0, 7, 7, 21])
    assert out.node[:4].tolist() == [0, 7, 7, 21]
    assert sum(out.num_sampled_nodes) == out.node.numel()


@pytest.mark.parametrize("seeds", [[0, 1, 2], [5, 5, 9]])
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_disjoint_trees_are_each_seeds_own_undirected_neighbourhood(seeds, dtype):
    # Every hop of every tree, also past the first: each tree holds exactly its seed's
    # undirected neighbourhood, each (tree, node) and each (tree, edge) once, true edges only.
    data = random_graph(num_nodes=60, num_edges=150, dtype=dtype)
    sampler = pyg_mgpu.BidirectionalNeighborSampler(data, [-1, -1, -1], disjoint=True, seed=0)
    out = sample(sampler, seeds)
    ei = data.edge_index.long()
    assert out.batch[:len(seeds)].tolist() == list(range(len(seeds)))
    assert out.node[:len(seeds)].tolist() == seeds
    row, col, edge = out.row.long(), out.col.long(), out.edge.long()
    assert torch.equal(out.batch[row], out.batch[col])  # no edge joins two trees
    assert torch.equal(out.node[row], ei[0, edge]) and torch.equal(out.node[col], ei[1, edge])
    for tree, seed in enumerate(seeds):
        nodes, edges = undirected_reach(data, [seed], hops=3)
        in_tree = out.batch == tree
        assert sorted(out.node[in_tree].tolist()) == sorted(nodes)
        assert sorted(edge[out.batch[col] == tree].tolist()) == sorted(edges)
    assert sum(out.num_sampled_nodes) == out.node.numel()
    assert sum(out.num_sampled_edges) == out.edge.numel()
    assert len(out.num_sampled_nodes) == 2 * 2 * 3 and len(out.num_sampled_edges) == 2 * 3


def test_disjoint_trees_match_pygs_expected_batches():
    # The graph and expected output of PyG's test_bidirectional_neighbor_sampler (disjoint):
    # Alice (0) -> Bob (1), Alice -> Carol (2), Carol -> Dave (3); seeds Bob and Dave.
    data = Data(edge_index=torch.tensor([[0, 0, 2], [1, 2, 3]]), num_nodes=4)
    out = sample(pyg_mgpu.BidirectionalNeighborSampler(data, [2, 2, 2, 2], disjoint=True,
                                                       seed=0), [1, 3])
    assert out.node.tolist() == [1, 3, 0, 2, 0, 2, 1, 3]
    assert out.batch.tolist() == [0, 1, 0, 1, 1, 0, 1, 0]
    assert out.row.tolist() == [2, 3, 4, 2, 4, 5] and out.col.tolist() == [0, 1, 3, 5, 6, 7]
    assert out.edge.tolist() == [0, 2, 1, 1, 0, 2]
    assert out.num_sampled_nodes == [2, 2, 0, 0, 0, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0]
    assert out.num_sampled_edges == [2, 0, 1, 1, 0, 2, 0, 0]
