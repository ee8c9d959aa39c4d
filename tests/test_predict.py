"""pyg_mgpu.predict: every node's outputs, layer by layer through files, equal the full-graph
forward; hidden-layer storage, node subsets, argument checks and resuming."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.data import Data, HeteroData

import pyg_mgpu
from pyg_mgpu.distributed.context import RankFailed
from pyg_mgpu.distributed.launch import spawn
from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.inference import decode, predictions, store
from pyg_mgpu.data.csc import csc_of
from pyg_mgpu.inference.blocks import batches, make_block
from pyg_mgpu.nn.models import build_model

import _predict_ranks

def tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array))  # a copy: the outputs are read-only mappings


NUM_NODES = 401  # a prime: no batch size or rank count divides it


def graph(num_nodes=NUM_NODES, num_edges=3000, seed=0) -> Data:
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=generator)
    # Self-loops (one twice), which GAT and GCN replace with their own, and an isolated node.
    loops = torch.tensor([[3, 3, 7], [3, 3, 7]])
    edge_index = torch.cat([edge_index, loops], dim=1)
    edge_index = edge_index[:, (edge_index != num_nodes - 1).all(0)]
    return Data(x=torch.randn(num_nodes, 8, generator=generator), edge_index=edge_index)


MODELS = {
    "pyg_mgpu sage": lambda: build_model("sage", 8, 16, 5, 3),
    "pyg_mgpu gcn": lambda: build_model("gcn", 8, 16, 5, 3),
    "pyg_mgpu gat": lambda: build_model("gat", 8, 16, 5, 2, heads=4),
    "pyg_mgpu gin": lambda: build_model("gin", 8, 16, 5, 2, norm="layer"),
    "PyG GraphSAGE": lambda: pyg_nn.GraphSAGE(8, 16, 3, out_channels=5),
    "PyG GCN": lambda: pyg_nn.GCN(8, 16, 2, out_channels=5),
    "PyG GCN without self-loops": lambda: pyg_nn.GCN(8, 16, 2, out_channels=5,
                                                     add_self_loops=False),
    "PyG GAT": lambda: pyg_nn.GAT(8, 16, 2, out_channels=5, heads=2),
    "PyG GATv2": lambda: pyg_nn.GAT(8, 16, 2, out_channels=5, heads=2, v2=True),
    "PyG GIN with BatchNorm": lambda: pyg_nn.GIN(8, 16, 3, out_channels=5, norm="batch_norm"),
    "PyG GraphSAGE, jk last": lambda: pyg_nn.GraphSAGE(8, 16, 2, out_channels=5, jk="last"),
    # Message passing: sage_layer computes neither projection nor normalization.
    "PyG GraphSAGE, project and normalize": lambda: pyg_nn.GraphSAGE(
        8, 16, 2, out_channels=5, project=True, normalize=True),
}


def trained_looking(make) -> torch.nn.Module:
    torch.manual_seed(0)
    model = make()
    for module in model.modules():  # running statistics other than the initial 0 and 1
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("name", MODELS)
def test_outputs_equal_the_full_graph_forward(name, tmp_path):
    data, model = graph(), trained_looking(MODELS[name])
    expected = model(data.x, data.edge_index)
    got = pyg_mgpu.predict(model, data, tmp_path, outputs=["logits", "probabilities", "labels"],
                           batch_size=64)
    assert np.array_equal(got.node_ids, np.arange(NUM_NODES))
    torch.testing.assert_close(tensor(got.logits[:]), expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(tensor(got.probabilities[:]),
                               expected.softmax(-1), rtol=0, atol=1e-4)
    assert torch.equal(tensor(got.labels[:]), expected.argmax(-1))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "labels.npy", "logits.npy", "manifest.json", "node_ids.npy",
        "probabilities.npy"]  # layers/ removed


def test_pygs_default_sageconv_runs_without_message_passing(tmp_path, monkeypatch):
    """Its means come from embedding_bag, with no row per edge; the outputs stay the full
    forward's."""
    data, model = graph(), trained_looking(MODELS["PyG GraphSAGE"])
    expected = model(data.x, data.edge_index)

    def no_propagate(*args, **kwargs):
        raise AssertionError("SAGEConv.propagate ran")
    monkeypatch.setattr(pyg_nn.SAGEConv, "propagate", no_propagate)
    got = pyg_mgpu.predict(model, data, tmp_path, batch_size=64)
    torch.testing.assert_close(tensor(got.logits[:]), expected, rtol=0, atol=1e-4)


