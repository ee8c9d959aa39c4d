"""Peak memory of a command and all its processes: ``python -m pyg_mgpu.memory -- CMD ...``.

It samples PSS (proportional set size), not RSS: the kernel divides each shared page among the
processes that map it, so summing PSS over the parent and its ranks counts a dataset held in
shared memory once. The evidence that the ranks share the parent's copy is total PSS near one
dataset copy plus per-process runtime, and, on Linux >= 5.9, the split of the peak: shared-memory
PSS ("shmem") summed over all processes near ``dataset_bytes``, where a copy per rank would add
the dataset's size again per rank under "anon". Peaks are sampled, so a spike shorter than
``--interval`` can be missed.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import psutil

from pyg_mgpu.files import cannot_write, check_writable, save_json
from pyg_mgpu.tools.cli import Parser

MB = 2 ** 20  # MB here means MiB, as in metrics.json's peak_mem_mb


# smaps_rollup lines -> our keys. The split shows where memory sits: a dataset shared by the
# ranks appears under "shmem" once in total; a private copy per rank would appear under "anon".
PSS_FIELDS = {"Pss:": "pss", "Pss_Anon:": "anon", "Pss_File:": "file", "Pss_Shmem:": "shmem"}


def read_pss(pid: int) -> Optional[dict[str, int]]:
    """PSS of one process in bytes, or None when it has exited or cannot be read.

    Reads ``/proc/<pid>/smaps_rollup`` (kernel-summed, cheap even for big processes), which also
    gives the anon/file/shmem split on Linux >= 5.9, and falls back to psutil's
    ``memory_full_info().pss`` (total only).

    Returns:
        ``{"pss": total}``, plus ``"anon"``, ``"file"`` and ``"shmem"`` where the kernel has them.
    """
    parts = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in PSS_FIELDS:
                    parts[PSS_FIELDS[key]] = int(value.split()[0]) * 1024  # the file has kB
        if "pss" in parts:
            return parts
    except OSError:
        pass
    try:
        return {"pss": psutil.Process(pid).memory_full_info().pss}
    except (psutil.Error, AttributeError):  # gone, a zombie, or no PSS on this platform
        return None


def shm_used(shm_dir: str = "/dev/shm") -> Optional[int]:
    """Bytes used in ``shm_dir`` (mapped or not), or None where it does not exist."""
    try:
        return shutil.disk_usage(shm_dir).used
    except OSError:
        return None


def tree_pss(pid: int, tries: int = 3) -> dict[int, dict[str, int]]:
    """:func:`read_pss` of ``pid`` and each of its descendants alive now, keyed by pid.

    Processes are read one after another, not atomically. When one of them ends during a
    sample, the pages it shared move to the survivors, and the ones read after it would count
    them at a larger share than those read before: such a sample is taken again, and after
    ``tries`` of them ``{}`` (no sample). While pages change hands otherwise (a rank mapping
    shared pages for the first time), one sample can still count those pages slightly high.
    """
    for _ in range(tries):
        pids = _living_tree(pid)
        if not pids:
            return {}
        sizes = {p: read_pss(p) for p in pids}
        if all(sizes.values()) and set(pids) <= set(_living_tree(pid)):
            return sizes
    return {}


def _living_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, leaving out processes that have ended (zombies)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    living = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                living.append(proc.pid)
        except psutil.Error:
            pass
    return living


def _describe(pid: int) -> str:
    try:
        return " ".join(" ".join(psutil.Process(pid).cmdline()).split())[:120]
    except psutil.Error:
        return "?"


def _mb(parts: dict[str, int]) -> dict[str, float]:
    return {f"{key}_mb": size / MB for key, size in parts.items()}


@dataclass
class PssPeaks:
    """Running peaks over a sequence of :func:`tree_pss` samples."""

    total: int = 0
    total_at_s: float = 0.0
    at_total: dict[int, dict[str, int]] = field(default_factory=dict)  # the peak sample
    per_process: dict[int, int] = field(default_factory=dict)  # each pid's own peak PSS
    names: dict[int, str] = field(default_factory=dict)
    samples: int = 0
    # Before the first child process appears, the command is loading its data: this is the
    # load-time peak (the CLI's parent converting and sharing the graph, before any rank).
    load_total: int = 0
    load_at_s: float = 0.0
    loading: bool = True
    # RAM: PSS outside shared memory plus the growth of /dev/shm since the start. PSS counts a
    # shared-memory page only while some process maps it, so a graph copied into /dev/shm
    # files is invisible to it until the ranks touch its pages; this counts it from the start.
    ram: int = 0
    load_ram: int = 0

    def update(self, sample: dict[int, dict[str, int]], t: float,
               shm_growth: Optional[int] = None) -> None:
        self.samples += 1
        self.loading = self.loading and len(sample) <= 1
        total = sum(parts["pss"] for parts in sample.values())
        if self.loading and total > self.load_total:
            self.load_total, self.load_at_s = total, t
        if shm_growth is not None and all("shmem" in parts for parts in sample.values()):
            ram = total - sum(parts["shmem"] for parts in sample.values()) + max(0, shm_growth)
            self.ram = max(self.ram, ram)
            if self.loading:
                self.load_ram = max(self.load_ram, ram)
        for pid, parts in sample.items():
            if pid not in self.names:
                self.names[pid] = _describe(pid)
            self.per_process[pid] = max(parts["pss"], self.per_process.get(pid, 0))
        if total > self.total:
            self.total, self.total_at_s, self.at_total = total, t, sample

    def to_dict(self) -> dict:
        """JSON-ready peaks; ``*_at_total_peak`` fields describe the sample with the peak total."""
        split = {}
        for parts in self.at_total.values():
            for key, size in parts.items():
                split[key] = split.get(key, 0) + size
        return {
            "samples": self.samples,
            "peak_total_pss_mb": self.total / MB,
            "peak_at_s": self.total_at_s,
            "load_peak_pss_mb": self.load_total / MB,
            "load_peak_at_s": self.load_at_s,
            "peak_ram_mb": self.ram / MB if self.ram else None,
            "load_peak_ram_mb": self.load_ram / MB if self.load_ram else None,
            "split_at_total_peak": _mb(split),
            "num_processes": len(self.per_process),
            "processes": [{"pid": pid, "command": self.names[pid], "peak_pss_mb": size / MB,
                           "at_total_peak": _mb(self.at_total.get(pid, {"pss": 0}))}
                          for pid, size in sorted(self.per_process.items())],
        }


def measure(command: Sequence[str], interval: float) -> tuple[int, PssPeaks, float]:
    """Runs ``command`` to completion, sampling its process tree's PSS every ``interval`` s.

    Returns:
        (exit code, the peaks, seconds the command ran). A command killed by signal N gets
        exit code 128 + N, as in a shell.

    Raises:
        OSError: The command cannot be started.
    """
    peaks = PssPeaks()
    shm_at_start = shm_used()
    start = time.monotonic()
    child = subprocess.Popen(list(command))
    try:
        while True:
            shm = shm_used()
            peaks.update(tree_pss(child.pid), time.monotonic() - start,
                         None if shm is None or shm_at_start is None else shm - shm_at_start)
            try:
                child.wait(timeout=interval)  # returns at once when the child exits
                break
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        child.wait()  # the terminal's Ctrl-C reached the child too; report what we saw
    code = child.returncode
    return (128 - code if code < 0 else code), peaks, time.monotonic() - start


def run_dir_of(command: Sequence[str]) -> Optional[Path]:
    """The folder a training command writes to, from its ``--out DIR`` or ``--out=DIR``."""
    for i, arg in enumerate(command):
        if arg == "--out" and i + 1 < len(command):
            return Path(command[i + 1])
        if arg.startswith("--out="):
            return Path(arg[len("--out="):])
    return None


def dataset_bytes_of(run_dir: Path, since: float) -> Optional[int]:
    """``dataset_bytes`` from ``run_dir/metrics.json`` if that file was written after ``since``."""
    path = run_dir / "metrics.json"
    try:
        if path.stat().st_mtime < since:
            return None  # left by an earlier run: not this command's dataset
        return int(json.loads(path.read_text())["dataset_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m pyg_mgpu.memory",
        usage="%(prog)s [--interval S] [--out FILE.json] -- COMMAND [ARG ...]",
        description="Run COMMAND and report the peak total PSS of it and all its descendants.")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON file to write, or a folder to write memory.json into (default: "
                        "DIR/memory.json when COMMAND has --out DIR)")
    return p


def _split_text(parts: dict[str, float]) -> str:
    text = f"{parts['pss_mb']:8.1f} MB"
    if "shmem_mb" in parts:
        text += (f" (anon {parts['anon_mb']:.1f}, shmem {parts['shmem_mb']:.1f}, "
                 f"file {parts['file_mb']:.1f})")
    return text


def _print_summary(report: dict) -> None:
    if report["num_processes"] == 0:
        print(f"memory: the command ended within {report['duration_s']:.2f}s, before its first "
              f"sample: nothing measured; exit code {report['exit_code']}")
        return
    print(f"memory: peak total PSS {_split_text(report['split_at_total_peak']).strip()} at "
          f"{report['peak_at_s']:.1f}s over {report['num_processes']} process(es), "
          f"{report['samples']} samples; exit code {report['exit_code']}")
    for proc in report["processes"]:
        print(f"  pid {proc['pid']:>7}  own peak {proc['peak_pss_mb']:8.1f} MB  at total peak "
              f"{_split_text(proc['at_total_peak'])}  {proc['command'][:60]}")
    loaded = report["load_peak_pss_mb"] > 0  # a sample before the first child process
    if loaded:
        print(f"memory: load-time peak (before the first child process) "
              f"{report['load_peak_pss_mb']:.1f} MB at {report['load_peak_at_s']:.1f}s")
    else:
        print("memory: no load-time peak: the command started a child process before the "
              "first sample")
    if report["peak_ram_mb"] is not None:
        print(f"memory: RAM (PSS outside shared memory + /dev/shm growth) peaked at "
              f"{report['peak_ram_mb']:.1f} MB" + (
                  f", {report['load_peak_ram_mb']:.1f} MB while loading"
                  if report["load_peak_ram_mb"] is not None else ""))
    if report["dataset_bytes"] is not None:
        print(f"memory: dataset {report['dataset_bytes'] / MB:.1f} MB; peak total PSS / dataset "
              f"= {report['peak_total_pss_per_dataset']:.2f}" + (
                  f"; load-time peak / dataset = {report['load_peak_pss_per_dataset']:.2f} "
                  f"(PSS), {report['load_peak_ram_per_dataset'] or float('nan'):.2f} (RAM)"
                  if loaded else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        if "-h" in argv or "--help" in argv:
            parser.parse_args(["--help"])
        parser.print_usage(sys.stderr)
        print("error: no command to measure; put it after --, e.g. "
              "python -m pyg_mgpu.memory -- python -m pyg_mgpu.distributed_sampling --out DIR",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if args.interval <= 0:
        print(f"error: --interval must be > 0 seconds; got {args.interval}", file=sys.stderr)
        return 2
    run_dir = run_dir_of(command)
    out = args.out or (run_dir / "memory.json" if run_dir else None)
    if args.out is not None:
        if args.out.is_dir():  # a run folder, as the training CLI's --out is
            out = args.out / "memory.json"
        if not out.parent.is_dir():
            print(f"error: --out {args.out}: folder {out.parent} does not exist; create it "
                  "or choose another path", file=sys.stderr)
            return 2
        try:  # refused now, not after the measured command has run
            check_writable(out.parent)
        except OSError as e:
            print(f"error: {cannot_write(out.parent, e)}", file=sys.stderr)
            return 2

    started = time.time()
    try:
        code, peaks, duration = measure(command, args.interval)
    except OSError as e:
        print(f"error: cannot run {command[0]!r} ({e.strerror}); check the command after --",
              file=sys.stderr)
        return 2
    dataset_bytes = dataset_bytes_of(run_dir, started) if run_dir else None
    report = {
        "command": command,
        "exit_code": code,
        "interval_s": args.interval,
        "duration_s": duration,
        **peaks.to_dict(),
        "run_dir": str(run_dir) if run_dir else None,
        "dataset_bytes": dataset_bytes,
        "peak_total_pss_per_dataset": peaks.total / dataset_bytes if dataset_bytes else None,
        "load_peak_pss_per_dataset": (peaks.load_total / dataset_bytes
                                      if dataset_bytes else None),
        "load_peak_ram_per_dataset": (peaks.load_ram / dataset_bytes
                                      if dataset_bytes and peaks.load_ram else None),
    }
    _print_summary(report)
    if out and out.parent.is_dir():
        try:
            save_json(report, out)
        except OSError as e:
            print(f"error: {cannot_write(out, e)} The measurement is printed above.",
                  file=sys.stderr)
            return code or 1
        print(f"memory: wrote {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
