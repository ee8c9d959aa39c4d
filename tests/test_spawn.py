"""pyg_mgpu's public launcher: ranks with their context, a graph shared once, failures, torchrun."""
import faulthandler
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch_geometric.data import Data

import pyg_mgpu.distributed.process_group as process_group_module
import pyg_mgpu.distributed.watch as watch
from pyg_mgpu.data.csc import cached_csc
from pyg_mgpu.distributed.context import JobStopped, RankFailed
from pyg_mgpu.distributed.devices import free_port
from pyg_mgpu.distributed.launch import launch_local, spawn

import _exit_ranks
import _spawn_ranks


@pytest.mark.slow
def test_every_rank_gets_its_context():
    result = torch.full((2, 4), -1)  # not shared by the test: spawn shares plain tensors
    spawn(_spawn_ranks.record_context, args=(result,), devices="cpu", nprocs=2)
    assert result.tolist() == [[0, 2, 1, 1], [1, 2, 0, 1]]


@pytest.mark.slow
def test_a_data_argument_is_shared_with_its_csc_built_once():
    # Edges not sorted by destination: the CSC has to be built (once, in the parent).
    edge_index = torch.tensor([[0, 1, 2, 3, 0], [3, 2, 1, 0, 1]])
    data = Data(x=torch.zeros(4, 2), y=torch.arange(4), edge_index=edge_index)
    result = torch.zeros(2, 3, dtype=torch.bool)
    spawn(_spawn_ranks.check_shared_data, args=(data, result), devices="cpu", nprocs=2)
    assert result.all(), f"(shared tensors, CSC cached, CSC shared) per rank: {result.tolist()}"
    assert cached_csc(data) is not None and cached_csc(data).is_shared()
    assert data.x[:2, 0].tolist() == [100.0, 101.0], "a rank wrote into a private copy"


@pytest.mark.slow
def test_a_failed_rank_ends_the_job_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailed) as err:
        spawn(_spawn_ranks.raise_on_rank_one, devices="cpu", nprocs=2, timeout_s=120)
    message = str(err.value)
    assert "rank 1 failed" in message
    assert "Traceback" in message and "_fail_deep_inside" in message
    assert "ValueError: rank one gives up" in message
    assert time.monotonic() - start < 60



@pytest.mark.parametrize("wait_in_barrier", [False, True], ids=["peer returns", "peer waits"])
def test_a_rank_that_exits_before_its_function_returns_is_a_failure(wait_in_barrier):
    with pytest.raises(RankFailed) as err:
        spawn(_spawn_ranks.exit_quietly_on_rank_one, args=(wait_in_barrier,), devices="cpu",
              nprocs=2, timeout_s=120)
    assert str(err.value).startswith("rank 1 exited with code 0 before its function returned")


@pytest.mark.slow
def test_ranks_wait_for_rank0s_own_work_past_the_collective_timeout():
    # PyG's whole-graph inference runs on rank 0 alone after training: a peer waiting in a
    # collective timed out and failed the finished run.
    result = torch.zeros(2, 2, dtype=torch.long).share_memory_()
    spawn(_spawn_ranks.rank0_works_alone_past_the_timeout, args=(result,), devices="cpu",
          nprocs=2, timeout_s=1)
    assert result.tolist() == [[42, 2], [-1, 2]]


def test_ranks_that_end_at_the_same_moment_still_fail_the_job(tmp_path):
    # The watcher may first look when every rank has already ended: their exit codes count.
    outcome = watch.watch_ranks(_ended([3, 3]), watch.LauncherSignals(grace_s=2))
    assert outcome.first_failed == (0, 3)
    with pytest.raises(RankFailed, match="rank 0 exited with code 3"):
        watch.raise_for(outcome, 0, str(tmp_path), grace_s=2)


