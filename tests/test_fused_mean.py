"""The fused gather-and-mean kernels (``pyg_mgpu.nn.fused_mean``): their results against the
plain-torch route under Triton's interpreter (``tests/_fused_mean_cases.py``, in a process of
its own), the flag, and the kernels compiled for sm_90 and run on a GPU without it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_match_the_torch_route_under_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "_fused_mean_cases.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-3000:]


def test_the_flag_reaches_the_config_and_cpu_ranks_name_it_ignored():
    from pyg_mgpu.train.config import TrainConfig
    cfg = TrainConfig.from_flags(fused_aggregation=True)
    assert cfg.performance.fused_aggregation
    assert [line.split()[0] for line in cfg.ignored_flags("cpu")] == ["--fused-aggregation"]
    assert cfg.ignored_flags("cuda") == []
    assert not TrainConfig.from_flags().performance.fused_aggregation  # off by default


@pytest.mark.parametrize("flags, named", [
    ({"model": "gcn"}, "--model gcn"), ({"model": "gin"}, "--model gin"),
    ({"recipe": "pyg"}, "--recipe pyg"),
    ({"dataset": "synthetic-hetero", "model": "rgcn"}, "--model rgcn and --dataset")])
def test_gpu_ranks_name_the_flag_ignored_where_our_graphsage_does_not_run(flags, named):
    # The route is off for PyG's models and heterogeneous graphs: on GPU ranks too, the flag
    # must not pass silently.
    from pyg_mgpu.train.config import TrainConfig
    cfg = TrainConfig.from_flags(fused_aggregation=True, **flags)
    for device_type in ("cuda", "cpu"):
        (line,) = cfg.ignored_flags(device_type)
        assert line.startswith("--fused-aggregation runs in pyg_mgpu's own GraphSAGE") and \
            named in line, line


# Both kernels compiled for sm_90 (H100/H200) ahead of time, no GPU needed: the interpreter
# runs code that the compiler may still reject. Importing triton under the interpreter turns
# its own library functions into interpreted ones, so this runs in a process of its own.
AHEAD_OF_TIME = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pyg_mgpu.nn import fused_mean as fm
target = GPUTarget("cuda", 90, 32)
common = {"ptr": "*i32", "src": "*i32", "num_features": "i32", "HAS_INDEX": "constexpr",
          "BLOCK_E": "constexpr", "BLOCK_F": "constexpr"}
for dtype, index in (("fp32", None), ("bf16", "*i64")):
    consts = {"HAS_INDEX": index is not None, "BLOCK_E": 16, "BLOCK_F": 128}
    forward = dict(common, table="*" + dtype, index=index or "*i32", out="*" + dtype,
                   table_stride="i32", out_stride="i32")
    backward = dict(common, grad="*" + dtype, index=index or "*i32", grad_table="*fp32",
                    grad_stride="i32", grad_table_stride="i32")
    for kernel, signature in ((fm._mean_rows_kernel, forward),
                              (fm._scatter_mean_grad_kernel, backward)):
        order = list(kernel.arg_names)
        signature = {name: signature[name] for name in order}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=consts), target=target)
        assert compiled.asm["cubin"], kernel
        # An fp32 add to global memory: `red.global...add.f32` (Triton 3.9) or, the same
        # effect with the old value unused, `atom.global...add.f32` (Triton 3.6).
        atomic_add = re.search(r"\\b(?:red|atom)\\.global(?:\\.\\w+)*?\\.add\\.f32\\b",
                               compiled.asm["ptx"])
        print(kernel.fn.__name__, dtype, atomic_add is not None)
"""


def test_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", AHEAD_OF_TIME], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "_mean_rows_kernel fp32 False", "_scatter_mean_grad_kernel fp32 True",
        "_mean_rows_kernel bf16 False", "_scatter_mean_grad_kernel bf16 True"]


@pytest.mark.gpu
def test_compiled_kernels_match_embedding_bag_on_cuda():
    """The compiled kernels (a process without the interpreter) against the embedding_bag
    route on a small products-shaped batch: means, gradients and a whole model step, fp32
    and bf16 (the benchmark's own checks)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fused_mean.py"),
                           "--check-only", "--num-nodes", "200000", "--batch-size", "256"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout


def _rank_loaders(monkeypatch, graph_on: str = "gpu", **flags):
    """The CLI's loaders of one CPU rank on a small synthetic graph, planned with
    ``graph_on``, and with the fused kernels reported runnable on its CPU tensors."""
    import torch
    from pyg_mgpu.distributed.context import RankContext
    from pyg_mgpu.nn import sage
    from pyg_mgpu.train import plan, trainer
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.dataset import load_configured
    monkeypatch.setattr(sage, "fused_aggregation_runs", lambda x: True)
    monkeypatch.setattr(plan, "choose_placement", lambda *args: graph_on)
    cfg = TrainConfig.from_flags(num_nodes=300, num_edges=2000, num_features=6, num_classes=3,
                                 hidden=8, batch_size=40, fanout="4,3", **flags)
    graph = load_configured(cfg)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                      backend="gloo")
    return cfg, graph, trainer.build_loaders(cfg, graph, ctx)


def test_without_the_flag_batches_carry_the_gathered_rows_as_before(monkeypatch):
    import torch
    from pyg_mgpu.train.loaders import make_loader
    cfg, graph, data = _rank_loaders(monkeypatch)
    assert data.train_loader.feature_table is None
    assert not data.evaluator.features_in_place
    data.train_loader.set_epoch(1)
    # The same loader as one built without the in-place option: every field, bit for bit.
    before = make_loader(graph, graph.train_idx, fanout=cfg.training.fanout,
                         sampler=data.plan.sampler, seed=cfg.training.seed, rank=0,
                         world_size=1, batch_size=cfg.training.batch_size,
                         sample_batches=data.plan.sample_batches)
    before.set_epoch(1)
    for batch, want in zip(data.train_loader, before, strict=True):
        assert torch.equal(batch.x, graph.x[batch.n_id])
        assert batch.keys() == want.keys()
        for key in want.keys():
            same = (torch.equal(batch[key], want[key]) if torch.is_tensor(want[key])
                    else batch[key] == want[key])
            assert same, key


def test_the_fused_route_needs_our_graphsage_and_the_whole_table_on_the_gpu(monkeypatch):
    import torch
    cfg, graph, data = _rank_loaders(monkeypatch, fused_aggregation=True)
    assert data.plan.fused_aggregation == "in_place"
    assert data.train_loader.feature_table is graph.x and data.evaluator.features_in_place
    for graph_on, flags in (("gpu", {"recipe": "pyg"}),  # PyG's recipe: its model takes no n_id
                            ("gpu", {"model": "gcn"}),
                            ("gpu", {"cuda_graph": True}),  # the padded step copies x itself
                            ("host", {})):  # rows in host memory: gathered once per batch
        _, graph, data = _rank_loaders(monkeypatch, graph_on, fused_aggregation=True, **flags)
        assert data.train_loader.feature_table is None, (graph_on, flags)
        assert data.plan.fused_aggregation != "in_place", (graph_on, flags)
        batch = next(iter(data.train_loader))
        assert torch.equal(batch.x, graph.x[batch.n_id])
