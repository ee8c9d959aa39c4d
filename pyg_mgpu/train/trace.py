"""``--trace-steps N``: ``torch.profiler`` over N training steps of the last epoch, on rank 0.

Where a GPU step's time goes kernel by kernel, which per-stage timers cannot say: the ops and
kernels by their own device time (and host time), per step, into ``kernels.csv``, and the
whole timeline into ``trace.json`` (Chrome's trace format: chrome://tracing or Perfetto).
The profiler starts after ``skip`` steps of the epoch (caches, allocator and prefetch warm)
and one more step of its own warm-up; it does not change what is computed.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile, schedule

KERNEL_FIELDS = ("name", "calls", "self_device_ms", "self_cpu_ms", "self_device_ms_per_step",
                 "self_cpu_ms_per_step")


class StepTrace:
    """Profiles ``steps`` steps of an epoch: :meth:`start` before it, :meth:`step` after each
    of its steps, :meth:`stop` after it (files are written when the last traced step ends)."""

    def __init__(self, out: Path, steps: int, device: torch.device, skip: int = 10):
        self.out, self.steps, self.device, self.skip = Path(out), steps, device, skip
        self._profiler: Optional[profile] = None
        self.traced = 0  # steps the profiler records (fewer than asked in a short epoch)
        self.table: list[dict] = []

    def start(self, steps_in_epoch: int) -> None:
        if steps_in_epoch < 2:  # the profiler's own warm-up step comes first
            return
        traced = min(self.steps, max(1, steps_in_epoch - 1))  # one warm-up step of its own
        skip = max(0, min(self.skip, steps_in_epoch - traced - 1))
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.traced = traced
        self._profiler = profile(activities=activities,
                                 schedule=schedule(wait=skip, warmup=1, active=traced, repeat=1),
                                 on_trace_ready=self._write)
        self._profiler.__enter__()

    def step(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    def stop(self) -> None:
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None

    def _write(self, prof: profile) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out / "trace.json"))
        rows = []
        for event in prof.key_averages():
            device_us = event.self_device_time_total
            cpu_us = event.self_cpu_time_total
            if (device_us <= 0 and cpu_us <= 0) or event.key.startswith("ProfilerStep"):
                continue
            rows.append({"name": event.key, "calls": event.count,
                         "self_device_ms": device_us / 1e3, "self_cpu_ms": cpu_us / 1e3,
                         "self_device_ms_per_step": device_us / 1e3 / self.traced,
                         "self_cpu_ms_per_step": cpu_us / 1e3 / self.traced})
        rows.sort(key=lambda r: (-r["self_device_ms"], -r["self_cpu_ms"]))
        self.table = rows
        with open(self.out / "kernels.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=KERNEL_FIELDS)
            writer.writeheader()
            writer.writerows(rows)


def format_top(rows: list[dict], count: int = 12) -> str:
    """The first ``count`` rows of a kernel table, per traced step."""
    lines = [f"{'ms/step (device)':>16s} {'ms/step (host)':>14s}  calls  name"]
    for r in rows[:count]:
        lines.append(f"{r['self_device_ms_per_step']:16.3f} {r['self_cpu_ms_per_step']:14.3f} "
                     f"{r['calls']:6d}  {r['name'][:90]}")
    return "\n".join(lines)
