"""pyg_mgpu.NeighborLoader / NeighborSampler against PyG's semantics, on unsorted edge lists.

Features are ``arange`` and edge attributes a multiple of the edge id, so every gather can be
checked exactly against the caller's ``Data``.
"""
import copy
import itertools
import pickle

import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NodeSamplerInput

from pyg_mgpu.data.csc import cached_csc
from pyg_mgpu.sampling import weighted
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler


# The CPU selects keys with numpy's partition below weighted._PARTITION_MAX_THREADS threads,
# with topk from there on (as GPUs do): both must take the same columns.
BOTH_SELECTIONS = pytest.mark.parametrize("partition_max_threads", [10 ** 6, 1],
                                          ids=["numpy", "topk"])


def random_graph(num_nodes=200, num_edges=2000, dtype=torch.long, seed=0):
    """Distinct random edges in random (unsorted) order, with arange features/attributes."""
    gen = torch.Generator().manual_seed(seed)
    pairs = torch.randperm(num_nodes * num_nodes, generator=gen)[:num_edges]
    edge_index = torch.stack([pairs // num_nodes, pairs % num_nodes]).to(dtype)
    assert (edge_index[1, 1:] < edge_index[1, :-1]).any(), "must be unsorted"
    return Data(x=torch.arange(num_nodes), edge_index=edge_index,
                edge_attr=torch.arange(num_edges) * 10, num_nodes=num_nodes)


def global_edges(batch):
    """(source, destination) of each batch edge in the caller's node ids."""
    return batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]


def check_names_callers_edges(data, batch):
    src, dst = global_edges(batch)
    ei = data.edge_index.long()
    assert torch.equal(ei[0, batch.e_id], src) and torch.equal(ei[1, batch.e_id], dst)
    assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    assert torch.equal(batch.x, data.x[batch.n_id])


def in_degree(data):
    return torch.bincount(data.edge_index[1].long(), minlength=data.num_nodes)


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
@pytest.mark.parametrize("options", [{}, {"replace": True}, {"disjoint": True},
                                     {"subgraph_type": "induced"}])
def test_batches_name_the_callers_nodes_and_edges(dtype, options):
    data = random_graph(dtype=dtype)
    loader = NeighborLoader(data, [4, 3], batch_size=32, seed=0, **options)
    assert str(loader) == "NeighborLoader()"
    assert len(loader) == 7
    seen = []
    for batch in loader:
        check_names_callers_edges(data, batch)
        assert batch.batch_size == batch.input_id.numel()
        assert torch.equal(batch.n_id[:batch.batch_size], batch.input_id)  # seeds first
        assert batch.edge_index.max() < batch.num_nodes
        # As PyG's: indices keep the graph's integer type; edge ids are int64.
        assert batch.edge_index.dtype == batch.n_id.dtype == dtype
        assert batch.e_id.dtype == torch.long
        assert (batch.batch is not None) == bool(options.get("disjoint"))
        seen.append(batch.input_id)
    assert torch.equal(torch.cat(seen), torch.arange(data.num_nodes))


def check_per_hop(data, batch, fanouts):
    """Per-hop counts add up; each hop's destinations are the previous hop's new nodes, grouped
    in order; each keeps min(degree, fanout) distinct in-edges."""
    deg = in_degree(data)
    assert sum(batch.num_sampled_nodes) == batch.num_nodes
    assert sum(batch.num_sampled_edges) == batch.num_edges
    assert batch.n_id.unique().numel() == batch.num_nodes
    node_start = edge_start = 0
    for hop, k in enumerate(fanouts):
        n_front, n_edges = batch.num_sampled_nodes[hop], batch.num_sampled_edges[hop]
        col = batch.edge_index[1, edge_start:edge_start + n_edges]
        assert ((col >= node_start) & (col < node_start + n_front)).all()
        assert (col[1:] >= col[:-1]).all(), "edges grouped by destination, in node order"
        frontier = batch.n_id[node_start:node_start + n_front]
        counts = torch.bincount(col - node_start, minlength=n_front)
        assert torch.equal(counts, deg[frontier].clamp(max=k))
        e_id = batch.e_id[edge_start:edge_start + n_edges]
        pairs = col * data.num_edges + e_id
        assert pairs.unique().numel() == pairs.numel(), "an edge drawn twice for a node"
        node_start += n_front
        edge_start += n_edges


def test_per_hop_counts_and_fanouts():
    data = random_graph()
    for batch in NeighborLoader(data, [5, 3], batch_size=40, seed=1):
        check_per_hop(data, batch, [5, 3])


def test_full_neighbourhood_is_every_in_edge_in_the_callers_order():
    data = random_graph()
    batch = NeighborLoader(data, [-1], batch_size=10, seed=0)([3, 1, 4])
    ei = data.edge_index
    expected = torch.cat([(ei[1] == v).nonzero().view(-1) for v in (3, 1, 4)])
    assert torch.equal(batch.e_id, expected)  # by destination in seed order, then input order
    check_names_callers_edges(data, batch)


def test_bidirectional_is_the_sampled_edges_plus_their_reverses():
    data = random_graph()
    seeds = torch.arange(30)
    directional = NeighborSampler(data, [4, 3], seed=5).sample(seeds)
    both = NeighborSampler(data, [4, 3], subgraph_type="bidirectional", seed=5).sample(seeds)
    assert torch.equal(directional.node, both.node)

    def pairs(out):
        return set(zip(out.node[out.row].tolist(), out.node[out.col].tolist()))
    one_way = pairs(directional)
    assert pairs(both) == one_way | {(d, s) for s, d in one_way}
    assert both.num_sampled_nodes is None and both.num_sampled_edges is None  # as PyG


def test_induced_is_every_edge_among_the_sampled_nodes():
    data = random_graph()
    for batch in NeighborLoader(data, [3, 2], batch_size=50, subgraph_type="induced", seed=2):
        inside = torch.zeros(data.num_nodes, dtype=torch.bool)
        inside[batch.n_id] = True
        expected = (inside[data.edge_index[0]] & inside[data.edge_index[1]]).nonzero().view(-1)
        assert torch.equal(batch.e_id.sort().values, expected)
        check_names_callers_edges(data, batch)


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_induced_order_on_graphs_with_isolated_nodes(dtype):
    """Induced edges grouped by destination in node order, then in CSC order, also where
    sampled nodes have no in-edges (empty runs) and on an edgeless graph."""
    for seed, num_edges in ((0, 600), (1, 40), (2, 0)):
        data = random_graph(num_nodes=300, num_edges=max(num_edges, 40), dtype=dtype, seed=seed)
        data.edge_index, data.edge_attr = data.edge_index[:, :num_edges], None
        sampler = NeighborSampler(data, [4, 4], subgraph_type="induced", seed=seed)
        out = sampler.sample(torch.arange(0, 300, 7))
        node = out.node.long()
        # out.edge holds CSC positions; the permutation names the caller's edges.
        e_id = out.edge if sampler.perm is None else sampler.perm.long()[out.edge]
        inside = torch.full((300,), -1)
        inside[node] = torch.arange(node.numel())
        # The expected list: for each sampled node in order, its in-edges (in the caller's
        # order, which the CSC keeps per destination) whose source was sampled.
        src, dst = data.edge_index.long()
        expected = [e for v in node.tolist() for e in (dst == v).nonzero().view(-1).tolist()
                    if inside[src[e]] >= 0]
        assert e_id.tolist() == expected
        assert torch.equal(out.col, inside[dst[e_id]]) and torch.equal(out.row, inside[src[e_id]])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_runs_match_ranges_and_repeats_built_by_loops(dtype):
    from pyg_mgpu.sampling.induced import _runs
    generator = torch.Generator().manual_seed(0)
    for n in (0, 1, 5, 40):
        length = torch.randint(0, 4, (n,), generator=generator)
        length[::3] = 0  # empty runs, also first and last
        total = int(length.sum())
        start = torch.randint(0, 1000, (n,), generator=generator)
        expected = [list(range(s, s + k)) for s, k in zip(start.tolist(), length.tolist())]
        got = _runs(start.to(dtype), length, step=1, total=total)
        assert got.dtype == dtype and got.tolist() == sum(expected, [])
        values = torch.randint(-9, 9, (n,), generator=generator)
        assert torch.equal(_runs(values, length, step=0, total=total),
                           values.repeat_interleave(length))


def test_disjoint_gives_every_seed_its_own_tree():
    # Seeds 0 and 1 share in-neighbour 2; 2's in-neighbour is 3.
    data = Data(edge_index=torch.tensor([[2, 2, 3], [0, 1, 2]]), num_nodes=4)
    out = NeighborSampler(data, [-1, -1], disjoint=True).sample(torch.tensor([0, 1]))
    assert out.node.tolist() == [0, 1, 2, 2, 3, 3]
    assert out.batch.tolist() == [0, 1, 0, 1, 0, 1]
    assert out.num_sampled_nodes == [2, 2, 2] and out.num_sampled_edges == [2, 2]
    # Every edge stays inside its seed's tree.
    assert torch.equal(out.batch[out.row], out.batch[out.col])
    joint = NeighborSampler(data, [-1, -1]).sample(torch.tensor([0, 1]))
    assert joint.node.tolist() == [0, 1, 2, 3]


def test_a_repeated_seed_is_known_by_its_first_position():
    # Edges 1->0, 2->0, 3->1, 0->2; seeds [0, 0, 1]: the edge 0->2 names seed 0 at position 0.
    data = Data(edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 1, 2]]), num_nodes=4)
    out = NeighborSampler(data, [-1, -1]).sample(torch.tensor([0, 0, 1]))
    hop2 = slice(out.num_sampled_edges[0], None)
    assert out.node[:3].tolist() == [0, 0, 1]
    assert out.row[hop2].tolist() == [0]


