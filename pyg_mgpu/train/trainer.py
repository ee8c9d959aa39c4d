"""What one CLI rank does: build the model and loaders, train, validate, test, report.

:func:`run_training` reads top to bottom as the recipe: a DDP model
(:func:`~pyg_mgpu.train.trainee.build_ddp`), this rank's loaders over the shared graph
(:func:`build_loaders`), an optional resume, the epochs (:func:`fit`:
:func:`~pyg_mgpu.train.loop.train_epoch`, validation, checkpoint; a stop signal ends them at the
next step, with a checkpoint of it), then the test accuracy of the best model and the run's
outputs (:func:`report`). Validation runs on rank 0 between barriers (``--eval-on rank0``, the
recipe's shape) or sharded over all ranks (``--eval-on all``); either way accuracies are sums
and counts divided once.
"""
from __future__ import annotations

import contextlib
import copy
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from pyg_mgpu.data.protocol import TrainingGraph
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed.process_group import on_rank0_alone
from pyg_mgpu.distributed.stop import StopAgreement, StopSignal, graceful, signal_name
from pyg_mgpu.inference.layerwise import layerwise_inference
from pyg_mgpu.sampling.feature_cache import FeatureCache
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.train.busy import BusyShare, nvml_reader
from pyg_mgpu.train.checkpoint import (
    CHECKPOINT,
    Progress,
    StepPosition,
    describe,
    restore_checkpoint,
    save_checkpoint,
    save_torch,
)
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.evaluator import Evaluator
from pyg_mgpu.train.health import collapse_warnings
from pyg_mgpu.train.inference import exact_accuracy, layerwise_logits
from pyg_mgpu.train.loaders import make_feature_cache, make_loader, place_graph
from pyg_mgpu.train.loop import EpochTotals, StageTimer, train_epoch
from pyg_mgpu.train.metrics import peak_mem_mb, total_stage_times, write_outputs
from pyg_mgpu.train.plan import RunPlan, least_free_gpu_bytes, plan_rank
from pyg_mgpu.train.run_folder import hold_run_folder
from pyg_mgpu.train.tensorboard_log import TensorBoardLog
from pyg_mgpu.train.trace import StepTrace, format_top
from pyg_mgpu.train.trainee import Trainee, build_ddp


@dataclass
class RankData:
    """This rank's view of the graph and its loaders."""

    graph: TrainingGraph  # on this rank's GPU, or the shared host copy
    plan: RunPlan
    train_loader: NeighborLoader
    evaluator: Evaluator
    feature_cache: Optional[FeatureCache]


def build_loaders(cfg: TrainConfig, graph: TrainingGraph, ctx: RankContext) -> RankData:
    """Plans this rank's run (:func:`plan_rank`), places the graph for it and builds its
    sharded training loader and evaluator."""
    plan = plan_rank(cfg, graph, ctx, least_free_gpu_bytes(ctx))
    graph = place_graph(graph, ctx.device, plan.graph_on, plan.sampler)
    feature_cache = make_feature_cache(graph, ctx.device, int(plan.feature_cache_gb * 2**30))
    if feature_cache is not None and ctx.is_main:
        tqdm.write(f"graph in host memory; {feature_cache.num_cached:,} hottest feature rows "
                   f"({feature_cache.nbytes() / 2**30:.2f} GiB) cached on the GPU")
    train_loader = make_loader(graph, graph.train_idx, fanout=cfg.training.fanout,
                               sampler=plan.sampler, seed=cfg.training.seed, rank=ctx.rank,
                               world_size=ctx.world_size, batch_size=cfg.training.batch_size,
                               num_workers=cfg.performance.num_workers,
                               feature_cache=feature_cache, device=ctx.device,
                               sample_batches=plan.sample_batches,
                               features_in_place=plan.fused_aggregation == "in_place")
    return RankData(graph, plan, train_loader,
                    Evaluator(graph, cfg, ctx, plan, feature_cache), feature_cache)


