"""The kernel table of a ``--trace-steps`` run: ``python -m pyg_mgpu.tools.kernel_table RUN``.

From the run's ``trace.json`` (``torch.profiler``'s Chrome trace of the traced steps), a
Markdown table of the kernels that took the most GPU time per step: name, calls per step,
microseconds per step, share of the step, and the stage of the training step that launched
them; then the GPU time per stage, and how long the training stream sat idle in a step. On a
CPU run, where nothing runs on a device, the ops take the kernels' place, by their own (self)
host time.

A kernel's stage is read from where its launch sits in the trace, as the training loop
(:func:`pyg_mgpu.train.loop.train_epoch`) orders a step: ``optimizer`` inside
``Optimizer.step``/``zero_grad``; ``backward`` inside autograd's ``evaluate_function``;
``load`` on a thread other than the training loop's (the prefetch thread: sampling, gathering,
the copy) or, on the loop's thread, between the end of the backward pass and the optimizer
step (where the next batch is loaded); ``metrics`` after the optimizer step; ``forward``
(loss included) before the backward pass. With ``--cuda-graph`` the replayed backward counts
as ``forward``, as in the stage times.

Without ``trace.json``, the table comes from ``kernels.csv`` alone, without stages or shares.
"""
from __future__ import annotations

import argparse
import bisect
import csv
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from pyg_mgpu.tools.cli import Parser

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STAGES = ("load", "forward", "backward", "optimizer", "metrics")
_LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
_HOST_CATEGORIES = ("cpu_op", "user_annotation")


@dataclass
class KernelRow:
    """One kernel (or, on a CPU run, one op) summed over the traced steps."""
    name: str
    calls: int = 0
    us: float = 0.0
    stages: Counter = field(default_factory=Counter)  # microseconds per stage

    def stage(self) -> str:
        """The stage that launched most of its time; a mix as ``backward 70%, load 30%``."""
        if not self.stages:
            return "-"
        total = sum(self.stages.values())
        ranked = [(s, us / total) for s, us in self.stages.most_common() if us / total >= 0.05]
        if ranked[0][1] >= 0.95:
            return ranked[0][0]
        return ", ".join(f"{s} {share:.0%}" for s, share in ranked)


@dataclass
class KernelTable:
    """What :func:`kernel_table` read from a run."""
    rows: list[KernelRow]  # by time, longest first
    steps: int
    step_us: Optional[float]  # mean wall time of a traced step (the host's clock)
    device: bool  # rows are device kernels (False: host ops of a CPU run)
    stage_us: dict = field(default_factory=dict)  # per step, per stage
    stream_busy_us: Optional[float] = None  # per step, the training stream
    any_stream_busy_us: Optional[float] = None  # per step, any stream
    training_stream: Optional[int] = None


