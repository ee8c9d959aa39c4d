"""The run plan: what a rank runs, with every ``auto`` or unset setting of its config resolved.

A flag left to its default (``--sample-batches``, ``--prefetch``, ``--feature-cache-gb``,
``--eval-batch-size``, ``--sampler auto``, ``--graph-on auto``, ``--backend auto``) takes a value
that depends on the device, the graph or the other settings; so does the route
``--fused-aggregation`` takes. It is resolved here, once, on each
rank (the device's free memory is known only there); rank 0's plan is what ``metrics.json`` and
the checkpoints record, and a resumed run names each planned value that differs from its
checkpoint's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch

from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.sampling.sampler_choice import resolve_sampler
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.loaders import (batches_per_walk, choose_placement, feature_cache_budget,
                                    fused_aggregation_route)


@dataclass(frozen=True)
class RunPlan:
    """The resolved settings of one rank; each field is the flag of its name."""

    sampler: str  # native, or pyg (pyg-lib or torch-sparse)
    graph_on: str  # where this rank samples from: cpu, gpu, or host (pinned, read in place)
    sample_batches: int  # batches per walk of the training loader
    prefetch: int  # batches prepared ahead of training; 0: none
    feature_cache_gb: float  # the GPU feature cache's budget; 0: no cache
    eval_batch_size: int
    backend: str  # the process group's: gloo or nccl
    matmul_precision: str  # float32 matmuls: highest (strict fp32) or high (TF32 on GPUs)
    fused_aggregation: str  # off, means, or in_place (layer 1 reads the feature table itself)
    cuda_graph: bool  # the step at padded sizes, replayed from a CUDA graph on GPUs

    def to_dict(self) -> dict:
        return asdict(self)

    def differences(self, recorded: Optional[dict]) -> list[str]:
        """Each planned value that differs from ``recorded`` (a checkpoint's plan), as
        ``--flag before -> now``; none where nothing was recorded (older checkpoints)."""
        from pyg_mgpu.train.setting import flag_of
        if not recorded:
            return []
        return [f"{flag_of(name)} {recorded[name]} -> {value}"
                for name, value in self.to_dict().items()
                if name in recorded and recorded[name] != value]


def plan_rank(cfg: TrainConfig, graph: TrainingGraph, ctx: RankContext,
              least_free_gpu_bytes: Optional[int] = None) -> RunPlan:
    """This rank's plan. ``least_free_gpu_bytes``: the least free memory of any rank's GPU, by
    which every rank places the graph alike (None on CPU ranks)."""
    perf = cfg.performance
    sampler = resolve_sampler(cfg.training.sampler)
    graph_on = choose_placement(graph, ctx.device, perf.graph_on, sampler, least_free_gpu_bytes)
    on_gpu = graph_on in ("gpu", "host")  # the GPU samples: its own copy, or the pinned one
    # PyG's sampler takes no generator of its own; in a background thread its draws would
    # interleave with dropout's from process-wide random state, differently every run.
    prefetch = perf.prefetch
    if prefetch is None:
        prefetch = int(ctx.device.type == "cuda" and sampler == "native")
    budget = feature_cache_budget(graph, ctx.device, perf.feature_cache_gb, graph_on)
    return RunPlan(
        sampler=sampler, graph_on=graph_on,
        sample_batches=batches_per_walk(perf.sample_batches, graph, sampler,
                                        cfg.training.batch_size, on_gpu=on_gpu),
        prefetch=prefetch, feature_cache_gb=budget / 2**30,  # exact: a power of two
        eval_batch_size=cfg.evaluation.eval_batch_size or cfg.training.batch_size,
        backend=ctx.backend, matmul_precision=perf.matmul_precision,
        fused_aggregation=fused_aggregation_route(cfg, graph, ctx.device, graph_on),
        cuda_graph=perf.cuda_graph)


def least_free_gpu_bytes(ctx: RankContext) -> Optional[int]:
    """The least free memory of any rank's GPU (None on CPU ranks).

    Ranks place the graph by it alike: one sampling on its GPU and another on the host would
    draw from generators of different devices, and a checkpoint's RNG states would then fit a
    resumed run only if every rank chose the same again.
    """
    import torch.distributed as dist
    if ctx.device.type != "cuda":
        return None
    free = torch.tensor([torch.cuda.mem_get_info(ctx.device)[0]],
                        device=ctx.collective_device)
    dist.all_reduce(free, op=dist.ReduceOp.MIN)
    return int(free[0])
