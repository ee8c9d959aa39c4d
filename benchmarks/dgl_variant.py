"""DGL's single-machine multi-GPU GraphSAGE recipe: the reference that pyg_mgpu is compared against.

The recipe is DGL's own (``examples/multigpu/node_classification_sage.py``): the parent builds the
graph once with every sparse format created, spawns one rank per device, each rank trains a stack
of ``SAGEConv('mean')`` layers under DDP on batches from ``dgl.dataloading.DataLoader(...,
use_ddp=True)`` with a ``NeighborSampler``, and rank 0 validates after every epoch. With
``--sampler graphbolt`` the batches come from GraphBolt's ``DistributedItemSampler`` instead.

It runs in its own environment (``benchmarks/dgl_env.sh``: DGL 2.1 only loads with torch 2.0-2.2),
so it imports nothing from pyg_mgpu. It reads the neutral ``.npz`` export
(``ConvertedGraph.save_npz``) and writes ``OUT/metrics.json`` in the schema of
``python -m pyg_mgpu.distributed_sampling``, so ``python -m pyg_mgpu.compare_dgl`` reads both alike.

Usage::

    $(bash benchmarks/dgl_env.sh) benchmarks/dgl_variant.py --npz /tmp/cora.npz --nprocs 2 \\
        --epochs 50 --out runs/dgl-cora
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import resource
import socket
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import dgl
from dgl.nn import SAGEConv

SAMPLERS = ("dataloader", "graphbolt")


@dataclass(frozen=True)
class Config:
    """One run of the DGL recipe; the fields mirror the main command's flags of the same name."""

    npz: str
    nprocs: int = 2
    epochs: int = 10
    batch_size: int = 1024
    fanout: tuple[int, ...] = (25, 10)
    hidden: int = 256
    dropout: float = 0.5
    lr: float = 0.003
    seed: int = 0
    out: Optional[str] = None
    sampler: str = "dataloader"
    devices: str = "auto"
    num_workers: int = 0

    def __post_init__(self) -> None:
        if not Path(self.npz).is_file():
            raise ValueError(f"--npz {self.npz}: no such file; export one with "
                             "ConvertedGraph.save_npz(path) (python -m pyg_mgpu.compare_dgl does).")
        if self.nprocs < 1:
            raise ValueError(f"--nprocs must be >= 1, got {self.nprocs}.")
        if self.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {self.epochs}.")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}.")
        if not self.fanout or any(k == 0 or k < -1 for k in self.fanout):
            raise ValueError(f"--fanout needs positive per-layer counts (or -1 for all "
                             f"neighbours), e.g. 25,10; got {','.join(map(str, self.fanout))}.")
        if self.hidden < 1:
            raise ValueError(f"--hidden must be >= 1, got {self.hidden}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must lie in [0, 1), got {self.dropout}.")
        if self.lr <= 0:
            raise ValueError(f"--lr must be positive, got {self.lr}.")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"--sampler must be one of {', '.join(SAMPLERS)}, got "
                             f"{self.sampler!r}.")
        if self.devices not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--devices must be auto, cpu or cuda, got {self.devices!r}.")
        if self.devices == "cuda" and torch.cuda.device_count() < self.nprocs:
            raise ValueError(f"--devices cuda with --nprocs {self.nprocs} needs {self.nprocs} "
                             f"GPUs, found {torch.cuda.device_count()}; lower --nprocs or use "
                             "--devices cpu.")
        if self.num_workers < 0:
            raise ValueError(f"--num-workers must be >= 0, got {self.num_workers}.")

    @property
    def use_cuda(self) -> bool:
        if self.devices == "auto":
            return torch.cuda.is_available() and torch.cuda.device_count() >= self.nprocs
        return self.devices == "cuda"


@dataclass
class Dataset:
    """What the parent loads once and every rank shares."""

    name: str
    graph: dgl.DGLGraph  # node data: "feat" (float32), "label" (int64)
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int


