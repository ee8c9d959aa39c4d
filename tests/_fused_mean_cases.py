"""The fused gather-and-mean kernels (``pyg_mgpu.nn.fused_mean``) against the plain-torch route,
on CPU tensors under Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before anything imports triton: triton's own library
functions are made interpreted or compiled when triton is imported, and in a test session
another module (Lightning, through torch) may import it first. So these cases run in a process
of their own, started with the variable set, by ``tests/test_fused_mean.py``.

Tolerances: fp32 means and gradients to 1e-5 (absolute and relative; only the order of the
sums differs); bf16 outputs within 2e-2 of the fp32 reference of the same bf16 inputs (one
bf16 rounding of a value below 4 is at most 2**-7).
"""
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

_before = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    pytest.importorskip("triton")
    compiled_before = "pyg_mgpu.nn.fused_mean" in sys.modules
    import pyg_mgpu.nn.fused_mean as fused_mean
    if compiled_before:
        fused_mean = importlib.reload(fused_mean)
finally:
    if _before is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = _before

from pyg_mgpu.nn import sage  # noqa: E402
from pyg_mgpu.nn.sage import GraphSAGE, mean_aggregate, sage_layer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    """Triton's interpreter for every test of this file (kernels on CPU tensors)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


FP32 = dict(rtol=1e-5, atol=1e-5)
BF16 = dict(rtol=2e-2, atol=2e-2)


def csr(degrees, num_src, seed=0):
    """CSR pointers of ``degrees`` and uniformly drawn sources (int64)."""
    gen = torch.Generator().manual_seed(seed)
    degrees = torch.tensor(degrees)
    ptr = torch.zeros(degrees.numel() + 1, dtype=torch.long)
    ptr[1:] = degrees.cumsum(0)
    return ptr, torch.randint(0, num_src, (int(ptr[-1]),), generator=gen)


def segment_mean(x, ptr, src):
    """The reference: ``index_select`` then ``index_add_`` by destination, over the degree."""
    deg = ptr.diff()
    dst = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    total = torch.zeros(deg.numel(), x.size(1), dtype=x.dtype).index_add_(
        0, dst, x.index_select(0, src))
    return total / deg.clamp(min=1).unsqueeze(1).to(x.dtype)


# Empty rows (first, middle, last), a hub row of 70 edges (several blocks of 16 and a partial
# one), rows of exactly one block; 130 features: a second, partial block of features.
DEGREES = [0, 3, 70, 0, 16, 1, 17, 0]


@pytest.mark.parametrize("index_type", [torch.int32, torch.int64])
@pytest.mark.parametrize("num_features", [5, 130])
def test_means_and_gradients_match_index_add(index_type, num_features):
    ptr, src = csr(DEGREES, num_src=40)
    x = torch.randn(40, num_features, requires_grad=True)
    got, root = fused_mean.gather_mean(x, ptr.to(index_type), src.to(index_type), num_root=3)
    want = segment_mean(x, ptr, src)
    torch.testing.assert_close(got, want, **FP32)
    assert torch.equal(got[torch.tensor(DEGREES) == 0], torch.zeros(3, num_features))
    assert torch.equal(root, x[:3].detach())
    grad, grad_root = torch.randn_like(want), torch.randn(3, num_features)
    (by_kernel,) = torch.autograd.grad([got, root], x, [grad, grad_root])
    (by_torch,) = torch.autograd.grad([want, x[:3]], x, [grad, grad_root])
    torch.testing.assert_close(by_kernel, by_torch, **FP32)


def test_means_match_the_embedding_bag_path():
    ptr, src = csr(DEGREES, num_src=30, seed=1)
    x = torch.randn(30, 12, requires_grad=True)
    got = fused_mean.gather_mean(x, ptr.int(), src.int(), num_root=8)
    want = mean_aggregate(x, ptr, src, num_root=8)
    grads = [torch.randn(8, 12), torch.randn(8, 12)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32)
    torch.testing.assert_close(torch.autograd.grad(got, x, grads)[0],
                               torch.autograd.grad(want, x, grads)[0], **FP32)


def test_rows_read_through_an_index_equal_the_gathered_rows():
    ptr, src = csr(DEGREES, num_src=25, seed=2)
    table = torch.randn(100, 9)
    n_id = torch.randperm(100)[:25]
    n_id[5] = n_id[7]  # a row named twice: its gradient gets both shares
    table.requires_grad_(True)
    got = fused_mean.gather_mean(table, ptr.int(), src.int(), n_id.int(), num_root=6)
    gathered = table[n_id]
    want = (segment_mean(gathered, ptr, src), gathered[:6])
    grads = [torch.randn(8, 9), torch.randn(6, 9)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32)
    torch.testing.assert_close(torch.autograd.grad(got, table, grads)[0],
                               torch.autograd.grad(want, table, grads)[0], **FP32)
    # A feature table without a gradient (a batch's first layer) makes none.
    out, _ = fused_mean.gather_mean(table.detach(), ptr.int(), src.int(), n_id.int())
    assert not out.requires_grad


def test_bf16_means_and_gradients_are_fp32_sums_rounded_once():
    ptr, src = csr(DEGREES, num_src=40, seed=3)
    x = torch.randn(40, 20).to(torch.bfloat16).requires_grad_(True)
    got, root = fused_mean.gather_mean(x, ptr.int(), src.int(), num_root=2)
    assert got.dtype == root.dtype == torch.bfloat16
    x32 = x.detach().float().requires_grad_(True)
    want = segment_mean(x32, ptr, src)
    torch.testing.assert_close(got.float(), want, **BF16)
    grad = torch.randn(len(DEGREES), 20).to(torch.bfloat16)
    (by_kernel,) = torch.autograd.grad(got, x, grad)
    assert by_kernel.dtype == torch.bfloat16
    (by_torch,) = torch.autograd.grad(want, x32, grad.float())
    torch.testing.assert_close(by_kernel.float(), by_torch, **BF16)
    # The embedding_bag path in bf16 agrees to the same tolerance.
    torch.testing.assert_close(got, mean_aggregate(x.detach(), ptr, src)[0], **BF16)


def test_no_destinations_and_no_edges():
    x = torch.randn(4, 3, requires_grad=True)
    out, _ = fused_mean.gather_mean(x, torch.zeros(1, dtype=torch.int32),
                                    torch.zeros(0, dtype=torch.int32))
    assert out.shape == (0, 3)
    out, _ = fused_mean.gather_mean(x, torch.zeros(3, dtype=torch.int32),
                                    torch.zeros(0, dtype=torch.int32))
    assert torch.equal(out, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="int32 or int64"):
        fused_mean.gather_mean(x, torch.zeros(3), torch.zeros(0, dtype=torch.int32))


def small_batch():
    """A 2-hop [5, 5] sample of 16 seeds on a small synthetic graph: (table, n_id, edge
    index, nodes per hop, edges per hop)."""
    from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
    from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
    g = make_synthetic(SyntheticSpec(num_nodes=400, num_edges=3000, num_features=8), seed=0)
    out = NeighborSampler(g.loader_data(), [5, 5], seed=0).sample(torch.arange(16))
    return (g.x, out.node, torch.stack([out.row, out.col]), out.num_sampled_nodes,
            out.num_sampled_edges)


def run_model(monkeypatch, fused: bool, through_n_id: bool):
    """A 2-layer GraphSAGE's logits and weight gradients; ``fused``: the Triton aggregation
    (allowed on CPU tensors here, where the interpreter runs it)."""
    table, n_id, edge_index, nodes, edges = small_batch()
    monkeypatch.setattr(sage, "fused_aggregation_runs", lambda x: fused)
    torch.manual_seed(0)
    model = GraphSAGE(8, 16, 5, 2, dropout=0.0, fused_aggregation=fused)
    if through_n_id:
        logits = model(table, edge_index, nodes, edges, n_id=n_id)
    else:
        logits = model(table[n_id], edge_index, nodes, edges)
    logits.square().sum().backward()
    return logits.detach(), [p.grad for p in model.parameters()]


def test_model_with_fused_aggregation_matches_the_embedding_bag_model(monkeypatch):
    want_logits, want_grads = run_model(monkeypatch, fused=False, through_n_id=False)
    for through_n_id in (False, True):
        logits, grads = run_model(monkeypatch, fused=True, through_n_id=through_n_id)
        torch.testing.assert_close(logits, want_logits, **FP32)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, **FP32)
    # Without the fused path, n_id means the rows are gathered first: the same model exactly.
    logits, grads = run_model(monkeypatch, fused=False, through_n_id=True)
    assert torch.equal(logits, want_logits)


def test_cpu_tensors_keep_the_embedding_bag_path():
    """On CPU tensors the switch changes nothing: the same bits as the default model."""
    table, n_id, edge_index, nodes, edges = small_batch()
    assert not sage.fused_aggregation_runs(table)
    outputs = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = GraphSAGE(8, 16, 5, 2, dropout=0.0, fused_aggregation=fused)
        outputs.append(model(table[n_id], edge_index, nodes, edges))
    assert torch.equal(outputs[0], outputs[1])


def test_sage_layer_fused_equals_sage_layer():
    from torch_geometric.nn import SAGEConv
    ptr, src = csr(DEGREES, num_src=20, seed=4)
    x = torch.randn(20, 6)
    torch.manual_seed(0)
    conv = SAGEConv(6, 4, aggr="mean")
    torch.testing.assert_close(sage_layer(conv, x, 8, ptr.int(), src.int(), fused=True),
                               sage_layer(conv, x, 8, ptr, src), **FP32)


@pytest.fixture
def one_rank(tmp_path):
    """A process group of one CPU rank (gloo), as the CLI's training loop runs in."""
    import torch.distributed as dist
    from pyg_mgpu.distributed.context import RankContext
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    yield RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                      backend="gloo")
    dist.destroy_process_group()