class _Intervals:
    """Sorted, merged time intervals: does a point fall inside one?"""

    def __init__(self, spans: Iterable[tuple[float, float]]):
        self.starts, self.ends = [], []
        for start, end in sorted(spans):
            if self.ends and start <= self.ends[-1]:
                self.ends[-1] = max(self.ends[-1], end)
            else:
                self.starts.append(start)
                self.ends.append(end)

    def __contains__(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t <= self.ends[i]

    def length_within(self, start: float, end: float) -> float:
        return sum(max(0.0, min(e, end) - max(s, start)) for s, e in zip(self.starts, self.ends))


class _StageOf:
    """The stage of a host event at time ``t`` on thread ``tid`` (see the module's doc)."""

    def __init__(self, host: list[dict], steps: list[dict]):
        self.main_tid = steps[0]["tid"] if steps else None
        self.optimizer = _Intervals(_span(e) for e in host if e["name"].startswith("Optimizer."))
        backward = [e for e in host if e["name"].startswith("autograd::engine::evaluate_function")]
        self.backward = defaultdict(list)
        for e in backward:
            self.backward[e["tid"]].append(_span(e))
        self.backward = {tid: _Intervals(spans) for tid, spans in self.backward.items()}
        # Per step: when its backward pass ended and its optimizer step began.
        self.phases = []
        for step in steps:
            start, end = _span(step)
            bwd = [_span(e)[1] for e in backward if start <= e["ts"] <= end]
            opt = [e["ts"] for e in host if e["name"].startswith("Optimizer.step")
                   and start <= e["ts"] <= end]
            self.phases.append((start, end, max(bwd) if bwd else None, min(opt) if opt else None))
        self.phases.sort()

    def __call__(self, tid, t: float) -> str:
        if t in self.optimizer:
            return "optimizer"
        if tid in self.backward and t in self.backward[tid]:
            return "backward"
        if tid != self.main_tid:
            return "load"
        i = bisect.bisect_right(self.phases, (t, float("inf"))) - 1
        if i < 0 or t > self.phases[i][1]:
            return "forward"
        _, _, backward_end, optimizer_start = self.phases[i]
        if optimizer_start is not None and t >= optimizer_start:
            return "metrics"
        if backward_end is not None and t >= backward_end:
            return "load"
        return "forward"


def _span(event: dict) -> tuple[float, float]:
    return event["ts"], event["ts"] + event.get("dur", 0.0)


def _self_times(host: list[dict]) -> list[tuple[dict, float]]:
    """Each host op with its own time: its duration less its direct children's, per thread."""
    out = []
    by_tid = defaultdict(list)
    for e in host:
        by_tid[e["tid"]].append(e)
    for events in by_tid.values():
        events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
        stack: list[list] = []  # [event, end, children's time]
        for e in events:
            start, end = _span(e)
            while stack and start >= stack[-1][1]:
                done = stack.pop()
                out.append((done[0], done[0].get("dur", 0.0) - done[2]))
            if stack:
                stack[-1][2] += min(end, stack[-1][1]) - start
            stack.append([e, end, 0.0])
        out.extend((done[0], done[0].get("dur", 0.0) - done[2]) for done in stack)
    return out


def table_from_trace(trace: dict) -> KernelTable:
    """The kernel table of a Chrome trace written by ``torch.profiler`` (``trace.json``)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    # The host's step annotations only: on CUDA, kineto writes each ProfilerStep#N again on
    # the GPU timeline (cat "gpu_user_annotation", tid a stream), which would count every step
    # twice and could make a stream the training loop's thread.
    steps = [e for e in events if e.get("cat") in _HOST_CATEGORIES
             and e.get("name", "").startswith("ProfilerStep#")]
    host = [e for e in events if e.get("cat") in _HOST_CATEGORIES
            and not e.get("name", "").startswith("ProfilerStep#")]
    stage_of = _StageOf(host, steps)
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in _LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    rows: dict[str, KernelRow] = {}
    if device:
        timed = [(e, e.get("dur", 0.0)) for e in device]
    else:  # a CPU run: the ops are the kernels
        timed = [(e, t) for e, t in _self_times(host) if e.get("cat") == "cpu_op"]
    stage_us = Counter()
    for e, us in timed:
        row = rows.setdefault(e["name"], KernelRow(e["name"]))
        row.calls += 1
        row.us += us
        where = launches.get(e.get("args", {}).get("correlation")) if device else e
        if where is not None:
            stage = stage_of(where["tid"], where["ts"])
            row.stages[stage] += us
            stage_us[stage] += us
    n = max(1, len(steps))
    table = KernelTable(sorted(rows.values(), key=lambda r: -r.us), steps=len(steps),
                        step_us=(sum(e["dur"] for e in steps) / n) if steps else None,
                        device=bool(device),
                        stage_us={s: stage_us[s] / n for s in STAGES if s in stage_us})
    if device and steps:
        window = (min(e["ts"] for e in steps), max(_span(e)[1] for e in steps))
        by_stream = defaultdict(list)
        trained = Counter()
        for e in device:
            stream = e.get("args", {}).get("stream")
            by_stream[stream].append(_span(e))
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is not None and stage_of(launch["tid"], launch["ts"]) in (
                    "forward", "backward", "optimizer"):
                trained[stream] += e.get("dur", 0.0)
        if trained:
            table.training_stream = trained.most_common(1)[0][0]
            table.stream_busy_us = _Intervals(by_stream[table.training_stream]).length_within(
                *window) / n
        table.any_stream_busy_us = _Intervals(
            span for spans in by_stream.values() for span in spans).length_within(*window) / n
    return table


def table_from_csv(path: Path) -> KernelTable:
    """The table from ``kernels.csv`` alone: its kernels (rows with device time and no host
    time of their own), or its ops on a CPU run; no stages, no step time."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    kernels = [r for r in rows if float(r["self_device_ms"]) > 0 and float(r["self_cpu_ms"]) == 0]
    device = bool(kernels)
    key = "self_device_ms" if device else "self_cpu_ms"
    chosen = kernels if device else rows
    steps = _steps_in_csv(rows)
    table = [KernelRow(r["name"], calls=int(r["calls"]), us=float(r[key]) * 1e3)
             for r in chosen]
    return KernelTable(sorted(table, key=lambda r: -r.us), steps=steps, step_us=None,
                       device=device)


def _steps_in_csv(rows: list[dict]) -> int:
    for r in rows:
        per_step = float(r["self_cpu_ms_per_step"])
        if per_step > 0:
            return max(1, round(float(r["self_cpu_ms"]) / per_step))
    return 1


def kernel_table(run: Path) -> KernelTable:
    """The kernel table of a run folder (or of a ``trace.json``/``kernels.csv`` given itself)."""
    run = Path(run)
    if run.suffix == ".json":
        trace, kernels = run, run / "none"
    elif run.suffix == ".csv":
        trace, kernels = run / "none", run
    else:
        trace, kernels = run / "trace.json", run / "kernels.csv"
    if trace.is_file():
        with open(trace) as f:
            try:
                loaded = json.load(f)
            except ValueError as e:
                raise ValueError(f"{trace}: not a whole JSON trace ({e}); it may be truncated: "
                                 "trace the run again") from None
        return table_from_trace(loaded)
    if kernels.is_file():
        return table_from_csv(kernels)
    if not run.exists():
        raise FileNotFoundError(f"{run}: no such folder or file")
    raise FileNotFoundError(f"{run} holds neither trace.json nor kernels.csv: run "
                            "python -m pyg_mgpu.distributed_sampling with --trace-steps N and "
                            "--out there")


def _name(text: str, width: int = 90) -> str:
    text = text if len(text) <= width else text[:width - 3] + "..."
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def format_table(table: KernelTable, top: int = 25) -> str:
    """The table in Markdown: the ``top`` rows, the stages, the training stream's idle time."""
    what = "kernel" if table.device else "op (CPU run: host self time)"
    steps = max(1, table.steps)
    step = f", a step {table.step_us / 1e3:.3f} ms on the host's clock" if table.step_us else ""
    lines = [f"{table.steps} traced steps{step}.", "",
             f"| # | {what} | calls per step | µs per step | share of the step | stage |",
             "| --- | --- | --- | --- | --- | --- |"]
    for i, row in enumerate(table.rows[:top], 1):
        us = row.us / steps
        share = f"{us / table.step_us:.1%}" if table.step_us else "-"
        lines.append(f"| {i} | {_name(row.name)} | {row.calls / steps:.4g} | {us:,.1f} | "
                     f"{share} | {row.stage()} |")
    total = sum(r.us for r in table.rows) / steps
    rest = total - sum(r.us for r in table.rows[:top]) / steps
    lines.append(f"| | all {len(table.rows)} ({len(table.rows) - min(top, len(table.rows))} "
                 f"more: {rest:,.1f} µs) | | {total:,.1f} | "
                 f"{f'{total / table.step_us:.1%}' if table.step_us else '-'} | |")
    if table.stage_us:
        lines += ["", "| stage | µs per step | share of the step |", "| --- | --- | --- |"]
        for stage, us in table.stage_us.items():
            share = f"{us / table.step_us:.1%}" if table.step_us else "-"
            lines.append(f"| {stage} | {us:,.1f} | {share} |")
    if table.stream_busy_us is not None and table.step_us:
        idle = table.step_us - table.stream_busy_us
        lines += ["", f"Training stream (stream {table.training_stream}): busy "
                      f"{table.stream_busy_us:,.1f} µs per step, idle {idle:,.1f} µs "
                      f"({idle / table.step_us:.1%} of the step); some stream busy "
                      f"{table.any_stream_busy_us / table.step_us:.1%} of the step."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m pyg_mgpu.tools.kernel_table",
                    description="The kernels of a --trace-steps run by GPU time per step, with "
                                "the stage of the step that launched them, as Markdown.")
    parser.add_argument("run", help="the run's folder (its trace.json or kernels.csv)")
    parser.add_argument("--top", type=int, default=25, help="rows of the table")
    parser.add_argument("--out", help="also write the table to this file")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        text = format_table(kernel_table(Path(args.run)), top=args.top)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
