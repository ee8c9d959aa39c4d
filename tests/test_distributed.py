"""2-rank gloo tests on CPU: shared memory, global sharding invariants, reductions, failures."""
import time
from pathlib import Path

import pytest
import torch

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.distributed.context import RankFailed
from pyg_mgpu.distributed.devices import resolve_devices
from pyg_mgpu.distributed.launch import launch_local

import _ranks

CPU2 = [torch.device("cpu")] * 2
pytestmark = pytest.mark.slow


def small_graph(num_nodes=600):
    return make_synthetic(SyntheticSpec(num_nodes=num_nodes, num_edges=6000, num_features=4),
                          seed=0).share_memory_()


def test_ranks_map_the_parents_storage():
    graph = small_graph()
    result = torch.zeros(2).share_memory_()
    launch_local(_ranks.write_into_shared_graph, CPU2, args=(graph, result))
    assert result.tolist() == [1, 1]
    assert graph.x[0, 0] == 100.0 and graph.x[1, 0] == 101.0


def test_every_training_node_once_per_epoch_and_equal_steps():
    graph = small_graph(num_nodes=1001)  # 500 training nodes: shards of 250, batch 64
    epochs = 2
    seen = torch.zeros(epochs, graph.num_nodes, dtype=torch.long).share_memory_()
    steps = torch.zeros(epochs, 2, dtype=torch.long).share_memory_()
    launch_local(_ranks.record_epoch_seeds, CPU2, args=(graph, seen, steps, epochs, 64))
    expected = torch.zeros(graph.num_nodes, dtype=torch.long)
    expected[graph.train_idx] = 1
    for epoch in range(epochs):
        assert torch.equal(seen[epoch], expected), "a training node was missed or seen twice"
        assert steps[epoch, 0] == steps[epoch, 1] == 4


def test_metrics_reduce_sums_and_counts_exactly():
    result = torch.zeros(2, 2, dtype=torch.float64).share_memory_()
    launch_local(_ranks.reduce_metrics, CPU2, args=(result,))
    for rank in range(2):
        assert result[rank, 0].item() == pytest.approx(0.75)
        assert result[rank, 1].item() == pytest.approx((3 * 1.0 + 1 * 5.0) / 4)


def shared_segments() -> set:
    return set(Path("/dev/shm").glob("*pyg_mgpu-rounds-*"))


@pytest.mark.parametrize("exchange,shared", [
    ("gloo", False),
    ("shared", True),  # the CLI's CPU ranks: one machine
    ("shared, unless rank 1 cannot map it", False),  # as on two machines: gloo on both ranks
    ("shared, unless rank 0 cannot make it", False),  # /dev/shm full: gloo on both ranks
])
def test_deferred_allreduce_trains_exactly_like_ddps_blocking_one(exchange, shared):
    before = shared_segments()
    result = torch.full((2, 4), float("nan"), dtype=torch.float32).share_memory_()
    launch_local(_ranks.deferred_vs_blocking_allreduce, CPU2, args=(result, exchange))
    for rank in range(2):
        assert result[rank, 3].item() == shared, "the wrong exchange was picked"
        assert result[rank, 0].item() == 0.0, "deferred all-reduce changed the training"
        assert result[rank, 1].item() > 0.01, "the models did not train at all"
        assert result[rank, 2].item() == 0.0, "the ranks' models drifted apart"
    assert shared_segments() <= before, "a shared segment was left in /dev/shm"


def test_three_ranks_through_shared_memory_keep_identical_replicas():
    # Summed in rank order, not gloo's ring order: the same training up to rounding.
    result = torch.full((3, 4), float("nan"), dtype=torch.float32).share_memory_()
    launch_local(_ranks.deferred_vs_blocking_allreduce, [torch.device("cpu")] * 3,
                 args=(result, "shared"))
    for rank in range(3):
        assert result[rank, 3].item() == 1.0
        assert result[rank, 0].item() < 1e-5, "the shared exchange trained differently"
        assert result[rank, 1].item() > 0.01
        assert result[rank, 2].item() == 0.0, "the ranks' models drifted apart"


def test_the_padded_step_starts_from_rank_0s_weights_and_averages_gradients():
    graph = small_graph()
    from pyg_mgpu.nn.sage import GraphSAGE
    numel = sum(p.numel() for p in GraphSAGE(graph.num_features, 16, graph.num_classes,
                                             2).parameters())
    params, grads, own = (torch.zeros(2, numel).share_memory_() for _ in range(3))
    launch_local(_ranks.padded_step_over_ranks, CPU2, args=(graph, params, grads, own))
    assert torch.equal(params[0], params[1])
    assert torch.equal(grads[0], grads[1]) and not torch.equal(own[0], own[1])
    torch.testing.assert_close(grads[0], own.mean(0), rtol=1e-5, atol=1e-6)


def test_failed_rank_ends_the_job_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailed) as err:
        launch_local(_ranks.fail_on_rank_one, CPU2, timeout_s=120)
    assert "rank 1" in str(err.value) and "boom from the test" in str(err.value)
    assert time.monotonic() - start < 60


def test_unequal_step_counts_fail_fast_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(RankFailed) as err:
        launch_local(_ranks.disagree_on_steps, CPU2, timeout_s=120)
    assert "between 10 and 11 training steps" in str(err.value)
    assert time.monotonic() - start < 60


def test_device_resolution_errors_are_actionable():
    assert resolve_devices("cpu", 3) == [torch.device("cpu")] * 3
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA sees none"):
            resolve_devices("cuda:0,1", None)
    with pytest.raises(ValueError, match="^devices must be auto, cpu, cuda"):
        resolve_devices("tpu", None)
