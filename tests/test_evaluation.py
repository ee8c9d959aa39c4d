"""Exact evaluation: sums and counts reduced over ranks before one division; layer-wise inference
equal to the full-graph forward."""
from unittest import mock

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn.models import GIN, GraphSAGE

import pyg_mgpu.data.csc as csc_module
from pyg_mgpu.data import SyntheticSpec, load_dataset
from pyg_mgpu.distributed.launch import spawn
from pyg_mgpu.inference.layerwise import layerwise_inference
from pyg_mgpu.metrics import accuracy, global_ratio
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader

import _spawn_ranks
from _spawn_ranks import SHARDS, Logits

SMALL = SyntheticSpec(num_nodes=400, num_edges=4_000, num_features=8, num_classes=3)


def test_ratio_in_one_process_is_the_plain_ratio():
    assert global_ratio(3, 4) == 0.75
    assert global_ratio(torch.tensor(3), 4, sum_over_ranks=False) == 0.75
    with pytest.raises(ValueError, match="nothing was evaluated"):
        global_ratio(0, 0)


def test_accuracy_counts_only_the_seed_rows():
    model = Logits().train()
    assert accuracy(model, SHARDS[0]) == 0.75  # 3 of 4 seeds; the non-seed rows are wrong
    assert model.training, "the model's mode was not restored"


def test_accuracy_says_what_it_cannot_score():
    data = Data(x=torch.randn(6, 4), edge_index=torch.tensor([[1, 2, 3], [0, 0, 1]]))
    loader = NeighborLoader(data, [-1], batch_size=3)
    two_classes = GraphSAGE(4, 8, num_layers=1, out_channels=2)
    with pytest.raises(ValueError, match="has no y; attach the labels"):
        accuracy(two_classes, loader, sum_over_ranks=False)
    data.y = torch.tensor([0, 1, 0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"got logits \(3, 1\) and labels \(3,\)"):
        accuracy(GraphSAGE(4, 8, num_layers=1, out_channels=1), loader, sum_over_ranks=False)
    # Labels the model's own predictions but on nodes 1 and 4: 4 of 6 right.
    predicted = full_graph_logits(two_classes, data).argmax(-1)
    data.y = predicted.clone()
    data.y[[1, 4]] = 1 - predicted[[1, 4]]
    assert accuracy(two_classes, loader, sum_over_ranks=False) == 4 / 6


@pytest.mark.slow
def test_unequal_shards_reduce_to_the_exact_accuracy():
    result = torch.full((2, 3), float("nan"), dtype=torch.float64)
    spawn(_spawn_ranks.evaluate_unequal_shards, args=(result,), devices="cpu", nprocs=2)
    # 3 of 5 right over both ranks, not the 0.375 mean of the ranks' 0.75 and 0.0.
    for rank in range(2):
        assert result[rank, 0].item() == pytest.approx(0.6), "sharded accuracy"
        assert result[rank, 2].item() == pytest.approx(0.6), "global_ratio of the counts"
    assert result[0, 1].item() == pytest.approx(0.6), "rank-0-only accuracy"
    assert result[1, 1].isnan(), "rank 1 did not evaluate"


def test_a_ddp_model_scored_on_one_rank_is_scored_through_its_module():
    # DDP's own forward would broadcast BatchNorm's buffers and wait for rank 1 forever.
    data = load_dataset("synthetic", synthetic=SMALL)
    result = torch.full((2,), float("nan"), dtype=torch.float64)
    spawn(_spawn_ranks.evaluate_a_ddp_model_on_rank_0, args=(data, result), devices="cpu",
          nprocs=2, timeout_s=60)
    assert 0.0 <= result[0].item() <= 1.0 and result[0].item() == result[1].item()


def full_graph_logits(model, data):
    with torch.no_grad():
        return model.eval()(data.x, data.edge_index)


@pytest.mark.parametrize("model_class", [GraphSAGE, GIN])
def test_layerwise_inference_equals_the_full_graph_forward(model_class):
    data = load_dataset("synthetic", synthetic=SMALL)  # its CSC is attached: never rebuilt
    torch.manual_seed(0)
    model = model_class(SMALL.num_features, 16, 2, SMALL.num_classes).train()
    with mock.patch.object(csc_module, "build_csc", side_effect=AssertionError("CSC rebuilt")):
        out = layerwise_inference(model, data, batch_size=64)  # batches do not divide 400
    assert model.training, "the model's mode was not restored"
    torch.testing.assert_close(out, full_graph_logits(model, data))


def test_layerwise_inference_on_a_plain_data():
    # Edges in no particular order and no CSC yet: built once, cached with the Data.
    edge_index = torch.tensor([[0, 3, 1, 2, 4, 0], [1, 0, 4, 1, 2, 2]])
    data = Data(x=torch.randn(5, 4), edge_index=edge_index)
    model = GraphSAGE(4, 8, 2, 3)
    out = layerwise_inference(model, data, batch_size=2)
    torch.testing.assert_close(out, full_graph_logits(model, data))
    assert csc_module.cached_csc(data) is not None


def test_layerwise_inference_needs_an_inference_method():
    data = load_dataset("synthetic", synthetic=SMALL)
    with pytest.raises(TypeError, match="Logits has no inference"):
        layerwise_inference(Logits(), data)


def test_sampled_accuracy_with_every_neighbour_equals_full_graph_accuracy():
    data = load_dataset("synthetic", synthetic=SMALL)
    torch.manual_seed(0)
    model = GraphSAGE(SMALL.num_features, 16, 2, SMALL.num_classes)
    loader = NeighborLoader(data, num_neighbors=[-1, -1], input_nodes=data.test_mask,
                            batch_size=64)
    pred = full_graph_logits(model, data).argmax(-1)
    expected = (pred == data.y)[data.test_mask].float().mean().item()
    assert accuracy(model, loader) == pytest.approx(expected)


def test_epoch_totals_count_exactly_across_a_checkpoint():
    # A mid-epoch checkpoint carries exact counts; the resumed totals equal uninterrupted ones,
    # also from a state taken before the first batch.
    from pyg_mgpu.train.loop import EpochTotals
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n, 4, generator=gen), torch.randint(4, (n,), generator=gen))
               for n in (5, 7, 3, 6)]
    cpu = torch.device("cpu")

    def run(totals, part):
        for logits, y in part:
            totals.update(logits, y, torch.nn.functional.cross_entropy(logits, y))
        return totals

    whole = run(EpochTotals(cpu), batches)
    for cut in (0, 2):
        resumed = run(EpochTotals.from_state(run(EpochTotals(cpu), batches[:cut]).state(), cpu),
                      batches[cut:])
        assert resumed.state()[1:] == whole.state()[1:]
        assert resumed.compute(sum_over_ranks=False) == pytest.approx(
            whole.compute(sum_over_ranks=False))
    correct = sum(int((logits.argmax(-1) == y).sum()) for logits, y in batches)
    predicted = torch.bincount(torch.cat([logits.argmax(-1) for logits, _ in batches]),
                               minlength=4).tolist()
    assert whole.state()[1:] == (correct, 21, predicted)