class StepCheckpoints:
    """What happens between steps and between epochs: the ranks' agreement on stopping, and the
    checkpoints it, ``--checkpoint-every-steps`` or ``--checkpoint-every-s`` call for.

    :meth:`after_step` is :func:`~pyg_mgpu.train.loop.train_epoch`'s hook; a stop writes a
    checkpoint of that step and raises :class:`~pyg_mgpu.distributed.stop.StopSignal`, on every
    rank at the same step.
    """

    def __init__(self, cfg: TrainConfig, ctx: RankContext, trainee: Trainee,
                 progress: Progress, out: Path, data: RankData,
                 data_fingerprint: Optional[str] = None):
        self.cfg, self.ctx, self.trainee = cfg, ctx, trainee
        self.progress, self.out = progress, out
        self.sampler, self.plan = data.train_loader.node_sampler, data.plan
        self.data_fingerprint = data_fingerprint
        self.agreement = StopAgreement(cfg.faults.checkpoint_every_s, timeout_s=cfg.ranks.timeout_s)
        self.epoch, self.steps, self.start = 0, 0, 0.0

    def begin_epoch(self, epoch: int, steps: int, start: float) -> None:
        """``steps``: the epoch's batches; ``start``: its clock's start (perf_counter)."""
        self.epoch, self.steps, self.start = epoch, steps, start

    def after_step(self, done: int, totals: EpochTotals, sampler_state) -> None:
        decision = self.agreement.after_step()
        every = self.cfg.faults.checkpoint_every_steps
        inside = done < self.steps  # at the epoch's end the epoch checkpoint follows
        periodic = every is not None and ((self.epoch - 1) * self.steps + done) % every == 0
        if decision.stop or (inside and (periodic or decision.checkpoint)):
            self._save(StepPosition(self.epoch, done, totals.state(), sampler_state,
                                    time.perf_counter() - self.start))
        if decision.stop:
            self._stop(decision.stop, f"epoch {self.epoch}, {done} steps in")

    def after_epoch(self) -> None:
        """The epoch checkpoint; then a stop requested during validation ends the run here."""
        self._save(None)
        decision = self.agreement.now()
        if decision.stop:
            self._stop(decision.stop, f"after epoch {self.epoch}")

    def close(self) -> None:
        self.agreement.close()

    def _save(self, step: Optional[StepPosition]) -> None:
        progress, trainee = self.progress, self.trainee
        save_checkpoint(self.out, self.ctx, self.cfg, progress, trainee.model,
                        trainee.optimizer, self.sampler, step=step,
                        padded_layout=trainee.graphed and trainee.graphed.layout_state(),
                        data_fingerprint=self.data_fingerprint, plan=self.plan.to_dict())
        self.agreement.checkpoint_written()

    def _stop(self, signum: int, where: str) -> None:
        if self.ctx.is_main:
            tqdm.write(f"{signal_name(signum)}: stopped {where}; checkpoint in "
                       f"{self.out / CHECKPOINT}")
        raise StopSignal(signum)


def _then_trace(after_step, trace: StepTrace, *args) -> None:
    after_step(*args)
    trace.step()


def fit(cfg: TrainConfig, ctx: RankContext, trainee: Trainee, data: RankData,
        progress: Progress, out: Path, data_fingerprint: Optional[str] = None,
        board: Optional[TensorBoardLog] = None) -> Progress:
    """Trains the remaining epochs: one epoch, validation, checkpoint, log line each.

    Between steps the ranks agree whether to stop (a stop signal reached any of them) or to
    write a step checkpoint (:class:`StepCheckpoints`); checkpoints keep ``data_fingerprint``.
    """
    timer = StageTimer(ctx.device, sync=cfg.performance.profile)
    between = StepCheckpoints(cfg, ctx, trainee, progress, out, data, data_fingerprint)
    busy = BusyShare(nvml_reader(ctx.device) if ctx.is_main else None)
    trace = (StepTrace(out, cfg.performance.trace_steps, ctx.device)
             if cfg.performance.trace_steps and ctx.is_main else None)
    try:
        for epoch in range(progress.next_epoch, cfg.training.epochs + 1):
            # A checkpoint taken inside this epoch: its steps done, sums and seconds so far.
            resumed, progress.resume_step = progress.resume_step, None
            done = resumed.done if resumed else 0
            data.train_loader.set_epoch(epoch, start_step=done)
            timer.seconds.clear()
            start = time.perf_counter() - (resumed.elapsed_s if resumed else 0.0)
            between.begin_epoch(epoch, done + len(data.train_loader), start)
            totals = EpochTotals.from_state(resumed.totals, ctx.device) if resumed else None
            traced = trace is not None and epoch == cfg.training.epochs
            after_step = between.after_step
            if traced:
                trace.start(len(data.train_loader))
                after_step = partial(_then_trace, between.after_step, trace)
            busy.start()
            train_loss, train_acc, classes = train_epoch(
                trainee.trained, trainee.optimizer, data.train_loader, ctx, timer, epoch, cfg,
                trainee.grad_sync, totals=totals, done=done, after_step=after_step,
                graphed=trainee.graphed, prefetch=data.plan.prefetch)
            epoch_time = time.perf_counter() - start
            gpu_busy_pct = busy.stop()
            if traced:
                trace.stop()
                tqdm.write(f"trace of {trace.traced} steps (kernels.csv, trace.json in {out}):\n"
                           + format_top(trace.table) if trace.table else
                           "no trace: --trace-steps needs an epoch of at least 2 steps")
            val_acc, eval_time = None, 0.0
            if epoch % cfg.evaluation.eval_every == 0 or epoch == cfg.training.epochs:
                start = time.perf_counter()
                val_acc = data.evaluator.accuracy(trainee.model, data.graph.val_idx)
                eval_time = time.perf_counter() - start
                if val_acc > progress.best["val_acc"]:
                    progress.best = {"val_acc": val_acc, "epoch": epoch}
                    progress.best_state = copy.deepcopy(trainee.model.state_dict())
                    if ctx.is_main:
                        save_torch(progress.best_state, out / "best.pt")
            progress.history.append({"epoch": epoch, "train_loss": train_loss,
                                     "train_acc": train_acc, "val_acc": val_acc,
                                     "classes_predicted": classes,
                                     "epoch_time_s": epoch_time, "eval_time_s": eval_time,
                                     "gpu_busy_pct": gpu_busy_pct,
                                     "stage_times_s": dict(timer.seconds)})
            if board is not None:  # rank 0's TensorBoard log
                board.epoch(progress.history[-1], seeds=data.graph.train_idx.numel())
            progress.next_epoch = epoch + 1
            warnings = collapse_warnings(progress.history, lr=cfg.model.lr, norm=cfg.model.norm,
                                         model=cfg.model.model)
            if ctx.is_main:
                val = "-" if val_acc is None else f"{val_acc:.4f}"
                tqdm.write(f"epoch {epoch:3d} | loss {train_loss:.4f} | train acc "
                           f"{train_acc:.4f} | val acc {val} | {epoch_time:.2f}s train, "
                           f"{eval_time:.2f}s eval")
                if cfg.performance.profile:
                    stages = ", ".join(f"{k} {v:.2f}s" for k, v in timer.seconds.items())
                    tqdm.write(f"          stages (rank 0): {stages}")
                for warning in warnings:
                    if warning["epoch"] == epoch:  # each warning once, when it first applies
                        tqdm.write(f"warning: {warning['message']}")
            between.after_epoch()
    except StopSignal:
        between.close()  # every rank stopped at the same step: the last exchange completes
        raise
    # (After any other error a peer may be gone, and waiting for the exchange could hang.)
    between.close()
    return progress


