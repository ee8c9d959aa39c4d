"""One epoch of DDP training on this rank's shard: the loop, its per-stage clock, and the
forward pass on a sampled batch.

The loss and accuracy are reduced as sums and counts over ranks (:class:`EpochTotals`), never
as averages of per-rank ratios.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed.grad_sync import GradSync
from pyg_mgpu.metrics.batches import seed_outputs, seed_store
from pyg_mgpu.metrics.reduce import all_reduce_sum, global_ratio
from pyg_mgpu.sampling.prefetch import Prefetcher
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.train.graphed_step import GraphedStep


@dataclass
class StageTimer:
    """Seconds spent per training stage, for ``--profile`` and metrics.json.

    Stages: ``sample`` (the sampler, when it runs in this thread), ``gather`` (features, labels
    and batch assembly; ``load`` instead when DataLoader workers, the prefetch thread or PyG's
    sampler do the sampling, and only the wait for the batch is seen here), ``forward``,
    ``backward`` (gradient computation), ``allreduce`` (CPU ranks: the wait for the gradient
    all-reduce that is left after the next batch has loaded, the wait for the slowest rank
    included; on GPUs it stays inside ``backward``, and with ``--cuda-graph`` it is the wait
    for the step's own all-reduce, while ``forward`` holds the replayed forward and backward),
    ``optimizer`` and ``checkpoint`` (the ranks' agreement on stopping, and step checkpoints
    when they are written).
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


def seed_logits(model: torch.nn.Module, batch, *, trim: bool = True,
                amp: bool = False, feature_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Seed logits (float32) of a sampled batch; ``feature_table``: the table whose rows the
    batch's ``n_id`` name, for a batch without ``x`` (:func:`seed_outputs`).

    Trimming needs the per-hop counts; PyG's sampler gives them only with pyg-lib (not with
    torch-sparse), and without them every layer runs on every node, which is slower but exact.
    A ``HeteroData`` batch is passed as ``model(x_dict, edge_index_dict)``, plus
    ``num_sampled_nodes_dict`` and ``num_sampled_edges_dict`` when trimming; a model that
    returns a dict per node type has the seeds' type taken from it.
    """
    seeds = seed_store(batch)
    counts = {}  # untrimmed: PyG's recipe, every layer on every sampled node
    if trim and getattr(seeds, "num_sampled_nodes", None) is not None:
        if seeds is not batch:  # the CLI's HeteroGNN takes the per-hop counts per type
            counts = {"num_sampled_nodes_dict": batch.num_sampled_nodes_dict,
                      "num_sampled_edges_dict": batch.num_sampled_edges_dict}
        else:  # PyG's keywords: our GraphSAGE and PyG's models (--model) take them alike
            counts = {"num_sampled_nodes_per_hop": batch.num_sampled_nodes,
                      "num_sampled_edges_per_hop": batch.num_sampled_edges}
    rows = seeds.x if feature_table is None else feature_table
    with torch.autocast(rows.device.type, dtype=torch.bfloat16, enabled=amp):
        return seed_outputs(model, batch, feature_table=feature_table, **counts).float()


class EpochTotals:
    """This rank's training loss sum, correct predictions, seed count and predictions per class
    for one epoch.

    Everything stays on the batch's device, so a training step never waits for the GPU to read
    it back: each batch adds its loss to a sum and writes its seeds' predictions and hits
    (prediction == label) into the epoch's buffers, three kernels, and the counts are summed
    once, when asked. :meth:`compute` sums them over the ranks and divides once. A NaN loss
    makes the epoch's loss NaN: a diverged run shows. The per-class counts tell a collapsed
    model, which predicts one class for every seed (:mod:`pyg_mgpu.train.health`).
    """

    def __init__(self, device: torch.device):
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self._predictions = torch.zeros(0, dtype=torch.long, device=device)  # grown as needed
        self._hits = torch.zeros(0, dtype=torch.bool, device=device)
        self._buffered = 0  # seeds in the buffers
        self._num_classes = 0
        # Counts carried from a checkpoint of an epoch resumed mid-way.
        self._carried_seen = self._carried_correct = 0
        self._carried_predicted: Optional[torch.Tensor] = None

    @property
    def seen(self) -> int:
        """This rank's seeds so far."""
        return self._carried_seen + self._buffered

    def state(self) -> tuple:
        """(loss sum, correct, seen, predictions per class) as exact host numbers, for a
        mid-epoch checkpoint."""
        return (float(self.loss_sum), int(self.correct()), self.seen,
                self.predicted().tolist())

    @classmethod
    def from_state(cls, state: tuple, device: torch.device) -> "EpochTotals":
        totals = cls(device)
        totals.loss_sum.fill_(state[0])
        totals._carried_correct, totals._carried_seen = state[1], state[2]
        if len(state) > 3 and state[3]:  # empty before the first batch
            totals._carried_predicted = torch.tensor(state[3], dtype=torch.long, device=device)
            totals._num_classes = len(state[3])
        return totals

    def update(self, logits: torch.Tensor, y: torch.Tensor, loss: torch.Tensor) -> None:
        """One batch: its seed logits, their labels and its mean loss."""
        n = y.numel()
        self.loss_sum.add_(loss.detach(), alpha=n)  # float64 sum, one kernel
        if self._buffered + n > self._hits.numel():  # room for 64 batches more, or double
            self._grow(max(self._buffered + 64 * n, 2 * self._hits.numel()))
        predictions = self._predictions[self._buffered:self._buffered + n]
        torch.argmax(logits.detach(), -1, out=predictions)
        torch.eq(predictions, y.view(-1), out=self._hits[self._buffered:self._buffered + n])
        self._buffered += n
        self._num_classes = logits.size(-1)

    def _grow(self, size: int) -> None:
        predictions = self._predictions.new_zeros(size)
        hits = self._hits.new_zeros(size)
        predictions[:self._buffered] = self._predictions[:self._buffered]
        hits[:self._buffered] = self._hits[:self._buffered]
        self._predictions, self._hits = predictions, hits

    def correct(self) -> torch.Tensor:
        """This rank's correct predictions so far (a device scalar)."""
        return self._hits[:self._buffered].sum() + self._carried_correct

    def predicted(self) -> torch.Tensor:
        """This rank's predictions per class so far."""
        counts = torch.bincount(self._predictions[:self._buffered], minlength=self._num_classes)
        if self._carried_predicted is not None:
            counts += self._carried_predicted
        return counts

    def compute(self, sum_over_ranks: bool = True) -> tuple[float, float]:
        """(mean loss, accuracy) over every rank's seeds (a collective unless
        ``sum_over_ranks=False``)."""
        return (global_ratio(self.loss_sum, self.seen, sum_over_ranks=sum_over_ranks),
                global_ratio(self.correct(), self.seen, sum_over_ranks=sum_over_ranks))

    def classes_predicted(self) -> int:
        """How many classes the model predicted for at least one seed, over every rank (a
        collective)."""
        return int((all_reduce_sum(self.predicted()) > 0).sum())


def fewest_and_most(value: int, ctx: RankContext) -> tuple[int, int]:
    """The smallest and largest of every rank's ``value``, in one collective."""
    values = torch.tensor([value, -value], device=ctx.collective_device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return -int(values[1]), int(values[0])


def check_equal_steps(steps: int, ctx: RankContext) -> None:
    """Fails on every rank if the ranks are about to run different numbers of steps.

    A rank with fewer steps would leave the others waiting in DDP's all-reduce. The sharding
    makes the counts equal (tested); this one collective per epoch turns a bug there into an
    error instead of a hang, at one collective per epoch rather than one per step.
    """
    fewest, most = fewest_and_most(steps, ctx)
    if most != fewest:
        raise RuntimeError(f"ranks would run between {fewest} and {most} training steps this "
                           f"epoch (this rank: {steps}); every rank must run the same number.")


StepHook = Callable[[int, "EpochTotals", Any], None]
"""Called after each step with the epoch's steps done, the running totals and the sampler's
state before the next batch was drawn (for a checkpoint); it may raise to end the epoch."""


def trains_trimmed_exactly(model: torch.nn.Module) -> bool:
    """Whether trimming each layer to the rows that reach a seed leaves training's seed outputs
    and gradients as they are: not with BatchNorm, which in training normalises with the
    statistics of every row it is given (in evaluation it uses its running statistics, and
    trimming is exact)."""
    return not any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
                   for module in model.modules())


def train_epoch(ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, loader,
                ctx: RankContext, timer: StageTimer, epoch: int,
                cfg: TrainConfig, grad_sync: Optional[GradSync] = None,
                totals: Optional[EpochTotals] = None, done: int = 0,
                after_step: Optional[StepHook] = None,
                graphed: Optional[GraphedStep] = None,
                prefetch: int = 0) -> tuple[float, float, int]:
    """One epoch on this rank's shard; returns the global (loss, accuracy, classes predicted)
    over all ranks.

    Each step loads the next batch after ``backward()``: with ``grad_sync`` (CPU ranks) the
    gradient all-reduce is still running then, and the optimizer step waits for it after.
    ``totals`` and ``done`` continue an epoch from a checkpoint (the loader then starts at
    batch ``done``: ``set_epoch(epoch, start_step=done)``). ``ddp`` is the DDP-wrapped model,
    or with ``graphed`` (``--cuda-graph``) the module itself: the padded step takes the place
    of its forward and backward and all-reduces the gradients itself. ``prefetch``: batches a
    background thread prepares ahead (the run plan's).
    """
    ddp.train()
    totals = totals or EpochTotals(ctx.device)
    check_equal_steps(len(loader), ctx)
    trim = cfg.model.recipe == "pyg_mgpu" and trains_trimmed_exactly(ddp)
    # The sampler's state before each batch is drawn: a checkpoint after a step records the one
    # before the batch already drawn ahead of it, which the resumed run draws again.
    generator = getattr(loader.node_sampler, "generator", None)
    snapshot = None
    if generator is not None and loader.num_workers == 0:
        # pyg_mgpu's loader knows the state from before the walk that holds the next batch.
        snapshot = getattr(loader, "sampler_state", generator.get_state)
    # The sampler's own clock splits loading into sampling and gathering when it runs in this
    # thread; otherwise only the wait for the next batch ("load") is on this thread's clock.
    sampler = loader.node_sampler if loader.num_workers == 0 and not prefetch else None
    clock = (lambda: sampler.busy_s) if hasattr(sampler, "busy_s") else None
    # The fused route: batches without x, whose rows the model reads from this table through
    # their n_id (the run plan's fused_aggregation "in_place"). None: the plain route, batch.x.
    feature_table = getattr(loader, "feature_table", None)
    progress = tqdm(total=len(loader), desc=f"epoch {epoch}", disable=not ctx.is_main,
                    leave=False, dynamic_ncols=True)
    with Prefetcher(loader, ctx.device, prefetch, snapshot=snapshot, timer=timer,
                    sampling_clock=clock) as batches, progress:
        timer.start()
        batch = batches.next()
        while batch is not None:
            seeds = seed_store(batch)
            y = seeds.y[:seeds.batch_size]
            if graphed is None:
                optimizer.zero_grad(set_to_none=True)
                out = seed_logits(ddp, batch, trim=trim,
                                  amp=cfg.performance.amp == "bf16", feature_table=feature_table)
                loss = F.cross_entropy(out, y)
                timer.lap("forward")
                loss.backward()
                timer.lap("backward")
            else:  # padded; forward and backward replayed from one CUDA graph
                out, loss = graphed.forward_backward(batch, pause_loading=batches.paused)
                timer.lap("forward")
            next_batch = batches.next()  # while the gradient all-reduce runs
            if grad_sync is not None or graphed is not None:
                (graphed or grad_sync).wait()
                timer.lap("allreduce")
            optimizer.step()
            totals.update(out, y, loss)
            timer.lap("optimizer")
            done += 1
            progress.update()
            if after_step is not None:
                after_step(done, totals, batches.last_snapshot)
                timer.lap("checkpoint")
            batch = next_batch
    return (*totals.compute(), totals.classes_predicted())
