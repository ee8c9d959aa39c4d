"""The run plan: every default that depends on the device, the graph or other settings is
resolved once, and the resolved values are what the rank runs and records."""
from types import SimpleNamespace

import pytest
import torch

from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.loaders import BATCHES_PER_WALK, SMALL_CPU_BATCH
from pyg_mgpu.train.plan import RunPlan, plan_rank

GRAPH = SimpleNamespace(is_hetero=False, num_features=8, x=torch.zeros(10, 8), mapped={},
                        nbytes=lambda: 1000)
CPU = SimpleNamespace(device=torch.device("cpu"), backend="gloo")


def test_the_fused_aggregations_route_is_planned_from_the_device_and_the_placement(
        monkeypatch):
    from pyg_mgpu.nn import sage
    from pyg_mgpu.train import plan as plan_module
    fused = TrainConfig.from_flags(fused_aggregation=True)
    assert plan_rank(fused, GRAPH, CPU).fused_aggregation == "off"  # CPU ranks: plain means
    monkeypatch.setattr(sage, "fused_aggregation_runs", lambda x: True)  # as on a GPU
    assert plan_rank(fused, GRAPH, CPU).fused_aggregation == "means"  # rows in host memory
    monkeypatch.setattr(plan_module, "choose_placement", lambda *args: "gpu")
    assert plan_rank(fused, GRAPH, CPU).fused_aggregation == "in_place"
    for flags in ({"cuda_graph": True}, {"model": "gcn"}, {"recipe": "pyg"}, {}):
        route = plan_rank(TrainConfig.from_flags(fused_aggregation=bool(flags), **flags),
                          GRAPH, CPU).fused_aggregation
        assert route == ("means" if "cuda_graph" in flags else "off"), flags


def test_cpu_ranks_resolve_every_default():
    plan = plan_rank(TrainConfig.from_flags(batch_size=128), GRAPH, CPU)
    assert plan == RunPlan(sampler="native", graph_on="cpu", sample_batches=1, prefetch=0,
                           feature_cache_gb=0, eval_batch_size=128, backend="gloo",
                           matmul_precision="highest", fused_aggregation="off",
                           cuda_graph=False)
    small = plan_rank(TrainConfig.from_flags(batch_size=SMALL_CPU_BATCH), GRAPH, CPU)
    assert small.sample_batches == BATCHES_PER_WALK
    given = plan_rank(TrainConfig.from_flags(sample_batches=3, prefetch=2, eval_batch_size=5),
                      GRAPH, CPU)
    assert (given.sample_batches, given.prefetch, given.eval_batch_size) == (3, 2, 5)
    tf32 = plan_rank(TrainConfig.from_flags(matmul_precision="high"), GRAPH, CPU)
    assert tf32.matmul_precision == "high"


@pytest.mark.parametrize("free, graph_on, cache_gb", [
    (2**31, "gpu", 0),  # the graph fits in half the free memory: no cache
    (1000, "host", 250 / 2**30),  # pinned on the host: a quarter of the free memory cached
])
def test_gpu_ranks_resolve_placement_prefetch_and_cache(monkeypatch, free, graph_on, cache_gb):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    gpu = SimpleNamespace(device=torch.device("cuda", 0), backend="nccl")
    plan = plan_rank(TrainConfig.from_flags(batch_size=1024), GRAPH, gpu, least_free_gpu_bytes=free)
    assert plan.graph_on == graph_on and plan.prefetch == 1
    assert plan.sample_batches == BATCHES_PER_WALK  # the sampler runs on the GPU
    assert plan.feature_cache_gb == pytest.approx(cache_gb, abs=1e-6)
    cpu_sampled = plan_rank(TrainConfig.from_flags(graph_on="cpu", feature_cache_gb=0.5), GRAPH,
                            gpu, least_free_gpu_bytes=free)
    assert (cpu_sampled.graph_on, cpu_sampled.sample_batches) == ("cpu", 1)
    assert cpu_sampled.feature_cache_gb == 0.5


def test_differences_name_each_flag():
    plan = plan_rank(TrainConfig.from_flags(batch_size=128), GRAPH, CPU)
    assert plan.differences(None) == []  # a checkpoint of an older release
    recorded = {**plan.to_dict(), "sample_batches": 8, "prefetch": 1}
    assert plan.differences(recorded) == ["--sample-batches 8 -> 1", "--prefetch 1 -> 0"]