def evaluate_best(cfg: TrainConfig, ctx: RankContext, model: torch.nn.Module, data: RankData,
              progress: Progress) -> dict:
    """Loads the best validation weights; their sampled test accuracy, and with
    ``--inference layerwise`` the exact (all-neighbour) validation and test accuracies."""
    model.load_state_dict(progress.best_state)
    results = {"test_acc": data.evaluator.accuracy(model, data.graph.test_idx)}
    if cfg.evaluation.inference != "layerwise":
        return results
    start = time.perf_counter()
    graph = data.graph
    batch_size = data.plan.eval_batch_size
    if cfg.model.model == "sage":  # the fast path's own inference, sharded over the ranks
        logits = layerwise_logits(model, graph, rank=ctx.rank, world_size=ctx.world_size,
                                  batch_size=batch_size, device=ctx.device)
    else:  # PyG's models: their own BasicGNN.inference, on rank 0 while the others wait
        logits = on_rank0_alone(ctx, lambda: layerwise_inference(
            model, graph.to_data(), batch_size=batch_size, device=ctx.device))
        if not ctx.is_main:
            return results  # only rank 0 reports
    results.update(val_acc_exact=exact_accuracy(logits, graph, graph.val_idx),
                   test_acc_exact=exact_accuracy(logits, graph, graph.test_idx),
                   exact_inference_time_s=time.perf_counter() - start)
    return results


