"""Rank functions for the inference and fault tests (module level, so spawned ranks import them)."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from pyg_mgpu.train.inference import layerwise_logits
from pyg_mgpu.nn.sage import GraphSAGE


def layerwise_on_every_rank(ctx, graph, state_dict, num_layers, hidden, batch_size, result):
    """Writes this rank's copy of the full-graph logits into ``result[rank]``."""
    model = GraphSAGE(graph.num_features, hidden, graph.num_classes, num_layers)
    model.load_state_dict(state_dict)
    logits = layerwise_logits(model, graph, rank=ctx.rank, world_size=ctx.world_size,
                              batch_size=batch_size, device=ctx.device)
    result[ctx.rank].copy_(logits)


def raise_while_peer_trains(ctx, graph, pids, steps_before_failure):
    """Both ranks train DDP steps; rank 1 raises after a few, while rank 0 keeps stepping and
    so blocks in the next gradient all-reduce waiting for it."""
    pids[ctx.rank] = os.getpid()
    torch.manual_seed(0)
    model = DistributedDataParallel(GraphSAGE(graph.num_features, 16, graph.num_classes, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    edge_index = graph.edge_index()
    for step in range(10_000):
        if ctx.rank == 1 and step == steps_before_failure:
            raise RuntimeError("injected failure mid-epoch")
        optimizer.zero_grad()
        loss = F.cross_entropy(model(graph.x, edge_index), graph.y.clamp(min=0))
        loss.backward()
        optimizer.step()


def sleep_past_the_timeout(ctx, pids, sleep_s):
    """Rank 1 never reaches the barrier in time; rank 0's barrier must time out."""
    pids[ctx.rank] = os.getpid()
    if ctx.rank == 1:
        time.sleep(sleep_s)
    dist.barrier()
