"""Rank functions for the multi-process tests (module level, so spawned ranks can import them)."""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pyg_mgpu.train.loaders import make_loader


def write_into_shared_graph(ctx, graph, result):
    assert graph.is_shared(), "rank received a private copy of the graph"
    graph.x[ctx.rank, 0] = 100.0 + ctx.rank  # the parent must see this write
    result[ctx.rank] = 1


def record_epoch_seeds(ctx, graph, seeds_out, steps_out, epochs, batch_size):
    loader = make_loader(graph, graph.train_idx, fanout=[3, 2], sampler="native", seed=3,
                         rank=ctx.rank, world_size=ctx.world_size, batch_size=batch_size)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        steps = 0
        for batch in loader:
            seeds = batch.n_id[:batch.batch_size]
            # Mark each seed in this epoch's shared tally; collisions would count 2.
            seeds_out[epoch].index_add_(0, seeds, torch.ones_like(seeds))
            steps += 1
        steps_out[epoch, ctx.rank] = steps
    dist.barrier()


def reduce_metrics(ctx, result):
    # Rank 0 sees 3 samples (all right), rank 1 sees 1 sample (wrong): global accuracy is 3/4,
    # not the 1/2 that averaging per-rank ratios would give. Losses likewise weighted 3:1.
    from pyg_mgpu.train.loop import EpochTotals
    if ctx.rank == 0:
        preds, target, loss = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]), 1.0
    else:
        preds, target, loss = torch.tensor([0]), torch.tensor([1]), 5.0
    logits = F.one_hot(preds, 3).float()
    totals = EpochTotals(torch.device("cpu"))
    totals.update(logits, target, torch.tensor(loss))
    result[ctx.rank, 0], result[ctx.rank, 1] = totals.compute()[::-1]


def fail_on_rank_one(ctx):
    if ctx.rank == 1:
        raise RuntimeError("boom from the test")
    dist.barrier()  # rank 0 would wait here forever if the failure did not end the job


def disagree_on_steps(ctx):
    from pyg_mgpu.train.loop import check_equal_steps
    check_equal_steps(5, ctx)  # equal: passes
    check_equal_steps(10 + ctx.rank, ctx)  # a sharding bug would look like this


def elsewhere(ctx, rank: int, what: str) -> None:
    """Rank ``rank`` as on another machine (``what="cannot map"``: it looks for rank 0's segment
    under another folder), or rank 0 without room in /dev/shm (``what="cannot create"``)."""
    from pyg_mgpu.distributed import shared_rounds
    if ctx.rank != rank:
        return
    if what == "cannot map":
        mapped = shared_rounds._map
        shared_rounds._map = lambda path, size, token: mapped(
            path.replace("/dev/shm/", "/dev/shm/another-machine-"), size, token)
    else:
        shared_rounds._create = lambda size: None


def deferred_vs_blocking_allreduce(ctx, result, exchange="gloo"):
    """Trains two copies of one model, DDP's blocking all-reduce against a deferred one (gloo's,
    or through shared memory), on rank-specific data, and records how far their parameters
    ended apart (and from the start)."""
    from torch.nn.parallel import DistributedDataParallel

    from pyg_mgpu.distributed.grad_sync import (
        DeferredAllReduce,
        SharedMemoryAllReduce,
        deferred_all_reduce,
    )

    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    models = [copy.deepcopy(start) for _ in range(2)]
    blocking = DistributedDataParallel(models[0])
    deferred = DistributedDataParallel(models[1], gradient_as_bucket_view=True,
                                       bucket_cap_mb=0.0001)  # several buckets
    if exchange == "gloo":
        grad_sync = DeferredAllReduce(deferred)
    else:
        if exchange == "shared, unless rank 1 cannot map it":
            elsewhere(ctx, 1, "cannot map")
        elif exchange == "shared, unless rank 0 cannot make it":
            elsewhere(ctx, 0, "cannot create")
        grad_sync = deferred_all_reduce(deferred, timeout_s=60)
    result[ctx.rank, 3] = isinstance(grad_sync, SharedMemoryAllReduce)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.05) for m in (blocking, deferred)]
    generator = torch.Generator().manual_seed(ctx.rank)  # each rank its own data
    for _ in range(4):
        x, y = torch.randn(32, 6, generator=generator), torch.randint(0, 3, (32,),
                                                                     generator=generator)
        for ddp, optimizer in zip((blocking, deferred), optimizers):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x), y).backward()
            if ddp is deferred:
                assert grad_sync.pending, "backward returned before the all-reduce started"
                grad_sync.wait()
            optimizer.step()
    params = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in models]
    result[ctx.rank, 0] = (params[0] - params[1]).abs().max()
    result[ctx.rank, 1] = (params[0] - torch.cat([p.flatten() for p in start.parameters()])
                           ).abs().max()
    # The ranks saw different data, yet averaged gradients keep their models identical.
    gathered = [torch.empty_like(params[1]) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, params[1])
    result[ctx.rank, 2] = max((other - gathered[0]).abs().max() for other in gathered[1:])