@pytest.mark.parametrize("kind", ["data", "hetero"])
def test_repeated_seeds_covering_the_graph_leave_each_node_once(kind):
    # Seeds [0, 0] of a 2-node graph: the batch's local ids (0, 1, then 2 for node 1) pass the
    # node count, and must still read as known, not as a new node.
    edge_index = torch.tensor([[1, 1], [0, 1]])  # 1->0, 1->1
    seeds = torch.tensor([0, 0])
    if kind == "data":
        out = NeighborSampler(Data(edge_index=edge_index, num_nodes=2), [-1, -1]).sample(seeds)
        node, row, col = out.node, out.row, out.col
    else:
        data = HeteroData()
        data["p"].num_nodes = 2
        data["p", "r", "p"].edge_index = edge_index
        out = NeighborSampler(data, [-1, -1]).sample_from_nodes(
            NodeSamplerInput(None, seeds, input_type="p"))
        node, row, col = out.node["p"], out.row[("p", "r", "p")], out.col[("p", "r", "p")]
    assert node.tolist() == [0, 0, 1]
    assert row.tolist() == [2, 2, 2] and col.tolist() == [0, 1, 2]
    assert (out.num_sampled_nodes if kind == "data" else out.num_sampled_nodes["p"]) == [2, 1, 0]


def test_disjoint_keeps_repeated_seeds_apart():
    data = random_graph()
    seeds = torch.tensor([7, 7, 9])
    out = NeighborSampler(data, [3, 2], disjoint=True, seed=0).sample(seeds)
    keys = out.batch * data.num_nodes + out.node
    assert keys.unique().numel() == keys.numel(), "a (seed, node) pair appears twice"
    assert out.node[:3].tolist() == [7, 7, 9] and out.batch[:3].tolist() == [0, 1, 2]
    assert torch.equal(out.batch[out.row], out.batch[out.col])


def test_disjoint_keys_of_every_width_give_the_same_trees():
    # 1024 trees over 2**21 nodes no longer fit (tree, node) keys in int32: the int64 keys must
    # give the trees that the int32 keys give on the same edges without the isolated nodes.
    small = random_graph()
    padded = Data(edge_index=small.edge_index, num_nodes=2**21)
    seeds = torch.randint(small.num_nodes, (1024,), generator=torch.Generator().manual_seed(0))
    outs = [NeighborSampler(graph, [3, 2], disjoint=True, seed=0).sample(seeds)
            for graph in (small, padded)]
    for name in ("node", "batch", "row", "col", "edge"):
        assert torch.equal(getattr(outs[0], name), getattr(outs[1], name)), name


def star(num_leaves, num_centres=1):
    """Centres 0..c-1 each have the same in-neighbours c..c+L-1, listed in reverse order."""
    leaves = torch.arange(num_centres, num_centres + num_leaves).flip(0)
    src = leaves.repeat(num_centres)
    dst = torch.arange(num_centres).repeat_interleave(num_leaves)
    return torch.stack([src, dst]), num_centres + num_leaves


def check_three_of_eight_uniform(out, p_min=1e-3) -> None:
    """3 of each of 3000 centres' 8 leaves, drawn without replacement: distinct, every leaf
    equally likely, and every one of the 56 subsets equally likely (chi-square)."""
    picked = (out.node[out.row].view(3000, 3).sort(1).values - 3000).cpu()
    assert (picked[:, 1:] > picked[:, :-1]).all(), "a neighbour drawn twice"
    assert chisquare(torch.bincount(picked.view(-1), minlength=8).numpy()).pvalue > p_min
    index = {s: i for i, s in enumerate(itertools.combinations(range(8), 3))}
    codes = torch.tensor([index[tuple(s)] for s in picked.tolist()])
    assert chisquare(torch.bincount(codes, minlength=len(index)).numpy()).pvalue > p_min


