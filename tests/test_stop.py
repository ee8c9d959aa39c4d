"""Stop signals and restarts: a stopped job leaves a checkpoint and no process, and the run
resumed from it (mid-epoch included) ends with the uninterrupted run's metrics.

The CLI runs in its own session with SIGINT ignored, as ``cmd &``, ``nohup`` and many batch
scripts start it; the signals land while epoch 2 trains.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from pyg_mgpu.distributed.devices import free_port
from pyg_mgpu.distributed.launch import launch_local
from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.train.checkpoint import CHECKPOINT

import _stop_ranks
from _processes import (default_sigint, group_members, ignore_sigint, kill_group,
                        wait_for_exit, wait_for_library, wait_for_output, wait_until_gone)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# 79 steps per epoch on each of 2 CPU ranks, a few seconds an epoch.
ARGS = ["--devices", "cpu", "--nprocs", "2", "--num-nodes", "20000", "--num-edges", "200000",
        "--batch-size", "64", "--hidden", "64", "--epochs", "3"]
CLI = [sys.executable, "-m", "pyg_mgpu.distributed_sampling"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("uninterrupted")
    assert main(ARGS + ["--out", str(out)]) == 0
    return json.loads((out / "metrics.json").read_text())


def assert_same_run(run_dir: Path, reference: dict) -> None:
    """The losses, accuracies and chosen model of an uninterrupted run, exactly."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in ("train_loss", "train_acc", "val_acc"):
        assert [e[key] for e in metrics["epochs"]] == [e[key] for e in reference["epochs"]], key
    for key in ("best_val_acc", "best_epoch", "test_acc"):
        assert metrics[key] == reference[key], key


def start(cmd: list, log: Path) -> subprocess.Popen:
    with log.open("w") as err:
        return subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, preexec_fn=ignore_sigint)


def read_checkpoint(run_dir: Path):
    """The checkpoint as it stands (None while there is none); atomic writes make any read
    whole."""
    try:
        return torch.load(run_dir / CHECKPOINT, weights_only=False, map_location="cpu")
    except FileNotFoundError:
        return None


def assert_stopped_in_epoch_2(ckpt: dict) -> None:
    """The checkpoint is the stop's: inside epoch 2, or after it (a stop during validation)."""
    where = ckpt["step"]["epoch"] if ckpt["step"] else ckpt["epoch"]
    assert where == 2, f"checkpoint at epoch {ckpt['epoch']}, step {ckpt['step']}"


def error_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines()
            if line.startswith("error:")]


@pytest.mark.parametrize("to", ["launcher", "process group"])
def test_sigterm_stops_with_a_checkpoint_and_the_resumed_run_matches(tmp_path, uninterrupted,
                                                                     to):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    job = start(CLI + ARGS + ["--out", str(run)], log)
    try:
        wait_for_output(job, log, "epoch 2:", timeout_s=120)
        members = group_members(job.pid)
        if to == "launcher":
            job.send_signal(signal.SIGTERM)  # kill PID, timeout, Kubernetes
        else:
            os.killpg(job.pid, signal.SIGTERM)  # Slurm, systemd, kill -- -PGID
        code = wait_for_exit(job, "SIGTERM", timeout_s=60)
        text = log.read_text(errors="replace")
        assert code == 128 + signal.SIGTERM, text[-3000:]
        assert wait_until_gone(members, timeout_s=10) == [], "processes outlived the stop"
    finally:
        kill_group(job.pid)
        job.wait()
    errors = error_lines(log)
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], text[-3000:]
    assert f"checkpoint {run / CHECKPOINT}" in errors[0] and f"--resume {run}" in errors[0]
    assert_stopped_in_epoch_2(read_checkpoint(run))
    assert main(ARGS + ["--resume", str(run)]) == 0
    assert_same_run(run, uninterrupted)