def test_ranks_their_watchdog_ended_stop_the_job_even_if_they_end_together(tmp_path):
    # Each rank's watchdog exits with 128 + SIGTERM after the grace period: a stop, not success.
    outcome = watch.watch_ranks(_ended([128 + signal.SIGTERM] * 2),
                                  watch.LauncherSignals(grace_s=2))
    with pytest.raises(JobStopped) as stopped:
        watch.raise_for(outcome, signal.SIGTERM, str(tmp_path), grace_s=2)
    assert stopped.value.signum == signal.SIGTERM
    assert stopped.value.killed_after_grace == [0, 1]


def _ended(exit_codes: list) -> list:
    """Processes that have all ended, each by ``os._exit(code)``, or killed by ``-code``."""
    def end(code):
        if code < 0:
            faulthandler.disable()  # a death on purpose: no "Fatal Python error" dump
            os.kill(os.getpid(), -code)
        os._exit(code)
    processes = [multiprocessing.get_context("fork").Process(target=end, args=(code,))
                 for code in exit_codes]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    return processes


def test_a_rank_killed_by_a_signal_is_named_before_the_peer_it_took_along(tmp_path):
    # Rank 1 SIGKILLed (the OOM killer); rank 0 reported the lost connection and exited before
    # the launcher looked: the cause is rank 1.
    (tmp_path / "rank0").write_text("1.0\nTraceback ...\nRuntimeError: Connection closed by peer")
    outcome = watch.watch_ranks(_ended([1, -signal.SIGKILL]),
                                  watch.LauncherSignals(grace_s=2))
    assert outcome.first_failed == (0, 1) and outcome.killed_by_signal == [1]
    with pytest.raises(RankFailed) as failed:
        watch.raise_for(outcome, 0, str(tmp_path), grace_s=2)
    assert str(failed.value).startswith("rank 1 was killed by signal SIGKILL")
    assert "then rank 0 failed: RuntimeError: Connection closed by peer" in str(failed.value)


def test_a_stop_is_a_completed_job_only_if_every_function_returned(tmp_path):
    # Ranks interrupted before their function ran exit 0 too (torch's wrapper swallows the
    # interrupt): without every rank's "done" the signal stopped the job.
    outcome = watch.watch_ranks(_ended([0, 0]), watch.LauncherSignals(grace_s=2))
    (tmp_path / "done0").touch()
    with pytest.raises(JobStopped):
        watch.raise_for(outcome, signal.SIGINT, str(tmp_path), grace_s=2)
    (tmp_path / "done1").touch()
    watch.raise_for(outcome, signal.SIGINT, str(tmp_path), grace_s=2)  # completed


def test_ranks_the_forwarded_signal_ended_outright_were_stopped_not_failed(tmp_path, capsys):
    # Before their handlers were installed, or after their work was done: the launcher's own
    # stop signal ended them. Done by both, the job completed; otherwise it stopped.
    signals = watch.LauncherSignals(grace_s=2)
    signals.signum = signal.SIGTERM
    outcome = watch.watch_ranks(_ended([0, -signal.SIGTERM]), signals)
    assert outcome.first_failed is None
    (tmp_path / "done0").touch()
    with pytest.raises(JobStopped) as stopped:
        watch.raise_for(outcome, signal.SIGTERM, str(tmp_path), grace_s=2)
    assert stopped.value.signum == signal.SIGTERM
    (tmp_path / "done1").touch()
    watch.raise_for(outcome, signal.SIGTERM, str(tmp_path), grace_s=2)  # completed
    assert "SIGTERM arrived as the ranks finished; the job completed" in capsys.readouterr().err
    # Another signal than the launcher's is a rank's failure.
    outcome = watch.watch_ranks(_ended([0, -signal.SIGKILL]), signals)
    with pytest.raises(RankFailed, match="rank 1 was killed by signal SIGKILL"):
        watch.raise_for(outcome, signal.SIGTERM, str(tmp_path), grace_s=2)