def test_requested_nodes_get_their_rows_in_their_order_and_a_hidden_layers_output(tmp_path):
    data, model = graph(), trained_looking(MODELS["PyG GraphSAGE"])
    nodes = torch.tensor([400, 3, 17, 0, 250, 7])
    hidden = F.relu(model.convs[0](data.x, data.edge_index))
    second = F.relu(model.convs[1](hidden, data.edge_index))
    for layer, expected in ((1, hidden), (2, second)):
        got = pyg_mgpu.predict(model, data, tmp_path / str(layer), nodes=nodes,
                               embeddings=layer, batch_size=4)
        assert np.array_equal(got.node_ids, nodes.numpy())
        torch.testing.assert_close(tensor(got.logits[:]),
                                   model(data.x, data.edge_index)[nodes], rtol=0, atol=1e-4)
        torch.testing.assert_close(tensor(got.embeddings[:]), expected[nodes],
                                   rtol=0, atol=1e-4)
    # The same ids as a numpy array (a view running backwards too) or a list.
    for name, as_given, ids in (("array", nodes.numpy(), nodes),
                                ("reversed", nodes.numpy()[::-1], nodes.flip(0)),
                                ("list", nodes.tolist(), nodes)):
        got = pyg_mgpu.predict(model, data, tmp_path / name, nodes=as_given, batch_size=4)
        assert np.array_equal(got.node_ids, ids.numpy())
        torch.testing.assert_close(tensor(got.logits[:]),
                                   model(data.x, data.edge_index)[ids], rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_hidden_layers_hold_the_rounded_float32_rows(dtype, tmp_path):
    data, model = graph(), trained_looking(MODELS["pyg_mgpu sage"])
    hidden = F.relu(model.convs[0](data.x, data.edge_index))  # layer 1 reads float32 features
    got = pyg_mgpu.predict(model, data, tmp_path, embeddings=1, hidden_dtype=dtype)
    stored = np.load(tmp_path / "embeddings.npy")
    assert stored.dtype == (np.uint16 if dtype == "bfloat16" else np.float16)
    # Bit for bit the float32 layer rounded once.
    assert torch.equal(decode(stored, dtype), hidden.to(getattr(torch, dtype)).float())
    assert got.embeddings_dtype == dtype
    # Layers after a rounded one are close to the float32 model's, not equal.
    torch.testing.assert_close(tensor(got.logits[:]), model(data.x, data.edge_index),
                               rtol=0, atol=0.05)


def test_blocks_number_destinations_first_whatever_their_order():
    data = graph(num_nodes=50, num_edges=300)
    csc = csc_of(data)
    for dst in (torch.tensor([9, 3, 40, 7]), (3, 10)):  # any ids, or a range of them
        block = make_block(csc.colptr, csc.row, dst)
        dst_ids = torch.arange(*dst) if isinstance(dst, tuple) else dst
        ids = torch.cat([dst_ids, block.others])  # the node of each block row
        src, dst_rows = block.edge_index
        edges = sorted((int(ids[s]), int(dst_ids[d])) for s, d in zip(src, dst_rows))
        expected = sorted((int(u), int(v)) for u, v in data.edge_index.t()
                          if int(v) in dst_ids.tolist())  # every in-edge, duplicates kept
        assert edges == expected
        assert block.others.tolist() == sorted(set(block.others.tolist()) - set(dst_ids.tolist()))


def test_batches_cap_destinations_and_in_edges():
    degree = torch.tensor([1, 1, 50, 1, 1, 1, 1, 3])
    got = list(batches(0, 8, 4, 5, lambda b0, b1: degree[b0:b1]))
    # At most 4 nodes and 5 in-edges a batch; the hub of 50 alone.
    assert got == [(0, 2), (2, 3), (3, 7), (7, 8)]
    assert list(batches(3, 5, 100, 100, lambda b0, b1: degree[b0:b1])) == [(3, 5)]


def test_batches_cut_by_their_in_edges_give_the_same_outputs(tmp_path, monkeypatch):
    data, model = graph(), trained_looking(MODELS["pyg_mgpu gcn"])
    monkeypatch.setattr(predictions, "BLOCK_BYTES", 4 * 16 * 20)  # about 20 edges a batch
    nodes = torch.tensor([5, 3, 400, 17])
    got = pyg_mgpu.predict(model, data, tmp_path, nodes=nodes, batch_size=64)
    torch.testing.assert_close(tensor(got.logits), model(data.x, data.edge_index)[nodes],
                               rtol=0, atol=1e-4)


@pytest.mark.parametrize("kwargs,message", [
    ({"embeddings": 3}, "embeddings=3: the model has 3 layers, so its hidden layers are 1..2"),
    ({"embeddings": 0}, "embeddings=0"),
    ({"nodes": torch.tensor([0, NUM_NODES])}, f"node id {NUM_NODES}, outside"),
    ({"nodes": torch.tensor([-1, 2])}, "node id -1, outside"),
    ({"nodes": torch.tensor([2, 5, 2])}, "more than once"),
    ({"nodes": torch.zeros(NUM_NODES, dtype=torch.bool)}, "mask.nonzero"),
    ({"outputs": ["scores"]}, "outputs takes any of logits, probabilities, labels, got scores"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"hidden_dtype": "int8"}, "hidden_dtype=int8"),
])
def test_bad_arguments_are_named_and_nothing_is_written(kwargs, message, tmp_path):
    data, model = graph(), trained_looking(MODELS["pyg_mgpu sage"])
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(".", r"\.")):
        pyg_mgpu.predict(model, data, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_models_and_graphs_it_cannot_run_exactly_are_refused(tmp_path):
    data = graph()
    with pytest.raises(TypeError, match="jk=None or 'last'"):
        pyg_mgpu.predict(pyg_nn.GraphSAGE(8, 16, 2, out_channels=5, jk="cat"), data, tmp_path)
    with pytest.raises(TypeError, match="normalizes across nodes"):
        pyg_mgpu.predict(pyg_nn.GIN(8, 16, 2, out_channels=5, norm="graph_norm"), data, tmp_path)
    with pytest.raises(TypeError, match="heterogeneous"):
        pyg_mgpu.predict(build_model("sage", 8, 16, 5, 2), HeteroData(), tmp_path)
    with pytest.raises(TypeError, match="not a model"):
        pyg_mgpu.predict(torch.nn.Linear(8, 5), data, tmp_path)
    # A BasicGNN whose conv takes no (source rows, destination rows), and an aggregation that
    # is not a plain reduction: refused by name, not crashed on.
    pna = pyg_nn.PNA(8, 16, 2, out_channels=5, aggregators=["mean"], scalers=["identity"],
                     deg=torch.tensor([0, 5, 10]))
    with pytest.raises(TypeError, match="PNA is not a model .* PyG's GraphSAGE, GCN, GAT"):
        pyg_mgpu.predict(pna, data, tmp_path)
    with pytest.raises(TypeError, match="aggr='lstm'; layer-wise prediction supports "
                                        "aggr='mean', 'sum', 'max', 'min'"):
        pyg_mgpu.predict(pyg_nn.GraphSAGE(8, 16, 2, out_channels=5, aggr="lstm"), data, tmp_path)
    with pytest.raises(ArgumentError, match="data has 8 features per node, the model's first "
                                            "layer takes 6"):
        pyg_mgpu.predict(pyg_nn.GCN(6, 16, 2, out_channels=5), data, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("aggr", ["sum", "max", "min"])
def test_other_plain_aggregations_equal_the_full_graph_forward(aggr, tmp_path):
    data = graph()
    model = trained_looking(lambda: pyg_nn.GraphSAGE(8, 16, 2, out_channels=5, aggr=aggr))
    got = pyg_mgpu.predict(model, data, tmp_path, batch_size=64)
    torch.testing.assert_close(tensor(got.logits[:]), model(data.x, data.edge_index),
                               rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["edge_weight", "edge_attr"])
def test_edge_features_are_refused_rather_than_left_out(name, tmp_path):
    data = graph()
    data[name] = torch.rand(data.edge_index.size(1))
    with pytest.raises(ArgumentError, match=f"data has {name}, which layer-wise prediction "
                                            "does not carry"):
        pyg_mgpu.predict(trained_looking(MODELS["PyG GCN"]), data, tmp_path)
    assert not list(tmp_path.iterdir())


def test_files_it_did_not_write_are_kept_and_outputs_replaced_only_with_overwrite(tmp_path):
    data, model = graph(), trained_looking(MODELS["PyG GraphSAGE"])
    # A layers/ folder of the caller's: predict keeps its hidden layers there, and would delete
    # it when done; refused, even with overwrite.
    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / "notes.txt").write_text("mine")
    for args in ({}, {"overwrite": True}):
        with pytest.raises(ValueError, match="layers was not written by pyg_mgpu.predict"):
            pyg_mgpu.predict(model, data, tmp_path, **args)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["layers", "notes.txt"]
    (tmp_path / "layers" / "notes.txt").rename(tmp_path / "notes.txt")
    (tmp_path / "layers").rmdir()
    # Outputs there already (a finished call's, or a file at an output's name) are refused,
    # left as they are, and replaced with overwrite; the caller's other files stay.
    first = tensor(pyg_mgpu.predict(model, data, tmp_path, batch_size=64).logits[:])
    written = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for args in ({}, {"outputs": ["labels"]}):
        with pytest.raises(ArgumentError, match="holds predictions already .*manifest.json, "
                                                "node_ids.npy, logits.npy.*overwrite=True"):
            pyg_mgpu.predict(model, data, tmp_path, **args)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == written
    got = pyg_mgpu.predict(model, data, tmp_path, outputs=["labels"], overwrite=True)
    assert torch.equal(tensor(got.labels[:]), first.argmax(-1)) and got.logits is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.npy", "manifest.json",
                                                          "node_ids.npy", "notes.txt"]
    (tmp_path / "manifest.json").write_text("{}")  # the caller's own, at predict's name
    (tmp_path / "labels.npy").unlink()
    with pytest.raises(ArgumentError, match=r"holds predictions already \(manifest.json, "
                                            r"node_ids.npy\)"):
        pyg_mgpu.predict(model, data, tmp_path, outputs=["labels"], resume=True)


