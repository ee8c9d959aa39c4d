"""``python -m pyg_mgpu.compare_dgl``: the main command's flags plus the comparison's own; the
comparison itself is :mod:`pyg_mgpu.tools.compare_dgl`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.distributed.host import exit_without_teardown
from pyg_mgpu.distributed_sampling import build_parser as build_train_parser
from pyg_mgpu.tools.compare_dgl import (DEFAULT_TOLERANCE, EXIT_ACCURACY_GAP, EXIT_BAD_INPUT,
                                        EXIT_SIDE_FAILED, FIXED_FLAGS, CompareError,
                                        CompareOptions, SideFailed, run)
from pyg_mgpu.train.config import ConfigError, TrainConfig, in_flags
from pyg_mgpu.train.metrics import RunError

_OWN = ("dgl_python", "dgl_sampler", "tolerance", "repeats", "side_timeout", "compare_only")


def build_parser() -> argparse.ArgumentParser:
    """The main command's flags, plus the comparison's own."""
    p = build_train_parser(
        prog="python -m pyg_mgpu.compare_dgl",
        description="Train with pyg_mgpu and with DGL's recipe on the same data and settings; "
                    "print and write a side-by-side table. Exit 1: a side failed; 2: bad "
                    "input; 3: test accuracies differ by more than --tolerance.",
        out_help="folder for comparison.md/.json, the exported dataset and both sides' runs "
                 "(default: runs/compare-dgl-<timestamp>)")
    g = p.add_argument_group("comparison with DGL")
    g.add_argument("--dgl-python", default=None,
                   help="python of the DGL environment (default: the one benchmarks/dgl_env.sh "
                        "builds or reuses under ~/.cache/pyg_mgpu/dgl-env)")
    g.add_argument("--dgl-sampler", choices=["dataloader", "graphbolt"], default="dataloader",
                   help="DGL side: DataLoader(use_ddp=True) or GraphBolt's "
                        "DistributedItemSampler")
    g.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="largest accepted absolute gap between the sides' test accuracies "
                        "(means over the seeds)")
    g.add_argument("--repeats", type=int, default=1,
                   help="train each side with seeds --seed, --seed+1, ... (the dataset stays "
                        "the one --seed makes) and compare the means")
    g.add_argument("--side-timeout", type=float, default=3600.0,
                   help="seconds one training run may take before it counts as failed")
    g.add_argument("--compare-only", nargs=2, type=Path, metavar=("PYG_DIR", "DGL_DIR"),
                   help="skip training: compare two existing run folders")
    return p


def _split_args(args: argparse.Namespace) -> tuple[TrainConfig, CompareOptions]:
    train = {k: v for k, v in vars(args).items() if k not in _OWN}
    opts = CompareOptions(**{k: v for k, v in vars(args).items() if k in _OWN})
    if opts.tolerance < 0:
        raise CompareError(f"--tolerance must be >= 0 (an absolute accuracy gap), got "
                           f"{opts.tolerance}.")
    if opts.repeats < 1:
        raise CompareError(f"--repeats must be a positive integer, got {opts.repeats}.")
    if opts.side_timeout <= 0:
        raise CompareError(f"--side-timeout must be positive seconds, got {opts.side_timeout}.")
    for key, value in FIXED_FLAGS.items():
        if train[key] != value:
            flag = "--" + key.replace("_", "-")
            raise CompareError(f"{flag} {train[key]}: the comparison starts a fresh run and, as "
                               "DGL's recipe does, validates on rank 0 after every epoch with "
                               f"the training batch size; drop {flag}.")
    weight_decay = train.get("weight_decay")  # absent: the sage recipe's 0
    if train["model"] != "sage" or weight_decay not in (None, 0):
        raise CompareError("the DGL variant trains GraphSAGE with plain Adam: drop --model "
                           f"{train['model']} / --weight-decay {weight_decay or 0}, or "
                           "compare other models without DGL (python -m pyg_mgpu.report).")
    cfg = TrainConfig.from_flags(**train)
    if cfg.is_hetero:
        raise CompareError(f"--dataset {cfg.data.dataset} is heterogeneous; the DGL variant trains "
                           "homogeneous GraphSAGE. Compare heterogeneous runs with each other "
                           "(python -m pyg_mgpu.report RUN_DIR ...).")
    return cfg, opts


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg, opts = _split_args(args)
        _, verdict = run(cfg, opts)
    except (CompareError, ConfigError, RunError, ValueError) as e:
        print(f"error: {in_flags(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SideFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_SIDE_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0 if verdict.passed else EXIT_ACCURACY_GAP


if __name__ == "__main__":
    exit_without_teardown(main())
