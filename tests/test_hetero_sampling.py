"""``pyg_mgpu.NeighborSampler`` / ``NeighborLoader`` on ``HeteroData``, with PyG's rules: per hop
and edge type, each destination node reached in the previous hop draws its in-edges of that type;
batches name the caller's nodes and edges per type, with every attribute following them, and the
per-hop counts are what PyG's ``trim_to_layer`` reads."""
import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.sampler import NodeSamplerInput
from torch_geometric.utils import trim_to_layer

import pyg_mgpu

WRITES, CITES, REV = ("author", "writes", "paper"), ("paper", "cites", "paper"), \
    ("paper", "rev_writes", "author")


def academic_graph(seed=0, num_papers=60, num_authors=90):
    """Papers citing papers, authors writing papers and the reverse, unsorted, with
    arange features and edge attributes."""
    gen = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.arange(num_papers) * 10
    data["author"].x = torch.arange(num_authors) * 10 + 1
    cites = torch.randint(num_papers, (2, 300), generator=gen)
    writes = torch.stack([torch.randint(num_authors, (400,), generator=gen),
                          torch.randint(num_papers, (400,), generator=gen)])
    data[CITES].edge_index = cites
    data[WRITES].edge_index = writes
    data[REV].edge_index = writes.flip(0)
    for et in (CITES, WRITES, REV):
        data[et].edge_attr = torch.arange(data[et].num_edges) * 7 + len(et[1])
    return data


def check_names_callers_edges(data, batch):
    for node_type in data.node_types:
        assert torch.equal(batch[node_type].x, data[node_type].x[batch[node_type].n_id])
    for et in data.edge_types:
        src, _, dst = et
        ei, e_id = batch[et].edge_index, batch[et].e_id
        assert torch.equal(batch[src].n_id[ei[0]], data[et].edge_index[0, e_id])
        assert torch.equal(batch[dst].n_id[ei[1]], data[et].edge_index[1, e_id])
        assert torch.equal(batch[et].edge_attr, data[et].edge_attr[e_id])


def typed_reach(data, seed_type, seeds, hops, keep=lambda et, e: True):
    """Per type, the nodes and edge ids that sampling every neighbour must give (PyG's hops:
    each hop expands only the nodes that the previous hop added); ``keep(edge_type, e)``
    says which edges may be drawn at all."""
    nodes = {t: set() for t in data.node_types}
    nodes[seed_type] = set(seeds)
    frontier = {t: set(v) for t, v in nodes.items()}
    edges = {et: set() for et in data.edge_types}
    for _ in range(hops):
        added = {t: set() for t in data.node_types}
        for et in data.edge_types:
            src, _, dst = et
            ei = data[et].edge_index
            for e in range(ei.size(1)):
                if int(ei[1, e]) in frontier[dst] and keep(et, e):
                    edges[et].add(e)
                    if int(ei[0, e]) not in nodes[src]:
                        added[src].add(int(ei[0, e]))
            nodes[src] |= added[src]
        frontier = added
    return nodes, edges


def test_batches_name_the_callers_nodes_and_edges_of_every_type():
    data = academic_graph()
    loader = pyg_mgpu.NeighborLoader(data, [3, 2], input_nodes=("paper", torch.arange(40)),
                                     batch_size=8, shuffle=True, seed=0)
    seen = []
    for batch in loader:
        check_names_callers_edges(data, batch)
        seen.append(batch["paper"].n_id[:batch["paper"].batch_size])
    assert sorted(torch.cat(seen).tolist()) == list(range(40))  # every seed once


def test_all_neighbours_is_the_typed_neighbourhood():
    data = academic_graph()
    sampler = pyg_mgpu.NeighborSampler(data, [-1, -1], seed=0)
    seeds = [3, 11, 12]
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds),
                                                     input_type="paper"))
    nodes, edges = typed_reach(data, "paper", seeds, 2)
    assert out.node["paper"][:3].tolist() == seeds
    for t in data.node_types:
        assert sorted(out.node[t].tolist()) == sorted(nodes[t]), t  # each node once
    for et in data.edge_types:
        perm = sampler.edge_permutation[et]
        ids = out.edge[et] if perm is None else perm[out.edge[et]]
        assert sorted(ids.tolist()) == sorted(edges[et]), et  # each edge once


