"""A training job from its config to its output folder: one launch sequence, for the ranks a
job spawns and for a rank of a ``torchrun`` job.

Both take the same steps: the output folder made and claimed, the devices resolved and their
warnings printed, a resume checked, the graph loaded once and checked
(:func:`~pyg_mgpu.train.dataset.load_checked`), the run's header, :func:`~pyg_mgpu.train.trainer.run_training` on every
rank, and the plots. They differ in who takes which step: a spawned job's parent loads and
shares the graph and starts the ranks; under torchrun every process is a rank, rank 0 claims
the folder and local rank 0 loads the graph for its machine (:mod:`pyg_mgpu.train.multinode`).
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

from pyg_mgpu.distributed.devices import (RANKS_PER_CORE_LIMIT, launched_by_torchrun,
                                          resolve_devices, torchrun_device)
from pyg_mgpu.files import cannot_write, check_writable
from pyg_mgpu.sampling.sampler_choice import resolve_sampler
from pyg_mgpu.train.checkpoint import CHECKPOINT, check_resumable, check_resume_names_a_folder
from pyg_mgpu.train.config import ConfigError, TrainConfig
from pyg_mgpu.train.dataset import load_checked, run_header


def make_out_dir(out: Optional[str]) -> Path:
    """``--out``, created and checked writable; without it a new ``runs/<timestamp>`` (with a
    suffix when a run started in the same second has it)."""
    return _make_out_dir(out)[0]


def _make_out_dir(out: Optional[str]) -> tuple[Path, bool]:
    """:func:`make_out_dir`, and whether this call's own ``mkdir`` created the folder (another
    run may create the same ``--out`` at once: only one ``mkdir`` succeeds)."""
    path = Path(out) if out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        if out:
            try:
                path.mkdir(parents=True)
                created = True
            except FileExistsError:
                if not path.is_dir():
                    raise
                created = False
        else:
            path, created = _new_folder(path), True
        check_writable(path)
    except OSError as e:
        raise ConfigError(cannot_write(path, e))
    return path, created


def _new_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ...: the first that did not exist, created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "a thousand runs started this second", str(path))


def run(cfg: TrainConfig) -> Path:
    """Loads the data once, shares it, starts the ranks (or, under torchrun, runs as one);
    returns the output folder."""
    resolve_sampler(cfg.training.sampler)
    check_resume_names_a_folder(cfg.faults.resume)
    cfg.data.make_paths_absolute()  # as recorded: predict may start in another folder
    if cfg.faults.resume == "auto":  # a restarted job continues; a first start starts afresh
        restarted = (Path(cfg.outputs.out) / CHECKPOINT).is_file()
        cfg.faults.resume = cfg.outputs.out if restarted else None
    if launched_by_torchrun():  # rank 0 makes and claims the folder, in the process group
        return _start(cfg, None)
    from pyg_mgpu.train.run_folder import claim_run_folder

    out, created = _make_out_dir(cfg.outputs.out or cfg.faults.resume)
    cfg.outputs.out = str(out)  # the folder chosen is the one recorded
    with claim_run_folder(out, resume=cfg.faults.resume, overwrite=cfg.outputs.overwrite):
        try:
            return _start(cfg, out)
        except BaseException:  # refused, stopped or failed: no empty run folder left behind
            if created:
                _remove_if_unused(out)  # under the lock: no other run holds it
            raise


def _remove_if_unused(out: Path) -> None:
    """Deletes ``out`` if nothing but the run's lock is in it. Called while an error is on its
    way to the user: a folder it cannot read is left as it is, and that error goes on."""
    from pyg_mgpu.train.run_folder import LOCK

    try:
        unused = {p.name for p in out.iterdir()} <= {LOCK}
    except OSError:
        return
    if unused:
        shutil.rmtree(out, ignore_errors=True)


def _resolve_devices(cfg: TrainConfig, torchrun: bool) -> list[torch.device]:
    """The ranks' devices (under torchrun: this rank's), their notices printed once."""
    with warnings.catch_warnings(record=True) as notices:  # one line each, as errors are
        warnings.simplefilter("always")
        devices = ([torchrun_device(cfg.ranks.devices, int(os.environ.get("LOCAL_RANK", 0)),
                                    cfg.ranks.backend)] if torchrun else
                   resolve_devices(cfg.ranks.devices, cfg.ranks.nprocs, cfg.ranks.backend,
                                   max_per_core=RANKS_PER_CORE_LIMIT))
    if int(os.environ.get("RANK", 0)) == 0:  # a torchrun job's ranks would each say it
        for notice in [str(n.message) for n in notices] + cfg.ignored_flags(devices[0].type):
            print(f"warning: {notice}", file=sys.stderr)
    return devices


def _train_rank(ctx, *args) -> None:
    """:func:`~pyg_mgpu.train.trainer.run_training`, imported in the rank that runs it: the
    training stack brings PyG, which the parent of a synthetic, ``.npz`` or cached graph never
    needs (it would load it for 2.3 s before the ranks start, 2026-12-02, 2 cores)."""
    from pyg_mgpu.train.trainer import run_training

    run_training(ctx, *args)


def _start(cfg: TrainConfig, out: Optional[Path]) -> Path:
    """The run in a claimed ``out``; under torchrun (``out`` None) as one rank of the job."""
    from pyg_mgpu.distributed.host import release_free_heap, usable_cores
    from pyg_mgpu.distributed.launch import launch_local
    from pyg_mgpu.train.run_folder import start_afresh

    torchrun = launched_by_torchrun()
    devices = _resolve_devices(cfg, torchrun)
    world_size = int(os.environ["WORLD_SIZE"]) if torchrun else len(devices)
    resumed = check_resumable(cfg, world_size) if cfg.faults.resume else None
    if torchrun:
        from pyg_mgpu.train.multinode import run_torchrun_rank
        return run_torchrun_rank(cfg, lambda: make_out_dir(cfg.outputs.out or cfg.faults.resume),
                                 devices[0], resumed)
    start = time.perf_counter()
    graph, fingerprint = load_checked(cfg, world_size, resumed)
    graph.share_memory_()
    load_s = time.perf_counter() - start
    print(run_header(graph, cfg, load_s, f"{world_size} rank(s) on {devices[0].type} | "
                     f"threads/rank {max(1, usable_cores() // world_size)}"), flush=True)
    release_free_heap()
    start_afresh(out, resume=cfg.faults.resume, overwrite=cfg.outputs.overwrite)
    # On the ranks resolved above (spawn would resolve them again); the graph is shared already.
    # PyG's recipe is the baseline: it runs as PyG's example would, on an untuned allocator.
    launch_local(_train_rank, devices,
                 args=(graph, cfg, str(out), {"load_time_s": load_s,
                                              "data_fingerprint": fingerprint}),
                 timeout_s=cfg.ranks.timeout_s, backend=cfg.ranks.backend,
                 grace_s=cfg.faults.grace_s, tune_allocator=cfg.model.recipe == "pyg_mgpu",
                 skip_teardown=True)
    from pyg_mgpu.train.plots import plot_run  # matplotlib: 0.5 s the ranks need not wait for

    plot_run(out)
    return out
