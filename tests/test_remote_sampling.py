"""``(FeatureStore, GraphStore)`` inputs through PyG's remote-backend interfaces (its in-memory
stores, as PyG's tests use them): batches name the caller's nodes and edges, features come from
the feature store, and all-neighbour sampling gives the same neighbourhoods as the ``Data`` and
``HeteroData`` forms of the same graph."""
import pytest
import torch
from torch_geometric.sampler import NodeSamplerInput
from torch_geometric.testing import MyFeatureStore, MyGraphStore

import _spawn_ranks
import pyg_mgpu
from pyg_mgpu.data.stores import open_stores
from pyg_mgpu.data.synthetic import SyntheticSpec
from test_hetero_sampling import academic_graph, typed_reach
from test_neighbor_loader import random_graph


def remote_homogeneous(data):
    feature_store, graph_store = MyFeatureStore(), MyGraphStore()
    feature_store.put_tensor(data.x, group_name=None, attr_name="x", index=None)
    graph_store.put_edge_index(data.edge_index, edge_type=None, layout="coo",
                               size=(data.num_nodes, data.num_nodes))
    return feature_store, graph_store


def remote_hetero(data):
    feature_store, graph_store = MyFeatureStore(), MyGraphStore()
    for node_type in data.node_types:
        feature_store.put_tensor(data[node_type].x, group_name=node_type, attr_name="x",
                                 index=None)
    for et in data.edge_types:
        graph_store.put_edge_index(data[et].edge_index, edge_type=et, layout="coo",
                                   size=(data[et[0]].num_nodes, data[et[-1]].num_nodes))
    return feature_store, graph_store


def test_homogeneous_store_batches_name_the_callers_nodes_and_edges():
    data = random_graph()
    loader = pyg_mgpu.NeighborLoader(remote_homogeneous(data), [4, 3], batch_size=20,
                                     input_nodes=torch.arange(100), seed=0)
    seen = []
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id])
        src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
        assert torch.equal(data.edge_index[0, batch.e_id], src)
        assert torch.equal(data.edge_index[1, batch.e_id], dst)
        seen.append(batch.n_id[:batch.batch_size])
    assert sorted(torch.cat(seen).tolist()) == list(range(100))


@pytest.mark.parametrize("input_nodes, message", [
    (None, "a (FeatureStore, GraphStore) pair needs its seeds named"),
    (torch.tensor([1, 2, 500]), "input_nodes holds node ids from 1 to 500, but the graph's ids "
                                "run from 0 to 199"),
    (torch.ones(10, dtype=torch.bool), "input_nodes is a mask of 10 entries, but the graph has "
                                       "200 nodes"),
])
def test_store_seeds_are_checked_when_the_loader_is_built(input_nodes, message):
    # As a Data's: a PyG loader over stores fails mid-epoch, or trains on part of the split.
    stores = remote_homogeneous(random_graph())
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pyg_mgpu.NeighborLoader(stores, [2], input_nodes=input_nodes, batch_size=8)
    hetero = remote_hetero(academic_graph())
    with pytest.raises(ValueError, match="input_nodes of type 'paper' holds node ids"):
        pyg_mgpu.NeighborLoader(hetero, [2], input_nodes=("paper", torch.tensor([10**6])),
                                batch_size=8)


def test_homogeneous_store_all_neighbours_equal_the_data_forms():
    data = random_graph()
    seeds = torch.tensor([3, 50, 7])
    from_store = pyg_mgpu.NeighborSampler(remote_homogeneous(data), [-1, -1]).sample(seeds)
    from_data = pyg_mgpu.NeighborSampler(data, [-1, -1]).sample(seeds)
    assert sorted(from_store.node.tolist()) == sorted(from_data.node.tolist())
    assert from_store.edge.numel() == from_data.edge.numel()


def test_hetero_store_samples_the_typed_neighbourhood():
    data = academic_graph()
    sampler = pyg_mgpu.NeighborSampler(remote_hetero(data), [-1, -1], seed=0)
    assert sampler.is_hetero
    seeds = [3, 11, 12]
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor(seeds),
                                                     input_type="paper"))
    nodes, edges = typed_reach(data, "paper", seeds, 2)
    for t in data.node_types:
        assert sorted(out.node[t].tolist()) == sorted(nodes[t]), t
    for et in data.edge_types:
        perm = sampler.edge_permutation[et]
        ids = out.edge[et] if perm is None else perm[out.edge[et]]
        assert sorted(ids.tolist()) == sorted(edges[et]), et