def test_fanout_per_edge_type_bounds_each_destination():
    data = academic_graph()
    fanout = {CITES: [2, 1], WRITES: [3, 0], REV: [1, 1]}
    loader = pyg_mgpu.NeighborLoader(data, fanout, input_nodes=("paper", None), batch_size=10,
                                     seed=1)
    for batch in loader:
        for et, per_hop in fanout.items():
            counts = batch[et].num_sampled_edges
            assert len(counts) == 2 and sum(counts) == batch[et].num_edges
            dst = batch[et].edge_index[1]
            start = 0
            for hop, k in enumerate(per_hop):  # edges come hop by hop
                hop_dst = dst[start:start + counts[hop]]
                start += counts[hop]
                if hop_dst.numel():
                    assert int(torch.bincount(hop_dst).max()) <= k
            if per_hop[1] == 0:
                assert counts[1] == 0
        for t in data.node_types:
            assert sum(batch[t].num_sampled_nodes) == batch[t].num_nodes


def test_distributed_shards_take_every_seed_once_in_equal_steps():
    data = academic_graph()
    mask = torch.zeros(data["paper"].num_nodes, dtype=torch.bool)
    mask[::3] = True  # 20 seeds over 2 ranks, batches of 3: 4 steps each
    for epoch in range(2):
        seeds, steps = [], []
        for rank in range(2):
            loader = pyg_mgpu.NeighborLoader(data, [2, 2], input_nodes=("paper", mask),
                                             batch_size=3, shuffle=True, distributed=True,
                                             rank=rank, world_size=2, seed=7)
            loader.set_epoch(epoch)
            batches = list(loader)
            steps.append(len(batches))
            for batch in batches:
                check_names_callers_edges(data, batch)
                seeds.append(batch["paper"].n_id[:batch["paper"].batch_size])
        assert steps[0] == steps[1] == len(loader)
        assert sorted(torch.cat(seeds).tolist()) == mask.nonzero().view(-1).tolist()


def test_pygs_trim_to_layer_accepts_the_counts():
    data = academic_graph()
    batch = next(iter(pyg_mgpu.NeighborLoader(data, [3, 2], batch_size=5,
                                              input_nodes=("paper", None), seed=0)))
    x = {t: batch[t].x.float().view(-1, 1) for t in batch.node_types}
    ei = {et: batch[et].edge_index for et in batch.edge_types}
    nodes = {t: batch[t].num_sampled_nodes for t in batch.node_types}
    edges = {et: batch[et].num_sampled_edges for et in batch.edge_types}
    x1, ei1, _ = trim_to_layer(1, nodes, edges, x, ei)
    for t in batch.node_types:  # layer 1 no longer needs the last hop's nodes
        assert x1[t].size(0) == batch[t].num_nodes - nodes[t][-1]
    for et in batch.edge_types:
        assert ei1[et].size(1) == batch[et].num_edges - edges[et][-1]


def test_weighted_types_never_draw_zero_weight_edges_when_others_suffice():
    data = academic_graph()
    weight = torch.ones(data[CITES].num_edges)
    weight[::2] = 0.0
    data[CITES].weight = weight
    sampler = pyg_mgpu.NeighborSampler(data, [1], weight_attr="weight", seed=0)
    for paper in range(data["paper"].num_nodes):
        out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([paper]),
                                                         input_type="paper"))
        e_id = sampler.edge_permutation[CITES]
        drawn = out.edge[CITES] if e_id is None else e_id[out.edge[CITES]]
        assert bool((weight[drawn] > 0).all()) or not bool(
            (weight[data[CITES].edge_index[1] == paper] > 0).any())


def test_same_seed_same_batches():
    data = academic_graph()
    runs = [[b["author"].n_id for b in pyg_mgpu.NeighborLoader(
        data, [2, 2], input_nodes=("paper", None), batch_size=16, seed=4)]
        for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def sample(sampler, seeds, seed_type="paper", time=None):
    return sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds), time=time,
                                                      input_type=seed_type))


def trees(out, data):
    """Per tree (seed position): per node type, its nodes; and per edge type, its edge ids."""
    result = {}
    for t in data.node_types:
        for node, tree in zip(out.node[t].tolist(), out.batch[t].tolist()):
            result.setdefault(tree, ({u: [] for u in data.node_types}, {}))[0][t].append(node)
    return result


def test_disjoint_grows_one_tree_per_seed():
    data = academic_graph()
    sampler = pyg_mgpu.NeighborSampler(data, [-1, -1], disjoint=True, seed=0)
    seeds = [3, 11, 3]  # a repeated seed gets a tree of its own
    out = sample(sampler, seeds)
    assert out.node["paper"][:3].tolist() == seeds and out.batch["paper"][:3].tolist() == [0, 1, 2]
    for tree, (nodes, _) in trees(out, data).items():
        expected, _ = typed_reach(data, "paper", [seeds[tree]], 2)
        for t in data.node_types:
            assert sorted(nodes[t]) == sorted(expected[t]), (tree, t)  # each once per tree
    for et in data.edge_types:  # every edge joins two nodes of the same tree
        src, _, dst = et
        assert torch.equal(out.batch[src][out.row[et]], out.batch[dst][out.col[et]])
    loader = pyg_mgpu.NeighborLoader(data, [2, 2], input_nodes=("paper", None), batch_size=8,
                                     disjoint=True, seed=0)
    for batch in loader:
        check_names_callers_edges(data, batch)
        size = batch["paper"].batch_size
        assert batch["paper"].batch[:size].tolist() == list(range(size))


