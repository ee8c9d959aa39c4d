"""Process bookkeeping for the fault and stop-signal tests: who is still alive, and waiting for
training to start."""
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest


def alive(pids) -> list[int]:
    """The pids that still run (a zombie has finished: only its exit status is left)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def wait_until_gone(pids, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (a job's session: parent, ranks, their helpers)."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass
    return alive(members)


def kill(pids) -> None:
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def rank_processes(parent: psutil.Process) -> list[psutil.Process]:
    """The parent's rank processes in rank order (spawned one after another, rank 0 first);
    the multiprocessing resource tracker, also a child, is not one."""
    ranks = [p for p in parent.children()
             if any("spawn_main" in part for part in p.cmdline())]
    return sorted(ranks, key=lambda p: (p.create_time(), p.pid))


def wait_for_output(job: subprocess.Popen, log: Path, text: str, timeout_s: float) -> None:
    """Returns once ``text`` is in ``log`` (rank 0's tqdm bar for ``epoch N``, say)."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if job.poll() is not None:
            pytest.fail(f"the job ended before {text!r} (exit {job.returncode}):\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {text!r} within {timeout_s:.0f}s:\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def wait_for_exit(job: subprocess.Popen, what: str, timeout_s: float = 30) -> int:
    try:
        return job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the parent still runs {timeout_s:.0f}s after {what} (hang)")


def ignore_sigint() -> None:
    """A child's starting state under ``cmd &`` or ``nohup``: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_sigint() -> None:
    """A terminal's foreground job's starting state: SIGINT at its default, whatever the test
    command started with (``nohup pytest &`` ignores it, and an ignored signal stays ignored
    through exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_library(job: subprocess.Popen, name: str, timeout_s: float) -> None:
    """Returns once ``job`` has mapped a shared library whose path holds ``name`` (``libtorch``:
    the process is inside ``import torch``)."""
    maps = Path(f"/proc/{job.pid}/maps")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if name in maps.read_text():
                return
        except OSError:  # exec'ing, or ended
            pass
        if job.poll() is not None:
            pytest.fail(f"the process ended before it loaded {name} (exit {job.returncode})")
        if time.monotonic() > deadline:
            pytest.fail(f"no {name} loaded within {timeout_s:.0f}s")
        time.sleep(0.01)
