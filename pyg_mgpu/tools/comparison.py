"""The comparison of two sides' runs: summaries of their ``metrics.json`` (means over seeds), the
verdict against a tolerance, and the table and report; pure functions, tested without
processes."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional, Sequence

from pyg_mgpu.train.metrics import RunError, load_metrics

SIDES = ("pyg_mgpu", "dgl")


def steady_epoch_time(records: Sequence[dict]) -> float:
    """Mean training seconds per epoch, leaving out the first epoch when there are others.

    The first epoch carries one-off costs (allocator warm-up, lazy initialisation, DGL building
    its sampling structures) that would otherwise dominate the short runs CI makes.
    """
    times = [float(r["epoch_time_s"]) for r in records]
    steady = times[1:] if len(times) > 1 else times
    return sum(steady) / len(steady)


def summarize_run(metrics: dict) -> dict:
    """The numbers the comparison shows, from one run's ``metrics.json``."""
    records = metrics["epochs"]
    return {
        "seed": metrics.get("config", {}).get("seed"),
        "test_acc": float(metrics["test_acc"]),
        "best_val_acc": float(metrics["best_val_acc"]),
        "best_epoch": metrics.get("best_epoch"),
        "epoch_time_s": steady_epoch_time(records),
        "first_epoch_time_s": float(records[0]["epoch_time_s"]),
        "epochs": len(records),
        "peak_mem_mb": float(metrics["peak_mem_mb"]),
        "wall_time_s": metrics.get("wall_time_s"),
    }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _std(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation; ``None`` for a single value."""
    if len(values) < 2:
        return None
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def summarize_side(runs: Sequence[dict], info: Optional[dict] = None) -> dict:
    """Means over one side's runs (one per seed), the test accuracy's spread, and the runs.

    Args:
        runs: :func:`summarize_run` results, one per seed.
        info: Facts shared by the runs (dataset, world size, device, backend, sampler).
    """
    if not runs:
        raise ValueError("summarize_side needs at least one run")
    tests = [r["test_acc"] for r in runs]
    return {
        **(info or {}),
        "test_acc": _mean(tests),
        "test_acc_std": _std(tests),
        "test_acc_min": min(tests),
        "test_acc_max": max(tests),
        "best_val_acc": _mean([r["best_val_acc"] for r in runs]),
        "epoch_time_s": _mean([r["epoch_time_s"] for r in runs]),
        "first_epoch_time_s": _mean([r["first_epoch_time_s"] for r in runs]),
        "peak_mem_mb": _mean([r["peak_mem_mb"] for r in runs]),
        "wall_time_s": (_mean([r["wall_time_s"] for r in runs])
                        if all(r["wall_time_s"] is not None for r in runs) else None),
        "num_runs": len(runs),
        "runs": list(runs),
    }


def side_info(metrics: dict) -> dict:
    """What a run was (not how it went): shown once per side."""
    keys = ("dataset", "world_size", "device", "backend", "sampler", "threads_per_rank",
            "framework")
    return {k: metrics[k] for k in keys if k in metrics}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The CI check: the sides' mean test accuracies differ by at most ``tolerance``."""

    gap: float
    tolerance: float

    @property
    def passed(self) -> bool:
        # A hair of slack so a gap equal to the tolerance in decimal passes in binary too.
        return self.gap <= self.tolerance + 1e-12

    def describe(self) -> str:
        word = "within" if self.passed else "OVER"
        return f"test accuracy gap {self.gap:.4f}: {word} the tolerance {self.tolerance:.4f}"


def check(comparison: dict, tolerance: float) -> Verdict:
    return Verdict(gap=abs(comparison["pyg_mgpu"]["test_acc"] - comparison["dgl"]["test_acc"]),
                   tolerance=tolerance)


def _acc(side: dict) -> str:
    text = f"{side['test_acc']:.4f}"
    if side.get("test_acc_std") is not None:
        text += f" ± {side['test_acc_std']:.4f} ({side['num_runs']} seeds)"
    return text


def _num(spec: str):
    return lambda v: "-" if v is None else spec.format(v)


# (row label, function of one side's summary)
TABLE_ROWS = (
    ("test acc", _acc),
    ("best val acc", lambda s: _num("{:.4f}")(s["best_val_acc"])),
    ("mean epoch s (after the 1st)", lambda s: _num("{:.3f}")(s["epoch_time_s"])),
    ("first epoch s", lambda s: _num("{:.3f}")(s["first_epoch_time_s"])),
    ("peak mem MB (sum of ranks' RSS)", lambda s: _num("{:.0f}")(s["peak_mem_mb"])),
    ("wall s (ranks' start to test)", lambda s: _num("{:.1f}")(s.get("wall_time_s"))),
    ("ranks x device (backend)", lambda s: f"{s.get('world_size', '?')} x "
                                           f"{s.get('device', '?')} ({s.get('backend', '?')})"),
    ("sampler", lambda s: str(s.get("sampler", "-"))),
)


def format_table(comparison: dict) -> str:
    """A Markdown table, one column per side, padded to read as plain text as well."""
    rows = [("", *SIDES)] + [(label, *(cell(comparison[s]) for s in SIDES))
                             for label, cell in TABLE_ROWS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(SIDES) + 1)]
    fmt = lambda r: "| " + " | ".join(f"{c:<{w}}" for c, w in zip(r, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(rows[0]), rule, *map(fmt, rows[1:])]) + "\n"


def format_report(comparison: dict, verdict: Verdict, settings: dict,
                  commands: Sequence[str] = ()) -> str:
    """The whole ``comparison.md``: settings, table, verdict, per-seed runs and commands."""
    shared = ", ".join(f"{k} {v}" for k, v in settings.items())
    lines = ["# pyg_mgpu vs DGL's recipe", "", f"Settings shared by both sides: {shared}.", "",
             format_table(comparison), f"**{verdict.describe()}.**", ""]
    if any(comparison[s]["num_runs"] > 1 for s in SIDES):
        lines += ["Per seed (test acc / best val acc / mean epoch s):", ""]
        for s in SIDES:
            runs = "; ".join(f"seed {r['seed']}: {r['test_acc']:.4f} / {r['best_val_acc']:.4f} / "
                             f"{r['epoch_time_s']:.3f}" for r in comparison[s]["runs"])
            lines.append(f"- {s}: {runs}")
        lines.append("")
    if commands:
        lines += ["Commands:", "", "```bash", *commands, "```", ""]
    return "\n".join(lines)


def compare_runs(run_dirs: dict[str, Sequence[Path]]) -> dict:
    """``{"pyg_mgpu": {...}, "dgl": {...}}`` from each side's run folders (one per seed)."""
    comparison = {}
    for side in SIDES:
        metrics = [load_metrics(d) for d in run_dirs[side]]
        for m, d in zip(metrics, run_dirs[side]):
            if m.get("test_acc") is None or m.get("best_val_acc") is None:
                raise RunError(f"{d}/metrics.json has no test_acc/best_val_acc; the run did "
                               "not finish")
        comparison[side] = summarize_side([summarize_run(m) for m in metrics],
                                          side_info(metrics[0]))
    return comparison


