"""Rank functions for tests/test_gpu_paths.py (module level, so spawned ranks import them)."""
import torch
import torch.distributed as dist

from pyg_mgpu.metrics.reduce import all_reduce_sum


def collectives_on_the_gpu(ctx, result):
    """``result[rank]`` = (rank, world, on CUDA, backend is nccl, all-reduced sum, broadcast).

    Runs every kind of collective the trainer uses, on the tensors each backend takes.
    """
    assert ctx.device.type == "cuda" and torch.cuda.current_device() == ctx.device.index
    total = all_reduce_sum(torch.tensor([ctx.rank + 1.0], device=ctx.device))
    assert total.is_cuda
    flag = torch.tensor([float(ctx.rank == 0) * 7.0], device=ctx.collective_device)
    dist.broadcast(flag, src=0)
    counts = torch.tensor([ctx.rank, -ctx.rank], device=ctx.collective_device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    states = [None] * ctx.world_size
    dist.all_gather_object(states, ctx.rank)
    assert states == list(range(ctx.world_size))
    result[ctx.rank] = torch.tensor([ctx.rank, ctx.world_size, 1.0, float(ctx.backend == "nccl"),
                                     float(total[0]), float(flag[0])])


def layerwise_on_the_gpu(ctx, graph, state_dict, num_layers, hidden, result):
    """Layer-wise logits over all ranks, computed on each rank's GPU from the host graph
    (with gloo the per-layer all-gather is staged on the host)."""
    from pyg_mgpu.nn.sage import GraphSAGE
    from pyg_mgpu.train.inference import layerwise_logits
    model = GraphSAGE(graph.num_features, hidden, graph.num_classes, num_layers)
    model.load_state_dict(state_dict)
    logits = layerwise_logits(model.to(ctx.device), graph, rank=ctx.rank,
                              world_size=ctx.world_size, batch_size=97, device=ctx.device)
    assert logits.is_cuda
    result[ctx.rank].copy_(logits.cpu())