@pytest.mark.slow
def test_sharded_evaluation_of_a_batchnorm_model_scores_rank0s_best_model(tmp_path):
    # After the last step each rank holds BatchNorm statistics of its own last batch (DDP
    # copies rank 0's only as a step begins): sharded evaluation must score rank 0's model,
    # the one best.pt holds and --eval-on rank0 scores.
    import json

    from pyg_mgpu.distributed_sampling import main
    common = ["--num-nodes", "300", "--num-edges", "1500", "--num-features", "8",
              "--batch-size", "16", "--fanout=-1,-1", "--model", "gin", "--norm", "batch",
              "--epochs", "2", "--devices", "cpu", "--nprocs", "2"]
    runs = {}
    for mode in ("rank0", "all"):
        assert main(common + ["--eval-on", mode, "--out", str(tmp_path / mode)]) == 0
        runs[mode] = json.loads((tmp_path / mode / "metrics.json").read_text())
    assert [e["train_loss"] for e in runs["rank0"]["epochs"]] == \
        [e["train_loss"] for e in runs["all"]["epochs"]]
    for key in ("best_val_acc", "test_acc"):
        assert runs["rank0"][key] == runs["all"][key], key
    assert [e["val_acc"] for e in runs["rank0"]["epochs"]] == \
        [e["val_acc"] for e in runs["all"]["epochs"]]