def load_npz(path: str) -> Dataset:
    """Reads the neutral export into a DGL graph with its sparse formats already built."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    missing = {"edge_index", "x", "y", "train_idx", "val_idx", "test_idx"} - set(arrays)
    if missing:
        raise ValueError(f"missing arrays {sorted(missing)}; export the dataset with "
                         "ConvertedGraph.save_npz.")
    x = torch.from_numpy(arrays["x"]).float()
    y = torch.from_numpy(arrays["y"]).long()
    src, dst = torch.from_numpy(arrays["edge_index"]).long()
    graph = dgl.graph((src, dst), num_nodes=x.size(0))
    graph.ndata["feat"] = x
    graph.ndata["label"] = y
    # Built once here, not in every rank: the ranks receive the graph with all formats through
    # shared memory (DGL's example does the same, for memory and start-up time).
    graph.create_formats_()
    num_classes = int(arrays["num_classes"]) if "num_classes" in arrays else int(y.max()) + 1
    return Dataset(
        name=Path(path).stem,
        graph=graph,
        train_idx=torch.from_numpy(arrays["train_idx"]).long(),
        val_idx=torch.from_numpy(arrays["val_idx"]).long(),
        test_idx=torch.from_numpy(arrays["test_idx"]).long(),
        num_classes=num_classes,
    )


def graphbolt_batches_per_rank(num_items: int, world_size: int, batch_size: int) -> int:
    """Batches every rank gets from ``DistributedItemSampler(drop_uneven_inputs=True)``.

    GraphBolt deals whole batches to the ranks in turn, so the last rank can be left with
    nothing (Cora's 140 training nodes in batches of 1024 on 2 ranks all go to rank 0), and
    dropping the uneven batches then leaves every rank with that least count.
    """
    full_rounds, rest = divmod(num_items, world_size * batch_size)
    full_batches, partial = divmod(rest, batch_size)
    last_rank = full_rounds * batch_size + (
        batch_size if world_size - 1 < full_batches
        else partial if world_size - 1 == full_batches else 0)
    return -(-last_rank // batch_size)


def dgl_fanouts(fanout: tuple[int, ...]) -> list[int]:
    """``--fanout`` for DGL's samplers. ``--fanout`` lists the seeds' hop first, as PyG's
    ``num_neighbors`` and pyg_mgpu's do; DGL's ``NeighborSampler`` and GraphBolt's
    ``sample_neighbor`` take one fanout per layer from the input side and draw the seeds' hop
    with the last, so the list is reversed for them."""
    return list(reversed(fanout))


def check_seeds_hop(block, seeds: torch.Tensor, graph, fanout: int) -> None:
    """The seeds' block (DGL's last) drew ``min(in-degree, fanout)`` edges into each seed, as
    sampling without replacement must with the seeds' hop first in ``--fanout``; raises
    otherwise."""
    drawn = block.in_degrees().cpu()
    every = graph.in_degrees(seeds.cpu())
    expected = every if fanout < 0 else every.clamp(max=fanout)
    if not torch.equal(drawn, expected):
        raise RuntimeError(f"the seeds' hop drew up to {int(drawn.max())} in-edges per seed "
                           f"where --fanout asks for {fanout}: the samplers' fanout order is "
                           "not the one --fanout gives")


class SAGE(nn.Module):
    """GraphSAGE as PyG's ``GraphSAGE``: SAGEConv('mean') layers, ReLU and dropout between them."""

    def __init__(self, in_size: int, hidden: int, out_size: int, num_layers: int,
                 dropout: float):
        super().__init__()
        sizes = [in_size] + [hidden] * (num_layers - 1) + [out_size]
        self.layers = nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: list, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


@dataclass(frozen=True)
class RankContext:
    """Runtime facts of one rank, passed explicitly."""

    rank: int
    world_size: int
    device: torch.device
    backend: str


@contextlib.contextmanager
def process_group(rank: int, world_size: int, port: int, use_cuda: bool
                  ) -> Iterator[RankContext]:
    """The one place the process group is set up and torn down (on success and on error)."""
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        yield RankContext(rank=rank, world_size=world_size, device=device, backend=backend)
    finally:
        dist.destroy_process_group()


