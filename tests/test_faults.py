"""A failing rank ends the whole job quickly, names itself, and leaves no process behind.

The CLI tests run the real ``python -m pyg_mgpu.distributed_sampling`` in its own session (so its
process group can always be killed in cleanup) and, mid-epoch, SIGKILL a rank (as the kernel's OOM
killer would) or SIGTERM the launcher (as ``timeout`` or a batch system would). Exceptions and
process-group timeouts are injected at the ``launch_local`` level: the trainer has no hook.
"""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from pyg_mgpu.data.synthetic import SyntheticSpec, make_synthetic
from pyg_mgpu.distributed.launch import RankFailed, launch_local

import _inference_ranks

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CPU2 = [torch.device("cpu")] * 2
# Big enough that an epoch lasts several seconds on 2 CPU ranks, small enough to build in ~2 s.
CLI_ARGS = ["--devices", "cpu", "--nprocs", "2", "--num-nodes", "200000",
            "--num-edges", "4000000", "--epochs", "50"]


def _alive(pids) -> list[int]:
    """The pids that still run (a zombie has finished: only its exit status is left)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_until_gone(pids, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(pids)


def _group_members(pgid: int) -> list[int]:
    """Live processes of a process group (the CLI's session: parent, ranks, their helpers)."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass
    return _alive(members)


def _kill(pids) -> None:
    for pid in _alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rank_processes(parent: psutil.Process) -> list[psutil.Process]:
    """The parent's rank processes in rank order (spawned one after another, rank 0 first);
    the multiprocessing resource tracker, also a child, is not one."""
    ranks = [p for p in parent.children()
             if any("spawn_main" in part for part in p.cmdline())]
    return sorted(ranks, key=lambda p: (p.create_time(), p.pid))


def _wait_for_training(job: subprocess.Popen, stderr: Path, timeout_s: float) -> None:
    """Returns once rank 0's tqdm bar for epoch 1 has drawn (the ranks are training)."""
    deadline = time.monotonic() + timeout_s
    while "epoch 1" not in stderr.read_text(errors="replace"):
        if job.poll() is not None:
            pytest.fail(f"the job ended before training (exit {job.returncode}):\n"
                        f"{stderr.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no 'epoch 1' progress within {timeout_s:.0f}s")
        time.sleep(0.2)


@contextlib.contextmanager
def _training_cli_job(tmp_path: Path):
    """Starts the CLI in its own session, yields it once both ranks train, and always kills the
    session's process group afterwards, so nothing survives a failed assertion."""
    stderr = tmp_path / "stderr.txt"
    with (tmp_path / "stdout.txt").open("w") as out, stderr.open("w") as err:
        job = subprocess.Popen(
            [sys.executable, "-m", "pyg_mgpu.distributed_sampling", *CLI_ARGS,
             "--out", str(tmp_path / "run")],
            stdout=out, stderr=err, cwd=REPO, start_new_session=True)
    try:
        _wait_for_training(job, stderr, timeout_s=120)
        yield job, stderr
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)  # the session's group: parent, ranks, helpers
        except ProcessLookupError:
            pass
        job.wait()


def _wait_for_exit(job: subprocess.Popen, what: str, timeout_s: float = 30) -> int:
    try:
        return job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the parent still runs {timeout_s:.0f}s after {what} (hang)")


def test_cli_rank_killed_mid_epoch_ends_the_job(tmp_path):
    with _training_cli_job(tmp_path) as (job, stderr):
        parent = psutil.Process(job.pid)
        ranks = _rank_processes(parent)
        assert len(ranks) == 2, f"expected 2 rank processes, found {ranks}"
        children = [p.pid for p in parent.children(recursive=True)]

        ranks[1].send_signal(signal.SIGKILL)  # what the kernel's OOM killer does
        code = _wait_for_exit(job, "rank 1 was killed")
        log = stderr.read_text(errors="replace")
        assert code == 1, f"exit code {code}, expected 1:\n{log[-3000:]}"
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert errors and re.search(r"\brank 1\b.*\bSIGKILL\b", errors[-1]), log[-3000:]
        assert _wait_until_gone(children, timeout_s=5) == [], "rank processes outlived the job"
        assert _group_members(job.pid) == [], "processes of the job outlived it"
        assert not (tmp_path / "run" / "metrics.json").exists()


def test_cli_parent_terminated_takes_its_ranks_along(tmp_path):
    # SIGTERM to the launcher is what `timeout`, `kill` and a batch system's time limit send.
    with _training_cli_job(tmp_path) as (job, _):
        children = [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
        job.send_signal(signal.SIGTERM)
        _wait_for_exit(job, "SIGTERM")
        # Spawned ranks get SIGINT when their parent dies (torch sets PR_SET_PDEATHSIG).
        assert _wait_until_gone(children, timeout_s=15) == [], "ranks outlived their parent"


def test_rank_raising_while_its_peer_blocks_in_allreduce():
    graph = make_synthetic(SyntheticSpec(num_nodes=500, num_edges=5000, num_features=8),
                           seed=0).share_memory_()
    pids = torch.zeros(2, dtype=torch.long).share_memory_()
    start = time.monotonic()
    try:
        with pytest.raises(RankFailed) as err:
            # Rank 1 raises before its 4th step; rank 0 runs that step's backward and waits in
            # DDP's gradient all-reduce for a peer that will never come.
            launch_local(_inference_ranks.raise_while_peer_trains, CPU2, args=(graph, pids, 3),
                         timeout_s=120)
        elapsed = time.monotonic() - start
        assert "rank 1" in str(err.value) and "injected failure mid-epoch" in str(err.value)
        assert elapsed < 30, f"the job took {elapsed:.0f}s to end after the failure"
        assert 0 not in pids.tolist(), "a rank never started"
        assert _wait_until_gone(pids.tolist(), timeout_s=5) == [], "a rank outlived the job"
    finally:
        _kill([pid for pid in pids.tolist() if pid])


def test_peer_that_never_arrives_times_out_the_collective():
    pids = torch.zeros(2, dtype=torch.long).share_memory_()
    timeout_s, sleep_s = 5, 120
    start = time.monotonic()
    try:
        with pytest.raises(RankFailed) as err:
            launch_local(_inference_ranks.sleep_past_the_timeout, CPU2, args=(pids, sleep_s),
                         timeout_s=timeout_s)
        elapsed = time.monotonic() - start
        # gloo raises in the waiting rank (0) once the timeout passes; the sleeper is terminated.
        assert "rank 0" in str(err.value), str(err.value)
        assert re.search(r"time[d ]?out", str(err.value), re.IGNORECASE), str(err.value)
        assert elapsed < 30, f"the job took {elapsed:.0f}s with a {timeout_s}s timeout"
        assert _wait_until_gone(pids.tolist(), timeout_s=5) == [], "a rank outlived the job"
    finally:
        _kill([pid for pid in pids.tolist() if pid])
