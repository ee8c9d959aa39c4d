"""Datasets stored with any integer type for ids and labels, half-precision features, and the
class count: each taken as stored where it fits, or refused with a message before any rank
starts."""
import numpy as np
import pytest
import torch
from torch_geometric.nn import GraphSAGE

import pyg_mgpu
from pyg_mgpu.data.datasets import load_graph
from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.data.validation import DatasetError
from pyg_mgpu.metrics.batches import seed_outputs

INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.fixture(scope="module")
def small():
    # 100 nodes: every id fits int8.
    return make_synthetic(SyntheticSpec(num_nodes=100, num_edges=600, num_features=6,
                                        num_classes=3), seed=0)


def write(path, graph, *, ids=np.int64, labels=np.int64, x=np.float32, **extra):
    arrays = {"edge_index": graph.edge_index().numpy().astype(ids),
              "x": graph.x.numpy().astype(x), "y": graph.y.numpy().astype(labels),
              **{k: getattr(graph, k).numpy().astype(ids)
                 for k in ("train_idx", "val_idx", "test_idx")}}
    np.savez(path, **{**arrays, **extra})
    return str(path)


def same_graph(a, b):
    return all(torch.equal(getattr(a, k), getattr(b, k))
               for k in ("colptr", "row", "y", "train_idx", "val_idx", "test_idx"))


@pytest.mark.parametrize("ids", INT_TYPES, ids=lambda t: t.__name__)
def test_every_integer_type_of_ids_and_labels_loads_as_int64(small, tmp_path, ids):
    reference = load_graph(write(tmp_path / "ref.npz", small))
    graph = load_graph(write(tmp_path / "g.npz", small, ids=ids, labels=ids))
    assert same_graph(graph, reference)
    assert graph.train_idx.dtype == graph.y.dtype == torch.int64


@pytest.mark.parametrize("ids", [torch.int16, torch.uint8, torch.uint32, torch.uint64])
def test_in_memory_graphs_of_any_integer_type_convert(small, ids):
    reference = ConvertedGraph.from_edge_index("ref", small.edge_index(), small.x, small.y,
                                               small.train_idx, small.val_idx, small.test_idx)
    # uint8 split ids would index as a mask if taken as they are.
    graph = ConvertedGraph.from_edge_index(
        "g", small.edge_index().to(ids), small.x, small.y.to(ids),
        *(getattr(small, k).to(ids) for k in ("train_idx", "val_idx", "test_idx")))
    assert same_graph(graph, reference)


def test_load_dataset_takes_unsigned_ids(small, tmp_path):
    data = pyg_mgpu.load_dataset(write(tmp_path / "u.npz", small, ids=np.uint32))
    reference = pyg_mgpu.load_dataset(write(tmp_path / "ref.npz", small))
    assert torch.equal(data.edge_index, reference.edge_index)
    assert torch.equal(data.train_mask, reference.train_mask)


def test_uint64_ids_beyond_int64_are_refused(small, tmp_path):
    path = tmp_path / "big.npz"
    arrays = dict(np.load(write(path, small, ids=np.uint64)))
    arrays["edge_index"][0, 3] = 2**63 + 5
    np.savez(path, **arrays)
    with pytest.raises(DatasetError, match=r"edge_index holds values of 2\*\*63 or more"):
        load_graph(str(path))


def test_half_precision_features_are_kept_in_memory_and_in_the_cache(small, tmp_path):
    path = write(tmp_path / "half.npz", small, x=np.float16)
    first = load_graph(path, cache_dir=tmp_path / "cache")
    cached = load_graph(path, cache_dir=tmp_path / "cache")
    for graph in (first, cached):
        assert graph.x.dtype == torch.float16
        assert torch.equal(graph.x, small.x.half())
    assert load_graph(path, feature_dtype=torch.float32).x.dtype == torch.float32
    assert load_graph(path, feature_dtype=torch.bfloat16).x.dtype == torch.bfloat16
    # A float32 file converted when float32 was the default keeps its cache entry.
    path32 = write(tmp_path / "full.npz", small)
    notices = []
    load_graph(path32, cache_dir=tmp_path / "cache", feature_dtype=torch.float32,
               log=notices.append)
    load_graph(path32, cache_dir=tmp_path / "cache", log=notices.append)
    assert "converted and wrote" in notices[0] and "graph cache: read" in notices[1]


def test_a_batch_of_half_features_is_computed_in_float32(small):
    model = GraphSAGE(6, 8, 2, 3)
    data = small.to_data()
    batch = next(iter(pyg_mgpu.NeighborLoader(data, [3, 3], batch_size=10)))
    expected = seed_outputs(model, batch.clone().update({"x": batch.x.half().float()}))
    batch.x = batch.x.half()
    out = seed_outputs(model, batch)
    assert out.dtype == torch.float32 and torch.equal(out, expected)


@pytest.mark.parametrize("extra", [{}, {"num_classes": np.int64(1)}])
def test_a_dataset_of_one_class_is_refused_at_load(small, tmp_path, extra):
    path = tmp_path / "one.npz"
    arrays = dict(np.load(write(path, small)))
    arrays["y"] = np.zeros_like(arrays["y"])
    np.savez(path, **arrays, **extra)
    with pytest.raises(DatasetError, match="at least 2 classes"):
        load_graph(str(path))