def report(cfg: TrainConfig, ctx: RankContext, data: RankData, progress: Progress,
           results: dict, out: Path, run_info: dict, wall_s: float) -> None:
    """Writes metrics.json and history.csv (rank 0) and prints the summary."""
    mem_mb = peak_mem_mb(ctx)  # a collective: every rank
    if not ctx.is_main:
        return
    graph, history = data.graph, progress.history
    metrics = {
        **run_info,
        "dataset": graph.name,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "num_features": graph.num_features,  # per node type on a heterogeneous graph
        "num_classes": graph.num_classes,
        "dataset_bytes": graph.nbytes(),
        "feature_cache_rows": data.feature_cache.num_cached if data.feature_cache else 0,
        "world_size": ctx.world_size,
        "device": ctx.device.type,
        "backend": ctx.backend,
        "sampler": data.plan.sampler,
        "recipe": cfg.model.recipe,
        "model": cfg.model.model,
        "amp": cfg.performance.amp,
        "steps_per_epoch": data.train_loader.epoch_sampler.steps_per_epoch,
        "train_nodes": graph.train_idx.numel(),
        "threads_per_rank": torch.get_num_threads(),
        "config": cfg.to_dict(),
        "plan": data.plan.to_dict(),
        "epochs": history,
        "warnings": collapse_warnings(history, lr=cfg.model.lr, norm=cfg.model.norm, model=cfg.model.model),
        "best_val_acc": progress.best["val_acc"],
        "best_epoch": progress.best["epoch"],
        **results,
        "mean_epoch_time_s": sum(r["epoch_time_s"] for r in history) / len(history),
        "stage_times_s": total_stage_times(history),
        "peak_mem_mb": mem_mb,
        "wall_time_s": wall_s,
    }
    write_outputs(metrics, out)
    tqdm.write(f"best val acc {progress.best['val_acc']:.4f} (epoch {progress.best['epoch']}) | "
               f"test acc {results['test_acc']:.4f} | outputs in {out}")
    if "test_acc_exact" in results:
        tqdm.write(f"exact (layer-wise) val acc {results['val_acc_exact']:.4f} | "
                   f"test acc {results['test_acc_exact']:.4f}")


def run_training(ctx: RankContext, graph: TrainingGraph, cfg: TrainConfig, out_dir: str,
                 run_info: Optional[dict] = None) -> None:
    """The rank function: trains, evaluates and (rank 0) writes the run's outputs.

    A stop signal ends it at the next step, with a checkpoint (:func:`fit`). Rank 0 holds
    the folder's lock (:func:`hold_run_folder`) while it writes there.
    """
    # tqdm's default lock is a named semaphore, for bars of several processes; only this one
    # draws here. A job killed whole (its resource tracker with it) would leave it in /dev/shm.
    tqdm.set_lock(threading.RLock())
    with graceful(), hold_run_folder(Path(out_dir)) if ctx.is_main else contextlib.nullcontext():
        _run_training(ctx, graph, cfg, out_dir, run_info)


def _run_training(ctx: RankContext, graph: TrainingGraph, cfg: TrainConfig, out_dir: str,
                  run_info: Optional[dict]) -> None:
    wall_start = time.perf_counter()
    out = Path(out_dir)
    trainee = build_ddp(cfg, graph, ctx)
    if trainee.graphed is not None and not trainee.graphed.capture and ctx.is_main:
        tqdm.write("--cuda-graph: the ranks run on the CPU, where the padded step runs "
                   "without a CUDA graph")
    data = build_loaders(cfg, graph, ctx)
    progress = Progress.start(trainee.model)
    if cfg.faults.resume:  # the generators' states are restored with the weights
        ckpt = restore_checkpoint(cfg.faults.resume, ctx, trainee.model, trainee.optimizer,
                                  data.train_loader.node_sampler)
        progress = Progress.from_checkpoint(ckpt, ctx.rank)
        if trainee.graphed is not None:
            layouts = ckpt.get("padded_layouts") or [None] * ctx.world_size
            trainee.graphed.resume_layout(layouts[ctx.rank])
        if ctx.is_main:
            tqdm.write(f"resumed from {cfg.faults.resume}, {describe(ckpt)}")
            changed = data.plan.differences(ckpt.get("plan"))
            if changed:  # another machine, or flags left to their defaults that resolve anew
                tqdm.write(f"warning: the resumed run's plan differs from its checkpoint's: "
                           f"{'; '.join(changed)}; it continues, but not with the batches or "
                           "speed the run had.", file=sys.stderr)
    board = TensorBoardLog.for_run(out, cfg.to_dict(), is_main=ctx.is_main,
                                first_epoch=progress.next_epoch)
    progress = fit(cfg, ctx, trainee, data, progress, out,
                   data_fingerprint=(run_info or {}).get("data_fingerprint"), board=board)
    results = evaluate_best(cfg, ctx, trainee.model, data, progress)
    results["tensorboard"] = board.finish(results, best_epoch=progress.best["epoch"])
    if trainee.graphed is not None:
        results["cuda_graph"] = trainee.graphed.summary()
    report(cfg, ctx, data, progress, results, out, run_info or {},
           time.perf_counter() - wall_start)
    if cfg.performance.compile:
        _stop_compile_workers()


def _stop_compile_workers() -> None:
    """Ends inductor's pool of compile subprocesses once nothing is left to compile.

    Left to the interpreter's exit, its shutdown can kill a finished rank with SIGABRT;
    PyTorch's issues recommend this explicit call (docs/architecture.md, ``--compile``).
    """
    from torch._inductor import async_compile
    shutdown = getattr(async_compile, "shutdown_compile_workers", None)  # private API
    if shutdown is not None:
        shutdown()
