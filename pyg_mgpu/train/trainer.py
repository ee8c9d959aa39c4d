"""What one rank does: train a DDP GraphSAGE on its shard, evaluate, and (rank 0) report.

Metrics are reduced as sums and counts (torchmetrics states: correct/total, weighted loss
sum/weight), never as averages of per-rank ratios. Validation runs on rank 0 between barriers
(``--eval-on rank0``, the recipe's shape) or sharded over all ranks (``--eval-on all``).
"""
from __future__ import annotations

import copy
import csv
import io
import resource
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from tqdm import tqdm

from pyg_mgpu.train.checkpoint import CHECKPOINT, save_json, save_text, save_torch
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.data.graph import GraphStore
from pyg_mgpu.distributed.launch import RankContext
from pyg_mgpu.train.inference import exact_accuracy, layerwise_logits
from pyg_mgpu.sampling.feature_cache import FeatureCache
from pyg_mgpu.distributed.grad_sync import DeferredAllReduce
from pyg_mgpu.sampling.loader import (make_feature_cache, make_loader, place_graph,
                     resolve_sampler)
from pyg_mgpu.nn.models import build_model
from pyg_mgpu.sampling.prefetch import Prefetcher
from pyg_mgpu.sampling.neighbor_sampler import NeighborSampler
from pyg_mgpu.sampling.sharding import eval_shard

HISTORY_FIELDS = ("epoch", "train_loss", "train_acc", "val_acc", "epoch_time_s", "eval_time_s")


@dataclass
class StageTimer:
    """Seconds spent per training stage, for ``--profile`` and metrics.json.

    Stages: ``sample`` (the sampler, when it runs in this thread), ``gather`` (features, labels
    and batch assembly; ``load`` instead when DataLoader workers, the prefetch thread or PyG's
    sampler do the sampling, and only the wait for the batch is seen here), ``forward``,
    ``backward`` (gradient computation), ``allreduce`` (CPU ranks: the wait for the gradient
    all-reduce that is left after the next batch has loaded, the wait for the slowest rank
    included; on GPUs it stays inside ``backward``) and ``optimizer``.
    """

    device: torch.device
    sync: bool = False
    seconds: dict = field(default_factory=lambda: defaultdict(float))
    _last: float = 0.0
    _nested: float = 0.0  # seconds of stages timed elsewhere since the last lap

    def start(self) -> None:
        self._last = time.perf_counter()
        self._nested = 0.0

    def add(self, stage: str, seconds: float) -> None:
        """A stage timed inside the current lap (sampling); the lap excludes it."""
        self.seconds[stage] += seconds
        self._nested += seconds

    def lap(self, stage: str) -> None:
        if self.sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[stage] += now - self._last - self._nested
        self._last, self._nested = now, 0.0


def _forward(model: torch.nn.Module, batch, *, trim: bool = True,
             amp: bool = False) -> torch.Tensor:
    """Seed logits (float32) of a sampled batch.

    Trimming needs the per-hop counts; PyG's sampler gives them only with pyg-lib (not with
    torch-sparse), and without them every layer runs on every node, which is slower but exact.
    """
    trim = trim and getattr(batch, "num_sampled_nodes", None) is not None
    with torch.autocast(batch.x.device.type, dtype=torch.bfloat16, enabled=amp):
        if trim:  # PyG's keywords: our GraphSAGE and PyG's models (--model) take them alike
            out = model(batch.x, batch.edge_index,
                        num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                        num_sampled_edges_per_hop=batch.num_sampled_edges)
        else:  # PyG's recipe: every layer on every sampled node
            out = model(batch.x, batch.edge_index)
    return out[:batch.batch_size].float()