def test_uniform_without_replacement_on_an_unsorted_graph():
    edge_index, n = star(8, num_centres=3000)
    perm = torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(0))
    data = Data(edge_index=edge_index[:, perm], num_nodes=n)
    check_three_of_eight_uniform(NeighborSampler(data, [3], seed=0).sample(torch.arange(3000)))


def test_replace_draws_fanout_times_uniformly():
    edge_index, n = star(3, num_centres=2000)
    data = Data(edge_index=edge_index, num_nodes=n)
    out = NeighborSampler(data, [5], replace=True, seed=0).sample(torch.arange(2000))
    assert out.num_sampled_edges == [2000 * 5]  # 5 draws even from 3 neighbours
    picked = out.node[out.row] - 2000
    assert chisquare(torch.bincount(picked, minlength=3).numpy()).pvalue > 1e-3
    per_centre = picked.view(2000, 5).sort(1).values
    assert (per_centre[:, 1:] == per_centre[:, :-1]).any(), "no repeats: not with replacement"


WEIGHTS = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])


def weighted_star(num_centres):
    edge_index, n = star(len(WEIGHTS), num_centres)
    # Leaf c + i is listed at position L - 1 - i of each centre: weight it WEIGHTS[i].
    weight = WEIGHTS.flip(0).repeat(num_centres)
    perm = torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(1))
    data = Data(edge_index=edge_index[:, perm], weight=weight[perm], num_nodes=n)
    return data, num_centres


@pytest.mark.parametrize("replace", [False, True])
def test_weighted_single_draws_are_proportional_to_weight(replace):
    data, c = weighted_star(4000)
    out = NeighborSampler(data, [1], weight_attr="weight", replace=replace,
                          seed=0).sample(torch.arange(c))
    leaf = out.node[out.row] - c
    counts = torch.bincount(leaf, minlength=len(WEIGHTS)).double()
    assert counts[4] == 0, "a weight-0 edge was drawn"
    expected = WEIGHTS[:4].double() / WEIGHTS.sum() * c
    assert chisquare(counts[:4].numpy(), expected.numpy()).pvalue > 1e-3


def test_weighted_pairs_follow_successive_draws_without_replacement():
    data, c = weighted_star(6000)
    out = NeighborSampler(data, [2], weight_attr="weight", seed=0).sample(torch.arange(c))
    pairs = (out.node[out.row] - c).view(c, 2).sort(1).values
    assert (pairs[:, 0] != pairs[:, 1]).all()
    w, total = WEIGHTS.double(), float(WEIGHTS.sum())
    combos = list(itertools.combinations(range(4), 2))
    # P({i, j}) = w_i / W * w_j / (W - w_i) + w_j / W * w_i / (W - w_j)
    expected = torch.tensor([w[i] / total * w[j] / (total - w[i]) +
                             w[j] / total * w[i] / (total - w[j]) for i, j in combos]) * c
    index = {p: k for k, p in enumerate(combos)}
    codes = torch.tensor([index[tuple(p)] for p in pairs.tolist()])
    counts = torch.bincount(codes, minlength=len(combos)).double()
    assert chisquare(counts.numpy(), expected.numpy() * counts.sum().item()
                     / expected.sum().item()).pvalue > 1e-3


def centres_of_degrees(degree, leaf_weight, shuffle_seed=None):
    """Centre ``v`` (ids ``0..C-1``) has the in-neighbours leaves ``0..degree[v]-1`` (ids
    ``C + leaf``), leaf ``j`` weighted ``leaf_weight[j]``; the edge list is shuffled when a
    seed is given."""
    num_centres = degree.numel()
    leaf = torch.cat([torch.arange(d) for d in degree.tolist()])
    centre = torch.arange(num_centres).repeat_interleave(degree)
    edge_index, weight = torch.stack([leaf + num_centres, centre]), leaf_weight[leaf]
    if shuffle_seed is not None:
        perm = torch.randperm(leaf.numel(), generator=torch.Generator().manual_seed(shuffle_seed))
        edge_index, weight = edge_index[:, perm], weight[perm]
    return Data(edge_index=edge_index, weight=weight, num_nodes=num_centres + len(leaf_weight))


def drawn_leaves(data, degree, fanout):
    """``[centres, fanout]`` leaves each centre drew (sorted), checked to be its own and
    distinct; the draws run where ``data`` is."""
    num_centres = degree.numel()
    out = NeighborSampler(data, [fanout], weight_attr="weight", seed=0).sample(
        torch.arange(num_centres, device=data.edge_index.device))
    dst, src = out.node[out.col].cpu(), out.node[out.row].cpu() - num_centres
    assert torch.equal(dst, torch.arange(num_centres).repeat_interleave(fanout))
    assert (src < degree[dst]).all(), "drew an edge that is not the node's own"
    picks = src.view(num_centres, fanout).sort(1).values
    assert (picks[:, 1:] > picks[:, :-1]).all(), "an edge drawn twice"
    return picks


@pytest.mark.parametrize("padding_budget", [0, 10 ** 9])
def test_weighted_pairs_are_exact_for_mixed_degrees_sharing_key_matrices(padding_budget,
                                                                         monkeypatch):
    """Weighted draws read each node's edges as a row of the CSC weights into key matrices
    that nodes of nearby degrees share (budget 0: one matrix per degree; a huge budget: one
    matrix for all, padded to the largest degree). The padding (the next node's edges, or the
    zeros past the last node) must never be drawn, and every degree must still get exact
    successive draws."""
    monkeypatch.setattr(weighted, "_PADDING_BUDGET_CPU", padding_budget)
    check_successive_draws_for_mixed_degrees(lambda data: data)


def successive_draw_probability(weight, subset):
    """Probability that drawing ``len(subset)`` edges one at a time, each proportionally to
    the remaining weights, takes exactly ``subset``: the sum over the orders it can come in."""
    total = float(weight.sum())
    probability = 0.0
    for order in itertools.permutations(subset):
        p, left = 1.0, total
        for i in order:
            p, left = p * float(weight[i]) / left, left - float(weight[i])
        probability += p
    return probability


def check_successive_draws_for_mixed_degrees(place, degrees=range(3, 9),
                                             weights=torch.arange(1.0, 9.0), per_degree=3000,
                                             fanout=2, p_min=1e-3):
    """The sets of ``fanout`` leaves drawn from nodes of the given degrees (neighbours in the
    CSC differ in degree), leaf ``j`` weighted ``weights[j]``, on a shuffled edge list placed
    by ``place``, follow successive draws for every degree (chi-square over all subsets)."""
    degree = torch.tensor(list(degrees)).repeat(per_degree)
    data = place(centres_of_degrees(degree, weights, shuffle_seed=2))
    picks = drawn_leaves(data, degree, fanout)
    for d in degrees:
        subsets = list(itertools.combinations(range(d), fanout))
        expected = torch.tensor([successive_draw_probability(weights[:d].double(), subset)
                                 for subset in subsets], dtype=torch.float64)
        assert abs(float(expected.sum()) - 1) < 1e-9
        index = {subset: k for k, subset in enumerate(subsets)}
        codes = torch.tensor([index[tuple(p)] for p in picks[degree == d].tolist()])
        counts = torch.bincount(codes, minlength=len(subsets)).double()
        assert chisquare(counts.numpy(), (expected * per_degree).numpy()).pvalue > p_min, d