class Interrupted(Exception):
    pass


def test_resume_continues_after_the_last_whole_layer(tmp_path, monkeypatch):
    data, model = graph(), trained_looking(MODELS["pyg_mgpu gcn"])  # 3 layers, GCN's degrees
    expected = model(data.x, data.edge_index)
    run_layer, computed = predictions._Run._run_layer, []

    def stop_before(layer):
        def counted(run, i):
            if i == layer:
                raise Interrupted
            computed.append(i)
            run_layer(run, i)
        monkeypatch.setattr(predictions._Run, "_run_layer", counted)

    stop_before(2)  # layers 1 and 2 finished, then a failure
    with pytest.raises(Interrupted):
        pyg_mgpu.predict(model, data, tmp_path, embeddings=1, batch_size=50)
    assert computed == [-1, 0, 1]
    layers = tmp_path / predictions.LAYERS
    # Layer 2 is whole; a half-written layer 3 (garbage) lies beside it.
    assert (layers / "layer2.npy").is_file()
    store.create(layers / "logits.npy", (NUM_NODES, 5), np.float32)
    np.load(store.partial(layers / "logits.npy"), mmap_mode="r+")[:] = 1e9
    computed.clear()
    stop_before(None)
    got = pyg_mgpu.predict(model, data, tmp_path, embeddings=1, batch_size=50, resume=True)
    assert computed == [2]  # the degrees and layers 1 and 2 were not computed again
    torch.testing.assert_close(tensor(got.logits[:]), expected, rtol=0, atol=1e-4)
    assert got.embeddings.shape == (NUM_NODES, 16)
    assert not layers.exists() and not list(tmp_path.glob(".*"))