def check_equal_steps(steps: int, ctx: RankContext) -> None:
    """Fails on every rank if the ranks are about to run different numbers of steps.

    A rank with fewer steps would leave the others waiting in DDP's all-reduce. The sharding
    makes the counts equal (tested); this one collective per epoch turns a bug there into an
    error instead of a hang. (``Join``, the per-step alternative, cost ~5% of a CPU step.)
    """
    counts = torch.tensor([steps, -steps], device=ctx.device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest = int(counts[0]), -int(counts[1])
    if most != fewest:
        raise RuntimeError(f"ranks would run between {fewest} and {most} training steps this "
                           f"epoch (this rank: {steps}); every rank must run the same number.")


def train_epoch(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, loader,
                ctx: RankContext, num_classes: int, timer: StageTimer, epoch: int,
                cfg: TrainConfig, grad_sync: Optional[DeferredAllReduce] = None
                ) -> tuple[float, float]:
    """One epoch on this rank's shard; returns the global (loss, accuracy) over all ranks.

    Each step loads the next batch after ``backward()``: with ``grad_sync`` (CPU ranks) the
    gradient all-reduce is still running then, and the optimizer step waits for it after.
    """
    ddp.train()
    loss_sum = MeanMetric(sync_on_compute=True).to(ctx.device)
    accuracy = MulticlassAccuracy(num_classes, average="micro",
                                  sync_on_compute=True).to(ctx.device)
    check_equal_steps(len(loader), ctx)
    depth = cfg.prefetch
    if depth is None:
        # PyG's sampler takes no generator of its own; in a background thread its draws would
        # interleave with dropout's from process-wide random state, differently every run.
        depth = int(ctx.device.type == "cuda" and isinstance(loader.node_sampler,
                                                             NeighborSampler))
    prefetcher = Prefetcher(loader, ctx.device, depth) if depth else None
    batches = iter(tqdm(prefetcher or loader, total=len(loader), desc=f"epoch {epoch}",
                        disable=not ctx.is_main, leave=False, dynamic_ncols=True))
    # The sampler's own clock splits loading into sampling and gathering when it runs in this
    # thread; otherwise only the wait for the next batch ("load") is on this thread's clock.
    sampler = loader.node_sampler if loader.num_workers == 0 and not prefetcher else None
    sampler_busy = getattr(sampler, "busy_s", None)

    def load_next():
        nonlocal sampler_busy
        batch = next(batches, None)
        if batch is not None and prefetcher is None:  # the prefetcher moved it already
            batch = batch.to(ctx.device, non_blocking=True)
        if sampler_busy is not None:
            timer.add("sample", sampler.busy_s - sampler_busy)
            sampler_busy = sampler.busy_s
        timer.lap("gather" if sampler_busy is not None else "load")
        return batch

    try:
        timer.start()
        batch = load_next()
        while batch is not None:
            y = batch.y[:batch.batch_size]
            optimizer.zero_grad(set_to_none=True)
            out = _forward(ddp, batch, trim=cfg.recipe == "pyg_mgpu", amp=cfg.amp == "bf16")
            loss = F.cross_entropy(out, y)
            timer.lap("forward")
            loss.backward()
            timer.lap("backward")
            next_batch = load_next()  # while the gradient all-reduce runs (grad_sync)
            if grad_sync is not None:
                grad_sync.wait()
                timer.lap("allreduce")
            optimizer.step()
            loss_sum.update(loss.detach(), weight=y.numel())
            accuracy.update(out.detach(), y)
            timer.lap("optimizer")
            batch = next_batch
    finally:
        if prefetcher is not None:
            prefetcher.close()
    return float(loss_sum.compute()), float(accuracy.compute())


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device, num_classes: int,
             sync: bool, amp: bool = False) -> float:
    """Accuracy over every node of ``loader`` (all ranks' shards when ``sync``)."""
    was_training = model.training
    model.eval()
    accuracy = MulticlassAccuracy(num_classes, average="micro", sync_on_compute=sync).to(device)
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        accuracy.update(_forward(model, batch, amp=amp), batch.y[:batch.batch_size])
    model.train(was_training)
    return float(accuracy.compute())