def test_launcher_killed_its_ranks_stop_by_themselves(tmp_path):
    # SIGKILL cannot be handled: the ranks see their parent die (parent-death signal, and their
    # watchdog) and stop as on a signal, with a checkpoint, although SIGINT was ignored.
    run, log = tmp_path / "run", tmp_path / "log.txt"
    job = start(CLI + ARGS + ["--out", str(run), "--grace-s", "20"], log)
    try:
        wait_for_output(job, log, "epoch 2:", timeout_s=120)
        ranks = [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
        job.send_signal(signal.SIGKILL)
        job.wait()
        assert wait_until_gone(ranks, timeout_s=15) == [], "ranks outlived their launcher"
        assert group_members(job.pid) == []
    finally:
        kill_group(job.pid)
    text = log.read_text(errors="replace")
    assert "SIGINT: stopped" in text or "SIGTERM: stopped" in text, text[-3000:]
    assert_stopped_in_epoch_2(read_checkpoint(run))


def test_sigterm_to_the_group_with_loader_workers_still_checkpoints(tmp_path):
    # The workers get the signal too; they leave stopping to their rank instead of dying.
    run, log = tmp_path / "run", tmp_path / "log.txt"
    job = start(CLI + ARGS + ["--out", str(run), "--num-workers", "2"], log)
    try:
        wait_for_output(job, log, "epoch 2:", timeout_s=120)
        members = group_members(job.pid)
        os.killpg(job.pid, signal.SIGTERM)
        code = wait_for_exit(job, "SIGTERM", timeout_s=60)
        assert code == 128 + signal.SIGTERM, log.read_text(errors="replace")[-3000:]
        assert wait_until_gone(members, timeout_s=10) == [], "processes outlived the stop"
    finally:
        kill_group(job.pid)
        job.wait()
    assert_stopped_in_epoch_2(read_checkpoint(run))


def test_a_hangup_to_the_group_stops_with_one_line(tmp_path):
    # The terminal closed: SIGHUP reaches every process of the job, multiprocessing's resource
    # tracker included, whose death made each rank print a warning and a traceback.
    run, log = tmp_path / "run", tmp_path / "log.txt"

    def from_a_terminal():  # SIGHUP handled, even where these tests run under nohup
        ignore_sigint()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with log.open("w") as err:
        job = subprocess.Popen(CLI + ARGS + ["--epochs", "100", "--out", str(run)], stdout=err,
                               stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                               preexec_fn=from_a_terminal)
    try:
        wait_for_output(job, log, "epoch 2:", timeout_s=120)
        members = group_members(job.pid)
        os.killpg(job.pid, signal.SIGHUP)
        code = wait_for_exit(job, "SIGHUP", timeout_s=60)
        assert wait_until_gone(members, timeout_s=10) == [], "processes outlived the stop"
    finally:
        kill_group(job.pid)
        job.wait()
    text = log.read_text(errors="replace")
    assert code == 128 + signal.SIGHUP, text[-3000:]
    assert "Traceback" not in text and "resource_tracker" not in text, text[-3000:]
    errors = error_lines(log)
    assert len(errors) == 1 and "stopped by SIGHUP" in errors[0], text[-3000:]
    assert read_checkpoint(run) is not None


def test_nohup_keeps_the_job_through_a_hangup(tmp_path):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    with log.open("w") as err:
        job = subprocess.Popen(CLI + ARGS + ["--out", str(run)], stdout=err,
                               stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                               preexec_fn=lambda: [signal.signal(s, signal.SIG_IGN)
                                                   for s in (signal.SIGINT, signal.SIGHUP)])
    try:
        wait_for_output(job, log, "epoch 2:", timeout_s=120)
        os.killpg(job.pid, signal.SIGHUP)  # the terminal closed
        wait_for_output(job, log, "epoch 3:", timeout_s=60)  # trains on
        job.send_signal(signal.SIGTERM)
        assert wait_for_exit(job, "SIGTERM", timeout_s=60) == 128 + signal.SIGTERM
    finally:
        kill_group(job.pid)
        job.wait()


def crash_after_step_checkpoint(cmd: list, run: Path, log: Path, epoch: int,
                                mid_walk_of: int = 1) -> dict:
    """Runs ``cmd`` until it writes a step checkpoint inside ``epoch`` (at a step that is not
    a multiple of ``mid_walk_of``), then kills its whole process group; returns the step."""
    job = start(cmd, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            ckpt = read_checkpoint(run)
            step = ckpt and ckpt["step"]
            if step and step["epoch"] == epoch and (mid_walk_of == 1 or
                                                    step["done"] % mid_walk_of):
                break
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        kill_group(job.pid)  # a crash or a reclaimed machine: no handler runs
        job.wait()
    finally:
        kill_group(job.pid)
    return read_checkpoint(run)["step"]


def test_step_checkpoint_after_a_crash_resumes_mid_epoch_exactly(tmp_path, uninterrupted):
    # A step checkpoint early in epoch 2, then the whole job dies at once.
    run = tmp_path / "run"
    step = crash_after_step_checkpoint(
        CLI + ARGS + ["--out", str(run), "--checkpoint-every-steps", "5"], run,
        tmp_path / "log.txt", epoch=2)
    assert step is not None and 0 < step["done"] < 79, "the last checkpoint is inside an epoch"
    assert len(step["totals"]) == 2 and all(t[2] > 0 for t in step["totals"])
    assert main(ARGS + ["--resume", str(run)]) == 0
    assert_same_run(run, uninterrupted)


def crash_and_resume_match_a_whole_run(tmp_path: Path, args: list, every: int,
                                       mid_walk_of: int = 1) -> None:
    """Runs ``args`` whole, then again killed after a step checkpoint inside epoch 2 (written
    every ``every`` steps, not at a multiple of ``mid_walk_of``) and resumed: the same run."""
    whole = tmp_path / "whole"
    assert main(args + ["--out", str(whole)]) == 0
    reference = json.loads((whole / "metrics.json").read_text())
    run = tmp_path / "run"
    step = crash_after_step_checkpoint(
        CLI + args + ["--out", str(run), "--checkpoint-every-steps", str(every)], run,
        tmp_path / "log.txt", epoch=2, mid_walk_of=mid_walk_of)
    assert 0 < step["done"] < 79 and (mid_walk_of == 1 or step["done"] % mid_walk_of)
    assert main(args + ["--resume", str(run)]) == 0
    assert_same_run(run, reference)


def test_resume_inside_a_walk_of_several_batches_is_exact(tmp_path):
    # --sample-batches 3 draws batches 3 at a time; a checkpoint inside a walk is drawn again
    # from the walk's start by the resumed run. Every 3rd step of the run (79 per epoch) puts
    # each of epoch 2's checkpoints at steps 2, 5, 8, ...: inside a walk, however many more the
    # job writes before it is killed.
    crash_and_resume_match_a_whole_run(tmp_path, ARGS + ["--sample-batches", "3"], every=3,
                                       mid_walk_of=3)


def test_resume_of_the_padded_step_is_exact(tmp_path):
    # --cuda-graph pads each batch to its rank's layout, which grows with the batches seen,
    # and dropout draws as many masks as the padded sizes hold: the checkpoint keeps each
    # rank's layout, so the resumed run pads (and draws) as the uninterrupted one did.
    crash_and_resume_match_a_whole_run(tmp_path, ARGS + ["--cuda-graph"], every=5)


def test_periodic_checkpoints_change_nothing(tmp_path, uninterrupted):
    assert main(ARGS + ["--out", str(tmp_path), "--checkpoint-every-steps", "7",
                        "--checkpoint-every-s", "0.2"]) == 0
    assert_same_run(tmp_path, uninterrupted)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["best.pt", CHECKPOINT]


def test_resume_auto_starts_fresh_then_continues(tmp_path, uninterrupted, capfd):
    assert main(ARGS[:-1] + ["2", "--out", str(tmp_path), "--resume", "auto"]) == 0
    assert "resumed from" not in capfd.readouterr().out  # nothing there yet: a fresh start
    assert main(ARGS + ["--out", str(tmp_path), "--resume", "auto"]) == 0
    assert f"resumed from {tmp_path}, after epoch 2" in capfd.readouterr().out
    assert_same_run(tmp_path, uninterrupted)
    assert main(ARGS + ["--out", str(tmp_path), "--resume", "auto", "--lr", "0.01"]) == 2
    assert "lr=0.003" in capfd.readouterr().err


def test_ctrl_c_while_torch_loads_is_one_line(tmp_path):
    # Ctrl-C in a terminal: SIGINT to the foreground job, here while it imports torch.
    log = tmp_path / "log.txt"
    with log.open("w") as err:
        job = subprocess.Popen(CLI + ARGS + ["--out", str(tmp_path / "run")], stdout=err,
                               stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                               preexec_fn=default_sigint)
    try:
        wait_for_library(job, "libtorch", timeout_s=60)
        job.send_signal(signal.SIGINT)
        code = wait_for_exit(job, "SIGINT", timeout_s=60)
    finally:
        kill_group(job.pid)
        job.wait()
    text = log.read_text(errors="replace")
    assert code == 128 + signal.SIGINT, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = error_lines(log)
    assert len(errors) == 1 and errors[0].startswith("error: stopped by SIGINT"), text[-3000:]


def test_resume_auto_needs_out(capfd):
    assert main(ARGS + ["--resume", "auto"]) == 2
    assert "--resume auto" in capfd.readouterr().err


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_restart_after_a_killed_worker_matches(tmp_path, uninterrupted):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1",
           "--monitor-interval", "0.5", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "pyg_mgpu.distributed_sampling",
           *ARGS[4:], "--devices", "cpu", "--out", str(run), "--resume", "auto",
           "--checkpoint-every-steps", "10"]
    job = start(cmd, log)
    try:
        deadline = time.monotonic() + 120
        while not ((ckpt := read_checkpoint(run)) and ckpt["step"] and
                   ckpt["step"]["epoch"] == 2):
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        workers = psutil.Process(job.pid).children()
        assert len(workers) == 2, workers
        workers[-1].send_signal(signal.SIGKILL)
        code = wait_for_exit(job, "the restart", timeout_s=180)
        text = log.read_text(errors="replace")
        assert code == 0, text[-4000:]
        assert "resumed from" in text
    finally:
        kill_group(job.pid)
        job.wait()
    assert_same_run(run, uninterrupted)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_sigterm_to_torchrun_stops_its_ranks_with_a_checkpoint(tmp_path):
    # torchrun forwards the signal to its ranks; it does not restart after one.
    run, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "-m", "pyg_mgpu.distributed_sampling", *ARGS[4:], "--devices", "cpu",
           "--out", str(run), "--grace-s", "20"]
    job = start(cmd, log)
    try:
        wait_for_output(job, log, "epoch 2:", timeout_s=120)
        members = group_members(job.pid)
        job.send_signal(signal.SIGTERM)
        code = wait_for_exit(job, "SIGTERM", timeout_s=60)
        text = log.read_text(errors="replace")
        assert code != 0, text[-3000:]
        assert wait_until_gone(members, timeout_s=10) == [], "processes outlived the stop"
    finally:
        kill_group(job.pid)
        job.wait()
    assert "error: stopped by SIGTERM; checkpoint" in text, text[-3000:]
    assert_stopped_in_epoch_2(read_checkpoint(run))


