"""pyg_mgpu.predict on heterogeneous models, and on node subsets: outputs per node type equal
the full-graph forward; a subset's layers compute only the nodes the next layer reads."""
import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData

import pyg_mgpu
from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.inference import closure
from pyg_mgpu.inference.arguments import EDGE, NODE, graph_of
from pyg_mgpu.inference.layers import HomogeneousStack, stack_of
from pyg_mgpu.nn.hetero import HeteroGNN
from pyg_mgpu.nn.models import build_model

import test_predict


def tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.array(array))


SIZES = {"paper": 97, "author": 61, "field": 13}  # primes: no batch or rank count divides them


def hetero_graph(seed=0) -> HeteroData:
    """Papers (labelled) cite papers; authors write papers; papers have fields. Reverse edges
    reach authors and fields; field 12 and author 60 have no edges at all."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for t, n in SIZES.items():
        data[t].x = torch.randn(n, {"paper": 8, "author": 4, "field": 6}[t], generator=g)

    def edges(src, dst, count):
        return torch.stack([torch.randint(0, SIZES[src] - 1, (count,), generator=g),
                            torch.randint(0, SIZES[dst] - 1, (count,), generator=g)])
    data["paper", "cites", "paper"].edge_index = edges("paper", "paper", 400)
    writes = edges("author", "paper", 250)
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    has = edges("paper", "field", 150)
    data["paper", "has", "field"].edge_index = has
    data["field", "rev_has", "paper"].edge_index = has.flip(0)
    return data


def hetero_model(data: HeteroData, conv: str, num_layers: int = 3) -> HeteroGNN:
    torch.manual_seed(0)
    channels = {t: data[t].x.size(1) for t in data.node_types}
    return HeteroGNN(data.metadata(), channels, 16, 5, num_layers, target="paper",
                     conv=conv).eval()


def first_layer(model: HeteroGNN, data: HeteroData) -> dict:
    """Every type's output of the model's first layer on the whole graph (after ReLU)."""
    outputs, edge_types = model.plan[0]
    out = {t: model.roots[0][t](data[t].x) for t in model.roots[0]}
    for et in edge_types:
        message = model.convs[0]["__".join(et)]((data[et[0]].x, data[et[2]].x),
                                                data[et].edge_index)
        out[et[2]] = out[et[2]] + message if et[2] in out else message
    return {t: h.relu() for t, h in out.items()}


@pytest.mark.parametrize("conv", ["sage", "rgcn"])
def test_hetero_outputs_per_type_equal_the_full_graph_forward(conv, tmp_path):
    data = hetero_graph()
    model = hetero_model(data, conv)
    expected = model(data.x_dict, data.edge_index_dict)
    hidden = first_layer(model, data)
    got = pyg_mgpu.predict(model, data, tmp_path, outputs=["logits", "labels"], embeddings=1,
                           batch_size=16)
    torch.testing.assert_close(tensor(got.logits["paper"]), expected, rtol=0, atol=1e-4)
    assert torch.equal(tensor(got.labels["paper"]), expected.argmax(-1))
    assert set(got.logits) == {"paper"}  # the last layer outputs the labelled type alone
    assert set(got.embeddings) == set(model.plan[0][0]) == {"paper", "author", "field"}
    for t, rows in got.embeddings.items():
        torch.testing.assert_close(tensor(rows), hidden[t], rtol=0, atol=1e-4)
        assert np.array_equal(got.node_ids[t], np.arange(SIZES[t]))
    assert got.files()["author/embeddings"] == {"file": "author/embeddings.npy",
                                                "shape": [61, 16], "dtype": "float32"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["author", "field", "manifest.json",
                                                          "paper"]


def test_hetero_nodes_of_the_labelled_type_in_their_order(tmp_path):
    data = hetero_graph()
    model = hetero_model(data, "rgcn")
    nodes = torch.tensor([96, 3, 40, 0])
    got = pyg_mgpu.predict(model, data, tmp_path, nodes=nodes, embeddings=2, batch_size=3)
    expected = model(data.x_dict, data.edge_index_dict)[nodes]
    torch.testing.assert_close(tensor(got.logits["paper"]), expected, rtol=0, atol=1e-4)
    assert np.array_equal(got.node_ids["paper"], nodes.numpy())
    assert set(got.embeddings) == {"paper"} and got.embeddings["paper"].shape == (4, 16)


def test_hetero_models_refuse_a_homogeneous_graph_and_missing_types(tmp_path):
    data = hetero_graph()
    model = hetero_model(data, "sage")
    with pytest.raises(TypeError, match="HeteroData"):
        pyg_mgpu.predict(model, Data(x=torch.randn(3, 8)), tmp_path)
    del data["author"].x
    with pytest.raises(ArgumentError, match="no features x for node types author"):
        pyg_mgpu.predict(model, data, tmp_path)


def test_overwrite_removes_the_earlier_calls_outputs_whatever_their_folders(tmp_path):
    data = hetero_graph()
    homogeneous = Data(x=data["paper"].x, edge_index=data["paper", "cites", "paper"].edge_index)
    pyg_mgpu.predict(build_model("sage", 8, 16, 5, 2), homogeneous, tmp_path,
                     outputs=["logits", "labels"], embeddings=1)
    (tmp_path / "notes.txt").write_text("mine")
    # A heterogeneous model's outputs, in a folder per type, replace the files at the top.
    got = pyg_mgpu.predict(hetero_model(data, "rgcn", num_layers=2), data, tmp_path,
                           outputs=["logits"], overwrite=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "manifest.json", "notes.txt", "paper", "paper/logits.npy", "paper/node_ids.npy"]
    assert set(got.logits) == {"paper"}
    # And the other way round: the type folders go (a folder holding other files stays).
    (tmp_path / "paper" / "notes.txt").write_text("mine")
    pyg_mgpu.predict(build_model("sage", 8, 16, 5, 2), homogeneous, tmp_path, overwrite=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "logits.npy", "manifest.json", "node_ids.npy", "notes.txt", "paper", "paper/notes.txt"]


def chain(num_nodes: int) -> Data:
    """Edges i -> i + 1: node i's in-neighbour is i - 1."""
    ids = torch.arange(num_nodes - 1)
    return Data(x=torch.randn(num_nodes, 8), edge_index=torch.stack([ids, ids + 1]))