class Evaluator:
    """Validation/test accuracy on rank 0 alone, or sharded over all ranks."""

    def __init__(self, graph: GraphStore, cfg: TrainConfig, ctx: RankContext, sampler: str,
                 feature_cache: Optional[FeatureCache] = None):
        self.ctx, self.graph, self.cfg = ctx, graph, cfg
        self.feature_cache = feature_cache
        self.sharded = cfg.eval_on == "all"
        self.sampler = sampler

    def _loader(self, nodes: torch.Tensor):
        if self.sharded:
            nodes = eval_shard(nodes, self.ctx.rank, self.ctx.world_size)
        # Same seed on every rank and in every mode: the eval sample depends on the node only
        # through the batch it lands in, and with fanout -1 not at all.
        return make_loader(self.graph, nodes, fanout=self.cfg.fanout, sampler=self.sampler,
                           seed=self.cfg.seed + 7919,
                           batch_size=self.cfg.eval_batch_size or self.cfg.batch_size,
                           feature_cache=self.feature_cache, device=self.ctx.device)

    def accuracy(self, model: torch.nn.Module, nodes: torch.Tensor) -> float:
        """The split's accuracy, known on every rank afterwards."""
        result = torch.zeros(1, dtype=torch.float64)
        if self.sharded or self.ctx.is_main:
            result[0] = evaluate(model, self._loader(nodes), self.ctx.device,
                                 self.graph.num_classes, sync=self.sharded,
                                 amp=self.cfg.amp == "bf16")
        if not self.sharded:
            # Others wait at the broadcast (the recipe's barrier) while rank 0 evaluates.
            result = result.to(self.ctx.device)
            dist.broadcast(result, src=0)
        return float(result[0])