def test_weighted_takes_zero_weights_only_to_fill():
    data, c = weighted_star(10)
    out = NeighborSampler(data, [5], weight_attr="weight", seed=0).sample(torch.arange(c))
    assert out.num_sampled_edges == [50]  # degree 5 <= fanout: every edge, weight 0 included
    out = NeighborSampler(data, [4], weight_attr="weight", seed=0).sample(torch.arange(c))
    assert ((out.node[out.row] - c) != 4).all()


@BOTH_SELECTIONS
def test_weighted_fills_with_the_first_zero_weight_edges_in_the_callers_order(
        partition_max_threads, monkeypatch):
    """As docs/api.md says: a node short of positive weights takes its weight-0 edges in the
    order of the caller's edge_index (ties of keys go to the lower column)."""
    monkeypatch.setattr(weighted, "_PARTITION_MAX_THREADS", partition_max_threads)
    # Node 0's in-edges from 1..6, listed in a scrambled order; only the edge from 4 weighs.
    src = torch.tensor([5, 2, 4, 6, 1, 3])
    data = Data(edge_index=torch.stack([src, torch.zeros(6, dtype=torch.long)]),
                weight=(src == 4).float(), num_nodes=7)
    for seed in range(5):
        out = NeighborSampler(data, [3], weight_attr="weight", seed=seed).sample(
            torch.tensor([0]))
        assert sorted(out.node[out.row].tolist()) == [2, 4, 5]


@pytest.mark.parametrize("padding_budget", [0, 10 ** 9])
def test_weighted_fills_with_zero_weights_never_with_padding(padding_budget, monkeypatch):
    """A node with fewer positive weights than the fanout is filled with its weight-0 edges,
    even when it shares a padded key matrix with wider nodes."""
    monkeypatch.setattr(weighted, "_PADDING_BUDGET_CPU", padding_budget)
    degree = torch.tensor([4, 5, 6, 7]).repeat(50)
    leaf_weight = torch.tensor([1.0, 0, 0, 0, 0, 0, 0])  # leaf 0 alone is positive
    picks = drawn_leaves(centres_of_degrees(degree, leaf_weight), degree, 3)
    assert (picks[:, 0] == 0).all()