@pytest.mark.slow
def test_ranks_joining_later_than_the_collective_timeout_still_meet():
    # The rendezvous waits longer than the collectives' 1 s timeout: rank 1 comes 4 s late.
    result = torch.zeros(2).share_memory_()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_spawn_ranks.join_late_then_reduce,
                             args=(rank, init_method, 4.0, 1.0, result)) for rank in range(2)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(120)
    assert [rank.exitcode for rank in ranks] == [0, 0]
    assert result.tolist() == [2.0, 2.0]


def test_under_torchrun_fn_runs_in_this_process(monkeypatch):
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # Keep this test process's allocator and thread count as they are.
    tuned, budgets = [], []
    monkeypatch.setattr(process_group_module, "tune_cpu_allocator", lambda: tuned.append(True))
    monkeypatch.setattr(process_group_module, "set_thread_budget", budgets.append)
    seen = []

    def fn(ctx, data):
        seen.append((os.getpid(), ctx, data, dist.get_world_size()))

    data = Data(x=torch.zeros(3, 1), edge_index=torch.tensor([[0, 1], [1, 2]]))
    spawn(fn, args=(data,), devices="cpu", nprocs=4)  # nprocs: torchrun decides, ignored
    [(pid, ctx, received, group_size)] = seen
    assert pid == os.getpid() and received is data
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.device) == (0, 1, True,
                                                                    torch.device("cpu"))
    assert group_size == 1 and not dist.is_initialized(), "the group was not torn down"
    assert tuned == [True] and budgets == [1]


