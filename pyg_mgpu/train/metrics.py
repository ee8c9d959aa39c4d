"""What a run reports: ``metrics.json`` and ``history.csv`` (rank 0), and the job's memory."""
from __future__ import annotations

import csv
import io
import resource
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

from pyg_mgpu.train.checkpoint import save_json, save_text

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