@BOTH_SELECTIONS
@pytest.mark.parametrize("width, k", [(11, 10), (20, 10), (80, 25), (3, 1)])
def test_k_smallest_columns_are_each_rows_k_smallest(width, k, partition_max_threads,
                                                     monkeypatch):
    """The key selection returns each row's k smallest entries, whatever their signs, ties
    and the padding value, and of equal entries the lower columns."""
    monkeypatch.setattr(weighted, "_PARTITION_MAX_THREADS", partition_max_threads)
    generator = torch.Generator().manual_seed(width)
    keys = torch.randint(-2**31, 2**31 - 1, (500, width), dtype=torch.int32,
                         generator=generator)
    keys[:100] = torch.randint(-3, 3, (100, width), dtype=torch.int32)  # many ties
    keys[100:200, width // 2:] = torch.tensor(1.0).view(torch.int32)  # padding
    columns = torch.empty(500, k, dtype=torch.long)
    weighted._k_smallest_columns(keys, k, out=columns)
    assert ((columns >= 0) & (columns < width)).all()
    chosen = columns.sort(1).values
    assert (chosen[:, 1:] > chosen[:, :-1]).all(), "a column chosen twice"
    expected = keys.sort(1).values[:, :k]
    assert torch.equal(keys.gather(1, columns).sort(1).values, expected)
    # Ties: (key, column) sorted stably by key gives the columns to take.
    stable = keys.sort(dim=1, stable=True).indices[:, :k].sort(1).values
    assert torch.equal(chosen, stable)


def test_log_uniform_is_log_of_a_centred_grid_in_zero_one():
    """Every draw is within float32 rounding of log((j + 1/2) / 2^23) for an integer j in
    [0, 2^23): finite and below 0, the grid centred (an off-centre or unshifted grid fails
    the bound for small j, or gives log(0))."""
    generator = torch.Generator().manual_seed(0)
    log_u = weighted._log_uniform(2 ** 21, generator, torch.device("cpu")).double()
    # Recover each draw's grid index j from its value, then check it against the formula.
    j = (log_u.exp() * 2 ** 23 - 0.5).round()
    assert ((j >= 0) & (j < 2 ** 23)).all()
    exact = torch.log((j + 0.5) / 2 ** 23)
    assert ((log_u - exact).abs() <= 1.5e-7 * exact.abs()).all()
    assert (log_u < 0).all() and torch.isfinite(log_u).all()


def rows_drawn_by_rejection(monkeypatch):
    """A list that collects how many nodes each call of the rejection draws served."""
    rows, original = [], weighted._weighted_by_rejection

    def spy(weight, bound, start, deg, k, generator):
        rows.append(deg.numel())
        return original(weight, bound, start, deg, k, generator)
    monkeypatch.setattr(weighted, "_weighted_by_rejection", spy)
    return rows


@pytest.mark.parametrize("tries_per_draw", [3, 1])
def test_weighted_pairs_are_exact_by_rejection(tries_per_draw, monkeypatch):
    """Nodes with many in-edges of similar weights draw by rejection (tries with replacement,
    the first distinct edges kept), the others by keys. Both must give successive draws, also
    when a round repeats edges among its tries, and when most nodes need several rounds (the
    second case, with one try per missing draw)."""
    monkeypatch.setattr(weighted, "_REJECTION_MIN_DEGREE", 0)  # fanout 2: degree 16 and up
    monkeypatch.setattr(weighted, "_REJECTION_TRIES_PER_DRAW", tries_per_draw)
    rows = rows_drawn_by_rejection(monkeypatch)
    check_successive_draws_for_mixed_degrees(lambda data: data, degrees=(6, 16, 20),
                                             weights=torch.linspace(1, 3, 20), per_degree=6000)
    assert sum(rows) == 2 * 6000, "the nodes of degree 16 and 20 must draw by rejection"


@pytest.mark.parametrize("fanout, degrees", [(3, (5, 8)), (4, (6, 8))])
def test_weighted_draws_of_three_and_four_are_exact_by_rejection(fanout, degrees,
                                                                  monkeypatch):
    """Sets of three and four draws (every subset's frequency against successive draws),
    with the smaller degree on keys and the larger by rejection, where a node's last draws
    take many tries."""
    monkeypatch.setattr(weighted, "_REJECTION_MIN_DEGREE", 0)
    monkeypatch.setattr(weighted, "_REJECTION_DEGREE_PER_DRAW", 2)  # degree 2 * fanout and up
    rows = rows_drawn_by_rejection(monkeypatch)
    check_successive_draws_for_mixed_degrees(lambda data: data, degrees=degrees,
                                             weights=torch.linspace(1, 3, 8), per_degree=6000,
                                             fanout=fanout)
    assert sum(rows) == 6000, "the nodes of degree 8 must draw by rejection"


@pytest.mark.parametrize("fanout", [2, 10])
def test_the_default_thresholds_send_nodes_with_many_even_edges_to_rejection(fanout,
                                                                             monkeypatch):
    """Unpatched thresholds: a node draws by rejection from max(64, 8 * fanout) in-edges on,
    and only where its mean weight is at least 1/4 of its largest."""
    rows = rows_drawn_by_rejection(monkeypatch)
    threshold = max(weighted._REJECTION_MIN_DEGREE, weighted._REJECTION_DEGREE_PER_DRAW * fanout)
    even, uneven = torch.ones(threshold), torch.ones(threshold)
    uneven[0] = 5.0 * threshold  # mean / largest just below 1/5
    for leaf_weight, by_rejection in ((even, 40), (uneven, 0)):
        rows.clear()
        degree = torch.tensor([threshold - 1, threshold]).repeat(40)
        drawn_leaves(centres_of_degrees(degree, leaf_weight, shuffle_seed=5), degree, fanout)
        assert sum(rows) == by_rejection


def test_rejection_never_draws_weight_zero(monkeypatch):
    monkeypatch.setattr(weighted, "_REJECTION_MIN_DEGREE", 0)  # fanout 4: degree 32 and up
    rows = rows_drawn_by_rejection(monkeypatch)
    degree = torch.full((500,), 32)
    leaf_weight = torch.cat([torch.zeros(8), torch.ones(24)])  # mean / largest = 3/4
    picks = drawn_leaves(centres_of_degrees(degree, leaf_weight, shuffle_seed=3), degree, 4)
    assert sum(rows) == 500 and (picks >= 8).all()


def test_rejection_draws_each_disjoint_tree_apart(monkeypatch):
    """With disjoint trees one node is drawn for several times in a hop; each time must get
    its own distinct edges, not share what another tree took."""
    monkeypatch.setattr(weighted, "_REJECTION_MIN_DEGREE", 0)  # fanout 4: degree 32 and up
    rows = rows_drawn_by_rejection(monkeypatch)
    data = centres_of_degrees(torch.tensor([32]), torch.ones(32), shuffle_seed=4)
    out = NeighborSampler(data, [4], weight_attr="weight", disjoint=True, seed=0).sample(
        torch.zeros(300, dtype=torch.long))
    assert sum(rows) == 300
    leaves = (out.node[out.row] - 1).view(300, 4).sort(1).values
    assert torch.equal(out.batch[out.row], torch.arange(300).repeat_interleave(4))
    assert (leaves[:, 1:] > leaves[:, :-1]).all(), "an edge drawn twice in one tree"
    # Equal weights: every leaf is in a tree's draw with probability 4/32.
    counts = torch.bincount(leaves.view(-1), minlength=32).double()
    assert chisquare(counts.numpy()).pvalue > 1e-3


def test_rejection_bounds_are_the_largest_weight_of_nodes_that_suit_it():
    weight = torch.tensor([0.0, 0.0, 2, 2, 2, 10, 1, 1, 1, 10, 0, 0, 0, 0])
    colptr = torch.tensor([0, 0, 2, 5, 9, 14])
    # No in-edges; all weight 0; equal; mean / largest 13/40; mean / largest 10/50 < 1/4.
    assert weighted.rejection_bounds(weight, colptr).tolist() == [0, 0, 2, 10, 0]


def test_one_csc_per_graph_shared_by_loaders_and_kept_through_pickling():
    data = random_graph()
    a = NeighborLoader(data, [3], batch_size=8)
    b = NeighborLoader(data, [5, 2], batch_size=16)
    assert a.node_sampler.csc is b.node_sampler.csc is cached_csc(data)
    clone = pickle.loads(pickle.dumps(data))  # as a spawned rank receives it
    assert cached_csc(clone) is not None
    assert NeighborLoader(clone, [3], batch_size=8).node_sampler.csc is cached_csc(clone)
    batch = next(iter(a))
    assert cached_csc(batch) is None, "batches must not carry the graph's CSC"
    data.edge_index = data.edge_index.flip(0)  # a new edge list: the cache is stale
    assert cached_csc(data) is None
    check_names_callers_edges(data, next(iter(NeighborLoader(data, [3], batch_size=8))))


@pytest.mark.parametrize("hetero", [False, True])
def test_pygs_loader_on_our_sampler_gets_int64_edge_ids(hetero):
    # PyG's loader takes the sampler's edge permutation as e_id, and PyG's is int64.
    from torch_geometric.loader import NeighborLoader as PyGNeighborLoader

    from pyg_mgpu.seeds import rank_seed

    data = random_graph()
    if hetero:
        data = data.to_heterogeneous(node_type_names=["v"], edge_type_names=[("v", "e", "v")])
    seeds = ("v", None) if hetero else None
    ours = NeighborLoader(data, [3, 2], input_nodes=seeds, batch_size=8, seed=3)
    theirs = PyGNeighborLoader(data, [3, 2], input_nodes=seeds, batch_size=8,
                               neighbor_sampler=NeighborSampler(data, [3, 2],
                                                                seed=rank_seed(3, 0)))
    a, b = next(iter(ours)), next(iter(theirs))
    for store_a, store_b in zip(a.edge_stores, b.edge_stores):
        assert store_b.e_id.dtype == torch.long
        assert torch.equal(store_a.e_id, store_b.e_id)
    if not hetero:
        # The int64 copy is made once, in shared memory for DataLoader workers to share; the
        # package's own loaders widen e_id per batch and keep the int32 permutation alone.
        assert NeighborSampler(data, [3], share_memory=True).edge_permutation.is_shared()
        assert ours.node_sampler.edge_permutation.dtype == torch.int32


@pytest.mark.parametrize("kind", ["node", "link"])
def test_a_transform_sees_pygs_batch_and_may_return_anything(kind):
    # PyG applies the transform last and returns what it returns; the batch it is given has
    # an int64 e_id (PyG's edge permutation is int64) and no cached CSC of ours.
    from pyg_mgpu.sampling.link_neighbor_loader import LinkNeighborLoader

    data = random_graph()
    seen = []

    def transform(batch):
        seen.append((batch.e_id.dtype, cached_csc(batch)))
        return batch.n_id, batch.e_id

    def loader(**kwargs):
        if kind == "node":
            return NeighborLoader(data, [3, 2], batch_size=8, seed=3, **kwargs)
        return LinkNeighborLoader(data, [3, 2], batch_size=8, seed=3, **kwargs)

    plain = next(iter(loader()))
    n_id, e_id = next(iter(loader(transform=transform)))
    assert seen == [(torch.long, None)]
    assert torch.equal(n_id, plain.n_id) and torch.equal(e_id, plain.e_id)
    assert e_id.dtype == plain.e_id.dtype == torch.long
    assert cached_csc(plain) is None

    # Assigned after construction, as PyG allows, it still runs after the widening.
    later = loader()
    later.transform = transform
    n_id, e_id = next(iter(later))
    assert seen[-1] == (torch.long, None) and e_id.dtype == torch.long
    assert later.transform.transform is transform


@pytest.mark.parametrize("kwargs,error,says", [
    ({"input_nodes": torch.tensor([0, 200])}, ValueError, "input_nodes holds node ids from 0 to 200"),
    ({"input_nodes": torch.tensor([-1, 3])}, ValueError, "ids run from 0 to 199"),
    ({"input_nodes": torch.ones(150, dtype=torch.bool)}, ValueError, "a mask of 150 entries"),
    ({"input_nodes": torch.tensor([1.0, 2.0])}, TypeError, "torch.float32 values"),
    ({"input_nodes": torch.tensor([[1, 2]])}, ValueError, "shape (1, 2)"),
    ({"num_neighbors": 10}, TypeError, "num_neighbors takes integer counts"),
    ({"num_neighbors": [10.5, 5]}, TypeError, "got [10.5, 5]"),
    ({"num_neighbors": {("a", "to", "b"): [2]}}, ValueError, "the graph is homogeneous"),
    ({"num_neighbors": torch.ones(200, dtype=torch.bool)}, TypeError,
     "a node mask: the seeds go in input_nodes"),  # NeighborLoader(data, mask, [10, 10])
])
def test_bad_seeds_and_fanouts_are_named_when_the_loader_is_built(kwargs, error, says):
    # PyG's loader takes them and fails mid-epoch (an anonymous IndexError), or trains on
    # part of a short mask without a word.
    kwargs = {"num_neighbors": [3], **kwargs}
    with pytest.raises(error) as raised:
        NeighborLoader(random_graph(), batch_size=8, **kwargs)
    assert says in str(raised.value)


def test_heterogeneous_seeds_name_their_node_type():
    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(6, 2), torch.randn(4, 2)
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 3], [2, 5, 0]])
    with pytest.raises(ValueError, match=r"a tensor without its node type\. The graph's node "
                                         r"types are \['paper', 'author'\]"):
        NeighborLoader(data, [2], input_nodes=torch.arange(3), batch_size=2)
    with pytest.raises(ValueError, match=r"input_nodes names node type 'papers', but the graph "
                                         r"has no node type 'papers'"):
        NeighborLoader(data, [2], input_nodes=("papers", torch.arange(3)), batch_size=2)
    batch = next(iter(NeighborLoader(data, [2], input_nodes=("paper", torch.arange(3)),
                                     batch_size=3)))
    assert batch["paper"].batch_size == 3


