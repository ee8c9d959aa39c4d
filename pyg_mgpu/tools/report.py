"""Plots and comparison tables from run folders: ``python -m pyg_mgpu.report RUN_DIR ...``.

A run folder is what ``python -m pyg_mgpu.distributed_sampling --out DIR`` writes; everything
here reads its ``metrics.json``. Figures are drawn on matplotlib's Agg canvas directly (no pyplot),
so nothing needs a display and importing this module changes no global matplotlib state.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pyg_mgpu.train.checkpoint import _atomic_write, save_text

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
        raise RunError(f"{run_dir}: no such folder; {RUN_HINT}")
    if not path.is_file():
        raise RunError(f"{run_dir}: has no metrics.json (did the run finish?); {RUN_HINT}")
    try:
        metrics = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path}: cannot be read as JSON ({e}); {RUN_HINT}") from None
    records = metrics.get("epochs") if isinstance(metrics, dict) else None
    if not records or not isinstance(records, list) \
            or not all(isinstance(r, dict) and "epoch" in r for r in records):
        raise RunError(f"{path}: has no per-epoch records under 'epochs'; {RUN_HINT}")
    return metrics


def _series(metrics: dict, key: str) -> tuple[list[int], list[float]]:
    """(epochs, values) for one per-epoch field, skipping epochs where it is null/absent."""
    points = [(r["epoch"], r[key]) for r in metrics["epochs"] if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _save_figure(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # attaches the Agg canvas: PNG rendering without a display
    fig.tight_layout()
    return _atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))


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
        RunError: ``run_dir`` holds no usable ``metrics.json``.
    """
    run_dir = Path(run_dir)
    metrics = load_metrics(run_dir)
    epochs = [r["epoch"] for r in metrics["epochs"]]

    fig = Figure(figsize=(10, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    loss_ax.plot(*_series(metrics, "train_loss"), marker="o")
    loss_ax.set(title="train loss", xlabel="epoch", ylabel="cross-entropy")
    for key, label in (("train_acc", "train"), ("val_acc", "val")):
        acc_ax.plot(*_series(metrics, key), marker="o", label=label)
    acc_ax.set(title="accuracy", xlabel="epoch", ylabel="accuracy")
    acc_ax.legend()
    _epoch_axis(loss_ax, epochs)
    _epoch_axis(acc_ax, epochs)
    fig.suptitle(run_dir.name)
    curves = _save_figure(fig, run_dir / "curves.png")

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
    epoch_time = _save_figure(fig, run_dir / "epoch_time.png")
    return [curves, epoch_time]


def _stacked_bars(ax, epochs: list[int], parts: dict[str, list[float]]) -> None:
    bottom = [0.0] * len(epochs)
    for label, values in parts.items():
        ax.bar(epochs, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    _epoch_axis(ax, epochs)
    ax.legend()


def _epoch_axis(ax, epochs: list[int]) -> None:
    if len(epochs) <= 20:  # whole-epoch ticks; matplotlib would otherwise show 1.5, 2.5, ...
        ax.set_xticks(epochs)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)


def _fmt(spec: str) -> Callable[[object], str]:
    return lambda v: spec.format(v) if isinstance(v, (int, float)) else str(v)


# (row label, metrics key or function of the metrics, formatter)
TABLE_ROWS: tuple = (
    ("dataset", "dataset", str),
    ("world size", "world_size", str),
    ("device", "device", str),
    ("sampler", "sampler", str),
    ("epochs", lambda m: len(m["epochs"]), str),
    ("mean epoch s", "mean_epoch_time_s", _fmt("{:.2f}")),
    ("best val acc", "best_val_acc", _fmt("{:.4f}")),
    ("best epoch", "best_epoch", str),
    ("test acc", "test_acc", _fmt("{:.4f}")),
    ("peak mem MB", "peak_mem_mb", _fmt("{:.0f}")),
    ("wall s", "wall_time_s", _fmt("{:.1f}")),
)


def format_table(runs: dict[str, dict]) -> str:
    """A Markdown table with one column per run (side by side) and one row per quantity.

    Args:
        runs: Metrics dicts keyed by run label, in column order.

    Returns:
        The table, padded so it also reads well as plain text.
    """
    rows = [["", *runs]]
    for label, key, fmt in TABLE_ROWS:
        cells = []
        for metrics in runs.values():
            value = key(metrics) if callable(key) else metrics.get(key)
            cells.append("-" if value is None else fmt(value))
        rows.append([label, *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n"


def plot_comparison(runs: dict[str, dict], path: Path) -> Path:
    """Writes val accuracy and train seconds per epoch, one line per run, to ``path``."""
    fig = Figure(figsize=(10, 4))
    acc_ax, time_ax = fig.subplots(1, 2)
    for label, metrics in runs.items():
        acc_ax.plot(*_series(metrics, "val_acc"), marker="o", label=label)
        time_ax.plot(*_series(metrics, "epoch_time_s"), marker="o", label=label)
    acc_ax.set(title="validation accuracy", xlabel="epoch", ylabel="accuracy")
    time_ax.set(title="train seconds per epoch", xlabel="epoch", ylabel="seconds")
    epochs = sorted({r["epoch"] for m in runs.values() for r in m["epochs"]})
    for ax in (acc_ax, time_ax):
        _epoch_axis(ax, epochs)
        ax.legend(fontsize="small")
    return _save_figure(fig, Path(path))


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """Folder names, or the paths as given where two runs share a folder name."""
    names = [d.name or str(d) for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pyg_mgpu.report",
        description="Compare training runs: print a table, write report.md and report.png.")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="folders written by `python -m pyg_mgpu.distributed_sampling --out`")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for report.md and report.png (default: the first RUN_DIR)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or args.runs[0]
    try:
        runs = {label: load_metrics(d) for label, d in zip(_labels(args.runs), args.runs)}
        table = format_table(runs)
        out.mkdir(parents=True, exist_ok=True)
        save_text(f"# Run comparison\n\n{table}", out / "report.md")
        plot_comparison(runs, out / "report.png")
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --out {out}: cannot write there ({e.strerror}); choose a writable "
              "folder", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"wrote {out / 'report.md'} and {out / 'report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