def timed_graph():
    data = academic_graph()
    gen = torch.Generator().manual_seed(1)
    data["paper"].time = torch.randint(0, 100, (data["paper"].num_nodes,), generator=gen)
    data["author"].time = torch.randint(0, 100, (data["author"].num_nodes,), generator=gen)
    return data


def test_node_time_bounds_every_tree_by_its_seeds_time():
    data = timed_graph()
    sampler = pyg_mgpu.NeighborSampler(data, [-1, -1], time_attr="time", seed=0)
    assert sampler.disjoint  # temporal sampling grows a tree per seed, as PyG's
    seeds, limits = [3, 11, 12], [50, 90, 10]
    out = sample(sampler, seeds, time=torch.tensor(limits))
    found = trees(out, data)
    for tree, seed in enumerate(seeds):
        def no_later(et, e, tree=tree):
            return int(data[et[0]].time[data[et].edge_index[0, e]]) <= limits[tree]
        expected, _ = typed_reach(data, "paper", [seed], 2, keep=no_later)
        for t in data.node_types:
            assert sorted(found[tree][0][t]) == sorted(expected[t]), (tree, t)
    # Without input_time each seed's own timestamp bounds its tree.
    own = sample(sampler, seeds)
    timed = sample(sampler, seeds, time=data["paper"].time[torch.tensor(seeds)])
    for t in data.node_types:
        assert torch.equal(own.node[t], timed.node[t])


def test_edge_time_and_the_last_strategy():
    data = academic_graph()
    for et in data.edge_types:
        data[et].stamp = torch.randperm(data[et].num_edges, generator=torch.Generator()
                                        .manual_seed(len(et[1])))
    loader = pyg_mgpu.NeighborLoader(data, [3, 3], input_nodes=("paper", None), batch_size=6,
                                     time_attr="stamp", input_time=torch.full((60,), 150),
                                     seed=0)
    for batch in loader:
        check_names_callers_edges(data, batch)
        for et in data.edge_types:
            assert bool((batch[et].stamp <= 150).all())
    # 'last': every destination keeps its most recent eligible in-edges.
    sampler = pyg_mgpu.NeighborSampler(data, [2], time_attr="stamp", temporal_strategy="last",
                                       seed=0)
    out = sample(sampler, [5], time=torch.tensor([200]))
    for et in (CITES, WRITES):
        ids = sampler.edge_permutation[et][out.edge[et]]
        ei, stamp = data[et].edge_index, data[et].stamp
        eligible = ((ei[1] == 5) & (stamp <= 200)).nonzero().view(-1)
        expected = eligible[stamp[eligible].argsort()][-2:]
        assert sorted(ids.tolist()) == sorted(expected.tolist()), et


def test_induced_keeps_every_edge_among_the_sampled_nodes():
    data = academic_graph()
    sampler = pyg_mgpu.NeighborSampler(data, [2, 2], subgraph_type="induced", seed=0)
    out = sample(sampler, [3, 11, 12])
    assert out.num_sampled_nodes is None  # as PyG's induced sampling
    for et in data.edge_types:
        src, _, dst = et
        ei = data[et].edge_index
        inside = torch.isin(ei[0], out.node[src]) & torch.isin(ei[1], out.node[dst])
        ids = sampler.edge_permutation[et][out.edge[et]]
        assert sorted(ids.tolist()) == inside.nonzero().view(-1).tolist(), et
        assert torch.equal(out.node[src][out.row[et]], ei[0, ids])
        assert torch.equal(out.node[dst][out.col[et]], ei[1, ids])


def reversed_graph(data: HeteroData) -> HeteroData:
    """``data`` with every edge turned around, under the type (dst, rel, src)."""
    reverse = HeteroData()
    for t in data.node_types:
        reverse[t].x = data[t].x
    for src, rel, dst in data.edge_types:
        reverse[dst, rel, src].edge_index = data[src, rel, dst].edge_index.flip(0)
    return reverse


