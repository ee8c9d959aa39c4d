"""The walk's stages over its state (:mod:`pyg_mgpu.sampling.walk_state`): a hop numbered on the
GPU's path and settled after the next read is the hop numbered at once, and
:class:`~pyg_mgpu.sampling.batches.BatchCounts` counts a pending hop's nodes by batch."""
import pytest
import torch
from torch_geometric.data import HeteroData

from pyg_mgpu import NeighborSampler
from pyg_mgpu.gpu_path import host_ints
from pyg_mgpu.sampling.batches import BatchCounts
from pyg_mgpu.sampling.numbering import BatchIds, JointIds
from pyg_mgpu.sampling.walk_state import Drawn, PendingHop, WalkState

X, Y = ("a", "x", "b"), ("a", "y", "b")  # a hop's neighbours are all of "a", none of "b"


def two_type_graph():
    data = HeteroData()
    data["a"].num_nodes, data["b"].num_nodes = 12, 4
    data[X].edge_index = torch.tensor([[0, 1, 2], [0, 1, 2]])
    data[Y].edge_index = torch.tensor([[3, 4], [3, 0]])
    return NeighborSampler(data, {X: [1], Y: [1]}).graph


def two_hops(graph, batched: bool, deferred: bool) -> WalkState:
    """Seeds 3 and 5 of "a" (two batches when ``batched``), then two hops' draws into "a" over
    both edge types: repeats within and across them, seeds and the first hop's nodes among
    them. On the GPU's path (``deferred``) a hop is counted at the next one's read."""
    seed = {"a": torch.tensor([3, 5]), "b": torch.tensor([1])}
    if batched:
        ids = BatchIds(lambda t: graph.lookup(t, copies=2), graph.num_nodes,
                       {"a": torch.tensor([0, 1]), "b": torch.tensor([1])})
    else:
        ids = JointIds(graph.lookup)
    hops = [[(X, [5, 7, 7, 2], [0, 0, 1, 1]), (Y, [2, 9, 3], [1, 0, 0])],
            [(X, [7, 11], [1, 0]), (Y, [11, 3, 5], [0, 1, 1])]]
    state = WalkState(graph, ids, with_trees=batched, deferred=deferred)
    try:
        state.add_seeds(seed)
        for hop in hops:
            state.settle(host_ints(torch.cat(state.pending_counts())) if state.pending else [])
            state.number({"a": [Drawn(et, torch.tensor(nbr),
                                      torch.tensor(trees) if batched else None)
                                for et, nbr, trees in hop]})
            assert set(state.pending) == ({"a"} if deferred else set())  # "b" drew nothing
        state.settle(host_ints(torch.cat(state.pending_counts())) if state.pending else [])
        assert not state.pending
    finally:
        ids.close()
    return state


@pytest.mark.parametrize("batched", [False, True])
def test_a_settled_hop_is_the_hop_numbered_at_once(batched):
    graph = two_type_graph()
    at_once = two_hops(graph, batched, deferred=False)
    settled = two_hops(graph, batched, deferred=True)
    assert at_once.num_sampled_nodes == settled.num_sampled_nodes
    assert at_once.num_sampled_nodes == ({"a": [2, 5, 2], "b": [1, 0, 0]} if batched else
                                         {"a": [2, 3, 1], "b": [1, 0, 0]})
    for t in graph.node_types:
        assert torch.equal(at_once.cat(at_once.nodes[t]), settled.cat(settled.nodes[t]))
        if batched:
            assert torch.equal(at_once.cat(at_once.trees[t]), settled.cat(settled.trees[t]))
    for et in (X, Y):
        assert torch.equal(at_once.cat(at_once.rows[et]), settled.cat(settled.rows[et]))
    # The next hop draws for the new nodes only: on the GPU's path, the first positions.
    now, later = at_once.frontier["a"], settled.frontier["a"]
    assert torch.equal(now.nodes, later.nodes[later.active])
    assert torch.equal(now.local_ids(torch.arange(now.nodes.numel())),
                       later.local_ids(later.active.nonzero().squeeze(1)))
    assert now.nodes.tolist() == ([11, 3] if batched else [11])


def test_batch_counts_count_the_pending_hop_by_batch():
    # Two batches, one hop: seeds of batches 0, 1, 1; the hop's neighbours 4, 9 (twice), 8,
    # batch by batch as a walk draws them, new at positions 0, 1 and 3, of batches 0, 1 and 1;
    # edges into local nodes 0, 1, 2, 2.
    counts = BatchCounts(num_batches=2, num_hops=1)
    node, edge = "n", ("n", "to", "n")
    pending = {node: PendingHop(nbr=torch.tensor([4, 9, 9, 8]),
                                trees=torch.tensor([0, 1, 1, 1]),
                                first=torch.tensor([True, True, False, True]))}
    counts.receive(host_ints(counts.request({node: torch.tensor([0, 1, 1])}, pending,
                                            {edge: torch.tensor([0, 1, 2, 2])}, {node: [3]},
                                            {edge: [4]})))
    # Per batch its seeds and new nodes, then per batch its edges.
    assert counts.values == [1, 1, 2, 2, 1, 3]
