"""Multi-GPU / multi-CPU-rank GNN training: ``python -m pyg_mgpu.distributed_sampling``.

The command: its flags, made from the run's settings, become a
:class:`~pyg_mgpu.train.config.TrainConfig`, and :func:`pyg_mgpu.train.job.run` runs it (the
parent loads the dataset once into shared memory, then starts one rank per device, or the
process runs as one rank of a ``torchrun`` job). Mistakes in the input end with a one-line
error and exit code 2; a failed rank ends the job with exit code 1 and names the rank.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.distributed.host import exit_without_teardown
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    return stopped_at_start_is_one_line(_main, argv)


def _main(argv: Optional[Sequence[str]]) -> int:
    # --help, a refused flag and a refused setting never wait for torch's import
    args = build_parser().parse_args(argv)
    from pyg_mgpu.train.config import ConfigError, TrainConfig

    debug = args.debug
    try:
        cfg = TrainConfig.from_flags(**vars(args))
    except (ConfigError, ValueError) as e:
        return _refused(e, debug)
    from pyg_mgpu.distributed.context import JobStopped, RankFailed
    from pyg_mgpu.distributed.stop import StopSignal, stopped_exit_code
    from pyg_mgpu.distributed.watch import StoppedBeforeRanks
    from pyg_mgpu.train.job import run

    try:
        run(cfg)
    except (ConfigError, ValueError, OSError) as e:
        return _refused(e, debug)
    except StoppedBeforeRanks as e:  # nothing trained: no checkpoint to name
        print(f"\nerror: {e}", file=sys.stderr)
        return stopped_exit_code(e.signum)
    except (JobStopped, StopSignal) as e:  # StopSignal: this process is a torchrun rank
        if not isinstance(e, StopSignal) or int(os.environ.get("RANK", 0)) == 0:
            # A new line: a rank's progress bar may have been cut off mid-line.
            print(f"\nerror: {e}; {_checkpoint_note(cfg)}", file=sys.stderr)
        return stopped_exit_code(e.signum)
    except KeyboardInterrupt:
        raise  # main() reports it
    except Exception as e:
        if debug:
            traceback.print_exc()
        elif isinstance(e, RankFailed):  # it carries the rank's traceback already
            print(f"\nerror: {e}", file=sys.stderr)
        elif not _out_of_memory(e):
            traceback.print_exc()
        else:  # the launcher's own allocation, loading or converting the graph
            sys.stderr.write(f"error: out of memory before any rank started, loading the graph "
                             f"({_last_line(e)}); choose a smaller graph (--num-nodes, "
                             "--num-edges, --num-features), or run where more memory is free.\n")
        return 1
    return 0


def _out_of_memory(error: Exception) -> bool:
    """Whether an allocation of the launcher's own failed (torch's CPU allocator raises a
    ``RuntimeError`` saying so; a rank's failure arrives as ``RankFailed``)."""
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error)


def _last_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


def _refused(error: Exception, debug: bool) -> int:
    """Reports bad input (a setting, a dataset, an unwritable folder) in one line: exit 2."""
    from pyg_mgpu.train.config import in_flags

    if debug:
        traceback.print_exc()
    # One write: torchrun's ranks share the launcher's stderr, and each may refuse at once.
    sys.stderr.write(f"error: {in_flags(error)}\n")
    return 2


def _checkpoint_note(cfg) -> str:
    """Where a stopped run's checkpoint is and how to continue from it, in one clause."""
    from pyg_mgpu.train.checkpoint import CHECKPOINT, describe

    # cfg.outputs.out is set once the folder was chosen, before any rank ran; a folder made for
    # the run is removed again where nothing was written.
    if cfg is None or not cfg.outputs.out or not Path(cfg.outputs.out).is_dir():
        return "no checkpoint (the job stopped before writing one)"
    run_dir = Path(cfg.outputs.out)
    path = run_dir / CHECKPOINT
    try:
        import torch
        ckpt = torch.load(path, weights_only=False, mmap=True, map_location="cpu")
    except Exception:  # none yet (stopped in its first epoch), or unreadable
        return f"no checkpoint in {run_dir} (the job stopped before writing one)"
    return (f"checkpoint {path} ({describe(ckpt)}); continue with the same command and "
            f"--resume {run_dir}")


if __name__ == "__main__":
    exit_without_teardown(main())