def test_backward_walks_each_edge_type_from_its_source():
    data = academic_graph()
    reverse = reversed_graph(data)
    backward = pyg_mgpu.NeighborSampler(data, [-1, -1], sample_direction="backward", seed=0)
    forward = pyg_mgpu.NeighborSampler(reverse, [-1, -1], seed=0)
    got, expected = sample(backward, [3, 11]), sample(forward, [3, 11])
    for t in data.node_types:
        assert torch.equal(got.node[t], expected.node[t])
    for src, rel, dst in data.edge_types:  # the same edges, under the graph's own types
        et, rt = (src, rel, dst), (dst, rel, src)
        assert torch.equal(got.row[et], expected.col[rt])
        assert torch.equal(got.col[et], expected.row[rt])
        assert torch.equal(backward.edge_permutation[et][got.edge[et]],
                           forward.edge_permutation[rt][expected.edge[rt]])
    loader = pyg_mgpu.NeighborLoader(data, [2, 2], input_nodes=("paper", None), batch_size=8,
                                     neighbor_sampler=pyg_mgpu.NeighborSampler(
                                         data, [2, 2], sample_direction="backward", seed=0))
    for batch in loader:
        check_names_callers_edges(data, batch)


@pytest.mark.parametrize("remote", [False, True])
def test_backward_fanouts_per_edge_type_name_the_graphs_edge_types(remote):
    # {edge type: fanouts} keyed by the caller's edge types, as PyG's setter maps them: the
    # same batch as the forward walk over the reversed graph with the reversed keys.
    data = academic_graph()
    reverse = reversed_graph(data)
    fanouts = {("paper", "cites", "paper"): [-1, -1], ("author", "writes", "paper"): [0, 0],
               ("paper", "rev_writes", "author"): [-1, 0]}
    from test_remote_sampling import remote_hetero
    graph = remote_hetero(data) if remote else data
    backward = pyg_mgpu.NeighborSampler(graph, fanouts, sample_direction="backward", seed=0)
    forward = pyg_mgpu.NeighborSampler(
        reverse, {(dst, rel, src): k for (src, rel, dst), k in fanouts.items()}, seed=0)
    got, expected = sample(backward, [3, 11]), sample(forward, [3, 11])
    assert got.row[("author", "writes", "paper")].numel() == 0
    assert got.row[("paper", "rev_writes", "author")].numel() > 0
    for t in data.node_types:  # as sets: a store may order a node's edges its own way
        assert sorted(got.node[t].tolist()) == sorted(expected.node[t].tolist())
    for src, rel, dst in data.edge_types:
        et, rt = (src, rel, dst), (dst, rel, src)
        assert (sorted(backward.edge_permutation[et][got.edge[et]].tolist())
                == sorted(forward.edge_permutation[rt][expected.edge[rt]].tolist()))


def test_edge_ids_are_int64_on_every_edge_type():
    # academic_graph's edge types are unsorted: their CSC keeps the permutation as int32.
    data = academic_graph()
    loader = pyg_mgpu.NeighborLoader(data, [3, 2], input_nodes=("paper", None), batch_size=16)
    batch = next(iter(loader))
    assert {et: batch[et].e_id.dtype for et in batch.edge_types} == dict.fromkeys(
        data.edge_types, torch.int64)


def test_refuses_what_pyg_refuses():
    data = timed_graph()
    for options, error, what in (
            ({"disjoint": True, "subgraph_type": "induced"}, ValueError, "induced"),
            ({"time_attr": "time", "subgraph_type": "induced"}, ValueError, "induced"),
            ({"time_attr": "time", "sample_direction": "backward"}, NotImplementedError,
             "backward"),
            ({"time_attr": "time", "weight_attr": "edge_attr"}, ValueError, "weighted"),
            ({"time_attr": "nowhere"}, ValueError, "neither a node-level"),
            ({"sample_direction": "sideways"}, ValueError, "sample_direction")):
        with pytest.raises(error, match=what):
            pyg_mgpu.NeighborSampler(data, [2], **options)
    edge_timed = academic_graph()
    edge_timed[CITES].stamp = torch.arange(300)
    sampler = pyg_mgpu.NeighborSampler(edge_timed, [2], time_attr="stamp")
    with pytest.raises(ValueError, match="input_time"):
        sample(sampler, [1])  # edge timestamps: the seeds' times must be given
    with pytest.raises(ValueError, match="input_time was given"):
        sample(pyg_mgpu.NeighborSampler(data, [2]), [1], time=torch.tensor([5]))
    with pytest.raises(ValueError, match=r"node type\(s\) \['papr'\]"):
        sample(pyg_mgpu.NeighborSampler(data, [2]), [1], seed_type="papr")
    with pytest.raises(ValueError, match="homogeneous graphs"):
        pyg_mgpu.BidirectionalNeighborSampler(data, [2])
    with pytest.raises(ValueError, match="outside"):
        data[WRITES].edge_index = torch.tensor([[0], [1000]])
        pyg_mgpu.NeighborSampler(data, [2])