def test_a_long_bad_argument_is_shown_short():
    with pytest.raises(TypeError) as raised:
        NeighborLoader(random_graph(), [0.5] * 100_000, batch_size=8)
    assert len(str(raised.value)) < 300


def test_set_epoch_takes_integers_and_integer_tensors():
    loader = NeighborLoader(random_graph(), [2], batch_size=8, distributed=True, rank=0,
                            world_size=2)
    loader.set_epoch(torch.tensor(3))  # as restored from a checkpoint
    by_tensor = [b.n_id[:b.batch_size] for b in loader]
    loader.set_epoch(3)
    assert all(torch.equal(a, b.n_id[:b.batch_size]) for a, b in zip(by_tensor, loader))
    for bad in ("1", 1.5):
        with pytest.raises(TypeError, match="set_epoch takes the epoch as an integer"):
            loader.set_epoch(bad)


def test_too_few_input_nodes_for_the_ranks_are_refused_when_the_loader_is_built():
    with pytest.raises(ValueError, match="at least one of 2 input nodes; shard them over at "
                                         "most 2 ranks"):
        NeighborLoader(random_graph(), [2], input_nodes=[3, 7], batch_size=2,
                       distributed=True, rank=0, world_size=3)


def test_valid_seeds_and_fanouts_in_every_form_pass():
    import numpy as np
    data = random_graph()
    mask = torch.zeros(200, dtype=torch.bool)
    mask[[3, 7]] = True
    for kwargs in ({"input_nodes": mask}, {"input_nodes": [3, 7]},
                   {"input_nodes": torch.tensor([3, 7], dtype=torch.int32)},
                   {"num_neighbors": (2, 1)}, {"num_neighbors": torch.tensor([2, 1])},
                   {"num_neighbors": list(np.array([2, 1]))}, {"num_neighbors": [-1]}):
        kwargs = {"num_neighbors": [2], "input_nodes": [3, 7], **kwargs}
        batch = next(iter(NeighborLoader(data, batch_size=2, **kwargs)))
        assert batch.n_id[:2].tolist() == [3, 7]


def test_a_graph_changed_in_place_after_a_loader_was_built_is_sampled_as_it_is_now():
    # PyG builds its sampler's inputs from the graph for every loader: so do we, where the
    # cached ones no longer describe it (torch counts each tensor's in-place changes).
    data = Data(x=torch.arange(7), edge_index=torch.tensor([[1, 2, 3], [0, 0, 0]]),
                edge_attr=torch.arange(3), w=torch.ones(3), t=torch.zeros(7, dtype=torch.long))
    NeighborLoader(data, [-1], batch_size=1)
    NeighborLoader(data, [1], batch_size=1, weight_attr="w")
    NeighborLoader(data, [-1], batch_size=1, time_attr="t", input_time=torch.tensor([5]))
    kept = pickle.loads(pickle.dumps(data))  # a copy counts its own changes from here
    assert cached_csc(kept) is not None
    data.edge_index[0] += 3
    changed = pickle.loads(pickle.dumps(data))  # a copy made after the change: stale in it
    assert cached_csc(changed) is None
    assert next(iter(NeighborLoader(changed, [-1], batch_size=1,
                                    input_nodes=torch.tensor([0])))).n_id.tolist() == [0, 4, 5, 6]
    batch = next(iter(NeighborLoader(data, [-1], batch_size=1, input_nodes=torch.tensor([0]))))
    assert batch.n_id.tolist() == [0, 4, 5, 6]
    check_names_callers_edges(data, batch)
    assert cached_csc(kept) is not None, "another copy's cache went stale"
    data.w[0] = 0  # edge 4 -> 0 can no longer be drawn
    copied = copy.deepcopy(data)
    assert {int(next(iter(NeighborLoader(copied, [1], batch_size=1, weight_attr="w",
                                         input_nodes=torch.tensor([0])))).n_id[1])
            for _ in range(40)} == {5, 6}
    drawn = {int(next(iter(NeighborLoader(data, [1], batch_size=1, weight_attr="w",
                                          input_nodes=torch.tensor([0])))).n_id[1])
             for _ in range(40)}
    assert drawn == {5, 6}
    data.t[5] = 9  # later than the seed's time 5: no longer a neighbour
    batch = next(iter(NeighborLoader(data, [-1], batch_size=1, time_attr="t",
                                     input_nodes=torch.tensor([0]),
                                     input_time=torch.tensor([5]))))
    assert sorted(batch.n_id.tolist()) == [0, 4, 6]
    hetero = HeteroData()
    hetero["a"].x, hetero["b"].x = torch.arange(7), torch.arange(1)
    hetero["a", "to", "b"].edge_index = torch.tensor([[1, 2, 3], [0, 0, 0]])
    NeighborLoader(hetero, [-1], input_nodes="b", batch_size=1)
    hetero["a", "to", "b"].edge_index[0] += 3
    batch = next(iter(NeighborLoader(hetero, [-1], input_nodes="b", batch_size=1)))
    assert batch["a"].n_id.tolist() == [4, 5, 6]


