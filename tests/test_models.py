"""``--model``: every model's trimmed layers give the seeds what the untrimmed model gives them."""
import json

import pytest
import torch
from torch_geometric.nn.models import GCN as PyGGCN

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.nn.models import build_model
from pyg_mgpu.train.loaders import make_loader
from pyg_mgpu.train.checkpoint import CHECKPOINT, check_resumable
from pyg_mgpu.train.config import HOMOGENEOUS_MODELS, ConfigError, TrainConfig


def sampled_batch(fanout: list[int], batch_size: int = 64):
    """One batch of PyG's shape, per-hop counts included. The synthetic graph has self-loops,
    which GCN's normalization treats specially."""
    g = make_synthetic(SyntheticSpec(num_nodes=2000, num_edges=30_000, num_features=16), seed=0)
    loader = make_loader(g, g.train_idx, fanout=fanout, sampler="native", seed=0,
                         batch_size=batch_size)
    return g, next(iter(loader))


@pytest.mark.parametrize("name", HOMOGENEOUS_MODELS)
@pytest.mark.parametrize("fanout", [[10, 5], [4, 4, 4]])
def test_trimmed_seed_outputs_and_gradients_equal_untrimmed(name, fanout):
    g, batch = sampled_batch(fanout)
    seeds = batch.batch_size
    torch.manual_seed(0)
    model = build_model(name, 16, 32, g.num_classes, len(fanout), heads=4).eval()
    outputs, grads = [], []
    for counts in ({}, {"num_sampled_nodes_per_hop": batch.num_sampled_nodes,
                        "num_sampled_edges_per_hop": batch.num_sampled_edges}):
        model.zero_grad()
        out = model(batch.x, batch.edge_index, **counts)
        out[:seeds].sum().backward()
        outputs.append(out)
        grads.append([p.grad.clone() for p in model.parameters()])
    full, trimmed = outputs
    # Fewer rows: the counts were used, so the equality below is not the untrimmed run twice.
    assert full.size(0) == batch.num_nodes and trimmed.size(0) < full.size(0)
    torch.testing.assert_close(trimmed[:seeds], full[:seeds], rtol=1e-5, atol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("name, norm", [("gin", "batch"), ("gcn", "batch"), ("gin", "layer"),
                                        ("gat", "none"), ("sage", None)])
def test_training_trims_only_where_the_seeds_get_what_the_untrimmed_model_gives(name, norm):
    # BatchNorm in training normalises with the statistics of the rows it is given: trimmed,
    # the seeds' outputs differ (by 0.5 and more here), so such a model trains untrimmed.
    from pyg_mgpu.train.loop import trains_trimmed_exactly
    g, batch = sampled_batch([4, 4, 4])
    torch.manual_seed(0)
    options = {} if norm is None else {"norm": norm}
    model = build_model(name, 16, 32, g.num_classes, 3, dropout=0.0, heads=4,
                        **options).train()
    full = model(batch.x, batch.edge_index)[:batch.batch_size]
    trimmed = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                    num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
    exact = torch.allclose(trimmed, full, rtol=1e-5, atol=1e-5)
    assert trains_trimmed_exactly(model) == exact == (norm != "batch")


def test_gcn_is_pygs_gcn_untrimmed_and_layerwise():
    # Our GCN only moves the normalization out of the layers: same parameters, same outputs,
    # also through PyG's layer-wise inference (which calls the layers directly).
    from pyg_mgpu.inference.layerwise import layerwise_inference
    g, batch = sampled_batch([10, 5])
    torch.manual_seed(0)
    ours = build_model("gcn", 16, 32, g.num_classes, 2).eval()
    pyg = PyGGCN(16, 32, 2, g.num_classes).eval()
    pyg.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(batch.x, batch.edge_index), pyg(batch.x, batch.edge_index))
    data = g.to_data()
    torch.testing.assert_close(layerwise_inference(ours, data, batch_size=500),
                               layerwise_inference(pyg, data, batch_size=500))
    assert not ours.convs[0].normalize  # left as forward needs it