def test_closure_takes_in_neighbours_hop_by_hop_and_all_past_the_fraction():
    graph = graph_of(chain(20))
    stack = HomogeneousStack(build_model("sage", 8, 16, 5, 3))
    needed = closure.needed_nodes(graph, 3, stack.outputs, stack.reads, NODE,
                                  torch.tensor([9, 5]))
    assert needed[2][NODE].tolist() == [9, 5]  # the last layer: the requested, in their order
    assert needed[1][NODE].tolist() == [4, 5, 8, 9]
    assert needed[0][NODE].tolist() == [3, 4, 5, 7, 8, 9]
    wide = closure.needed_nodes(graph, 3, stack.outputs, stack.reads, NODE,
                                torch.arange(1, 20, 2))  # 10 of 20, then 19 of 20
    assert wide[1][NODE] is None and wide[0][NODE] is None
    data = hetero_graph()
    hetero = stack_of(hetero_model(data, "sage"))
    needed = closure.needed_nodes(graph_of(data, *hetero.input_types()), 3, hetero.outputs,
                                  hetero.reads, "paper", torch.tensor([5]))
    cites, writes = data["paper", "cites", "paper"].edge_index, \
        data["author", "writes", "paper"].edge_index
    assert needed[1]["paper"].tolist() == sorted({5, *cites[0, cites[1] == 5].tolist()})
    assert needed[1]["author"].tolist() == sorted(set(writes[0, writes[1] == 5].tolist()))


def test_a_subset_computes_its_closure_only_and_equals_the_full_computation(tmp_path,
                                                                             monkeypatch):
    data = test_predict.graph()
    model = test_predict.trained_looking(test_predict.MODELS["pyg_mgpu gcn"])
    computed = [0, 0, 0]
    step = HomogeneousStack.step

    def counted(stack, i, t, dst, *args):
        computed[i] += dst[1] - dst[0] if isinstance(dst, tuple) else dst.numel()
        return step(stack, i, t, dst, *args)

    monkeypatch.setattr(HomogeneousStack, "step", counted)
    monkeypatch.setattr(closure, "FULL_FRACTION", 0.9)
    nodes = torch.tensor([7, 3])
    got = pyg_mgpu.predict(model, data, tmp_path, nodes=nodes, embeddings=1, batch_size=8)
    needed = closure.needed_nodes(graph_of(data), 3, lambda i: [NODE], lambda i, t: [EDGE],
                                  NODE, nodes)
    assert computed == [needed[0][NODE].numel(), needed[1][NODE].numel(), 2]
    assert computed[0] < test_predict.NUM_NODES and computed[1] < computed[0]
    torch.testing.assert_close(tensor(got.logits), model(data.x, data.edge_index)[nodes],
                               rtol=0, atol=1e-4)
    assert not (tmp_path / "layers").exists()
    monkeypatch.undo()
    every = pyg_mgpu.predict(model, data, tmp_path / "all", embeddings=1)
    torch.testing.assert_close(tensor(got.embeddings), tensor(every.embeddings)[nodes],
                               rtol=0, atol=1e-5)
