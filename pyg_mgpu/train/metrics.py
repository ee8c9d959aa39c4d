"""What a run reports: ``metrics.json`` and ``history.csv`` (rank 0), and the job's memory; and
``metrics.json`` read back (:func:`load_metrics`) by the plots, reports and comparisons."""
from __future__ import annotations

import csv
import io
import json
import resource
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

from pyg_mgpu.files import save_json, save_text

HISTORY_FIELDS = ("epoch", "train_loss", "train_acc", "val_acc", "epoch_time_s", "eval_time_s")


def peak_mem_mb(ctx) -> float:
    """Sum over ranks of each rank's peak resident memory (shared pages count in every rank).

    A collective: every rank must call it.
    """
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total = torch.tensor([kb / 1024.0], dtype=torch.float64,
                         device=ctx.collective_device)
    dist.all_reduce(total)
    return float(total[0])


def total_stage_times(history: list[dict]) -> dict:
    totals: dict = defaultdict(float)
    for record in history:
        for stage, seconds in record["stage_times_s"].items():
            totals[stage] += seconds
    return dict(totals)


def write_outputs(metrics: dict, out: Path) -> None:
    save_json(metrics, out / "metrics.json")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HISTORY_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(metrics["epochs"])
    save_text(buf.getvalue(), out / "history.csv")


RUN_HINT = "pass a folder written by `python -m pyg_mgpu.distributed_sampling --out DIR`"


class RunError(ValueError):
    """A folder given as a run is missing, incomplete or unreadable."""


def load_metrics(run_dir: Path) -> dict:
    """Reads and sanity-checks ``run_dir/metrics.json``.

    Args:
        run_dir: A run folder.

    Returns:
        The metrics dict, with a non-empty ``epochs`` list.

    Raises:
        RunError: The folder or file is missing, or the file is not a run's metrics.
    """
    run_dir = Path(run_dir)
    path = run_dir / "metrics.json"
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: " + ("a file, not a run folder" if run_dir.exists() else
                                         "no such folder") + f"; {RUN_HINT}")
    if not path.is_file():
        raise RunError(f"{run_dir}: has no metrics.json (did the run finish?); {RUN_HINT}")
    try:
        metrics = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path}: cannot be read as JSON ({e}); {RUN_HINT}") from None
    records = metrics.get("epochs") if isinstance(metrics, dict) else None
    if (not records or not isinstance(records, list)
            or not all(isinstance(r, dict) and "epoch" in r for r in records)):
        raise RunError(f"{path}: has no per-epoch records under 'epochs'; {RUN_HINT}")
    return metrics
