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


def typed_reach(data, seed_type, seeds, hops):
    """Per type, the nodes and edge ids that sampling every neighbour must give (PyG's hops:
    each hop expands only the nodes that the previous hop added)."""
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
                if int(ei[1, e]) in frontier[dst]:
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


def test_refuses_what_it_cannot_do_yet():
    data = academic_graph()
    for options, what in (({"disjoint": True}, "disjoint"),
                          ({"subgraph_type": "induced"}, "induced"),
                          ({"time_attr": "x"}, "temporal"),
                          ({"sample_direction": "backward"}, "backward")):
        with pytest.raises(ValueError, match=what):
            pyg_mgpu.NeighborSampler(data, [2], **options)
    with pytest.raises(ValueError, match="outside"):
        data[WRITES].edge_index = torch.tensor([[0], [1000]])
        pyg_mgpu.NeighborSampler(data, [2])
