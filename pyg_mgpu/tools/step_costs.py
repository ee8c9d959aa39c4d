"""Kernel launches and host reads of one training step, counted on the CPU:
``python -m pyg_mgpu.bench --step-costs``.

On a GPU every aten op that computes is a kernel launch of a few microseconds of host time,
and every op whose output size or value the host must know (``nonzero``, ``masked_select``,
boolean indexing, ``item()``, ``repeat_interleave`` without ``output_size``, ``bincount``,
``unique``) makes the host wait for the GPU. A ``TorchDispatchMode`` sees each op of a step on
CPU tensors; views cost no kernel. The step is the CLI's: ``pyg_mgpu.NeighborLoader`` with the
native sampler, the trimmed GraphSAGE, Adam and the epoch's device-side counters. It is
counted on the path a GPU takes (:func:`pyg_mgpu.gpu_path.counting_gpu_path`, and Adam's
multi-tensor form, its default on GPUs), stage by stage.

Not seen on the CPU: copies between host and device (the seeds' and the batch's), which a GPU
run adds.
"""
from __future__ import annotations

import contextlib
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pyg_mgpu.gpu_path import on_host, reading_hook

STAGES = ("sampling", "batch assembly", "forward", "backward", "optimizer", "metrics")

# Ops whose result size or value the host reads before it can go on: each waits for the GPU.
_SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
             "aten::bincount", "aten::_unique", "aten::_unique2", "aten::unique_dim",
             "aten::unique_consecutive", "aten::equal", "aten::is_nonzero"}
# Ops that allocate or describe memory without a kernel.
_NO_KERNEL_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::detach",
                  "aten::alias", "aten::lift_fresh", "aten::sym_size", "aten::sym_stride",
                  "aten::sym_numel", "aten::sym_storage_offset", "aten::_unsafe_view"}


@dataclass
class StageCosts:
    """What one stage of a step issued."""
    kernels: int = 0
    views: int = 0
    syncs: int = 0
    sync_ops: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {"kernel_ops": self.kernels, "views": self.views, "host_syncs": self.syncs,
                "sync_ops": dict(self.sync_ops)}


def _tensors(values) -> list:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += _tensors(value)
    return found


