"""Layer-wise full-graph inference equals the full-graph model, on one rank and on two."""
import math

import pytest
import torch

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.distributed.launch import launch_local
from pyg_mgpu.train.inference import exact_accuracy, gathered_rows, layerwise_logits
from pyg_mgpu.nn.sage import GraphSAGE
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.sampling.sharding import shard_bounds

import _inference_ranks

CPU = torch.device("cpu")


def small_graph(num_nodes=997):  # a prime: no batch size or world size divides it
    return make_synthetic(SyntheticSpec(num_nodes=num_nodes, num_edges=12_000,
                                        num_features=8), seed=0)


def make_model(graph, num_layers, hidden=16):
    torch.manual_seed(num_layers)
    return GraphSAGE(graph.num_features, hidden, graph.num_classes, num_layers).eval()


@pytest.mark.parametrize("num_nodes", [1, 5, 7, 12, 97])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
def test_gathered_rows_put_each_slice_at_its_padded_offset(num_nodes, world_size):
    slice_rows = math.ceil(num_nodes / world_size)
    rows = gathered_rows(torch.arange(num_nodes), num_nodes, world_size)
    for rank in range(world_size):
        start, end = shard_bounds(num_nodes, world_size, rank)
        expected = torch.arange(end - start) + rank * slice_rows
        assert torch.equal(rows[start:end], expected)
    assert rows.max() < world_size * slice_rows


@pytest.mark.parametrize("num_layers", [2, 3])
def test_equals_the_untrimmed_model_on_the_full_graph(num_layers):
    graph = small_graph()
    model = make_model(graph, num_layers)
    expected = model(graph.x, graph.edge_index())
    got = layerwise_logits(model, graph, rank=0, world_size=1, batch_size=100, device=CPU)
    assert got.shape == (graph.num_nodes, graph.num_classes)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bf16_stored_features_give_the_float32_model_on_rounded_features():
    graph = small_graph()
    model = make_model(graph, 2)
    rounded = graph.x.to(torch.bfloat16)
    expected = model(rounded.float(), graph.edge_index())
    graph.x = rounded  # as --amp bf16 stores them
    got = layerwise_logits(model, graph, rank=0, world_size=1, batch_size=100, device=CPU)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_ignores_dropout_and_leaves_the_training_flag():
    graph = small_graph()
    model = make_model(graph, 2).train()
    got = layerwise_logits(model, graph, rank=0, world_size=1, batch_size=256, device=CPU)
    assert model.training
    torch.testing.assert_close(got, model.eval()(graph.x, graph.edge_index()),
                               rtol=1e-5, atol=1e-5)


def test_equals_sampled_evaluation_with_all_neighbours():
    graph = small_graph()
    model = make_model(graph, 2)
    seeds = graph.val_idx
    out = NeighborSampler(graph.loader_data(), [-1, -1], seed=0).sample(seeds)
    sampled = model(graph.x[out.node], torch.stack([out.row, out.col]),
                    out.num_sampled_nodes, out.num_sampled_edges)
    logits = layerwise_logits(model, graph, rank=0, world_size=1, batch_size=64, device=CPU)
    torch.testing.assert_close(logits[seeds], sampled, rtol=1e-5, atol=1e-5)
    sampled_acc = float((sampled.argmax(-1) == graph.y[seeds]).float().mean())
    assert exact_accuracy(logits, graph, seeds) == pytest.approx(sampled_acc)


def test_exact_accuracy_counts_correct_rows():
    graph = small_graph(num_nodes=20)
    logits = torch.nn.functional.one_hot(graph.y.clamp(min=0), graph.num_classes).float()
    idx = torch.arange(10)
    assert exact_accuracy(logits, graph, idx) == 1.0
    logits[idx[:4]] = logits[idx[:4]].roll(1, dims=1)  # 4 of 10 now predict another class
    assert exact_accuracy(logits, graph, idx) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="one per node"):
        exact_accuracy(logits[:5], graph, idx)


def test_bad_arguments_are_named():
    graph = small_graph(num_nodes=20)
    model = make_model(graph, 2)
    with pytest.raises(ValueError, match="batch size"):
        layerwise_logits(model, graph, rank=0, world_size=1, batch_size=0, device=CPU)
    with pytest.raises(RuntimeError, match="process group"):
        layerwise_logits(model, graph, rank=0, world_size=2, batch_size=8, device=CPU)


@pytest.mark.slow
@pytest.mark.parametrize("num_layers", [2, 3])
def test_two_ranks_get_the_single_process_logits(num_layers):
    graph = small_graph().share_memory_()  # 997 nodes: slices of 499 and 498, one padding row
    model = make_model(graph, num_layers)
    expected = layerwise_logits(model, graph, rank=0, world_size=1, batch_size=100, device=CPU)
    result = torch.full((2, graph.num_nodes, graph.num_classes), float("nan")).share_memory_()
    launch_local(_inference_ranks.layerwise_on_every_rank, [CPU] * 2,
                 args=(graph, model.state_dict(), num_layers, 16, 100, result), timeout_s=120)
    for rank in range(2):
        torch.testing.assert_close(result[rank], expected, rtol=1e-5, atol=1e-5)
