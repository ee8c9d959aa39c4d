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
from pyg_mgpu.distributed.grad_sync import GradSync, broadcast_parameters, deferred_all_reduce
from pyg_mgpu.nn.hetero import HeteroGNN
from pyg_mgpu.nn.models import build_model
from pyg_mgpu.seeds import dropout_seed
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.graphed_step import GraphedStep


@dataclass
class Trainee:
    """The model as trained: the module, its DDP wrapper, the optimizer, the deferred
    all-reduce (CPU ranks) or None; with ``--cuda-graph`` no DDP wrapper but the padded step
    (:class:`GraphedStep`), which all-reduces the gradients itself."""

    model: torch.nn.Module
    ddp: Optional[DistributedDataParallel]
    optimizer: torch.optim.Optimizer
    grad_sync: Optional[GradSync]
    graphed: Optional[GraphedStep] = None

    @property
    def trained(self) -> torch.nn.Module:
        """What the training loop calls: the DDP wrapper, or the module itself."""
        return self.ddp if self.ddp is not None else self.model


_FUSED_CPU_ADAM = TorchVersion(torch.__version__) >= "2.4"  # CPU kernels from torch 2.4 on


def set_matmul_precision(cfg: TrainConfig) -> None:
    """This process's float32 matmuls as ``--matmul-precision`` asks: strict fp32
    (``highest``) or TF32 on GPUs (``high``), for training and evaluation alike. A
    process-wide torch setting, so each rank sets it before its model computes anything."""
    torch.set_float32_matmul_precision(cfg.performance.matmul_precision)


def build_ddp(cfg: TrainConfig, graph: TrainingGraph, ctx: RankContext) -> Trainee:
    """The model (identical initial weights on every rank), wrapped in DDP (not with
    ``--cuda-graph``), and its optimizer."""
    set_matmul_precision(cfg)
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
                            fast_dropout=ours and not cfg.performance.compile,
                            fused_aggregation=ours and cfg.performance.fused_aggregation
                            ).to(ctx.device)
    if cfg.performance.compile:
        model.compile(dynamic=True)  # in place: state_dict keys stay PyG's
    ddp = grad_sync = graphed = None
    if cfg.performance.cuda_graph:
        # No DDP: its reducer keeps each parameter's gradient-accumulation node, bound to the
        # stream current when DDP was built, and a graph captured on another stream cannot
        # take in that stream's work. The padded step all-reduces one flat buffer instead.
        broadcast_parameters(model)
        graphed = GraphedStep(model, amp=cfg.performance.amp == "bf16")
    else:
        # CPU ranks overlap the gradient all-reduce with loading the next batch; PyG's recipe
        # keeps DDP as its example has it. (On GPUs NCCL's all-reduce is asynchronous already.)
        defer_allreduce = ours and ctx.device.type == "cpu"
        ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                      else None, gradient_as_bucket_view=defer_allreduce)
        grad_sync = deferred_all_reduce(ddp, cfg.ranks.timeout_s) if defer_allreduce else None
    # Fused: on a GPU one kernel for every parameter instead of a dozen multi-tensor launches,
    # on the CPU one C++ loop instead of a Python one per parameter (PyG's recipe keeps its
    # example's default there).
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.model.lr,
                                 weight_decay=cfg.model.weight_decay,
                                 fused=(ours and _FUSED_CPU_ADAM) or ctx.device.type == "cuda"
                                 or None)
    torch.manual_seed(dropout_seed(cfg.training.seed, ctx.rank))  # independent dropout masks per rank
    return Trainee(model, ddp, optimizer, grad_sync, graphed)