@pytest.mark.parametrize("shared", [True, False], ids=["shared memory", "gloo"])
def test_ranks_agree_on_the_step_to_stop_at(shared):
    steps = torch.zeros(2, dtype=torch.long).share_memory_()
    launch_local(_stop_ranks.agree_on_a_stop, [torch.device("cpu")] * 2,
                 args=(3, steps, shared))
    # Signalled during step 3 on rank 1 alone; the agreement is read one step later.
    assert steps.tolist() == [4, 4]


@pytest.mark.parametrize("target,grace_s,message,to", [
    ("sleep", 30, "stopped by SIGTERM", "launcher"),
    # Each rank gets the signal twice (from the group, then forwarded): cleanup goes on.
    ("sleep", 30, "stopped by SIGTERM", "process group"),
    ("ignore", 2, "stopped by SIGTERM (rank", "launcher"),  # ... had not ended within 2s ...
    # Rank 1 frozen (its watchdog cannot run): rank 0's watchdog ends it after the grace
    # period, and rank 1, killed by the launcher, is named too.
    ("ignore", 2, "stopped by SIGTERM (ranks 0, 1 had not ended", "launcher, rank 1 frozen"),
])
def test_spawn_stops_a_users_ranks(tmp_path, target, grace_s, message, to):
    log = tmp_path / "log.txt"
    job = start([sys.executable, str(REPO / "tests" / "_stop_ranks.py"), target, str(grace_s)],
                log)
    try:
        wait_for_output(job, log, "rank 0 ready", timeout_s=60)
        wait_for_output(job, log, "rank 1 ready", timeout_s=60)
        ranks = psutil.Process(job.pid).children()
        if to.endswith("rank 1 frozen"):
            os.kill(int(re.search(r"rank 1 ready \(pid (\d+)\)", log.read_text())[1]),
                    signal.SIGSTOP)
        started = time.monotonic()
        if to.startswith("launcher"):
            job.send_signal(signal.SIGTERM)
        else:
            os.killpg(job.pid, signal.SIGTERM)
        code = wait_for_exit(job, "SIGTERM", timeout_s=grace_s + 20)
        assert time.monotonic() - started < grace_s + 10
        assert code == 128 + signal.SIGTERM, log.read_text()
        assert f"JobStopped: {message}" in log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()
        if target == "ignore":
            assert f"had not ended within {grace_s}s" in log.read_text()
        assert wait_until_gone([p.pid for p in ranks], timeout_s=5) == []
    finally:
        kill_group(job.pid)
        job.wait()


