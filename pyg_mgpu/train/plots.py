"""A run folder's figures, drawn as the run ends: ``curves.png`` and ``epoch_time.png`` from its
``metrics.json``. Figures are drawn on matplotlib's Agg canvas directly (no pyplot), so nothing
needs a display and importing this module changes no global matplotlib state.
"""
from __future__ import annotations

import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pyg_mgpu.files import atomic_write
from pyg_mgpu.train.metrics import load_metrics


def series(metrics: dict, key: str) -> tuple[list[int], list[float]]:
    """(epochs, values) for one per-epoch field, skipping epochs where it is null/absent."""
    points = [(r["epoch"], r[key]) for r in metrics["epochs"] if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def save_figure(fig: Figure, path: Path) -> Path:
    """Writes ``fig`` to ``path`` as a PNG.

    Raises:
        OSError: naming ``path`` (a failed write or sync, a full disk, names no file itself).
    """
    FigureCanvasAgg(fig)  # attaches the Agg canvas: PNG rendering without a display
    fig.tight_layout()
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e


def plot_completed_run(run_dir: Path) -> list[Path]:
    """:func:`plot_run` for a run whose outputs are complete: a figure that cannot be written
    (a full disk) is a ``warning:`` line naming it and why, not a failure of the run.

    Returns:
        The paths written (none after such a failure).
    """
    try:
        return plot_run(run_dir)
    except OSError as e:
        print(f"warning: {e.filename or run_dir} was not written ({e.strerror or e}); the run "
              f"completed, and its other outputs are in {run_dir}.", file=sys.stderr,
              flush=True)
        return []


def plot_run(run_dir: Path) -> list[Path]:
    """Writes ``curves.png`` and ``epoch_time.png`` into a run folder.

    ``curves.png`` shows train loss and train/val accuracy per epoch; ``epoch_time.png`` shows
    train and eval seconds per epoch (stacked), and rank 0's per-stage training seconds when the
    run recorded them. Epochs without validation are skipped on the val curve.

    Args:
        run_dir: A run folder holding ``metrics.json``.

    Returns:
        The paths written.

    Raises:
        ~pyg_mgpu.train.metrics.RunError: ``run_dir`` holds no usable ``metrics.json``.
        OSError: a figure could not be written (the error names its file).
    """
    run_dir = Path(run_dir)
    metrics = load_metrics(run_dir)
    epochs = [r["epoch"] for r in metrics["epochs"]]

    fig = Figure(figsize=(10, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    loss_ax.plot(*series(metrics, "train_loss"), marker="o")
    loss_ax.set(title="train loss", xlabel="epoch", ylabel="cross-entropy")
    for key, label in (("train_acc", "train"), ("val_acc", "val")):
        acc_ax.plot(*series(metrics, key), marker="o", label=label)
    acc_ax.set(title="accuracy", xlabel="epoch", ylabel="accuracy")
    acc_ax.legend()
    epoch_axis(loss_ax, epochs)
    epoch_axis(acc_ax, epochs)
    fig.suptitle(run_dir.name)
    curves = save_figure(fig, run_dir / "curves.png")

    stage_names = list(dict.fromkeys(s for r in metrics["epochs"]
                                     for s in r.get("stage_times_s") or {}))
    fig = Figure(figsize=(10 if stage_names else 5, 4))
    axes = fig.subplots(1, 2 if stage_names else 1, squeeze=False)[0]
    _stacked_bars(axes[0], epochs, {
        "train": [r.get("epoch_time_s") or 0.0 for r in metrics["epochs"]],
        "eval": [r.get("eval_time_s") or 0.0 for r in metrics["epochs"]]})
    axes[0].set(title="seconds per epoch", xlabel="epoch", ylabel="seconds")
    if stage_names:
        _stacked_bars(axes[1], epochs, {
            s: [(r.get("stage_times_s") or {}).get(s, 0.0) for r in metrics["epochs"]]
            for s in stage_names})
        axes[1].set(title="training stages (rank 0)", xlabel="epoch", ylabel="seconds")
    fig.suptitle(run_dir.name)
    epoch_time = save_figure(fig, run_dir / "epoch_time.png")
    return [curves, epoch_time]


def _stacked_bars(ax, epochs: list[int], parts: dict[str, list[float]]) -> None:
    bottom = [0.0] * len(epochs)
    for label, values in parts.items():
        ax.bar(epochs, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    epoch_axis(ax, epochs)
    # The legend in rows of 3 above the tallest bar, in headroom made for it, not over the bars.
    rows = -(-len(parts) // 3)
    if max(bottom, default=0.0) > 0:
        ax.set_ylim(0, max(bottom) * (1.1 + 0.1 * rows))
    ax.legend(ncol=min(3, len(parts)), loc="upper center", fontsize="x-small")


def epoch_axis(ax, epochs: list[int]) -> None:
    if len(epochs) <= 20:  # whole-epoch ticks; matplotlib would otherwise show 1.5, 2.5, ...
        ax.set_xticks(epochs)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)
