"""Heterogeneous node classification: the models, the featurization of ogbn-mag's featureless
types, and the CLI on 2 CPU ranks (accuracy against features only, resume, OGB's raw files)."""
import json
import sys
import time
from pathlib import Path

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import SAGEConv, to_hetero

import pyg_mgpu
from pyg_mgpu.data.hetero_datasets import fill_missing_features
from pyg_mgpu.data.synthetic_hetero import SyntheticHeteroSpec, make_synthetic_hetero
from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.nn.hetero import HeteroGNN, layer_plan
from test_datasets import no_stdin, offline, write_ogbn_mag  # noqa: F401 (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hetero_node_classification import features_only_accuracy  # noqa: E402

SMALL = SyntheticHeteroSpec(num_papers=300, num_authors=120, num_cites=1500, num_writes=900)
MAG_EDGE_TYPES = [("author", "affiliated_with", "institution"), ("author", "writes", "paper"),
                  ("paper", "cites", "paper"), ("paper", "has_topic", "field_of_study"),
                  ("institution", "rev_affiliated_with", "author"),
                  ("paper", "rev_writes", "author"), ("field_of_study", "rev_has_topic", "paper")]


class TwoLayerSAGE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = SAGEConv((-1, -1), 16), SAGEConv((-1, -1), 5)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def test_hetero_sage_computes_what_to_hetero_graphsage_computes():
    data = make_synthetic_hetero(SMALL)
    reference = to_hetero(TwoLayerSAGE(), data.metadata(), aggr="sum")
    with torch.no_grad():
        reference(data.x_dict, data.edge_index_dict)  # sizes the lazy layers
    model = HeteroGNN(data.metadata(), {"paper": 64, "author": 64}, 16, 5, num_layers=2,
                      target="paper", dropout=0.0)
    for i, (_, edge_types) in enumerate(model.plan):
        for et in edge_types:  # the same weights, edge type by edge type
            key = "__".join(et)
            model.convs[i][key].load_state_dict(getattr(reference, f"conv{i + 1}")[key]
                                                .state_dict())
    model.eval()
    expected = reference(data.x_dict, data.edge_index_dict)["paper"]
    assert torch.allclose(model(data.x_dict, data.edge_index_dict), expected, atol=1e-5)
    # The last layer's (paper, rev_writes, author) copy, which never reaches papers, is gone.
    assert sum(p.numel() for p in model.parameters()) < \
        sum(p.numel() for p in reference.parameters())


def test_layer_plan_keeps_only_what_reaches_the_target():
    plan = layer_plan(MAG_EDGE_TYPES, "paper", 2)
    last_outputs, last_edges = plan[1]
    assert last_outputs == ["paper"]
    assert {et[2] for et in last_edges} == {"paper"} and len(last_edges) == 3
    first_outputs, first_edges = plan[0]
    assert set(first_outputs) == {"paper", "author", "field_of_study"}  # not institution
    assert ("author", "affiliated_with", "institution") not in first_edges
    assert ("institution", "rev_affiliated_with", "author") in first_edges


@pytest.mark.parametrize("conv", ["sage", "rgcn"])
def test_every_parameter_gets_a_gradient(conv):
    # DistributedDataParallel (without find_unused_parameters) waits for every gradient.
    data = HeteroData()
    for t, n in (("paper", 6), ("author", 4), ("field_of_study", 2), ("institution", 2)):
        data[t].x = torch.randn(n, 3)
    for src, rel, dst in MAG_EDGE_TYPES:
        n_src, n_dst = data[src].num_nodes, data[dst].num_nodes
        data[src, rel, dst].edge_index = torch.stack([torch.arange(6) % n_src,
                                                      torch.arange(6) % n_dst])
    model = HeteroGNN(data.metadata(), dict.fromkeys(data.node_types, 3), 8, 4, num_layers=2,
                      target="paper", conv=conv)
    model(data.x_dict, data.edge_index_dict).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_sage_refuses_a_type_that_receives_no_edges():
    metadata = (["paper", "author"], [("author", "writes", "paper"),
                                      ("paper", "cites", "paper")])
    with pytest.raises(ValueError, match="author.*receive no edges"):
        HeteroGNN(metadata, {"paper": 3, "author": 3}, 8, 2, num_layers=2, target="paper")
    HeteroGNN(metadata, {"paper": 3, "author": 3}, 8, 2, num_layers=2, target="paper",
              conv="rgcn")  # R-GCN's own weight per node type gives authors an output