@pytest.mark.parametrize("second", ["the same, delivered twice", "a second one"])
def test_a_repeated_signal_is_one_stop_and_a_second_one_cuts_the_grace_short(tmp_path,
                                                                              second):
    # GNU timeout signals the launcher, then its whole process group: one stop, delivered
    # twice. A second signal a while later kills the ranks at once: still a stop (143).
    log = tmp_path / "log.txt"
    job = start([sys.executable, str(REPO / "tests" / "_stop_ranks.py"), "ignore", "3"], log)
    try:
        wait_for_output(job, log, "rank 0 ready", timeout_s=60)
        wait_for_output(job, log, "rank 1 ready", timeout_s=60)
        job.send_signal(signal.SIGTERM)
        if second == "the same, delivered twice":
            time.sleep(0.1)  # long enough for the first to be handled, not to be coalesced
            os.killpg(job.pid, signal.SIGTERM)
        else:
            time.sleep(1.0)
            job.send_signal(signal.SIGTERM)
        code = wait_for_exit(job, "SIGTERM", timeout_s=60)
        assert code == 128 + signal.SIGTERM, log.read_text()
        within = re.search(r"had not ended within ([\d.]+)s", log.read_text())
        assert within, log.read_text()
        if second == "the same, delivered twice":
            assert float(within[1]) == 3  # the whole grace period
        else:
            assert 1 <= float(within[1]) < 3  # cut short by the second signal
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        kill_group(job.pid)
        job.wait()