def test_devices_that_cannot_be_had_fail_before_spawning():
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        spawn(_spawn_ranks.record_context, devices="tpu")
    with pytest.raises(ValueError, match="at least 1 rank"):
        spawn(_spawn_ranks.record_context, devices="cpu", nprocs=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA sees none"):
            spawn(_spawn_ranks.record_context, devices="cuda")


def test_a_crash_after_every_rank_finished_its_work_does_not_fail_the_job(tmp_path, capsys):
    # Both functions returned and reported it; rank 1 then died in a library's teardown at
    # interpreter exit (SIGABRT). Nothing is lost: the launcher says so and succeeds.
    outcome = watch.watch_ranks(_ended([0, -signal.SIGABRT]), watch.LauncherSignals(grace_s=2))
    (tmp_path / "done0").touch()
    (tmp_path / "done1").touch()
    watch.raise_for(outcome, 0, str(tmp_path), grace_s=2)
    assert "rank 1 was killed by signal SIGABRT" in capsys.readouterr().err
    # Without rank 1's report its function did not finish: the job failed.
    (tmp_path / "done1").unlink()
    with pytest.raises(RankFailed, match="rank 1 was killed by signal SIGABRT"):
        watch.raise_for(outcome, 0, str(tmp_path), grace_s=2)


_EXIT_PROBE = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from pyg_mgpu.distributed.host import exit_without_teardown
out = Path(sys.argv[1])

class Teardown:
    def __del__(self):
        (out / "teardown").touch()

kept = Teardown()  # a module global: only the interpreter's teardown finalizes it
atexit.register((out / "atexit").touch)
threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").touch())).start()
pool = ThreadPoolExecutor(2)  # idle workers that are not daemons: they quit on threading's hooks
pool.submit(print, "flushed", end="").result()
{exit}(3)
"""


@pytest.mark.parametrize("exit", ["exit_without_teardown", "sys.exit"])
def test_an_exit_without_teardown_is_an_exit_less_the_modules_teardown(tmp_path, exit):
    ended = subprocess.run([sys.executable, "-c", _EXIT_PROBE.format(exit=exit), str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert (ended.returncode, ended.stdout) == (3, "flushed"), ended.stderr
    left = {p.name for p in tmp_path.iterdir()}
    # Exit handlers ran, a thread that is not a daemon was waited for, an idle pool's workers
    # were let go (the run would time out otherwise), output was flushed...
    assert {"atexit", "thread"} <= left
    # ... and only sys.exit's teardown finalized the module's objects.
    assert ("teardown" in left) == (exit == "sys.exit")


def test_an_exit_without_teardown_with_stdout_closed_keeps_its_exit_code():
    ended = subprocess.run(["bash", "-c", f"{sys.executable} -c 'from pyg_mgpu.distributed.host "
                            "import exit_without_teardown; exit_without_teardown(2)' >&-"],
                           capture_output=True, text=True, timeout=120)
    assert (ended.returncode, ended.stderr) == (2, "")


def test_a_failure_reported_with_stdout_closed_still_writes_its_report(tmp_path):
    probe = ("from pyg_mgpu.distributed.reports import reported\n"
             f"with reported({str(tmp_path)!r}, 3):\n"
             "    raise RuntimeError('the rank failed')\n")
    ended = subprocess.run(["bash", "-c", f"{sys.executable} -c \"$0\" >&-", probe],
                           capture_output=True, text=True, timeout=120)
    assert (ended.returncode, ended.stderr) == (1, "")
    assert "RuntimeError: the rank failed" in (tmp_path / "rank3").read_text()


@pytest.mark.slow
def test_ranks_skip_the_teardown_only_when_asked(tmp_path):
    for skip in (False, True):
        folder = tmp_path / str(skip)
        folder.mkdir()
        launch_local(_exit_ranks.mark_exit_and_teardown, [torch.device("cpu")] * 2,
                     args=(str(folder),), skip_teardown=skip)
        assert (folder / "atexit0").exists() and (folder / "atexit1").exists(), skip
        finalized = [(folder / f"teardown{rank}").read_text() == "finalized" for rank in (0, 1)]
        assert finalized == [not skip] * 2, skip


def test_a_launch_removes_the_report_folders_of_launchers_that_no_longer_exist(monkeypatch,
                                                                               tmp_path):
    # A job SIGKILLed as a whole (its process group) leaves its folder behind.
    import tempfile

    from pyg_mgpu.distributed.reports import REPORT_DIR_PREFIX, new_report_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    orphan = tmp_path / f"{REPORT_DIR_PREFIX}{int(ended.stdout)}-abc"
    live = tmp_path / f"{REPORT_DIR_PREFIX}{os.getppid()}-abc"
    unnamed = tmp_path / f"{REPORT_DIR_PREFIX}abc"
    for folder in (orphan, live, unnamed):
        (folder / "stop0").parent.mkdir()
        (folder / "stop0").write_text("15")
    made = new_report_dir()
    assert not orphan.exists() and live.exists() and unnamed.exists()
    assert os.path.basename(made).startswith(f"{REPORT_DIR_PREFIX}{os.getpid()}-")
    assert os.path.dirname(made) == str(tmp_path)


def test_what_a_new_process_cannot_start_is_refused_before_starting_any(monkeypatch):
    def nested(ctx):
        pass
    started = []
    monkeypatch.setattr("pyg_mgpu.distributed.launch.launch_local",
                        lambda *a, **k: started.append(a))
    for fn in (lambda ctx: None, nested):
        with pytest.raises(TypeError, match="define it with def at the top level of a .py"):
            spawn(fn, devices="cpu", nprocs=2)
    with pytest.raises(TypeError, match=r"for one argument, args=\(x,\)"):
        spawn(_spawn_ranks.record_context, args=Data(x=torch.ones(2)), devices="cpu")
    assert started == []
    spawn(_spawn_ranks.record_context, args=[1], devices="cpu")  # a list is a tuple here
    assert len(started) == 1
    # python - < script.py: each new process would run "<stdin>" again, whatever fn is
    monkeypatch.setattr(sys.modules["__main__"], "__file__", "<stdin>", raising=False)
    with pytest.raises(TypeError, match="the main script is read from <stdin>"):
        spawn(_spawn_ranks.record_context, args=[1], devices="cpu")
    assert len(started) == 1