def train_one_epoch(monkeypatch, ctx, in_place: bool) -> dict:
    """One epoch and a validation of the CLI's pieces (``build_ddp``, ``build_loaders``,
    ``train_epoch``) on a small synthetic graph, planned as on a GPU that holds the whole graph
    (``--graph-on gpu``), with ``--fused-aggregation`` and the fused kernels allowed on CPU
    tensors. ``in_place`` False: the loaders gather ``x[n_id]`` as they do without the fused
    route. Returns what the model was called with and computed, step by step."""
    from dataclasses import replace
    from pyg_mgpu.train import trainer
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.dataset import load_configured
    from pyg_mgpu.train.loop import StageTimer, train_epoch
    from pyg_mgpu.train.plan import plan_rank
    from pyg_mgpu.train.trainee import build_ddp
    cfg = TrainConfig.from_flags(num_nodes=300, num_edges=2000, num_features=6, num_classes=3,
                                 hidden=8, batch_size=40, fanout="4,3", dropout=0.0,
                                 fused_aggregation=True)
    graph = load_configured(cfg)
    seen = {"inputs": [], "logits": [], "grads": [], "indexed_means": 0}
    gather_mean = fused_mean.gather_mean

    def counted_gather_mean(table, ptr, src, index=None, num_root=0):
        seen["indexed_means"] += index is not None
        return gather_mean(table, ptr, src, index, num_root)

    def record(module, args, kwargs, out):
        seen["inputs"].append((args[0] is graph.x, kwargs.get("n_id")))
        seen["logits"].append(out.detach().clone())

    with monkeypatch.context() as patch:
        patch.setattr(sage, "fused_aggregation_runs", lambda x: True)
        patch.setattr(fused_mean, "gather_mean", counted_gather_mean)
        # Planned as on a GPU holding the whole graph; the fused means either read the table
        # in place or take the rows the loader gathered.
        route = "in_place" if in_place else "means"
        patch.setattr(trainer, "plan_rank", lambda *a: replace(
            plan_rank(*a), graph_on="gpu", fused_aggregation=route))
        trainee = build_ddp(cfg, graph, ctx)
        data = trainer.build_loaders(cfg, graph, ctx)
        trainee.model.register_forward_hook(record, with_kwargs=True)
        data.train_loader.set_epoch(1)
        loss, acc, _ = train_epoch(
            trainee.trained, trainee.optimizer, data.train_loader, ctx, StageTimer(ctx.device),
            1, cfg, trainee.grad_sync, after_step=lambda *_: seen["grads"].append(
                [p.grad.clone() for p in trainee.model.parameters()]))
        seen["val_acc"] = data.evaluator.accuracy(trainee.model, graph.val_idx)
        seen["batch"] = next(iter(data.train_loader))
    seen.update(graph=graph, loss=loss, acc=acc, table=data.train_loader.feature_table,
                weights=[p.detach().clone() for p in trainee.model.parameters()])
    return seen


