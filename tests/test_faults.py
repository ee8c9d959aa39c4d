"""A failing rank ends the whole job quickly, names itself, and leaves no process behind.

The CLI tests run the real ``python -m pyg_mgpu.distributed_sampling`` in its own session (so its
process group can always be killed in cleanup) and, mid-epoch, SIGKILL a rank (as the kernel's OOM
killer would), SIGKILL one of a rank's loader workers, or SIGTERM the launcher (as ``timeout`` or a
batch system would; tests/test_stop.py checks what a stop leaves behind). Exceptions and
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
from pyg_mgpu.distributed.context import RankFailed
from pyg_mgpu.distributed.launch import launch_local

import _inference_ranks
from _processes import (group_members, ignore_sigint, kill, kill_group, rank_processes,
                        wait_for_exit, wait_for_output, wait_until_gone)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CPU2 = [torch.device("cpu")] * 2
# Big enough that an epoch lasts several seconds on 2 CPU ranks, small enough to build in ~2 s.
CLI_ARGS = ["--devices", "cpu", "--nprocs", "2", "--num-nodes", "200000",
            "--num-edges", "4000000", "--epochs", "50"]


@contextlib.contextmanager
def _training_cli_job(tmp_path: Path, extra_args=()):
    """Starts the CLI in its own session with SIGINT ignored (as ``cmd &`` and ``nohup`` start
    it), yields it once both ranks train, and always kills the session's process group
    afterwards, so nothing survives a failed assertion."""
    stderr = tmp_path / "stderr.txt"
    with (tmp_path / "stdout.txt").open("w") as out, stderr.open("w") as err:
        job = subprocess.Popen(
            [sys.executable, "-m", "pyg_mgpu.distributed_sampling", *CLI_ARGS, *extra_args,
             "--out", str(tmp_path / "run")],
            stdout=out, stderr=err, cwd=REPO, start_new_session=True,
            preexec_fn=ignore_sigint)
    try:
        wait_for_output(job, stderr, "epoch 1", timeout_s=120)
        yield job, stderr
    finally:
        kill_group(job.pid)  # the session's group: parent, ranks, helpers
        job.wait()


def test_cli_rank_killed_mid_epoch_ends_the_job(tmp_path):
    with _training_cli_job(tmp_path) as (job, stderr):
        parent = psutil.Process(job.pid)
        ranks = rank_processes(parent)
        assert len(ranks) == 2, f"expected 2 rank processes, found {ranks}"
        children = [p.pid for p in parent.children(recursive=True)]

        ranks[1].send_signal(signal.SIGKILL)  # what the kernel's OOM killer does
        code = wait_for_exit(job, "rank 1 was killed")
        log = stderr.read_text(errors="replace")
        assert code == 1, f"exit code {code}, expected 1:\n{log[-3000:]}"
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert errors and re.search(r"\brank 1\b.*\bSIGKILL\b", errors[-1]), log[-3000:]
        assert wait_until_gone(children, timeout_s=5) == [], "rank processes outlived the job"
        assert group_members(job.pid) == [], "processes of the job outlived it"
        assert not (tmp_path / "run" / "metrics.json").exists()
        # The error is the last line, also once the resource tracker (a child, gone now) has
        # unlinked the semaphores the killed ranks could not.
        log = stderr.read_text(errors="replace")
        assert log.rstrip().splitlines()[-1] == errors[-1], log[-3000:]


def test_cli_parent_terminated_takes_its_ranks_along(tmp_path):
    # SIGTERM to the launcher is what `timeout`, `kill` and a batch system's time limit send;
    # the job runs with SIGINT ignored, as `cmd &` and `nohup` start it.
    with _training_cli_job(tmp_path) as (job, _):
        children = [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
        job.send_signal(signal.SIGTERM)
        code = wait_for_exit(job, "SIGTERM", timeout_s=60)  # the grace period is 30 s
        assert code == 128 + signal.SIGTERM
        assert wait_until_gone(children, timeout_s=15) == [], "ranks outlived their parent"
        assert group_members(job.pid) == [], "processes of the job outlived it"


def test_cli_loader_worker_killed_ends_the_job(tmp_path):
    with _training_cli_job(tmp_path, ["--num-workers", "2"]) as (job, stderr):
        ranks = rank_processes(psutil.Process(job.pid))
        deadline = time.monotonic() + 30
        while len(workers := ranks[1].children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # DataLoader starts its workers one after another
        assert len(workers) == 2, f"expected rank 1's 2 loader workers, found {workers}"
        workers[0].send_signal(signal.SIGKILL)
        code = wait_for_exit(job, "a loader worker was killed")
        log = stderr.read_text(errors="replace")
        assert code == 1, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert errors and "rank 1 failed" in errors[-1], log[-3000:]
        assert re.search(rf"DataLoader worker \(pid {workers[0].pid}\) is killed by signal",
                         log), log[-3000:]
        assert wait_until_gone([p.pid for p in ranks], timeout_s=5) == []
        # A worker notices its rank's death at its next status check (every 5 s).
        assert group_members(job.pid) == [] or wait_until_gone(
            group_members(job.pid), timeout_s=10) == [], "processes of the job outlived it"
        # The loader's queues' semaphores, which the failed rank never unregistered, are
        # unlinked by the resource tracker (gone with the job) without a warning.
        log = stderr.read_text(errors="replace")
        assert "leaked semaphore" not in log, log[-3000:]


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
        assert wait_until_gone(pids.tolist(), timeout_s=5) == [], "a rank outlived the job"
    finally:
        kill([pid for pid in pids.tolist() if pid])


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
        assert wait_until_gone(pids.tolist(), timeout_s=5) == [], "a rank outlived the job"
    finally:
        kill([pid for pid in pids.tolist() if pid])