def is_host_sync(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the op ``name`` (``aten::...``) with these arguments makes a GPU's host wait."""
    if name in _SYNC_OPS:
        return True
    if name == "aten::repeat_interleave":  # the output size is the repeats' sum
        return ((len(args) < 2 or isinstance(args[1], torch.Tensor))
                and kwargs.get("output_size", args[2] if len(args) > 2 else None) is None)
    if name in ("aten::index", "aten::index_put", "aten::index_put_"):  # boolean masks
        return any(t.dtype == torch.bool for t in _tensors(args[1:2]))
    return False


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it by :attr:`stage`. Ops on tensors that live in host
    memory on a GPU too (``host_only``: data pointers, e.g. the optimizer's step counters;
    and :func:`~pyg_mgpu.gpu_path.host_work`) are neither kernels nor waits."""

    def __init__(self, host_only: frozenset = frozenset()):
        super().__init__()
        self.stage = STAGES[0]
        self.costs = {stage: StageCosts() for stage in STAGES}
        self.host_only = host_only

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name  # without the overload: aten::repeat_interleave
        tensors = _tensors(args)
        host = on_host() or (bool(tensors) and
                             all(t.data_ptr() in self.host_only for t in tensors))
        costs = self.costs.setdefault(self.stage, StageCosts())
        if host or name.startswith("profiler::"):  # record_function marks launch nothing
            pass
        elif func.is_view or name in _NO_KERNEL_OPS:
            costs.views += 1
        else:
            costs.kernels += 1
            if is_host_sync(name, args, kwargs):
                costs.syncs += 1
                costs.sync_ops[name.removeprefix("aten::")] += 1
        return func(*args, **kwargs)

    def host_read(self) -> None:
        """A :func:`~pyg_mgpu.gpu_path.host_ints` read: one wait for the GPU."""
        costs = self.costs.setdefault(self.stage, StageCosts())
        costs.syncs += 1
        costs.sync_ops["host read"] += 1

    def __enter__(self):
        self._reads = reading_hook(self.host_read)
        self._reads.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._reads.__exit__(*exc)
        return super().__exit__(*exc)

    def in_stage(self, stage: str) -> "OpCounter":
        self.stage = stage
        return self


MEASURED_STEPS = 3
"""Measurements :func:`count_steps` takes by default, after one warm-up."""


def batches_needed(sample_batches: int, steps: int = MEASURED_STEPS) -> int:
    """The training batches :func:`count_steps` draws: a warm-up and ``steps`` measurements,
    each a walk of ``sample_batches``."""
    return sample_batches * (steps + 1)


def count_steps(graph, *, fanout=(15, 10, 5), batch_size: int = 1024, hidden: int = 256,
                steps: int = MEASURED_STEPS, seed: int = 0, gpu_path: bool = True,
                sample_batches: int = 1, cuda_graph: bool = False) -> dict:
    """Per stage, the kernel ops, views and host syncs of a training step of the CLI's
    GraphSAGE on ``graph`` (a ``ConvertedGraph``), on the GPU's path unless ``gpu_path`` is
    False (the CPU's forms, where they differ). ``steps`` measurements after a warm-up; with
    ``sample_batches`` k, each measurement is the k steps of one walk, divided by k (the
    walk's costs shared by its batches).

    With ``cuda_graph`` the step is ``--cuda-graph``'s
    (:class:`~pyg_mgpu.train.graphed_step.GraphedStep`): the ops it would capture (zeroing
    the gradients, forward, loss, backward) count as one launch in ``forward``, beside the
    copy into the padded buffers, and are reported apart as ``"captured"``; a capture
    refuses any host sync among them.

    Returns:
        ``{"stages": {stage: costs per step of the median measurement}, "total": {...},
        "per_step_kernels": [...], "per_step_syncs": [...]}``, and ``"captured"`` with
        ``cuda_graph``.
    """
    from pyg_mgpu.gpu_path import counting_gpu_path
    from pyg_mgpu.nn.models import build_model
    from pyg_mgpu.train.loaders import make_loader
    from pyg_mgpu.train.graphed_step import GraphedStep
    from pyg_mgpu.train.loop import EpochTotals, seed_logits, seed_store

    torch.manual_seed(seed)
    device = torch.device("cpu")
    k = sample_batches
    loader = make_loader(graph, graph.train_idx, fanout=fanout, sampler="native", seed=seed,
                         batch_size=batch_size, rank=0, world_size=1, sample_batches=k)
    loader.set_epoch(0)
    if len(loader) < batches_needed(k, steps):
        raise ValueError(f"{len(loader)} batches of {batch_size} training nodes are fewer than "
                         f"the {batches_needed(k, steps)} this count needs; use a bigger graph.")
    model = build_model("sage", graph.num_features, hidden, graph.num_classes, len(fanout),
                        0.5, sparse_aggregation=True, fast_dropout=True)
    # The fused Adam that the trainer uses on GPUs (the multi-tensor one off the GPU's path).
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=gpu_path or None,
                                 foreach=not gpu_path or None)
    totals = EpochTotals(device)
    sampler = loader.node_sampler
    counter: Optional[OpCounter] = None

    def counted_in(stage: str, method, then_one_launch: bool = False):
        """``method`` with its ops counted in ``stage``; with ``then_one_launch`` they are also
        one kernel of the stage it was called from (a graph's replay)."""
        def counted(*args, **kwargs):
            if counter is None:
                return method(*args, **kwargs)
            before, counter.stage = counter.stage, stage
            try:
                return method(*args, **kwargs)
            finally:
                counter.stage = before
                if then_one_launch:
                    counter.costs[before].kernels += 1
        return counted

    graphed = GraphedStep(model, capture=False) if cuda_graph else None
    if graphed is not None:  # the ops a graph holds: counted apart, then as its one launch
        graphed._forward_backward = counted_in("captured", graphed._forward_backward,
                                               then_one_launch=True)
    sampler.sample_from_nodes = counted_in("sampling", sampler.sample_from_nodes)
    sampler.sample_batches = counted_in("sampling", sampler.sample_batches)
    batches = iter(loader)
    per_step = []

    def step():
        stage = (lambda name: counter.in_stage(name)) if counter else (lambda name: None)
        stage("batch assembly")
        batch = next(batches)
        stage("forward")
        y = seed_store(batch).y[:batch.batch_size]
        if graphed is None:
            out = seed_logits(model, batch, trim=True)
            loss = F.cross_entropy(out, y)
            stage("backward")
            loss.backward()
        else:
            out, loss = graphed.forward_backward(batch)
        stage("optimizer")
        optimizer.step()
        if graphed is None:  # the graph zeroes its gradient buffer itself
            optimizer.zero_grad(set_to_none=True)
        stage("metrics")
        totals.update(out, y, loss)

    try:
        with counting_gpu_path() if gpu_path else contextlib.nullcontext():
            for _ in range(k):  # warm-up: the optimizer's state is made here
                step()
            step_counters = frozenset(s["step"].data_ptr() for s in optimizer.state.values())
            for _ in range(steps):
                counter = OpCounter(host_only=step_counters)
                with counter:
                    for _ in range(k):
                        step()
                per_step.append(counter.costs)
                counter = None
    finally:
        del sampler.sample_from_nodes, sampler.sample_batches  # the methods are back
    in_graph = [costs.pop("captured", None) for costs in per_step]
    kernels = [sum(c.kernels for c in costs.values()) for costs in per_step]
    middle = kernels.index(sorted(kernels)[len(kernels) // 2])
    median = per_step[middle]
    total = StageCosts()
    for costs in median.values():
        total.kernels += costs.kernels
        total.views += costs.views
        total.syncs += costs.syncs
        total.sync_ops.update(costs.sync_ops)

    def per_batch(costs: StageCosts) -> dict:
        counts = costs.to_dict()
        if k == 1:
            return counts
        for key in ("kernel_ops", "views", "host_syncs"):
            counts[key] = round(counts[key] / k, 2)
        counts["sync_ops"] = {name: round(n / k, 2) for name, n in counts["sync_ops"].items()}
        return counts

    result = {"stages": {stage: per_batch(costs) for stage, costs in median.items()},
              "total": per_batch(total), "per_step_kernels": [n / k for n in kernels],
              "per_step_syncs": [sum(c.syncs for c in costs.values()) / k for costs in per_step],
              "fanout": list(fanout), "batch_size": batch_size, "hidden": hidden,
              "sample_batches": k, "median_kernels": statistics.median(kernels) / k,
              "cuda_graph": cuda_graph}
    if cuda_graph:
        result["captured"] = per_batch(in_graph[middle])
    return result


def format_step_costs(result: dict) -> str:
    """A Markdown table: one row per stage, and the step."""
    rows = ["| stage | kernel ops | views | host syncs | syncing ops |",
            "| --- | --- | --- | --- | --- |"]
    for stage, costs in [*result["stages"].items(), ("step", result["total"])]:
        ops = ", ".join(f"{name} {n}" for name, n in sorted(costs["sync_ops"].items()))
        rows.append(f"| {stage} | {costs['kernel_ops']} | {costs['views']} | "
                    f"{costs['host_syncs']} | {ops or '-'} |")
    if "captured" in result:
        captured = result["captured"]
        rows.append(f"| (in the graph: one launch in forward) | {captured['kernel_ops']} | "
                    f"{captured['views']} | {captured['host_syncs']} | "
                    f"{', '.join(sorted(captured['sync_ops'])) or '-'} |")
    return "\n".join(rows) + "\n"
