"""Multi-GPU / multi-CPU-rank GNN training: ``python -m pyg_mgpu.distributed_sampling``.

The parent loads the dataset once into shared memory, then starts one rank per device (or runs
as one rank of a ``torchrun`` job). Mistakes in the input end with a one-line error and exit
code 2; a failed rank ends the job with exit code 1 and names the rank.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.tools.cli import Parser, add_setting_flags, stopped_at_start_is_one_line

# torch, PyG and the rest of the package are imported inside the functions, under main()'s
# handling of Ctrl-C: loading them takes seconds, and a Ctrl-C then is a stop like any other.


_DESCRIPTION = ("Train a GNN (GraphSAGE, or PyG's GCN, GAT, GIN; R-GCN on heterogeneous graphs: "
                "--model) with neighbour sampling on every GPU (or N CPU ranks).")


def build_parser(prog: str = "python -m pyg_mgpu.distributed_sampling",
                 description: str = _DESCRIPTION,
                 out_help: Optional[str] = None) -> argparse.ArgumentParser:
    """The CLI's parser: a flag per setting of :class:`~pyg_mgpu.train.config.TrainConfig`,
    grouped by topic (the docs' CLI reference is built from it). Other commands that take the
    same flags (``python -m pyg_mgpu.compare_dgl``) name themselves and their output folder."""
    from pyg_mgpu.train.config import TrainConfig

    parser = Parser(prog=prog, description=description)
    add_setting_flags(parser, TrainConfig, helps={"out": out_help} if out_help else None)
    return parser


def make_out_dir(out: Optional[str]) -> Path:
    """``--out``, created and checked writable; without it a new ``runs/<timestamp>`` (with a
    suffix when a run started in the same second has it)."""
    from pyg_mgpu.train.config import ConfigError

    path = Path(out) if out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        if out:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path = _new_folder(path)
        probe = path / f".write-test-{os.getpid()}"  # by pid: never another process's
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--out {path}: cannot write there ({e.strerror}); choose a "
                          "writable folder.")
    return path


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


def run(cfg) -> Path:
    """Loads the data once, shares it, starts the ranks; returns the output folder.

    ``cfg``: a :class:`~pyg_mgpu.train.config.TrainConfig`.
    """
    from pyg_mgpu.distributed.devices import launched_by_torchrun
    from pyg_mgpu.train.checkpoint import CHECKPOINT, check_resume_names_a_folder
    from pyg_mgpu.train.loaders import resolve_sampler

    resolve_sampler(cfg.training.sampler)
    check_resume_names_a_folder(cfg.faults.resume)
    if cfg.faults.resume == "auto":  # a restarted job continues; a first start starts afresh
        cfg.faults.resume = cfg.outputs.out if (Path(cfg.outputs.out) / CHECKPOINT).is_file() \
            else None
    if launched_by_torchrun():  # rank 0 makes and claims the folder, in the process group
        return _start(cfg, None)
    from pyg_mgpu.train.run_folder import claim_run_folder

    out = make_out_dir(cfg.outputs.out or cfg.faults.resume)
    cfg.outputs.out = str(out)  # the folder chosen is the one recorded
    with claim_run_folder(out, resume=cfg.faults.resume, overwrite=cfg.outputs.overwrite):
        return _start(cfg, out)


def _start(cfg, out: Optional[Path]) -> Path:
    """The run in a claimed ``out``; under torchrun (``out`` None) as one rank of the job."""
    from pyg_mgpu.data.fingerprint import data_fingerprint
    from pyg_mgpu.distributed.devices import (RANKS_PER_CORE_LIMIT, launched_by_torchrun,
                                              resolve_devices, torchrun_device)
    from pyg_mgpu.distributed.host import release_free_heap, usable_cores
    from pyg_mgpu.distributed.launch import launch_local
    from pyg_mgpu.sampling.sharding import check_shardable
    from pyg_mgpu.train.checkpoint import check_resumable, check_same_data
    from pyg_mgpu.train.dataset import load_configured

    torchrun = launched_by_torchrun()
    with warnings.catch_warnings(record=True) as notices:  # one line each, as errors are
        warnings.simplefilter("always")
        devices = ([torchrun_device(cfg.ranks.devices, int(os.environ.get("LOCAL_RANK", 0)),
                                    cfg.ranks.backend)] if torchrun else
                   resolve_devices(cfg.ranks.devices, cfg.ranks.nprocs, cfg.ranks.backend,
                                   max_per_core=RANKS_PER_CORE_LIMIT))
    if int(os.environ.get("RANK", 0)) == 0:  # a torchrun job's ranks would each say it
        for notice in [str(n.message) for n in notices] + cfg.ignored_flags(devices[0].type):
            print(f"warning: {notice}", file=sys.stderr)
    resumed = (check_resumable(cfg, int(os.environ["WORLD_SIZE"]) if torchrun else len(devices))
               if cfg.faults.resume else None)
    if torchrun:
        from pyg_mgpu.train.multinode import run_torchrun_rank
        return run_torchrun_rank(cfg, lambda: make_out_dir(cfg.outputs.out or cfg.faults.resume),
                                 resumed)
    start = time.perf_counter()
    graph = load_configured(cfg)
    check_shardable(graph.train_idx.numel(), len(devices), cfg.training.batch_size)
    fingerprint = data_fingerprint(graph.tensors())
    if resumed is not None:
        check_same_data(resumed, fingerprint, cfg.faults.resume, graph.tensors())
    graph.share_memory_()
    load_s = time.perf_counter() - start
    print(f"{graph.summary()} | loaded in {load_s:.1f}s | {len(devices)} rank(s) on "
          f"{devices[0].type} | threads/rank {max(1, usable_cores() // len(devices))}\n"
          f"{cfg.recipe_summary()}", flush=True)
    release_free_heap()
    from pyg_mgpu.train.trainer import run_training
    # On the ranks resolved above (spawn would resolve them again); the graph is shared already.
    # PyG's recipe is the baseline: it runs as PyG's example would, on an untuned allocator.
    launch_local(run_training, devices,
                 args=(graph, cfg, str(out), {"load_time_s": load_s,
                                              "data_fingerprint": fingerprint}),
                 timeout_s=cfg.ranks.timeout_s, backend=cfg.ranks.backend,
                 grace_s=cfg.faults.grace_s, tune_allocator=cfg.model.recipe == "pyg_mgpu")
    from pyg_mgpu.train.plots import plot_run
    plot_run(out)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    return stopped_at_start_is_one_line(_main, argv)


def _main(argv: Optional[Sequence[str]]) -> int:
    from pyg_mgpu.distributed.context import JobStopped, RankFailed
    from pyg_mgpu.distributed.stop import StopSignal, stopped_exit_code
    from pyg_mgpu.train.config import ConfigError, TrainConfig, in_flags

    args = build_parser().parse_args(argv)
    debug = args.debug
    cfg = None
    try:
        cfg = TrainConfig.from_flags(**vars(args))
        run(cfg)
    except (ConfigError, ValueError, OSError) as e:
        if debug:
            traceback.print_exc()
        # One write: torchrun's ranks share the launcher's stderr, and each may refuse at once.
        sys.stderr.write(f"error: {in_flags(e)}\n")
        return 2
    except (JobStopped, StopSignal) as e:  # StopSignal: this process is a torchrun rank
        if not isinstance(e, StopSignal) or int(os.environ.get("RANK", 0)) == 0:
            # A new line: a rank's progress bar may have been cut off mid-line.
            print(f"\nerror: {e}; {_checkpoint_note(cfg)}", file=sys.stderr)
        return stopped_exit_code(e.signum)
    except KeyboardInterrupt:
        raise  # main() reports it
    except Exception as e:  # a rank failed: RankFailed carries its traceback already
        if debug or not isinstance(e, RankFailed):
            traceback.print_exc()
        else:
            print(f"\nerror: {e}", file=sys.stderr)
        return 1
    return 0


def _checkpoint_note(cfg) -> str:
    """Where a stopped run's checkpoint is and how to continue from it, in one clause."""
    from pyg_mgpu.train.checkpoint import CHECKPOINT, describe

    if cfg is None or not cfg.outputs.out:  # stopped before the folder was chosen
        return "no checkpoint (the job stopped before writing one)"
    run_dir = Path(cfg.outputs.out)  # set once the folder was chosen, before any rank ran
    path = run_dir / CHECKPOINT
    try:
        import torch
        ckpt = torch.load(path, weights_only=False, mmap=True, map_location="cpu")
    except Exception:  # none yet (stopped in its first epoch), or unreadable
        return f"no checkpoint in {run_dir} (the job stopped before writing one)"
    return f"checkpoint {path} ({describe(ckpt)}); continue with --resume {run_dir}"


if __name__ == "__main__":
    sys.exit(main())