def test_resume_of_finished_outputs_computes_nothing_and_checks_the_model(tmp_path,
                                                                            monkeypatch):
    data, model = graph(), trained_looking(MODELS["pyg_mgpu gcn"])
    options = dict(outputs=["logits"], embeddings=1, nodes=None, batch_size=50,
                   hidden_dtype="float32")
    first = pyg_mgpu.predict(model, data, tmp_path, **options)
    logits = tensor(first.logits[:])
    assert predictions.check_resume(model, data, tmp_path, **options)

    def no_layer(run, i):
        raise AssertionError(f"layer {i} computed again")
    monkeypatch.setattr(predictions._Run, "_run_layer", no_layer)
    again = pyg_mgpu.predict(model, data, tmp_path, resume=True, **options)
    assert torch.equal(tensor(again.logits[:]), logits)
    assert again.embeddings.shape == (NUM_NODES, 16)
    other = build_model("gcn", 8, 16, 5, 3)  # same shapes, other weights
    with pytest.raises(ValueError, match="other model"):
        predictions.check_resume(other, data, tmp_path, **options)
    with pytest.raises(ValueError, match="other embeddings"):
        pyg_mgpu.predict(model, data, tmp_path, batch_size=50, resume=True)
    # Stopped after the last layer, before the embeddings and node ids were put in place: a
    # resume is not finished yet, and finishes without computing a layer again.
    monkeypatch.undo()
    finish = predictions._Run.finish

    def stopped(run):
        raise Interrupted
    monkeypatch.setattr(predictions._Run, "finish", stopped)
    with pytest.raises(Interrupted):
        pyg_mgpu.predict(model, data, tmp_path, overwrite=True, **options)
    assert not predictions.check_resume(model, data, tmp_path, **options)
    monkeypatch.setattr(predictions._Run, "finish", finish)
    monkeypatch.setattr(predictions._Run, "_run_layer", no_layer)
    again = pyg_mgpu.predict(model, data, tmp_path, resume=True, **options)
    assert torch.equal(tensor(again.logits[:]), logits)
    assert again.embeddings.shape == (NUM_NODES, 16) and again.node_ids.shape == (NUM_NODES,)
    assert not (tmp_path / predictions.LAYERS).exists()
    # Started afresh (overwrite, no resume), the outputs are computed again.
    monkeypatch.undo()
    assert not predictions.check_resume(model, data, tmp_path / "elsewhere", **options)
    fresh = pyg_mgpu.predict(model, data, tmp_path, batch_size=50, overwrite=True)
    assert torch.equal(tensor(fresh.logits[:]), logits)