def test_nodes_added_after_a_loader_was_built_are_sampled():
    # The same edge_index, more nodes (isolated ones appended): the cached CSC is stale.
    data = random_graph()
    n = data.num_nodes
    NeighborLoader(data, [3], batch_size=8)
    data.x, data.num_nodes = torch.cat([data.x, torch.arange(n, n + 4)]), n + 4
    batch = next(iter(NeighborLoader(data, [3], input_nodes=torch.arange(n, n + 4),
                                     batch_size=4)))
    assert batch.n_id.tolist() == list(range(n, n + 4)) and batch.edge_index.numel() == 0
    hetero = HeteroData()
    hetero["a"].x, hetero["b"].x = torch.arange(5), torch.arange(3)
    hetero["a", "to", "b"].edge_index = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 0]])
    NeighborLoader(hetero, [2], input_nodes="b", batch_size=2)
    hetero["b"].x = torch.arange(4)
    batch = next(iter(NeighborLoader(hetero, [2], input_nodes=("b", torch.tensor([3])),
                                     batch_size=1)))
    assert batch["b"].n_id.tolist() == [3] and batch["a"].num_nodes == 0


@pytest.mark.parametrize("shuffle", [True, False])
def test_distributed_sees_every_input_node_once_per_epoch(shuffle):
    data = random_graph(num_nodes=103)
    inputs = torch.arange(0, 103, 2)  # 52 input nodes over 3 ranks
    loaders = [NeighborLoader(data, [2], input_nodes=inputs, batch_size=5, shuffle=shuffle,
                              distributed=True, rank=r, world_size=3, seed=4)
               for r in range(3)]
    orders = []
    for epoch in range(2):
        for loader in loaders:
            loader.set_epoch(epoch)
        per_rank = [[b.n_id[:b.batch_size] for b in loader] for loader in loaders]
        assert len({len(batches) for batches in per_rank}) == 1, "unequal step counts"
        assert all(len(batches) == len(loader) for batches, loader in zip(per_rank, loaders))
        seen = torch.cat([torch.cat(batches) for batches in per_rank])
        assert torch.equal(seen.sort().values, inputs), "an input node missed or repeated"
        assert all(b.numel() <= 5 for batches in per_rank for b in batches)
        orders.append(seen)
    assert torch.equal(orders[0], orders[1]) != shuffle


def test_bad_input_says_what_to_do():
    data = random_graph()
    with pytest.raises(ValueError, match="drop_last"):
        NeighborLoader(data, [2], batch_size=4, drop_last=True, distributed=True, rank=0,
                       world_size=2)
    with pytest.raises(ValueError, match="process group"):
        NeighborLoader(data, [2], batch_size=4, distributed=True)
    with pytest.raises(ValueError, match="FeatureStore, GraphStore"):
        NeighborSampler((object(), object()), [2])
    with pytest.raises(ValueError, match="time_attr='nope' is not a tensor attribute"):
        NeighborLoader(data, [2], time_attr="nope", input_time=torch.zeros(200))
    with pytest.raises(ValueError, match="is_sorted"):
        NeighborSampler(random_graph(seed=3), [2], is_sorted=True)
    data.w = -torch.ones(data.num_edges)
    with pytest.raises(ValueError, match=">= 0"):
        NeighborSampler(data, [2], weight_attr="w")
    with pytest.raises(ValueError, match="induced"):
        NeighborSampler(data, [2], subgraph_type="induced", disjoint=True)
    shard = {"distributed": True, "rank": 0, "world_size": 2}
    with pytest.raises(ValueError, match="batch size must be a positive integer, got 8.5"):
        NeighborLoader(data, [2], batch_size=8.5, **shard)
    with pytest.raises(TypeError, match="integers, got rank='0'"):
        NeighborLoader(data, [2], batch_size=8, **{**shard, "rank": "0"})
    with pytest.raises(ValueError, match="no input nodes to shard"):
        NeighborLoader(data, [2], input_nodes=torch.tensor([], dtype=torch.long), **shard)
    import numpy as np  # numpy integers count as integers
    assert len(NeighborLoader(data, [2], batch_size=np.int64(50), **shard)) == 2


@pytest.mark.parametrize("options", [{}, {"weight_attr": "w"}, {"replace": True},
                                     {"disjoint": True}])
def test_same_seed_same_batches(options):
    # Mean in-degree 60: weighted draws take both routes (rejection from degree 64 on).
    data = random_graph(num_edges=12000)
    data.w = torch.rand(data.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5

    def e_ids(seed):
        return [b.e_id for b in NeighborLoader(data, [3, 3], batch_size=50, seed=seed,
                                               **options)]
    first, again, other = e_ids(9), e_ids(9), e_ids(10)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{}, {"weight_attr": "edge_attr"}, {"disjoint": True}])
def test_samples_on_the_device_that_holds_the_graph(options):
    data = random_graph(dtype=torch.int32)
    data.edge_attr = data.edge_attr.float() + 1
    cuda = data.clone().to("cuda")
    for batch in NeighborLoader(cuda, [4, 3], batch_size=64, seed=0, **options):
        assert batch.edge_index.is_cuda and batch.n_id.is_cuda and batch.e_id.is_cuda
        check_names_callers_edges(cuda, batch)


def test_backward_samples_out_neighbours():
    data = random_graph()
    out_degree = torch.bincount(data.edge_index[0], minlength=data.num_nodes)
    loader = NeighborLoader(data, [4], batch_size=20, seed=0,
                            neighbor_sampler=NeighborSampler(data, [4], seed=0,
                                                             sample_direction="backward"))
    for batch in loader:
        check_names_callers_edges(data, batch)
        src, _ = global_edges(batch)
        seeds = batch.n_id[:batch.batch_size]
        assert torch.equal(torch.bincount(src, minlength=data.num_nodes)[seeds],
                           out_degree[seeds].clamp(max=4))