class Batches:
    """Training and evaluation batches, from DGL's DataLoader or from GraphBolt.

    Every batch is ``(blocks, x, y)`` on the rank's device. Both paths give every rank the same
    number of training batches per epoch: ``use_ddp=True`` cuts the seeds into equal contiguous
    shards (the last one padded with its own seeds); GraphBolt's ``drop_uneven_inputs=True`` drops
    the batches some ranks have and others lack.
    """

    def __init__(self, cfg: Config, data: Dataset, ctx: RankContext):
        self.cfg, self.data, self.ctx = cfg, data, ctx
        self._checked = False
        if cfg.sampler == "dataloader":
            # Features and labels are gathered by the loader (DGL's prefetch), as in DGL's example.
            self.sampler = dgl.dataloading.NeighborSampler(
                dgl_fanouts(cfg.fanout), prefetch_node_feats=["feat"], prefetch_labels=["label"])
            self.train_loader = dgl.dataloading.DataLoader(
                data.graph, data.train_idx, self.sampler, device=ctx.device,
                batch_size=cfg.batch_size, shuffle=True, drop_last=False,
                num_workers=cfg.num_workers, use_ddp=True)
        else:
            self._init_graphbolt()

    def train(self) -> Iterator[tuple]:
        """One epoch of this rank's training batches; the run's first one is checked to have
        drawn the seeds' hop with ``--fanout``'s first count (:func:`check_seeds_hop`)."""
        if self.cfg.sampler == "graphbolt":
            yield from self._graphbolt_batches(self.gb_train, check=self._check_once)
            return
        # No set_epoch: with use_ddp, DGL 2.1 gives each rank a fixed shard of the seeds for the
        # whole run and reshuffles it locally every epoch with numpy's global generator.
        for _, seeds, blocks in self.train_loader:
            self._check_once(blocks[-1], seeds)
            yield blocks, blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]

    def _check_once(self, block, seeds: torch.Tensor) -> None:
        if not self._checked:
            check_seeds_hop(block, seeds, self.data.graph, self.cfg.fanout[0])
            self._checked = True

    def evaluate(self, idx: torch.Tensor) -> Iterator[tuple]:
        """Sampled batches over ``idx`` (in order, none dropped), for rank 0's evaluation."""
        if self.cfg.sampler == "graphbolt":
            yield from self._graphbolt_batches(self._gb_pipeline(idx, distributed=False))
            return
        loader = dgl.dataloading.DataLoader(
            self.data.graph, idx, self.sampler, device=self.ctx.device,
            batch_size=self.cfg.batch_size, shuffle=False, drop_last=False,
            num_workers=self.cfg.num_workers)
        for _, _, blocks in loader:
            yield blocks, blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]

    def _init_graphbolt(self) -> None:
        import dgl.graphbolt as gb

        g = self.data.graph
        # The CSC arrays of the parent's graph (already shared) back GraphBolt's sampling graph.
        indptr, indices, _ = g.adj_tensors("csc")
        self.gb_graph = gb.fused_csc_sampling_graph(indptr, indices)
        self.gb_features = gb.BasicFeatureStore(
            {("node", None, "feat"): gb.TorchBasedFeature(g.ndata["feat"])})
        self.gb_train = self._gb_pipeline(self.data.train_idx, distributed=True)

    def _gb_pipeline(self, idx: torch.Tensor, *, distributed: bool):
        import dgl.graphbolt as gb

        items = gb.ItemSet((idx, self.data.graph.ndata["label"][idx]),
                           names=("seed_nodes", "labels"))
        if distributed:
            pipe = gb.DistributedItemSampler(items, batch_size=self.cfg.batch_size, shuffle=True,
                                             drop_last=False, drop_uneven_inputs=True)
        else:
            pipe = gb.ItemSampler(items, batch_size=self.cfg.batch_size, shuffle=False)
        pipe = pipe.copy_to(self.ctx.device)
        pipe = pipe.sample_neighbor(self.gb_graph, dgl_fanouts(self.cfg.fanout))
        pipe = pipe.fetch_feature(self.gb_features, node_feature_keys=["feat"])
        if not distributed:
            # Not wrapped in a DataLoader: torch's DataLoader over a datapipe makes a new process
            # group and broadcasts a seed whenever iteration starts, a collective that would hang
            # while only rank 0 evaluates.
            return pipe
        return gb.DataLoader(pipe, num_workers=self.cfg.num_workers)

    @staticmethod
    def _graphbolt_batches(loader, check=None) -> Iterator[tuple]:
        """``(blocks, x, y)`` of GraphBolt's minibatches; ``check(seeds' block, seeds)`` first
        where given."""
        for mb in loader:
            if check is not None:
                check(mb.blocks[-1], mb.seed_nodes)
            yield mb.blocks, mb.node_features["feat"], mb.labels


@torch.no_grad()
def accuracy(model: nn.Module, batches: Iterator[tuple]) -> float:
    model.eval()
    correct = total = 0
    for blocks, x, y in batches:
        correct += int((model(blocks, x).argmax(-1) == y).sum())
        total += y.numel()
    model.train()
    return correct / max(total, 1)