def test_featureless_types_take_their_neighbours_mean():
    data = HeteroData()
    data["paper"].x = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 4.0]])
    data["author"].num_nodes = 3
    data["institution"].num_nodes = 2
    data["paper", "rev_writes", "author"].edge_index = torch.tensor([[0, 1, 2], [0, 0, 1]])
    data["author", "affiliated_with", "institution"].edge_index = torch.tensor([[0, 1], [1, 1]])
    fill_missing_features(data)
    assert data["author"].x.tolist() == [[2.0, 1.0], [5.0, 4.0], [0.0, 0.0]]  # 2: no papers
    # Institutions: one round later, from the authors' new features.
    assert data["institution"].x.tolist() == [[0.0, 0.0], [3.5, 2.5]]
    unreachable = HeteroData()
    unreachable["paper"].x = torch.randn(2, 2)
    unreachable["venue"].num_nodes = 2
    with pytest.raises(ValueError, match="venue"):
        fill_missing_features(unreachable)


def test_accuracy_reads_the_seed_type_of_heterogeneous_batches():
    data = make_synthetic_hetero(SMALL)
    model = HeteroGNN(data.metadata(), {"paper": 64, "author": 64}, 16, data.num_classes,
                      num_layers=2, target="paper")
    loader = pyg_mgpu.NeighborLoader(data, [-1, -1], input_nodes=("paper", data["paper"].val_mask),
                                     batch_size=7)
    model.eval()
    with torch.no_grad():  # all neighbours over two hops: the full graph's outputs
        predicted = model(data.x_dict, data.edge_index_dict).argmax(-1)
    mask = data["paper"].val_mask
    expected = float((predicted[mask] == data["paper"].y[mask]).float().mean())
    assert pyg_mgpu.accuracy(model, loader, sum_over_ranks=False) == pytest.approx(expected)


CLI = ["--dataset", "synthetic-hetero", "--devices", "cpu", "--nprocs", "2"]


@pytest.mark.slow
def test_cli_trains_the_synthetic_graph_far_above_features_only(tmp_path):
    assert main(CLI + ["--model", "rgcn", "--eval-on", "all", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    baseline = features_only_accuracy(make_synthetic_hetero())
    assert baseline < 0.45
    assert metrics["test_acc"] > baseline + 0.35, (metrics["test_acc"], baseline)
    assert metrics["dataset"] == "synthetic-hetero" and metrics["model"] == "rgcn"
    assert metrics["world_size"] == 2
    # Every training paper once per epoch: 10,000 of them in batches of 1024 over 2 ranks.
    assert metrics["train_nodes"] == 10_000 and metrics["steps_per_epoch"] == 5


@pytest.mark.slow
def test_cli_resume_reaches_the_uninterrupted_result(tmp_path):
    run = CLI + ["--batch-size", "2048"]
    assert main(run + ["--epochs", "3", "--out", str(tmp_path / "full")]) == 0
    assert main(run + ["--epochs", "2", "--out", str(tmp_path / "cut")]) == 0
    assert main(run + ["--epochs", "3", "--resume", str(tmp_path / "cut")]) == 0
    full = json.loads((tmp_path / "full" / "metrics.json").read_text())
    resumed = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert [e["train_loss"] for e in resumed["epochs"]] == \
        [e["train_loss"] for e in full["epochs"]]
    for key in ("best_val_acc", "best_epoch", "test_acc"):
        assert resumed[key] == full[key]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "rgcn"])