def link_metrics_over_ranks(ctx, scores, labels, pos, neg, result):
    """Rank r evaluates every other edge from r (AUC) and every other query from r (ranking)."""
    import pyg_mgpu
    mine = slice(ctx.rank, None, ctx.world_size)
    result[ctx.rank, 0] = pyg_mgpu.global_auc(scores[mine], labels[mine])
    result[ctx.rank, 1] = pyg_mgpu.global_auc(scores[mine], labels[mine], sum_over_ranks=False)
    metrics = pyg_mgpu.ranking_metrics(pos[mine], neg[mine], ks=(1, 3))
    result[ctx.rank, 2:5] = torch.tensor([metrics["mrr"], metrics["hits@1"], metrics["hits@3"]],
                                         dtype=result.dtype)


def link_metrics_with_a_nan_on_rank_1(ctx, refused):
    """Rank 1 alone scores one edge and one query NaN; ``refused[rank, i]`` = 1 where rank's
    call i (AUC, ranking) raised ValueError, after which the ranks still meet in a barrier."""
    import pyg_mgpu
    scores, labels = torch.tensor([0.9, 0.1, 0.8, 0.2]), torch.tensor([1, 0, 1, 0])
    pos, neg = torch.tensor([0.9, 0.5]), torch.tensor([[0.1, 0.2], [0.7, 0.5]])
    if ctx.rank == 1:
        scores[0], pos[1] = float("nan"), float("nan")
    for i, metric in enumerate((lambda: pyg_mgpu.global_auc(scores, labels),
                                lambda: pyg_mgpu.ranking_metrics(pos, neg))):
        try:
            metric()
        except ValueError:
            refused[ctx.rank, i] = 1
    dist.barrier()


def padded_step_over_ranks(ctx, graph, params_out, grads_out, own_grads_out):
    """Ranks start from different weights; broadcast_parameters gives every rank rank 0's, and
    the padded step (dropout 0, a different batch per rank) averages the flat gradients."""
    from pyg_mgpu.distributed.grad_sync import broadcast_parameters
    from pyg_mgpu.nn.sage import GraphSAGE
    from pyg_mgpu.train.graphed_step import GraphedStep
    torch.manual_seed(ctx.rank)
    model = GraphSAGE(graph.num_features, 16, graph.num_classes, 2, dropout=0.0)
    broadcast_parameters(model)
    params_out[ctx.rank] = torch.cat([p.detach().flatten() for p in model.parameters()])
    loader = make_loader(graph, graph.train_idx, fanout=[3, 2], sampler="native", seed=3,
                         rank=ctx.rank, world_size=ctx.world_size, batch_size=32)
    loader.set_epoch(0)
    batch = next(iter(loader))
    reference = copy.deepcopy(model)
    logits = reference(batch.x, batch.edge_index, batch.num_sampled_nodes,
                       batch.num_sampled_edges)[:batch.batch_size]
    F.cross_entropy(logits, batch.y[:batch.batch_size]).backward()
    own_grads_out[ctx.rank] = torch.cat([p.grad.flatten() for p in reference.parameters()])
    step = GraphedStep(model)
    step.forward_backward(batch)
    step.wait()
    grads_out[ctx.rank] = step.flat_grad