def peak_rss_mb() -> float:
    """This process's peak resident set (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_rank(rank: int, cfg: Config, data: Dataset, port: int, run_info: dict) -> None:
    """One rank: train under DDP, rank 0 validates each epoch and writes metrics.json."""
    threads = run_info["threads_per_rank"]
    torch.set_num_threads(threads)
    # DGL nags about CPU affinity on every CPU DataLoader; the threads are set above instead.
    warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt")
    # Same model initialisation on every rank (DDP broadcasts rank 0's anyway); per-rank
    # sampling and dropout streams.
    torch.manual_seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    dgl.seed(cfg.seed + rank)
    with process_group(rank, cfg.nprocs, port, cfg.use_cuda) as ctx:
        wall_start = time.perf_counter()  # as pyg_mgpu's: from the rank's start to the test
        torch.manual_seed(cfg.seed)
        model = SAGE(data.graph.ndata["feat"].size(1), cfg.hidden, data.num_classes,
                     len(cfg.fanout), cfg.dropout).to(ctx.device)
        torch.manual_seed(cfg.seed + rank)
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.device.index] if cfg.use_cuda else None)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
        batches = Batches(cfg, data, ctx)

        epochs, best_val, best_epoch, best_state = [], -1.0, 0, None
        for epoch in range(1, cfg.epochs + 1):
            start = time.perf_counter()
            # Loss sum, correct and seen counts: kept on the device (no sync per step), reduced
            # across ranks once per epoch, divided once.
            sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)
            for blocks, x, y in batches.train():
                out = ddp(blocks, x)
                loss = F.cross_entropy(out, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                n = torch.tensor(y.numel(), dtype=torch.float64, device=ctx.device)
                sums += torch.stack([loss.detach().double() * n,
                                     (out.detach().argmax(-1) == y).sum().double(), n])
            # This rank's own seconds, as pyg_mgpu records (ranks finish together anyway: the
            # last backward's all-reduce waits for all of them).
            elapsed = time.perf_counter() - start
            dist.all_reduce(sums)

            record = {"epoch": epoch, "train_loss": float(sums[0] / sums[2]),
                      "train_acc": float(sums[1] / sums[2]), "val_acc": None,
                      "epoch_time_s": elapsed, "eval_time_s": 0.0}
            if ctx.rank == 0:
                start = time.perf_counter()
                record["val_acc"] = accuracy(model, batches.evaluate(data.val_idx))
                record["eval_time_s"] = time.perf_counter() - start
                if record["val_acc"] > best_val:
                    best_val, best_epoch = record["val_acc"], epoch
                    best_state = copy.deepcopy(model.state_dict())
                print(f"epoch {epoch:3d}  loss {record['train_loss']:.4f}  "
                      f"train {record['train_acc']:.4f}  val {record['val_acc']:.4f}  "
                      f"{record['epoch_time_s']:.2f} s (+{record['eval_time_s']:.2f} s eval)",
                      flush=True)
            epochs.append(record)
            # The other ranks wait here while rank 0 evaluates.
            dist.barrier()

        test_acc = None
        if ctx.rank == 0:
            model.load_state_dict(best_state)
            test_acc = accuracy(model, batches.evaluate(data.test_idx))
        peak = torch.tensor([peak_rss_mb()], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(peak)
        if ctx.rank == 0:
            write_metrics(cfg, ctx, data, epochs, best_val, best_epoch, test_acc, float(peak),
                          {**run_info, "wall_time_s": time.perf_counter() - wall_start})


def write_metrics(cfg: Config, ctx: RankContext, data: Dataset, epochs: list[dict],
                  best_val: float, best_epoch: int, test_acc: float, peak_mem_mb: float,
                  run_info: dict) -> None:
    """Writes ``OUT/metrics.json`` with the keys of pyg_mgpu's (docs/outputs.md)."""
    g = data.graph
    metrics = {
        **run_info,
        "dataset": data.name,
        "num_nodes": g.num_nodes(),
        "num_edges": g.num_edges(),
        "dataset_bytes": sum(t.numel() * t.element_size() for t in
                             (*g.adj_tensors("csc")[:2], g.ndata["feat"], g.ndata["label"],
                              data.train_idx, data.val_idx, data.test_idx)),
        "world_size": ctx.world_size,
        "device": ctx.device.type,
        "backend": ctx.backend,
        "sampler": f"dgl-{cfg.sampler}",
        "config": {**asdict(cfg), "fanout": list(cfg.fanout)},
        "epochs": epochs,
        "best_val_acc": best_val,
        "best_epoch": best_epoch,
        "test_acc": test_acc,
        "mean_epoch_time_s": sum(r["epoch_time_s"] for r in epochs) / len(epochs),
        "peak_mem_mb": peak_mem_mb,
        "framework": {"dgl": dgl.__version__, "torch": torch.__version__,
                      "python": platform.python_version()},
    }
    print(f"best val {best_val:.4f} (epoch {best_epoch})  test {test_acc:.4f}  "
          f"peak RSS {peak_mem_mb:.0f} MB over {ctx.world_size} ranks", flush=True)
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        # Written whole, then renamed: a crash never leaves a truncated metrics.json.
        tmp = out / ".metrics.json.tmp"
        tmp.write_text(json.dumps(metrics, indent=2) + "\n")
        tmp.replace(out / "metrics.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: Optional[list[str]] = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--npz", required=True, help="dataset exported by ConvertedGraph.save_npz")
    p.add_argument("--nprocs", type=int, default=2, help="ranks (one per GPU, or CPU ranks)")
    p.add_argument("--devices", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: one GPU per rank when there are enough, else CPU with gloo")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanout", default="25,10", help="neighbours per layer, e.g. 25,10")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampler", default="dataloader", choices=SAMPLERS,
                   help="dataloader: DataLoader(use_ddp=True); graphbolt: DistributedItemSampler")
    p.add_argument("--num-workers", type=int, default=0, help="sampling worker processes")
    p.add_argument("--out", help="directory for metrics.json")
    a = p.parse_args(argv)
    try:
        fanout = tuple(int(k) for k in a.fanout.split(","))
    except ValueError:
        p.error(f"--fanout takes comma-separated integers such as 25,10, got {a.fanout!r}")
    try:
        return Config(npz=a.npz, nprocs=a.nprocs, epochs=a.epochs, batch_size=a.batch_size,
                      fanout=fanout, hidden=a.hidden, dropout=a.dropout, lr=a.lr, seed=a.seed,
                      out=a.out, sampler=a.sampler, devices=a.devices,
                      num_workers=a.num_workers)
    except ValueError as e:
        p.error(str(e))


