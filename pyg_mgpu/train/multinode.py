"""Running as one rank of a ``torchrun`` job (one or many machines).

torchrun starts every process itself, so there is no parent to load the graph for its ranks.
Instead, local rank 0 of each machine loads the dataset once (into the graph cache, or with
``--no-cache`` into a ``/dev/shm`` file unlinked as soon as everyone has mapped it); every rank on
that machine (itself included) then memory-maps those files, so a machine holds one copy of the
graph however many ranks it runs.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.hetero_graph import HeteroGraph
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed.process_group import torchrun_process_group
from pyg_mgpu.train.checkpoint import save_torch
from pyg_mgpu.train.config import TrainConfig, flag_of
from pyg_mgpu.train.dataset import load_checked, load_configured, run_header
from pyg_mgpu.train.loop import fewest_and_most
from pyg_mgpu.train.run_folder import RunFolderError, claim_run_folder, start_afresh


def _shm_path() -> Path:
    job = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    node = os.environ.get("GROUP_RANK", "0")
    port = os.environ.get("MASTER_PORT", "0")
    return Path("/dev/shm") / f"pyg_mgpu-{job}-{port}-node{node}.pt"


def load_graph_once_per_node(cfg: TrainConfig, ctx: RankContext) -> ConvertedGraph | HeteroGraph:
    """Local rank 0 loads the graph once; every local rank then maps one copy of it.

    With the graph cache (the default), local rank 0 converts or checks it and every rank maps
    the cache files, sharing their pages through the page cache. With ``--no-cache``, local
    rank 0 writes the graph to a ``/dev/shm`` file that every rank maps. A heterogeneous graph
    is read by every rank.
    """
    # Local rank 0 first: it writes the cache (or OGB's processed files) the others then read.
    # A heterogeneous graph bypasses the cache (placement does not apply): a copy per rank.
    if cfg.is_hetero or not cfg.data.no_cache:
        graph = load_configured(cfg, placement="mmap") if ctx.local_rank == 0 else None
        dist.barrier()
        return graph or load_configured(cfg, placement="mmap")
    path = _shm_path()
    if ctx.local_rank == 0:
        graph = load_configured(cfg)
        save_torch(graph.tensors() | {"name": graph.name, "num_classes": graph.num_classes},
                   path)
        del graph
    dist.barrier()
    try:
        state = torch.load(path, mmap=True, weights_only=True)
    finally:
        try:
            dist.barrier()  # everyone has mapped it: the name can go, the pages stay mapped
        finally:  # also when a peer failed: the file would hold a graph's worth of memory
            if ctx.local_rank == 0:
                path.unlink(missing_ok=True)
    return ConvertedGraph(**state)


# Settings each node's command may give for itself: where its files are, which of its devices
# run and how, and what only rank 0 acts on. Every other setting shapes the training that all
# ranks share, and must be the same on every node.
NODE_LOCAL_SETTINGS = ("root", "cache_dir", "no_cache", "features_on", "devices", "nprocs",
                       "timeout_s", "graph_on", "feature_cache_gb", "num_workers", "prefetch",
                       "profile", "trace_steps", "out", "overwrite", "resume", "debug",
                       "grace_s", "checkpoint_every_s", "recipe_sources")


def shared_settings(cfg: TrainConfig) -> dict:
    """The settings every node's command must give alike (all but :data:`NODE_LOCAL_SETTINGS`),
    each as the training reads it: ``--sampler auto`` is ``native``, and any ``.npz`` path
    names the same dataset (each node may keep its copy elsewhere)."""
    shared = {name: value for name, value in cfg.flat().items()
              if name not in NODE_LOCAL_SETTINGS}
    if shared["dataset"].endswith(".npz"):
        shared["dataset"] = "a .npz file"
    if shared["sampler"] == "auto":
        shared["sampler"] = "native"
    return shared


def check_same_command(cfg: TrainConfig, ctx: RankContext) -> None:
    """Every node was given the settings rank 0 was (:func:`shared_settings`). Nodes started
    with, say, other ``--epochs`` would otherwise fail in a collective much later, or wait
    there until the timeout. Every rank learns whether any differs, so all of them stop
    here."""
    mine = shared_settings(cfg)
    main = [mine if ctx.is_main else None]
    dist.broadcast_object_list(main, src=0)
    main = main[0]
    differs = next((name for name in mine if mine[name] != main[name]), None)
    _, most = fewest_and_most(int(differs is not None), ctx)
    if differs is not None:
        raise ValueError(f"{flag_of(differs)} is {mine[differs]!r} on this node and "
                         f"{main[differs]!r} on rank 0's: give every node the same command "
                         "(only where its files are and which devices it uses may differ).")
    if most:
        raise ValueError("another node was started with other settings than rank 0's (its "
                         "error line names the flag): give every node the same command.")


def check_same_resume(cfg: TrainConfig, ctx: RankContext) -> None:
    """Every rank decided alike whether to resume (``--resume auto`` looks for ``--out``'s
    checkpoint in each process, before the process group exists)."""
    fewest, most = fewest_and_most(int(bool(cfg.faults.resume)), ctx)
    if fewest != most:
        raise ValueError(f"--resume: some ranks found a checkpoint in {cfg.outputs.out} "
                         "and others did not; give --out a folder every machine sees (a shared "
                         "filesystem).")


def claim_on_rank0(cfg: TrainConfig, ctx: RankContext, make_out: Callable[[], Path],
                   claims: contextlib.ExitStack) -> Path:
    """The job's output folder, made and claimed (:func:`claim_run_folder`) by rank 0 alone,
    for as long as ``claims`` is open; every other rank learns where it is, or why the job
    cannot start there, so none is left waiting for a rank that gave up.

    Raises:
        ValueError: on every rank, where rank 0 refused the folder (another run holds it, or
            it holds a checkpoint this run would replace).
    """
    answer: list = [None, None]  # the folder, or the reason it was refused
    refused: Optional[Exception] = None
    if ctx.is_main:
        try:
            out = make_out()
            claims.enter_context(claim_run_folder(out, resume=cfg.faults.resume,
                                                  overwrite=cfg.outputs.overwrite))
            answer[0] = str(out)
        except (ValueError, OSError) as e:
            refused, answer[1] = e, str(e)
    dist.broadcast_object_list(answer, src=0)
    if refused is not None:
        raise refused
    if answer[1] is not None:
        raise RunFolderError(answer[1])
    return Path(answer[0])


def run_torchrun_rank(cfg: TrainConfig, make_out: Callable[[], Path], device: torch.device,
                      resumed: Optional[dict] = None) -> Path:
    """The entry point under torchrun: the job's launch sequence (:mod:`pyg_mgpu.train.job`)
    as one rank, with environment rendezvous. ``make_out``: makes the output folder (rank 0
    calls it); ``device``: this rank's, resolved; ``resumed``: the checkpoint ``--resume``
    names, whose data this run's must be. Returns the output folder."""
    from pyg_mgpu.train.trainer import run_training

    # The pyg recipe is a baseline: its allocator is left as PyG's example runs it.
    with contextlib.ExitStack() as claims:  # rank 0's claim lasts until its plots are written
        with torchrun_process_group(device, timeout_s=cfg.ranks.timeout_s,
                                    tune_allocator=cfg.model.recipe == "pyg_mgpu",
                                    backend=cfg.ranks.backend,
                                    grace_s=cfg.faults.grace_s) as ctx:
            check_same_command(cfg, ctx)
            check_same_resume(cfg, ctx)
            out = claim_on_rank0(cfg, ctx, make_out, claims)
            cfg.outputs.out = str(out)  # the folder chosen is the one recorded
            start = time.perf_counter()
            graph, fingerprint = load_checked(cfg, ctx.world_size, resumed,
                                              lambda cfg: load_graph_once_per_node(cfg, ctx))
            load_s = time.perf_counter() - start
            if ctx.is_main:
                print(run_header(graph, cfg, load_s, f"{ctx.world_size} rank(s) under torchrun "
                                 f"on {ctx.device.type}"), flush=True)
                start_afresh(out, resume=cfg.faults.resume, overwrite=cfg.outputs.overwrite)
            run_training(ctx, graph, cfg, str(out), {"load_time_s": load_s,
                                                     "launcher": "torchrun",
                                                     "data_fingerprint": fingerprint})
        if ctx.is_main:
            from pyg_mgpu.train.plots import plot_completed_run
            plot_completed_run(out)
    return out