@pytest.mark.parametrize("to", ["launcher", "process group"])
def test_a_stop_while_the_ranks_start_is_a_stop_not_a_failure(tmp_path, to):
    # The ranks are still unpickling their arguments (as a rank still importing would be):
    # no stop handler yet, so the signal ends them outright.
    log = tmp_path / "log.txt"
    job = start([sys.executable, str(REPO / "tests" / "_stop_ranks.py"), "slow_start", "30"],
                log)
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("rank starting") < 2:
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        if to == "launcher":
            job.send_signal(signal.SIGTERM)
        else:
            os.killpg(job.pid, signal.SIGTERM)
        code = wait_for_exit(job, "SIGTERM", timeout_s=60)
        assert code == 128 + signal.SIGTERM, log.read_text()
        assert "JobStopped: stopped by SIGTERM" in log.read_text()
        assert "killed by signal" not in log.read_text(), log.read_text()
    finally:
        kill_group(job.pid)
        job.wait()


@pytest.mark.parametrize("launcher", ["started the ranks", "still starting them"])
def test_ctrl_c_while_the_ranks_start_is_one_line_and_a_stop(launcher, tmp_path):
    # Ctrl-C reaches the whole process group while the ranks still unpickle their arguments
    # (as ranks still importing torch would): no KeyboardInterrupt traceback in them; they
    # hear the stop once their handlers exist and end before their function runs. Still
    # starting them (writing a rank's arguments), the launcher holds the signal: not lost.
    log = tmp_path / "log.txt"
    still = launcher == "still starting them"
    job = start([sys.executable, str(REPO / "tests" / "_stop_ranks.py"), "slow_start", "30",
                 "3"] + (["big"] if still else []), log)
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("rank starting") < (1 if still else 2):
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGINT)
        code = wait_for_exit(job, "SIGINT", timeout_s=60)
        text = log.read_text(errors="replace")
        assert code == 128 + signal.SIGINT, text
        assert "JobStopped: stopped by SIGINT" in text, text
        assert "Traceback" not in text and "killed" not in text, text
        assert "ready" not in text, text  # the rank function never started
    finally:
        kill_group(job.pid)
        job.wait()


def test_a_rank_whose_launcher_died_before_it_started_stops():
    # The launcher passes its pid: a rank that only starts watching after the launcher's death
    # (its parent is then another process) still stops, as on SIGTERM.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = ("import sys, time\n"
            "from pyg_mgpu.distributed import stop\n"
            f"stop.install_rank_handlers(5, launcher_pid={gone.pid})\n"
            "try:\n"
            "    time.sleep(60)\n"
            "except stop.StopSignal as e:\n"
            "    print('stopped by', e.signum)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.stdout.strip() == f"stopped by {int(signal.SIGTERM)}", done.stderr
