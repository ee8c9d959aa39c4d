"""Running as one rank of a ``torchrun`` job (one or many machines).

torchrun starts every process itself, so there is no parent to load the graph for its ranks.
Instead, local rank 0 of each machine loads the dataset and writes it once to ``/dev/shm``; every
rank on that machine (itself included) then memory-maps that file, so a machine holds one copy of
the graph however many ranks it runs. The file is unlinked as soon as everyone has mapped it.
"""
from __future__ import annotations

import os
import time
from dataclasses import fields
from pathlib import Path

import torch
import torch.distributed as dist

from pyg_mgpu.train.checkpoint import save_torch
from pyg_mgpu.train.config import TrainConfig
from pyg_mgpu.data.datasets import load_configured
from pyg_mgpu.data.graph import GraphStore
from pyg_mgpu.distributed.launch import RankContext, process_group, set_thread_budget, tune_cpu_allocator
from pyg_mgpu.sampling.sharding import check_shardable


def _shm_path() -> Path:
    job = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    node = os.environ.get("GROUP_RANK", "0")
    port = os.environ.get("MASTER_PORT", "0")
    return Path("/dev/shm") / f"pyg_mgpu-{job}-{port}-node{node}.pt"


def load_graph_once_per_node(cfg: TrainConfig, ctx: RankContext) -> GraphStore:
    """Local rank 0 loads and publishes the graph; every local rank maps the published file."""
    path = _shm_path()
    if ctx.local_rank == 0:
        graph = load_configured(cfg)
        state = {f.name: getattr(graph, f.name) for f in fields(graph)}
        save_torch(state, path)
        del graph, state
    dist.barrier()
    try:
        state = torch.load(path, mmap=True, weights_only=True)
    finally:
        dist.barrier()  # everyone has mapped it: the name can go, the pages stay mapped
        if ctx.local_rank == 0:
            path.unlink(missing_ok=True)
    return GraphStore(**state)


def run_torchrun_rank(cfg: TrainConfig, out: Path) -> None:
    """The entry point under torchrun: same trainer, environment rendezvous."""
    from pyg_mgpu.train.trainer import run_training

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    use_cuda = torch.cuda.is_available() and cfg.devices != "cpu"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if cfg.recipe == "pyg_mgpu":  # the pyg recipe is a baseline: left as PyG's example runs
        tune_cpu_allocator()
    set_thread_budget(local_world)
    with process_group(rank, world_size, device, init_method="env://",
                       timeout_s=cfg.timeout_s, local_rank=local_rank) as ctx:
        start = time.perf_counter()
        graph = load_graph_once_per_node(cfg, ctx)
        check_shardable(graph.train_idx.numel(), world_size, cfg.batch_size)
        if ctx.is_main:
            print(f"{graph.summary()} | {world_size} rank(s) under torchrun on {device.type}",
                  flush=True)
        run_training(ctx, graph, cfg, str(out),
                     {"load_time_s": time.perf_counter() - start, "launcher": "torchrun"})
    if rank == 0:
        from pyg_mgpu.tools.report import plot_run
        plot_run(out)