def _rng_state(train_loader, device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    generator = getattr(train_loader.node_sampler, "generator", None)
    if generator is not None:  # the native sampler (in this process; exact with 0 workers)
        state["sampler"] = generator.get_state()
    if device.type == "cuda":  # this rank's GPU only: the _all variants open every GPU
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, train_loader, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if "sampler" in state:
        train_loader.node_sampler.generator.set_state(state["sampler"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(out: Path, ctx: RankContext, cfg: TrainConfig, epoch: int,
                    model: torch.nn.Module, optimizer: torch.optim.Optimizer, history: list,
                    best: dict, best_state: dict, train_loader) -> None:
    """Everything ``--resume`` needs to continue exactly, written atomically by rank 0.

    Every rank's RNG state is gathered: each rank draws its own dropout masks and samples.
    """
    states: list = [None] * ctx.world_size
    dist.all_gather_object(states, _rng_state(train_loader, ctx.device))
    if ctx.is_main:
        save_torch({"epoch": epoch, "world_size": ctx.world_size, "config": cfg.to_dict(),
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "history": history, "best": best, "best_state": best_state,
                    "rng": states}, out / CHECKPOINT)


def _peak_mem_mb(ctx: RankContext) -> float:
    """Sum over ranks of each rank's peak resident memory (shared pages count in every rank)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total = torch.tensor([kb / 1024.0], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(total)
    return float(total[0])


def _least_free_gpu_bytes(ctx: RankContext) -> Optional[int]:
    """The least free memory of any rank's GPU (None on CPU ranks).

    Ranks place the graph by it alike: one sampling on its GPU and another on the host would
    draw from generators of different devices, and a checkpoint's RNG states would then fit a
    resumed run only if every rank chose the same again.
    """
    if ctx.device.type != "cuda":
        return None
    free = torch.tensor([torch.cuda.mem_get_info(ctx.device)[0]], device=ctx.device)
    dist.all_reduce(free, op=dist.ReduceOp.MIN)
    return int(free[0])


def run_training(ctx: RankContext, graph: GraphStore, cfg: TrainConfig, out_dir: str,
                 run_info: Optional[dict] = None) -> None:
    """The rank function: trains, evaluates and (rank 0) writes the run's outputs."""
    wall_start = time.perf_counter()
    out = Path(out_dir)
    sampler = resolve_sampler(cfg.sampler)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    ours = cfg.recipe == "pyg_mgpu"
    # The fused ReLU/dropout does not compile (AOTAutograd fails on its byte view); under
    # --compile inductor fuses PyG's plain ReLU and dropout instead.
    model = build_model(cfg.model, graph.num_features, cfg.hidden, graph.num_classes,
                        cfg.num_layers, cfg.dropout, heads=cfg.heads, sparse_aggregation=ours,
                        fast_dropout=ours and not cfg.compile).to(ctx.device)
    if cfg.compile:
        model.compile(dynamic=True)  # in place: state_dict keys stay PyG's
    # CPU ranks overlap the gradient all-reduce with loading the next batch; PyG's recipe
    # keeps DDP as its example has it. (On GPUs NCCL's all-reduce is asynchronous already.)
    defer_allreduce = ours and ctx.device.type == "cpu"
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                  else None, gradient_as_bucket_view=defer_allreduce)
    grad_sync = DeferredAllReduce(ddp) if defer_allreduce else None
    optimizer = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    timer = StageTimer(ctx.device, sync=cfg.profile)
    torch.manual_seed(cfg.seed * 7919 + 1 + ctx.rank)  # independent dropout masks per rank

    graph = place_graph(graph, ctx.device, cfg.graph_on, sampler, _least_free_gpu_bytes(ctx))
    feature_cache = make_feature_cache(graph, ctx.device, cfg.feature_cache_gb)
    if feature_cache is not None and ctx.is_main:
        tqdm.write(f"graph in host memory; {feature_cache.num_cached:,} hottest feature rows "
                   f"({feature_cache.nbytes() / 2**30:.2f} GiB) cached on the GPU")
    train_loader = make_loader(graph, graph.train_idx, fanout=cfg.fanout, sampler=sampler,
                               seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size,
                               batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                               feature_cache=feature_cache, device=ctx.device)
    evaluator = Evaluator(graph, cfg, ctx, sampler, feature_cache)

    history: list[dict] = []
    best = {"val_acc": -1.0, "epoch": 0}
    best_state = copy.deepcopy(model.state_dict())
    first_epoch = 1
    if cfg.resume:
        # To host memory whatever device saved it: RNG states must be CPU tensors, and
        # load_state_dict copies weights and optimizer state to the parameters' device.
        ckpt = torch.load(Path(cfg.resume) / CHECKPOINT, weights_only=False, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        history, best, best_state = ckpt["history"], ckpt["best"], ckpt["best_state"]
        _set_rng_state(ckpt["rng"][ctx.rank], train_loader, ctx.device)
        first_epoch = ckpt["epoch"] + 1
        if ctx.is_main:
            tqdm.write(f"resumed from {cfg.resume} after epoch {ckpt['epoch']}")
    for epoch in range(first_epoch, cfg.epochs + 1):
        train_loader.set_epoch(epoch)
        timer.seconds.clear()
        start = time.perf_counter()
        train_loss, train_acc = train_epoch(ddp, optimizer, train_loader, ctx,
                                            graph.num_classes, timer, epoch, cfg, grad_sync)
        epoch_time = time.perf_counter() - start
        val_acc, eval_time = None, 0.0
        if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            start = time.perf_counter()
            val_acc = evaluator.accuracy(model, graph.val_idx)
            eval_time = time.perf_counter() - start
            if val_acc > best["val_acc"]:
                best = {"val_acc": val_acc, "epoch": epoch}
                best_state = copy.deepcopy(model.state_dict())
                if ctx.is_main:
                    save_torch(best_state, out / "best.pt")
        record = {"epoch": epoch, "train_loss": train_loss, "train_acc": train_acc,
                  "val_acc": val_acc, "epoch_time_s": epoch_time, "eval_time_s": eval_time,
                  "stage_times_s": dict(timer.seconds)}
        history.append(record)
        save_checkpoint(out, ctx, cfg, epoch, model, optimizer, history, best, best_state,
                        train_loader)
        if ctx.is_main:
            val = "-" if val_acc is None else f"{val_acc:.4f}"
            tqdm.write(f"epoch {epoch:3d} | loss {train_loss:.4f} | train acc {train_acc:.4f} | "
                       f"val acc {val} | {epoch_time:.2f}s train, {eval_time:.2f}s eval")
            if cfg.profile:
                stages = ", ".join(f"{k} {v:.2f}s" for k, v in timer.seconds.items())
                tqdm.write(f"          stages (rank 0): {stages}")

    model.load_state_dict(best_state)
    test_acc = evaluator.accuracy(model, graph.test_idx)
    exact = {}
    if cfg.inference == "layerwise":
        start = time.perf_counter()
        logits = layerwise_logits(model, graph, rank=ctx.rank, world_size=ctx.world_size,
                                  batch_size=cfg.eval_batch_size or cfg.batch_size,
                                  device=ctx.device)
        exact = {"val_acc_exact": exact_accuracy(logits, graph, graph.val_idx),
                 "test_acc_exact": exact_accuracy(logits, graph, graph.test_idx),
                 "exact_inference_time_s": time.perf_counter() - start}
        del logits
    peak_mem_mb = _peak_mem_mb(ctx)
    if ctx.is_main:
        metrics = {
            **(run_info or {}),
            "dataset": graph.name,
            "num_nodes": graph.num_nodes,
            "num_edges": graph.num_edges,
            "dataset_bytes": graph.nbytes(),
            "feature_cache_rows": feature_cache.num_cached if feature_cache else 0,
            "world_size": ctx.world_size,
            "device": ctx.device.type,
            "backend": ctx.backend,
            "sampler": sampler,
            "recipe": cfg.recipe,
            "amp": cfg.amp,
            "steps_per_epoch": len(train_loader),
            "train_nodes": graph.train_idx.numel(),
            "threads_per_rank": torch.get_num_threads(),
            "config": cfg.to_dict(),
            "epochs": history,
            "best_val_acc": best["val_acc"],
            "best_epoch": best["epoch"],
            "test_acc": test_acc,
            **exact,
            "mean_epoch_time_s": sum(r["epoch_time_s"] for r in history) / len(history),
            "stage_times_s": _total_stage_times(history),
            "peak_mem_mb": peak_mem_mb,
            "wall_time_s": time.perf_counter() - wall_start,
        }
        write_outputs(metrics, out)
        tqdm.write(f"best val acc {best['val_acc']:.4f} (epoch {best['epoch']}) | "
                   f"test acc {test_acc:.4f} | outputs in {out}")
        if exact:
            tqdm.write(f"exact (layer-wise) val acc {exact['val_acc_exact']:.4f} | "
                       f"test acc {exact['test_acc_exact']:.4f}")
    if cfg.compile:
        _stop_compile_workers()


def _stop_compile_workers() -> None:
    """Ends inductor's pool of compile subprocesses once nothing is left to compile.

    Left to the interpreter's exit, its shutdown sometimes killed a finished rank with SIGABRT
    (2-rank ``--compile`` test runs: 3 of about 41 before this call, 0 of 23 after); PyTorch's
    issues recommend this explicit call.
    """
    from torch._inductor import async_compile
    shutdown = getattr(async_compile, "shutdown_compile_workers", None)  # private API
    if shutdown is not None:
        shutdown()


def _total_stage_times(history: list[dict]) -> dict:
    totals: dict = defaultdict(float)
    for record in history:
        for stage, seconds in record["stage_times_s"].items():
            totals[stage] += seconds
    return dict(totals)


def write_outputs(metrics: dict, out: Path) -> None:
    save_json(metrics, out / "metrics.json")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HISTORY_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(metrics["epochs"])
    save_text(buf.getvalue(), out / "history.csv")
