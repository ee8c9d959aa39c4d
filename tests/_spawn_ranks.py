"""Rank functions for the spawn and evaluation tests (module level, so spawned ranks import them)."""
import os
from unittest import mock

import torch
from torch_geometric.data import Data

import pyg_mgpu.data.csc as csc_module
from pyg_mgpu.metrics import accuracy, global_ratio


def record_context(ctx, result):
    """``result[rank]`` = (rank, world_size, is_main, device is CPU)."""
    result[ctx.rank] = torch.tensor([ctx.rank, ctx.world_size, ctx.is_main,
                                     ctx.device == torch.device("cpu")])


def check_shared_data(ctx, data, result):
    """Records what arrived: shared tensors, the parent's CSC (building another one fails)."""
    with mock.patch.object(csc_module, "build_csc", side_effect=AssertionError("CSC rebuilt")):
        csc = csc_module.csc_of(data)
    result[ctx.rank] = torch.tensor([
        all(t.is_shared() for t in (data.x, data.y, data.edge_index)),
        csc_module.cached_csc(data) is csc,
        csc.is_shared(),
    ])
    data.x[ctx.rank, 0] = 100.0 + ctx.rank  # the parent must see this write


def raise_on_rank_one(ctx):
    if ctx.rank == 1:
        _fail_deep_inside()
    torch.distributed.barrier()  # rank 0 would wait here forever if the failure did not end it


def _fail_deep_inside():
    raise ValueError("rank one gives up")


def exit_quietly_on_rank_one(ctx, wait_in_barrier):
    """Rank 1 ends its process with code 0 before its function returns (os._exit(0), as some
    libraries do); rank 0 returns, or waits for it in a barrier."""
    if ctx.rank == 1:
        os._exit(0)
    if wait_in_barrier:
        torch.distributed.barrier()


class Logits(torch.nn.Module):
    """A 'model' whose predictions are its input rows: batches set its answers exactly."""

    def forward(self, x, edge_index):
        return x


def batch_of(predictions, labels, batch_size):
    """A PyG mini-batch: the first ``batch_size`` rows are the seeds, the rest neighbours."""
    return Data(x=torch.nn.functional.one_hot(torch.tensor(predictions), 3).float(),
                y=torch.tensor(labels), edge_index=torch.empty(2, 0, dtype=torch.long),
                batch_size=batch_size)


# Rank 0: 3 of its 4 seeds right; rank 1: its 1 seed wrong. The accuracy is 3 of 5 = 0.6; the
# mean of the ranks' ratios would be 0.375. Non-seed rows are all wrong and must not count.
SHARDS = [
    [batch_of([0, 1, 2, 0, 1], [0, 1, 2, 2, 0], batch_size=3),  # 3 of 3 seeds right
     batch_of([1, 2], [0, 2], batch_size=1)],  # 0 of 1
    [batch_of([2, 0], [1, 1], batch_size=1)],  # 0 of 1
]


def evaluate_unequal_shards(ctx, result):
    """``result[rank]`` = (sharded accuracy, rank-0-only accuracy, global_ratio of counts)."""
    result[ctx.rank, 0] = accuracy(Logits(), SHARDS[ctx.rank])
    if ctx.is_main:  # rank 0 alone, over every batch; rank 1 does not take part
        result[ctx.rank, 1] = accuracy(Logits(), SHARDS[0] + SHARDS[1], sum_over_ranks=False)
    correct, total = [(3, 4), (0, 1)][ctx.rank]
    result[ctx.rank, 2] = global_ratio(correct, total)


def evaluate_a_ddp_model_on_rank_0(ctx, data, result):
    """Rank 0 alone scores a DistributedDataParallel model with BatchNorm (whose forward
    broadcasts buffers) and its unwrapped module; then both ranks meet at a barrier."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch_geometric.nn import GraphSAGE

    from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
    torch.manual_seed(0)
    ddp = DistributedDataParallel(GraphSAGE(data.num_features, 8, 2, 3, norm="batch_norm"))
    if ctx.is_main:
        loader = NeighborLoader(data, [-1, -1], batch_size=64)  # every neighbour: no draws
        result[0] = accuracy(ddp, loader, sum_over_ranks=False)
        result[1] = accuracy(ddp.module, loader, sum_over_ranks=False)
    dist.barrier()


def seeds_from_cached_stores(ctx, graph, result):
    """Records this rank's seeds of one epoch over the cache's stores, and whether the features
    arrived as the mapped cache file (not a pickled copy)."""
    import pyg_mgpu
    loader = pyg_mgpu.NeighborLoader(graph.stores, [3, 3], input_nodes=graph.train_idx,
                                     batch_size=16, shuffle=True, distributed=True)
    loader.set_epoch(1)
    seeds = torch.cat([batch.n_id[:batch.batch_size] for batch in loader])
    result[ctx.rank, :seeds.numel()] = seeds
    from pyg_mgpu.data.sharing import MappedTensor
    converted = graph.feature_store.graph
    result[ctx.rank, -1] = int("x" in converted.mapped and isinstance(converted.x, MappedTensor))


def join_late_then_reduce(rank, init_method, delay_s, timeout_s, result):
    """Joins a 2-rank group ``delay_s * rank`` seconds late, with a shorter collective timeout
    than that delay, and all-reduces a one."""
    import time

    from pyg_mgpu.distributed.process_group import process_group
    time.sleep(delay_s * rank)
    with process_group(rank, 2, torch.device("cpu"), init_method=init_method,
                       timeout_s=timeout_s, backend="gloo"):
        one = torch.ones(1)
        torch.distributed.all_reduce(one)
        result[rank] = one



def build_disagreeing_loader(ctx, data, loader_name, differ):
    """Rank 1 builds its distributed loader unlike rank 0 (``differ``: "seed", "inputs" or
    "epoch"), taking its rank and world size from the process group."""
    import pyg_mgpu
    seed = ctx.rank if differ == "seed" else 0
    order = torch.arange(data.num_nodes)
    if differ == "inputs" and ctx.rank == 1:
        order = order.flip(0)
    if loader_name == "NeighborLoader":
        loader = pyg_mgpu.NeighborLoader(data, [2], input_nodes=order, batch_size=4,
                                         shuffle=True, distributed=True, seed=seed)
    else:
        loader = pyg_mgpu.LinkNeighborLoader(data, [2], edge_label_index=data.edge_index[:, order],
                                             batch_size=4, shuffle=True, distributed=True,
                                             seed=seed)
    loader.set_epoch(3 + (ctx.rank if differ == "epoch" else 0))
    for _ in loader:
        pass
    torch.distributed.barrier()


def rank0_works_alone_past_the_timeout(ctx, result):
    """Rank 0 works alone for 3 s in a job whose collectives time out after 1 s; then every
    rank takes part in one more collective."""
    import time

    from pyg_mgpu.distributed.process_group import on_rank0_alone
    answer = on_rank0_alone(ctx, lambda: time.sleep(3) or 42)
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    result[ctx.rank] = torch.tensor([-1 if answer is None else answer, int(total)])
