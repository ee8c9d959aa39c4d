"""A run's TensorBoard log, ``RUN/tensorboard/``, written by rank 0 (``tensorboard --logdir
RUN``).

Per epoch: the training loss and accuracy, the validation accuracy (on the epochs that
validate), the epoch's training and evaluation seconds and its training seeds per second; once,
as the run ends, the best model's test accuracy (and with ``--inference layerwise`` the exact
ones) at the best model's epoch; and the run's configuration as text. The values are the ones
``metrics.json`` records, stored as TensorBoard stores scalars (float32).

TensorBoard is optional: without the ``tensorboard`` package the run goes on without the log,
rank 0 prints one warning line, and ``metrics.json`` says why under ``tensorboard``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from tqdm import tqdm

FOLDER = "tensorboard"

# Each per-epoch field of metrics.json that the log shows, and its tag there.
EPOCH_TAGS = {
    "train_loss": "loss/train",
    "train_acc": "accuracy/train",
    "val_acc": "accuracy/val",
    "epoch_time_s": "time/epoch_s",
    "eval_time_s": "time/eval_s",
    "gpu_busy_pct": "gpu/busy_pct",
}
RESULT_TAGS = {
    "test_acc": "accuracy/test",
    "val_acc_exact": "accuracy/val_exact",
    "test_acc_exact": "accuracy/test_exact",
}
SEEDS_PER_S = "throughput/train_seeds_per_s"


class TensorBoardLog:
    """Rank 0's ``SummaryWriter`` over a run folder, or nothing (other ranks, or no
    ``tensorboard`` package).

    Every epoch is flushed as it is logged, so a run that stops (a stop signal, a failure) leaves
    the epochs it finished readable.
    """

    def __init__(self, writer: Any = None, status: Optional[dict] = None):
        self.writer = writer
        self.status = status

    @classmethod
    def for_run(cls, out: Path, config: dict, *, is_main: bool,
             first_epoch: int = 1) -> "TensorBoardLog":
        """The log of the run in ``out``, with its ``config`` written as text, on rank 0
        (``is_main``); an empty one on the other ranks.

        ``first_epoch``: the epoch the run starts at; a resumed run hides what an earlier
        attempt logged from that epoch on (``SummaryWriter``'s ``purge_step``), so each epoch
        shows once.
        """
        if not is_main:
            return cls()
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch raises it when the tensorboard package is missing
            reason = f"the tensorboard package is not installed ({e}); pip install tensorboard"
            tqdm.write(f"warning: no TensorBoard log: {reason}")
            return cls(status={"written": False, "reason": reason})
        writer = SummaryWriter(log_dir=str(Path(out) / FOLDER),
                               purge_step=first_epoch if first_epoch > 1 else None)
        # Indented four spaces: TensorBoard renders text as Markdown, and this keeps it a code
        # block.
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        writer.add_text("config", "\n".join("    " + line for line in text.splitlines()),
                        global_step=first_epoch - 1)
        writer.flush()
        return cls(writer, {"written": True, "folder": FOLDER})

    def epoch(self, record: dict, *, seeds: int) -> None:
        """One epoch's record (as ``metrics.json`` holds it); ``seeds``: the training seeds of
        an epoch over every rank."""
        if self.writer is None:
            return
        step = record["epoch"]
        for key, tag in EPOCH_TAGS.items():
            if record.get(key) is not None:
                self.writer.add_scalar(tag, record[key], step)
        if record.get("epoch_time_s"):
            self.writer.add_scalar(SEEDS_PER_S, seeds / record["epoch_time_s"], step)
        self.writer.flush()

    def finish(self, results: dict, *, best_epoch: int) -> Optional[dict]:
        """Logs the best model's ``results`` (test accuracy, exact accuracies) at
        ``best_epoch`` and closes the log; returns what ``metrics.json`` records of it (None on
        the ranks that write nothing)."""
        if self.writer is not None:
            for key, tag in RESULT_TAGS.items():
                if results.get(key) is not None:
                    self.writer.add_scalar(tag, results[key], best_epoch)
            self.writer.close()
            self.writer = None
        return self.status