def test_resume_refuses_layers_of_another_model(tmp_path, monkeypatch):
    data = graph()
    run_layer = predictions._Run._run_layer

    def stop_at_the_last(run, i):
        if i == 2:
            raise Interrupted
        run_layer(run, i)

    monkeypatch.setattr(predictions._Run, "_run_layer", stop_at_the_last)
    with pytest.raises(Interrupted):
        pyg_mgpu.predict(trained_looking(MODELS["pyg_mgpu sage"]), data, tmp_path)
    monkeypatch.undo()
    other = build_model("sage", 8, 16, 5, 3)  # same shapes, other weights
    with pytest.raises(ValueError, match="other model"):
        pyg_mgpu.predict(other, data, tmp_path, resume=True)


@pytest.mark.slow
def test_two_ranks_share_each_layer_and_resume_after_a_rank_failed(tmp_path):
    data, model = graph(), trained_looking(MODELS["PyG GAT"])
    expected = model(data.x, data.edge_index)
    computed = torch.zeros(2, 2, dtype=torch.long).share_memory_()
    with pytest.raises(RankFailed, match="injected failure before layer 2"):
        spawn(_predict_ranks.predict_on_every_rank, args=(data, model, str(tmp_path), 1,
                                                          computed), devices="cpu", nprocs=2)
    assert (tmp_path / predictions.LAYERS / "layer1.npy").is_file()
    spawn(_predict_ranks.predict_on_every_rank, args=(data, model, str(tmp_path), -1, computed),
          devices="cpu", nprocs=2)
    assert computed.tolist() == [[1, 1], [1, 1]]  # layer 1 once, layer 2 after the resume
    logits = tensor(np.load(tmp_path / "logits.npy"))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
    assert torch.equal(tensor(np.load(tmp_path / "labels.npy")), expected.argmax(-1))
    hidden = F.relu(model.convs[0](data.x, data.edge_index))
    torch.testing.assert_close(tensor(np.load(tmp_path / "embeddings.npy")), hidden,
                               rtol=0, atol=1e-4)
