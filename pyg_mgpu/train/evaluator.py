"""Validation and test accuracy of a CLI rank: :class:`Evaluator`."""
from __future__ import annotations

from functools import partial
from typing import Optional

import torch
import torch.distributed as dist

from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.metrics import accuracy
from pyg_mgpu.sampling.feature_cache import FeatureCache
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.sampling.sharding import eval_shard
from pyg_mgpu.seeds import eval_loader_seed
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.loaders import make_loader
from pyg_mgpu.train.loop import seed_logits
from pyg_mgpu.train.plan import RunPlan


class Evaluator:
    """Validation/test accuracy on rank 0 alone, or sharded over all ranks; known on every rank
    afterwards."""

    def __init__(self, graph: TrainingGraph, cfg: TrainConfig, ctx: RankContext, plan: RunPlan,
                 feature_cache: Optional[FeatureCache] = None):
        self.ctx, self.graph, self.cfg, self.plan = ctx, graph, cfg, plan
        self.feature_cache = feature_cache
        self.features_in_place = plan.fused_aggregation == "in_place"
        self.sharded = cfg.evaluation.eval_on == "all"

    def _loader(self, nodes: torch.Tensor) -> NeighborLoader:
        if self.sharded:
            nodes = eval_shard(nodes, self.ctx.rank, self.ctx.world_size)
        # Same seed on every rank and in every mode: the eval sample depends on the node only
        # through the batch it lands in, and with fanout -1 not at all.
        return make_loader(self.graph, nodes, fanout=self.cfg.training.fanout,
                           sampler=self.plan.sampler, seed=eval_loader_seed(self.cfg.training.seed),
                           batch_size=self.plan.eval_batch_size,
                           feature_cache=self.feature_cache, device=self.ctx.device,
                           features_in_place=self.features_in_place)

    def accuracy(self, model: torch.nn.Module, nodes: torch.Tensor) -> float:
        result = torch.zeros(1, dtype=torch.float64)
        if self.sharded:
            self._buffers_from_rank0(model)
        if self.sharded or self.ctx.is_main:
            loader = self._loader(nodes)
            result[0] = accuracy(model, loader, device=self.ctx.device,
                                 sum_over_ranks=self.sharded,
                                 forward=partial(seed_logits,
                                                 amp=self.cfg.performance.amp == "bf16",
                                                 feature_table=loader.feature_table))
        if not self.sharded:
            # Others wait at the broadcast (the recipe's barrier) while rank 0 evaluates.
            result = result.to(self.ctx.collective_device)
            dist.broadcast(result, src=0)
        return float(result[0])

    def _buffers_from_rank0(self, model: torch.nn.Module) -> None:
        """Gives every rank rank 0's buffers (BatchNorm's running statistics) before a sharded
        evaluation. DDP copies them from rank 0 only as a training step begins, so after the
        last step each rank holds the statistics of its own last batch: the ranks would score
        their shards with different models, none of them ``best.pt`` (rank 0's), which
        ``--eval-on rank0`` scores. Training is unchanged: every model with buffers trains
        under DDP, whose next step copies rank 0's buffers anyway."""
        for buffer in model.buffers():
            shared = buffer.data.to(self.ctx.collective_device)
            dist.broadcast(shared, src=0)
            if shared.data_ptr() != buffer.data_ptr():
                buffer.data.copy_(shared)