def test_training_reads_the_feature_table_in_place(monkeypatch, one_rank):
    """The fused route: batches without x, the model called with the table and n_id; its
    logits, gradients, loss, weights and accuracies equal those of gathered batches."""
    gathered = train_one_epoch(monkeypatch, one_rank, in_place=False)
    fused = train_one_epoch(monkeypatch, one_rank, in_place=True)
    graph = fused["graph"]
    assert fused["table"] is graph.x and "x" not in fused["batch"]
    assert len(fused["grads"]) >= 2  # steps of the epoch
    # Every forward (training steps, then validation) read the table through the batch's n_id.
    assert all(is_table and n_id is not None for is_table, n_id in fused["inputs"])
    assert fused["indexed_means"] == len(fused["inputs"])  # the first layer's, each forward
    # Gathered: the loader's rows, as without the fused route.
    assert gathered["table"] is None and gathered["indexed_means"] == 0
    assert all(not is_table and n_id is None for is_table, n_id in gathered["inputs"])
    assert torch.equal(gathered["batch"].x, graph.x[gathered["batch"].n_id])
    assert len(fused["inputs"]) == len(gathered["inputs"])
    for a, b in zip(fused["logits"], gathered["logits"]):
        torch.testing.assert_close(a, b, **FP32)
    for step_a, step_b in zip(fused["grads"], gathered["grads"], strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            torch.testing.assert_close(a, b, **FP32)
    for a, b in zip(fused["weights"], gathered["weights"], strict=True):
        torch.testing.assert_close(a, b, **FP32)
    assert abs(fused["loss"] - gathered["loss"]) < 1e-5
    assert fused["acc"] == gathered["acc"] and fused["val_acc"] == gathered["val_acc"]
