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
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch

from pyg_mgpu.distributed.devices import (RANKS_PER_CORE_LIMIT, launched_by_torchrun,
                                          resolve_devices, torchrun_device)
from pyg_mgpu.files import cannot_write, check_writable
from pyg_mgpu.sampling.sampler_choice import resolve_sampler
from pyg_mgpu.train.checkpoint import CHECKPOINT, check_resumable, check_resume_names_a_folder
from pyg_mgpu.train.config import ConfigError, TrainConfig
from pyg_mgpu.train.dataset import load_checked, run_header

if TYPE_CHECKING:
    from pyg_mgpu.distributed.watch import LauncherSignals


def make_out_dir(out: Optional[str]) -> Path:
    """``--out``, created and checked writable; without it a new ``runs/<timestamp>`` (with a
    suffix when a run started in the same second has it)."""
    return _make_out_dir(out, made=[])


def _make_out_dir(out: Optional[str], made: list[Path]) -> Path:
    """:func:`make_out_dir`, appending to ``made`` each folder this call's own ``mkdir``
    created, parents first (another run may create the same folders at once: only one
    ``mkdir`` succeeds), as it creates it: an interruption leaves none unlisted."""
    path = Path(out) if out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        if out:
            _make_folders(path, made)
        else:
            path = _new_folder(path)
            made.append(path)
        check_writable(path)
    except OSError as e:
        raise ConfigError(cannot_write(path, e))
    return path


def _make_folders(path: Path, made: list[Path]) -> None:
    """``mkdir -p path``, one folder at a time, each one created here listed in ``made``; an
    ``OSError`` as ``mkdir`` has it (a file in the way: ``FileExistsError`` or
    ``NotADirectoryError``)."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing or [path]):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue
        made.append(folder)


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
    returns the output folder.

    Raises:
        StoppedBeforeRanks: a stop signal came before any rank started (see
            :class:`~pyg_mgpu.distributed.watch.LauncherSignals`).
        JobStopped: a stop signal ended the ranks before they finished.
        RankFailed: a rank failed.
    """
    resolve_sampler(cfg.training.sampler)
    check_resume_names_a_folder(cfg.faults.resume)
    cfg.data.make_paths_absolute()  # as recorded: predict may start in another folder
    if cfg.faults.resume == "auto":  # a restarted job continues; a first start starts afresh
        restarted = (Path(cfg.outputs.out) / CHECKPOINT).is_file()
        cfg.faults.resume = cfg.outputs.out if restarted else None
    if launched_by_torchrun():  # rank 0 makes and claims the folder, in the process group
        return _start(cfg, None)
    from pyg_mgpu.distributed.watch import LauncherSignals, report_completed
    from pyg_mgpu.train.run_folder import claim_run_folder, remove_if_unclaimed

    # Stop signals are handled from before the folder is made until the figures are drawn.
    # Before the ranks start, one raises here, so that the cleanup below runs and the graph's
    # /dev/shm copy is deleted (by its finalizer) rather than left by a killed process; while
    # they run it is theirs (launch_local); after they ended the run is complete, and it is
    # only reported.
    made: list[Path] = []  # the folders made for this run, removed again where left empty
    with LauncherSignals(cfg.faults.grace_s, raising=True) as signals:
        try:
            out = _make_out_dir(cfg.outputs.out or cfg.faults.resume, made)
            cfg.outputs.out = str(out)  # the folder chosen is the one recorded
            with claim_run_folder(out, resume=cfg.faults.resume,
                                  overwrite=cfg.outputs.overwrite):
                _start(cfg, out, signals)
                _draw_figures(out)
        except BaseException:  # refused, stopped or failed: no empty folder of its own left
            for folder in reversed(made):  # the run folder (its lock no longer held), parents
                remove_if_unclaimed(folder)
            raise
        late = signals.after_ranks()
        if late:  # it came while the figures were drawn: nothing was left to stop
            report_completed(late)
    return out


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


def _start(cfg: TrainConfig, out: Optional[Path],
           signals: Optional[LauncherSignals] = None) -> Path:
    """The run in a claimed ``out``; under torchrun (``out`` None) as one rank of the job.
    ``signals``: the launcher's handlers, kept after its ranks end."""
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
                 skip_teardown=True, signals=signals)
    return out


def _draw_figures(out: Path) -> None:
    """The run's figures, once its ranks have written ``metrics.json``."""
    # matplotlib: 0.5 s the ranks need not wait for
    from pyg_mgpu.train.plots import plot_completed_run

    plot_completed_run(out)