def test_cli_reads_ogbn_mag_from_raw_files(tmp_path, offline, no_stdin, model):
    write_ogbn_mag(tmp_path / "data")
    out = tmp_path / "run"
    assert main(["--dataset", "ogbn-mag", "--root", str(tmp_path / "data"), "--model", model,
                 "--devices", "cpu", "--nprocs", "2", "--epochs", "2", "--batch-size", "2",
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "ogbn-mag"
    # Each relation and its reverse; cites (paper to paper) made undirected in place, as PyG's
    # ToUndirected does (its 4 edges have no reverse among them, so 8).
    assert metrics["num_nodes"] == 14 and metrics["num_edges"] == 2 * 19
    assert metrics["train_nodes"] == 3 and len(metrics["epochs"]) == 2


@pytest.mark.parametrize("argv,message", [
    (CLI + ["--model", "gat"], "--model must be one of sage, rgcn"),
    (["--model", "rgcn"], "--model rgcn is for heterogeneous datasets"),
    (CLI + ["--inference", "layerwise"], "--inference layerwise is for homogeneous datasets"),
    (CLI + ["--graph-on", "gpu"], "--graph-on gpu is for homogeneous datasets"),
    (CLI + ["--recipe", "pyg"], "--recipe pyg is for homogeneous datasets"),
])
def test_options_the_heterogeneous_path_lacks_are_refused(argv, message, tmp_path, capsys):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.slow
def test_cli_resumes_mid_epoch_exactly_after_a_crash(tmp_path):
    # 20 steps an epoch on each of 2 ranks; a step checkpoint every 3 of them.
    from _processes import kill_group
    from test_stop import CLI as COMMAND, assert_same_run, read_checkpoint, start

    run = CLI + ["--model", "rgcn", "--batch-size", "256", "--epochs", "3"]
    assert main(run + ["--out", str(tmp_path / "full")]) == 0
    uninterrupted = json.loads((tmp_path / "full" / "metrics.json").read_text())
    cut, log = tmp_path / "cut", tmp_path / "log.txt"
    job = start(COMMAND + run + ["--out", str(cut), "--checkpoint-every-steps", "3"], log)
    try:
        deadline = time.monotonic() + 120
        while True:  # a step checkpoint inside epoch 2, then the whole job dies at once
            ckpt = read_checkpoint(cut)
            if ckpt and ckpt["step"] and ckpt["step"]["epoch"] == 2:
                break
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
    finally:
        kill_group(job.pid)
        job.wait()
    assert 0 < read_checkpoint(cut)["step"]["done"] < 20
    assert main(run + ["--resume", str(cut)]) == 0
    assert_same_run(cut, uninterrupted)


@pytest.mark.parametrize("conv", ["sage", "rgcn"])
@pytest.mark.parametrize("fanout", [[4, 3], [3, 2, 2]])
def test_trimmed_layers_give_the_seeds_the_untrimmed_outputs(conv, fanout):
    data = make_synthetic_hetero(SMALL)
    loader = pyg_mgpu.NeighborLoader(data, fanout, input_nodes=("paper", None), batch_size=16,
                                     seed=0)
    torch.manual_seed(0)
    model = HeteroGNN(data.metadata(), {"paper": 64, "author": 64}, 16, data.num_classes,
                      num_layers=len(fanout), target="paper", conv=conv).eval()
    for batch in list(loader)[:4]:
        seeds = batch["paper"].batch_size
        full = model(batch.x_dict, batch.edge_index_dict)[:seeds]
        trimmed = model(batch.x_dict, batch.edge_index_dict,
                        num_sampled_nodes_dict=batch.num_sampled_nodes_dict,
                        num_sampled_edges_dict=batch.num_sampled_edges_dict)
        assert trimmed.size(0) < batch["paper"].num_nodes  # the last layer ran on fewer nodes
        assert torch.allclose(trimmed[:seeds], full, atol=1e-5)


def test_trimming_refuses_fewer_hops_than_layers():
    data = make_synthetic_hetero(SMALL)
    batch = next(iter(pyg_mgpu.NeighborLoader(data, [4], input_nodes=("paper", None),
                                              batch_size=16, seed=0)))
    model = HeteroGNN(data.metadata(), {"paper": 64, "author": 64}, 16, data.num_classes,
                      num_layers=2, target="paper")
    with pytest.raises(ValueError, match="1 hop\\(s\\), fewer than the model's 2 layers"):
        model(batch.x_dict, batch.edge_index_dict,
              num_sampled_nodes_dict=batch.num_sampled_nodes_dict,
              num_sampled_edges_dict=batch.num_sampled_edges_dict)
    assert model(batch.x_dict, batch.edge_index_dict).size(0) == batch["paper"].num_nodes