def test_reassigned_num_neighbors_take_effect():
    # PyG's BidirectionalNeighborSampler sets num_neighbors hop by hop on its inner samplers.
    data = random_graph()
    sampler = NeighborSampler(data, [5, 5], seed=0)
    sampler.num_neighbors = [2]
    assert len(sampler.sample(torch.arange(10)).num_sampled_edges) == 1


@pytest.mark.parametrize("disjoint", [False, True])
def test_serves_pyg_link_neighbor_loader(disjoint):
    from torch_geometric.loader import LinkNeighborLoader
    data = random_graph()
    label_index = data.edge_index[:, :40]
    sampler = NeighborSampler(data, [3, 2], disjoint=disjoint, seed=0)
    loader = LinkNeighborLoader(data, [3, 2], edge_label_index=label_index, batch_size=10,
                                neighbor_sampler=sampler)
    for batch in loader:
        check_names_callers_edges(data, batch)
        # The labelled edges' endpoints are in the batch, at the positions the batch names.
        assert torch.equal(batch.n_id[batch.edge_label_index], label_index[:, batch.input_id])


@pytest.mark.parametrize("options", [{}, {"disjoint": True}, {"time_attr": "time"}])
@pytest.mark.parametrize("graph,fanout", [("no edges", [3, 2]), ("edges", []),
                                          ("no edges", [])])
def test_a_graph_without_edges_or_hops_gives_the_seeds_alone(options, graph, fanout):
    # As PyG's samplers: a Data without edge_index is a graph without edges, and
    # num_neighbors=[] samples no hop.
    data = random_graph()
    data.time = torch.arange(data.num_nodes)
    if graph == "no edges":
        del data.edge_index, data.edge_attr
    out = NeighborSampler(data, fanout, seed=0, **options).sample(torch.tensor([5, 9, 5]))
    assert out.node.tolist() == [5, 9, 5]  # the seeds as given, as pyg-lib keeps them
    assert out.row.numel() == out.col.numel() == out.edge.numel() == 0
    assert out.num_sampled_nodes == [3] + [0] * len(fanout)


def test_temporal_link_prediction_through_pyg_link_neighbor_loader():
    # Each labelled edge's time bounds both of its endpoints' trees: no sampled edge's source
    # is later than the time of the labelled edge whose tree it joins.
    from torch_geometric.loader import LinkNeighborLoader
    data = random_graph()
    data.time = torch.randint(0, 50, (data.num_nodes,), generator=torch.Generator().manual_seed(3))
    label_index, label_time = data.edge_index[:, :40], torch.arange(40) + 10
    sampler = NeighborSampler(data, [3, 2], time_attr="time", seed=0)
    loader = LinkNeighborLoader(data, [3, 2], edge_label_index=label_index, batch_size=10,
                                edge_label_time=label_time, time_attr="time",
                                neighbor_sampler=sampler)
    seen = 0
    for batch in loader:
        check_names_callers_edges(data, batch)
        assert torch.equal(batch.n_id[batch.edge_label_index], label_index[:, batch.input_id])
        # Tree i of the batch belongs to its labelled edge i (both endpoints), as in PyG.
        tree_time = label_time[batch.input_id].repeat(2)
        sources = batch.edge_index[0]
        assert bool((data.time[batch.n_id[sources]] <= tree_time[batch.batch[sources]]).all())
        seen += batch.input_id.numel()
    assert seen == 40


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["data", "temporal", "hetero"])
def test_spawn_started_loader_workers_give_the_in_process_batches(graph):
    # With the spawn start method (CUDA users' usual one) each worker unpickles the sampler.
    # All neighbours (-1): the batches do not depend on the workers' random streams.
    from test_hetero_sampling import timed_graph as timed_hetero_graph
    options, input_nodes = {}, None
    if graph == "hetero":
        data, input_nodes = timed_hetero_graph(), ("paper", None)
        options = {"time_attr": "time"}
    else:
        data = random_graph()
        if graph == "temporal":
            data.time = torch.arange(data.num_nodes)
            options = {"time_attr": "time"}

    def batches(**workers):
        loader = NeighborLoader(data, [-1, -1], input_nodes=input_nodes, batch_size=25,
                                **options, **workers)
        return [batch.to_dict() for batch in loader]

    def assert_equal(ours, theirs):  # batches as (nested, for HeteroData) dicts
        assert ours.keys() == theirs.keys()
        for key in ours:
            if isinstance(ours[key], dict):
                assert_equal(ours[key], theirs[key])
            elif isinstance(ours[key], torch.Tensor):
                assert torch.equal(ours[key], theirs[key]), key

    in_process = batches()
    spawned = batches(num_workers=2, multiprocessing_context="spawn")
    assert len(spawned) == len(in_process) > 1
    for ours, theirs in zip(spawned, in_process):
        assert_equal(ours, theirs)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_epoch_continued_from_a_step_draws_the_same_batches(prefetch):
    """``set_epoch(epoch, start_step=k)`` with the generator state from before batch k gives the
    batches k, k+1, ... of the uninterrupted epoch, also when a prefetcher drew ahead."""
    from pyg_mgpu.sampling.prefetch import Prefetcher
    data = random_graph(num_nodes=150)

    def loader():
        return NeighborLoader(data, [3, 2], input_nodes=torch.arange(150), batch_size=7,
                              shuffle=True, distributed=True, rank=1, world_size=2, seed=5)

    whole = loader()
    whole.set_epoch(3)
    generator = whole.node_sampler.generator
    states, batches = [], []
    source = Prefetcher(whole, torch.device("cpu"), prefetch, snapshot=generator.get_state) \
        if prefetch else whole
    iterator = iter(source)
    while True:
        before = generator.get_state()
        batch = next(iterator, None)
        states.append(source.last_snapshot if prefetch else before)
        if batch is None:
            break
        batches.append(batch)
    assert len(batches) == len(whole) == 11
    for k in (0, 4, 10, 11):
        rest = loader()
        rest.set_epoch(3, start_step=k)
        rest.node_sampler.generator.set_state(states[k])
        assert len(rest) == 11 - k
        got = list(rest)
        assert len(got) == 11 - k
        for a, b in zip(got, batches[k:]):
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)


def test_start_step_needs_distributed_epochs():
    data = random_graph()
    with pytest.raises(ValueError, match="distributed=True"):
        NeighborLoader(data, [2], batch_size=4).set_epoch(0, start_step=1)
    loader = NeighborLoader(data, [2], batch_size=4, distributed=True, rank=0, world_size=2)
    with pytest.raises(ValueError, match="start_step"):
        loader.set_epoch(0, start_step=len(loader) + 1)
