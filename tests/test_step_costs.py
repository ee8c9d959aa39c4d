"""``python -m pyg_mgpu.bench --step-costs``: the ops of a training step, counted on the CPU along
the path a GPU takes, per stage, with the ops that make a GPU's host wait told apart."""
import json

import torch

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.tools import bench
from pyg_mgpu.tools.step_costs import STAGES, OpCounter, count_steps


def test_host_syncs_and_views_are_told_apart():
    x = torch.arange(10)
    counter = OpCounter()
    with counter:
        x[x > 3]                                               # boolean indexing: a wait
        x.nonzero()                                            # a wait
        int(x.sum())                                           # item(): a wait
        torch.repeat_interleave(torch.tensor([1, 2]))          # size from data: a wait
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)  # size given
        x.view(2, 5)                                           # a view, no kernel
        x[torch.tensor([1, 2])]                                # integer indexing
    costs = counter.costs[STAGES[0]]
    assert costs.sync_ops == {"index": 1, "nonzero": 1, "_local_scalar_dense": 1,
                              "repeat_interleave": 1}
    assert costs.syncs == 4 and costs.views >= 1


def test_tensors_that_stay_on_the_host_cost_nothing():
    step = torch.zeros(())
    counter = OpCounter(host_only=frozenset({step.data_ptr()}))
    with counter:
        step.add_(1)
        float(step)
        with torch.profiler.record_function("a mark"):  # torch.optim marks its step so
            pass
    assert counter.costs[STAGES[0]].kernels == 0 and counter.costs[STAGES[0]].views == 0


def test_a_step_counted_on_the_gpus_path_per_stage():
    graph = make_synthetic(SyntheticSpec(num_nodes=2000, num_edges=20000, num_features=8,
                                         num_classes=4), 0)
    gpu = count_steps(graph, fanout=(5, 3), batch_size=64, hidden=16, steps=2)
    assert set(gpu["stages"]) == set(STAGES)
    assert gpu["total"]["kernel_ops"] == sum(s["kernel_ops"] for s in gpu["stages"].values())
    assert all(s["kernel_ops"] > 0 for s in gpu["stages"].values())
    assert gpu["stages"]["sampling"]["host_syncs"] > 0  # the sampler's data-sized outputs
    # The aggregation's destination pointers: a binary search on the GPU, bincount (which
    # reads its maximum back) on the CPU. The counter follows the GPU.
    assert "bincount" not in gpu["stages"]["forward"]["sync_ops"]
    cpu = count_steps(graph, fanout=(5, 3), batch_size=64, hidden=16, steps=1, gpu_path=False)
    assert cpu["stages"]["forward"]["sync_ops"].get("bincount", 0) > 0


def test_bench_writes_the_step_costs(tmp_path):
    assert bench.main(["--step-costs", "--num-nodes", "2000", "--num-edges", "20000",
                       "--num-features", "8", "--num-classes", "4", "--fanout", "5,3",
                       "--batch-size", "64", "--hidden", "16", "--sample-batches", "3",
                       "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["mode"] == "step_costs"
    alone, walked = report["results"], report["results"]["walked"]
    assert report["results"]["cuda_graph"]["captured"]["host_syncs"] == 0
    assert alone["total"]["kernel_ops"] > 0 and walked["sample_batches"] == 3
    # Three batches per walk: the sampler's launches and reads shared three ways.
    assert walked["stages"]["sampling"]["kernel_ops"] * 2 < alone["stages"]["sampling"]["kernel_ops"]
    assert walked["stages"]["sampling"]["host_syncs"] * 2 < alone["stages"]["sampling"]["host_syncs"]


def test_a_graphed_step_counts_its_captured_ops_as_one_launch():
    graph = make_synthetic(SyntheticSpec(num_nodes=2000, num_edges=20000, num_features=8,
                                         num_classes=4), 0)
    plain = count_steps(graph, fanout=(5, 3), batch_size=64, hidden=16, steps=2)
    graphed = count_steps(graph, fanout=(5, 3), batch_size=64, hidden=16, steps=2,
                          cuda_graph=True)
    captured = graphed["captured"]
    assert captured["host_syncs"] == 0  # a capture would refuse one
    # The graph holds the model's forward and backward, zeroes the flat gradient buffer and
    # adds each of the 6 parameters' gradients into it (2 layers: lin_l, its bias, lin_r).
    model_ops = sum(plain["stages"][s]["kernel_ops"] for s in ("forward", "backward"))
    assert captured["kernel_ops"] == model_ops + 1 + 6
    assert graphed["stages"]["backward"]["kernel_ops"] == 0
    # In forward: the copy into the padded buffers and the one replay.
    copy_in = graphed["stages"]["forward"]["kernel_ops"] - 1
    assert 0 < copy_in < captured["kernel_ops"]
    assert graphed["total"]["kernel_ops"] == sum(s["kernel_ops"]
                                                 for s in graphed["stages"].values())
    assert graphed["total"]["kernel_ops"] < plain["total"]["kernel_ops"]


def test_iota_hands_out_views_of_kept_aranges():
    from pyg_mgpu import gpu_path
    cpu = torch.device("cpu")
    small = gpu_path.iota(5, cpu)
    assert torch.equal(small, torch.arange(5)) and small.dtype == torch.long
    assert gpu_path.iota(7, cpu).data_ptr() == small.data_ptr()  # the same kept tensor
    assert gpu_path.iota(3, cpu, torch.int32).dtype == torch.int32
    # It grows past what it holds; the outgrown tensor stays alive and unchanged.
    size = gpu_path._IOTA[cpu, torch.long].numel() + 1
    big = gpu_path.iota(size, cpu)
    assert torch.equal(big, torch.arange(size)) and big.data_ptr() != small.data_ptr()
    assert torch.equal(small, torch.arange(5))
    assert any(t.data_ptr() == small.data_ptr() for t in gpu_path._IOTA_OUTGROWN)
