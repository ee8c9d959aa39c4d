"""Stop signals that reach the CLI's launcher while no rank runs: while it loads the data (before
any rank exists) and while it draws the figures (after every rank ended). Either way it ends with
its documented line and exit code, and leaves neither its /dev/shm copy of the graph nor a run
folder it made for itself.

The launcher runs as the CLI does, in its own session with SIGINT ignored (as ``cmd &``
starts it), with one step of its launch sequence held until the test has sent the signal.
"""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _processes import (group_members, ignore_sigint, kill_group, wait_for_exit,
                        wait_for_output, wait_until_gone)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--devices", "cpu", "--nprocs", "2", "--num-nodes", "2000", "--num-edges", "20000",
        "--num-features", "8", "--num-classes", "4", "--hidden", "16", "--batch-size", "128",
        "--epochs", "1"]

# The CLI's __main__, with one function of the launch sequence held: it prints `held`, waits
# for the file argv[2], then goes on. argv[1] names the function (module:attribute).
HOLDING = """
import importlib, sys, time
from pathlib import Path

from pyg_mgpu.distributed.host import exit_without_teardown
from pyg_mgpu.distributed_sampling import main

module_name, name = sys.argv[1].split(":")
module, go = importlib.import_module(module_name), Path(sys.argv[2])
real = getattr(module, name)

def held(*args, **kwargs):
    result = real(*args, **kwargs)
    print("held", flush=True)
    while not go.exists():
        time.sleep(0.05)
    return result

setattr(module, name, held)
exit_without_teardown(main(sys.argv[3:]))
"""


def start_holding(function: str, go: Path, argv: list, log: Path, hangup: str = "default"):
    """The CLI with ``function`` held (after it returned) until ``go`` exists. ``hangup``:
    SIGHUP at its default (a terminal's job) or ignored (``nohup``)."""
    def starting_state():
        ignore_sigint()
        signal.signal(signal.SIGHUP, signal.SIG_IGN if hangup == "ignored" else signal.SIG_DFL)
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-c", HOLDING, function, str(go), *argv],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, preexec_fn=starting_state)


def shm_copies(pid: int) -> list[str]:
    """The launcher's copies of the graph in /dev/shm."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"pyg_mgpu-graph-{pid}-*"))


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def signal_while_held(job, log: Path, go: Path, signum: int) -> tuple[int, str, list[str]]:
    """Sends ``signum`` to the launcher while its held step waits, then lets it go on; returns
    its exit code, its output and the /dev/shm copies it had before the signal."""
    try:
        wait_for_output(job, log, "held", timeout_s=120)
        copies = shm_copies(job.pid)
        members = group_members(job.pid)
        job.send_signal(signum)
        go.touch()  # the launcher goes on, whatever the signal did
        code = wait_for_exit(job, signal.Signals(signum).name, timeout_s=120)
        assert wait_until_gone(members, timeout_s=15) == [], "processes outlived the launcher"
    finally:
        kill_group(job.pid)
        job.wait()
    return code, log.read_text(errors="replace"), copies


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_while_the_data_loads_ends_cleanly(tmp_path, signum):
    # The graph is loaded and copied to /dev/shm; no rank exists yet.
    run, log, go = tmp_path / "run", tmp_path / "log.txt", tmp_path / "go"
    job = start_holding("pyg_mgpu.train.job:load_checked", go, ARGS + ["--out", str(run)], log)
    code, text, copies = signal_while_held(job, log, go, signum)
    name = signal.Signals(signum).name
    assert code == 128 + signum, text[-3000:]
    assert error_lines(text) == [f"error: stopped by {name}"], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert copies, "the test needs the graph copied to /dev/shm"
    assert shm_copies(job.pid) == [], "the graph's /dev/shm copy outlived the launcher"
    assert not run.exists(), "the run folder made for the stopped run is still there"


def test_a_hangup_while_the_data_loads_under_nohup_is_ignored(tmp_path):
    run, log, go = tmp_path / "run", tmp_path / "log.txt", tmp_path / "go"
    job = start_holding("pyg_mgpu.train.job:load_checked", go, ARGS + ["--out", str(run)], log,
                        hangup="ignored")
    code, text, _ = signal_while_held(job, log, go, signal.SIGHUP)
    assert code == 0, text[-3000:]
    assert (run / "metrics.json").is_file()
    assert shm_copies(job.pid) == []


def test_a_stop_while_the_figures_are_drawn_lets_the_run_complete(tmp_path):
    # Every rank has ended and written the run's outputs; the launcher draws the figures.
    run, log, go = tmp_path / "run", tmp_path / "log.txt", tmp_path / "go"
    job = start_holding("pyg_mgpu.train.plots:load_metrics", go, ARGS + ["--out", str(run)],
                        log)
    code, text, _ = signal_while_held(job, log, go, signal.SIGTERM)
    assert code == 0, text[-3000:]
    assert "pyg_mgpu: SIGTERM arrived as the ranks finished; the job completed" in text, text
    assert error_lines(text) == [], text[-3000:]
    assert (run / "curves.png").is_file() and (run / "epoch_time.png").is_file()
    assert shm_copies(job.pid) == [], "the graph's /dev/shm copy outlived the launcher"
