"""The model as trained: the module, its DDP wrapper, its optimizer and, on CPU ranks, the
deferred gradient all-reduce (:func:`build_ddp`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.torch_version import TorchVersion

from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed.grad_sync import GradSync, deferred_all_reduce
from pyg_mgpu.nn.hetero import HeteroGNN
from pyg_mgpu.nn.models import build_model
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.graphed_step import GraphedStep


@dataclass
class Trainee:
    """The model as trained: the module, its DDP wrapper, the optimizer, the deferred
    all-reduce (CPU ranks) or None, and with ``--cuda-graph`` the padded step that takes the
    place of DDP's forward and backward (it all-reduces the gradients itself)."""

    model: torch.nn.Module
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    grad_sync: Optional[GradSync]
    graphed: Optional[GraphedStep] = None


_FUSED_CPU_ADAM = TorchVersion(torch.__version__) >= "2.4"  # CPU kernels from torch 2.4 on


def build_ddp(cfg: TrainConfig, graph: TrainingGraph, ctx: RankContext) -> Trainee:
    """The model (identical initial weights on every rank), wrapped in DDP, and its optimizer."""
    torch.manual_seed(cfg.training.seed)
    ours = cfg.model.recipe == "pyg_mgpu"
    # The fused ReLU/dropout does not compile (AOTAutograd fails on its byte view); under
    # --compile inductor fuses PyG's plain ReLU and dropout instead.
    if graph.is_hetero:
        model = HeteroGNN(graph.data.metadata(), graph.num_features, cfg.model.hidden,
                          graph.num_classes, cfg.training.num_layers, graph.target, cfg.model.dropout,
                          conv=cfg.model.model).to(ctx.device)
    else:
        model = build_model(cfg.model.model, graph.num_features, cfg.model.hidden, graph.num_classes,
                            cfg.training.num_layers, cfg.model.dropout, heads=cfg.model.heads, norm=cfg.model.norm,
                            sparse_aggregation=ours,
                            fast_dropout=ours and not cfg.performance.compile).to(ctx.device)
    if cfg.performance.compile:
        model.compile(dynamic=True)  # in place: state_dict keys stay PyG's
    # CPU ranks overlap the gradient all-reduce with loading the next batch; PyG's recipe
    # keeps DDP as its example has it. (On GPUs NCCL's all-reduce is asynchronous already.)
    defer_allreduce = ours and ctx.device.type == "cpu" and not cfg.performance.cuda_graph
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                  else None, gradient_as_bucket_view=defer_allreduce)
    grad_sync = deferred_all_reduce(ddp, cfg.ranks.timeout_s) if defer_allreduce else None
    # Fused: on a GPU one kernel for every parameter instead of a dozen multi-tensor launches,
    # on the CPU one C++ loop instead of a Python one per parameter (PyG's recipe keeps its
    # example's default there).
    optimizer = torch.optim.Adam(ddp.parameters(), lr=cfg.model.lr,
                                 weight_decay=cfg.model.weight_decay,
                                 fused=(ours and _FUSED_CPU_ADAM) or ctx.device.type == "cuda"
                                 or None)
    graphed = (GraphedStep(model, amp=cfg.performance.amp == "bf16")
               if cfg.performance.cuda_graph else None)
    torch.manual_seed(cfg.training.seed * 7919 + 1 + ctx.rank)  # independent dropout masks per rank
    return Trainee(model, ddp, optimizer, grad_sync, graphed)
