"""Comparison tables and plots over run folders: ``python -m pyg_mgpu.report RUN_DIR ...``.

A run folder is what ``python -m pyg_mgpu.distributed_sampling --out DIR`` writes; everything
here reads its ``metrics.json`` (:func:`~pyg_mgpu.train.plots.load_metrics`), and draws as
:mod:`pyg_mgpu.train.plots` does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from matplotlib.figure import Figure

from pyg_mgpu.files import cannot_write, save_text
from pyg_mgpu.tools.cli import Parser
from pyg_mgpu.train.metrics import RunError, load_metrics
from pyg_mgpu.train.plots import epoch_axis, save_figure, series


def _fmt(spec: str) -> Callable[[object], str]:
    return lambda v: spec.format(v) if isinstance(v, (int, float)) else str(v)


def _setting(name: str) -> Callable[[dict], object]:
    """A run's setting from its metrics' ``config`` (None where the run did not record it)."""
    return lambda metrics: (metrics.get("config") or {}).get(name)


def _planned(name: str) -> Callable[[dict], object]:
    """A setting as the run resolved it (its ``plan``: rank 0's, with every default that
    depends on the device or the graph decided), else as it was given."""
    return lambda metrics: (metrics.get("plan") or {}).get(name, _setting(name)(metrics))


def _joined(values) -> str:
    return ",".join(map(str, values)) if isinstance(values, (list, tuple)) else str(values)


# (row label, metrics key or function of the metrics, formatter)
TABLE_ROWS: tuple = (
    ("dataset", "dataset", str),
    ("model", _setting("model"), str),
    ("fanout", _setting("fanout"), _joined),
    ("batch size", _setting("batch_size"), str),
    ("world size", "world_size", str),
    ("device", "device", str),
    ("sampler", "sampler", str),
    ("graph on", _planned("graph_on"), str),
    ("batches per walk", _planned("sample_batches"), str),
    ("prefetch", _planned("prefetch"), str),
    ("feature cache GB", _planned("feature_cache_gb"), _fmt("{:g}")),
    ("eval batch size", _planned("eval_batch_size"), str),
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
        acc_ax.plot(*series(metrics, "val_acc"), marker="o", label=label)
        time_ax.plot(*series(metrics, "epoch_time_s"), marker="o", label=label)
    acc_ax.set(title="validation accuracy", xlabel="epoch", ylabel="accuracy")
    time_ax.set(title="train seconds per epoch", xlabel="epoch", ylabel="seconds")
    epochs = sorted({r["epoch"] for m in runs.values() for r in m["epochs"]})
    for ax in (acc_ax, time_ax):
        epoch_axis(ax, epochs)
        ax.legend(fontsize="small")
    return save_figure(fig, Path(path))


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """Folder names, or the paths as given where two runs share a folder name."""
    names = [d.name or str(d) for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m pyg_mgpu.report",
        description="Compare training runs: print a table, write report.md and report.png.")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="folders written by `python -m pyg_mgpu.distributed_sampling --out`")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for report.md and report.png (default: the first RUN_DIR)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    # A run's metrics.json names its run
    args.runs = [run.parent if run.name == "metrics.json" and run.is_file() else run
                 for run in args.runs]
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
        print(f"error: {cannot_write(out, e)}", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"wrote {out / 'report.md'} and {out / 'report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