def test_build_model_knows_every_cli_model():
    for name in HOMOGENEOUS_MODELS:
        model = build_model(name, 16, 32, 4, 2)
        assert model(torch.randn(5, 16), torch.tensor([[1, 2], [0, 0]])).shape == (5, 4)
    gat = build_model("gat", 16, 32, 4, 2, heads=8)
    assert gat.convs[0].heads == 8 and gat.convs[0].out_channels == 4  # 8 heads x 4 = 32
    with pytest.raises(ValueError, match="unknown model 'mlp'"):
        build_model("mlp", 16, 32, 4, 2)


@pytest.mark.parametrize("options,message", [
    ({"model": "mlp"}, "--model must be one of sage, gcn, gat, gin, rgcn, got 'mlp'"),
    ({"heads": 0}, "--heads must be a positive integer"),
    ({"model": "gat", "hidden": 100, "heads": 8}, "--hidden 100 is not divisible by --heads 8"),
    ({"model": "gcn", "recipe": "pyg"}, "--recipe pyg"),
    ({"model": "gcn", "inference": "layerwise"}, "not exact for --model gcn"),
])
def test_model_options_are_validated(options, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_flags(**options)


def test_heads_only_constrain_gats_hidden_size():
    # GAT splits --hidden over its heads; GCN has no heads, so the same settings are valid.
    with pytest.raises(ConfigError, match="not divisible by --heads 8"):
        TrainConfig.from_flags(model="gat", hidden=100, heads=8)
    cfg = TrainConfig.from_flags(model="gcn", hidden=100, heads=8)
    assert cfg.model.hidden == 100


def test_bad_model_options_are_one_line_on_the_command_line(tmp_path, capsys):
    assert main(["--model", "gat", "--hidden", "100", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --hidden 100") and "\n" not in err


def test_resume_refuses_another_model(tmp_path):
    torch.save({"config": TrainConfig.from_flags(model="gcn").to_dict(), "world_size": 2,
                "epoch": 1, "step": None, "model": {}, "optimizer": {}, "history": [],
                "best": {}, "rng": []}, tmp_path / CHECKPOINT)
    check_resumable(TrainConfig.from_flags(model="gcn", resume=str(tmp_path)), 2)
    with pytest.raises(ValueError, match="model='gcn' but this run asks for 'gat'"):
        check_resumable(TrainConfig.from_flags(model="gat", resume=str(tmp_path)), 2)


@pytest.mark.slow
def test_two_ranks_train_pygs_gat(tmp_path):
    out = tmp_path / "gat"
    assert main(["--num-nodes", "1000", "--num-edges", "8000", "--num-features", "8",
                 "--num-classes", "4", "--hidden", "16", "--heads", "4", "--batch-size", "128",
                 "--epochs", "2", "--devices", "cpu", "--nprocs", "2", "--model", "gat",
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["model"] == "gat" and metrics["world_size"] == 2
    assert 0.0 <= metrics["test_acc"] <= 1.0
    # best.pt is PyG's GAT's own state_dict (no DDP "module." prefix).
    build_model("gat", 8, 16, 4, 2, heads=4).load_state_dict(torch.load(out / "best.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gat", "gin"])
def test_layerwise_inference_of_pygs_models_matches_full_neighbourhood_sampling(tmp_path, model):
    # With every neighbour sampled (--fanout=-1,-1) the sampled test accuracy is exact too, so
    # the layer-wise one (PyG's BasicGNN.inference on rank 0) must agree with it.
    out = tmp_path / model
    assert main(["--num-nodes", "1000", "--num-edges", "8000", "--num-features", "8",
                 "--num-classes", "4", "--hidden", "16", "--heads", "4", "--batch-size", "128",
                 "--epochs", "2", "--devices", "cpu", "--nprocs", "2", "--model", model,
                 "--fanout=-1,-1", "--inference", "layerwise", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert abs(metrics["test_acc_exact"] - metrics["test_acc"]) <= 0.01