def test_hetero_store_loader_batches_carry_the_stores_features():
    data = academic_graph()
    loader = pyg_mgpu.NeighborLoader(remote_hetero(data), [3, 2], batch_size=8,
                                     input_nodes=("paper", torch.arange(24)), seed=0)
    for batch in loader:
        for t in data.node_types:
            assert torch.equal(batch[t].x, data[t].x[batch[t].n_id])
        for et in data.edge_types:
            ei = batch[et].edge_index
            assert torch.equal(batch[et[0]].n_id[ei[0]], data[et].edge_index[0, batch[et].e_id])
            assert torch.equal(batch[et[-1]].n_id[ei[1]],
                               data[et].edge_index[1, batch[et].e_id])


def test_temporal_sampling_reads_the_stores_node_times():
    data = random_graph()
    feature_store, graph_store = remote_homogeneous(data)
    time = torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(1))
    feature_store.put_tensor(time, group_name=None, attr_name="time", index=None)
    sampler = pyg_mgpu.NeighborSampler((feature_store, graph_store), [-1], time_attr="time")
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([5, 9]),
                                                     time=torch.tensor([100, 30])))
    for tree, limit in enumerate([100, 30]):
        assert bool((time[out.node[out.batch == tree]][1:] <= limit).all())


# The project's own stores over the converted-graph cache.

SMALL_SPEC = SyntheticSpec(num_nodes=400, num_edges=4000, num_features=8, num_classes=3)


def test_cache_stores_give_the_batches_of_the_data(tmp_path):
    graph = open_stores("synthetic", synthetic=SMALL_SPEC, cache_dir=tmp_path)
    assert {"x", "y", "row", "colptr"} <= set(graph.feature_store.graph.mapped)  # on disk
    data = pyg_mgpu.load_dataset("synthetic", synthetic=SMALL_SPEC)
    from_stores = pyg_mgpu.NeighborLoader(graph.stores, [4, 3], input_nodes=graph.train_idx,
                                          batch_size=32, shuffle=True, seed=5)
    from_data = pyg_mgpu.NeighborLoader(data, [4, 3], input_nodes=graph.train_idx,
                                        batch_size=32, shuffle=True, seed=5)
    torch.manual_seed(0)
    batches = list(from_stores)
    torch.manual_seed(0)
    for ours, theirs in zip(batches, from_data, strict=True):
        for key in ("n_id", "e_id", "x", "y", "edge_index"):
            assert torch.equal(ours[key], theirs[key]), key
        # Edge ids name columns of the data's edge_index (the cache's CSC order).
        assert torch.equal(ours.n_id[ours.edge_index], data.edge_index[:, ours.e_id])
    assert graph.graph_store.csc()[2] is None  # its CSC as stored: no conversion
    with pytest.raises(NotImplementedError, match="read-only"):
        graph.feature_store.put_tensor(torch.zeros(3), group_name=None, attr_name="z",
                                       index=None)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["mmap", "shm"])
def test_cache_stores_reach_spawn_started_loader_workers(tmp_path, placement):
    # The sampler's CSC and the seeds map the cache's files: they go to each worker as the
    # files, which torch's own sharing cannot do ("Bad file descriptor").
    graph = open_stores("synthetic", synthetic=SMALL_SPEC, cache_dir=tmp_path,
                        placement=placement)

    def batches(**workers):
        return list(pyg_mgpu.NeighborLoader(graph.stores, [-1], input_nodes=graph.train_idx,
                                            batch_size=64, **workers))

    in_process = batches()
    spawned = batches(num_workers=2, multiprocessing_context="spawn")
    assert len(spawned) == len(in_process) > 1
    for ours, theirs in zip(spawned, in_process):
        for key in ("n_id", "e_id", "x", "y", "edge_index"):
            assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.slow
def test_cache_stores_reach_spawned_ranks_as_mapped_files(tmp_path):
    graph = open_stores("synthetic", synthetic=SMALL_SPEC, cache_dir=tmp_path)
    train = graph.train_idx.numel()
    result = torch.full((2, train + 1), -1)
    pyg_mgpu.spawn(_spawn_ranks.seeds_from_cached_stores, args=(graph, result), devices="cpu",
                   nprocs=2)
    assert result[:, -1].tolist() == [1, 1]  # each rank mapped the cache's feature file
    seeds = result[:, :-1]
    seeds = seeds[seeds >= 0]
    assert sorted(seeds.tolist()) == sorted(graph.train_idx.tolist())  # each once, all ranks