def main(argv: Optional[list[str]] = None) -> int:
    cfg = parse_args(argv)
    start = time.perf_counter()
    try:
        data = load_npz(cfg.npz)
    except (ValueError, OSError) as e:
        print(f"error: --npz {cfg.npz}: {e}", file=sys.stderr)
        return 2
    load_s = time.perf_counter() - start
    num_train = data.train_idx.numel()
    if cfg.sampler == "graphbolt" and not graphbolt_batches_per_rank(num_train, cfg.nprocs,
                                                                     cfg.batch_size):
        print(f"error: --sampler graphbolt: GraphBolt's DistributedItemSampler deals whole "
              f"batches to ranks, so {num_train} training nodes in batches of {cfg.batch_size} "
              f"leave rank {cfg.nprocs - 1} of {cfg.nprocs} with none, and evening out the "
              f"batch counts then drops them all; use --batch-size "
              f"{max(1, num_train // cfg.nprocs)} or less, or --sampler dataloader.",
              file=sys.stderr)
        return 2
    print(f"{data.name}: {data.graph.num_nodes():,} nodes, {data.graph.num_edges():,} "
          f"edges, {data.graph.ndata['feat'].size(1)} features, {data.num_classes} classes; "
          f"{cfg.nprocs} ranks on {'cuda' if cfg.use_cuda else 'cpu'}, sampler {cfg.sampler}",
          flush=True)
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // cfg.nprocs)
    # DGL's own OpenMP pool reads this when a rank starts.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # Transparent huge pages for torch's CPU allocations, as pyg_mgpu's launcher sets: the timing
    # then compares the recipes, not the allocators.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    run_info = {"load_time_s": load_s, "threads_per_rank": threads}
    try:
        mp.spawn(run_rank, args=(cfg, data, free_port(), run_info), nprocs=cfg.nprocs)
    except mp.ProcessRaisedException as e:
        print(f"error: a rank failed:\n{e}", file=sys.stderr)
        return 1
    except mp.ProcessExitedException as e:
        print(f"error: a rank died: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
