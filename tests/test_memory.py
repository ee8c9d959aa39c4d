"""Tests for pyg_mgpu.tools.memory: the PSS reader, and peaks measured on small python children."""
import json
import mmap
import os
import sys
import textwrap

import psutil
import pytest

from pyg_mgpu.tools import memory
from pyg_mgpu.tools.memory import MB, main, read_pss, run_dir_of, tree_pss

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PSS is Linux-only")

# Python's own PSS, and the slack for page-table and allocator overhead around an allocation.
INTERPRETER_MB = 40


def test_pss_of_this_process_is_positive_and_at_most_rss():
    pss = read_pss(os.getpid())["pss"]
    assert 1 * MB < pss <= psutil.Process().memory_info().rss


def test_shared_memory_shows_up_under_shmem():
    before = read_pss(os.getpid())
    if "shmem" not in before:
        pytest.skip("this kernel's smaps_rollup has no Pss_Shmem line (Linux < 5.9)")
    shared = mmap.mmap(-1, 64 * MB)  # MAP_SHARED anonymous memory is shmem
    for _ in range(64):
        shared.write(b"x" * MB)
    grown = read_pss(os.getpid())["shmem"] - before["shmem"]
    shared.close()
    assert 63 * MB <= grown <= 65 * MB


def test_pss_falls_back_to_psutil_without_smaps_rollup(monkeypatch):
    real_open = open

    def no_rollup(path, *args, **kwargs):
        if str(path).endswith("smaps_rollup"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_rollup)
    assert read_pss(os.getpid()) == {"pss": pytest.approx(
        psutil.Process().memory_full_info().pss, rel=0.2)}


def test_pss_of_a_missing_process_is_none():
    assert read_pss(2 ** 22 + 1) is None  # above the kernel's pid_max limit
    assert tree_pss(2 ** 22 + 1) == {}


@pytest.mark.parametrize("command, expected", [
    (["train", "--out", "runs/a", "--epochs", "2"], "runs/a"),
    (["train", "--out=runs/b"], "runs/b"),
    (["train", "--epochs", "2"], None),
])
def test_run_dir_of(command, expected):
    found = run_dir_of(command)
    assert (str(found) if found else None) == expected


def run_memory(tmp_path, script: str, *args: str) -> tuple[int, dict]:
    out = tmp_path / "memory.json"
    code = main(["--interval", "0.05", "--out", str(out), "--",
                 sys.executable, "-c", textwrap.dedent(script), *args])
    return code, json.loads(out.read_text())


# Writes the bytes it holds (touched, so resident) as a run's metrics.json, like the trainer.
ALLOCATE = """
    import json, os, sys, time
    block = b"x" * (200 << 20)
    os.makedirs(sys.argv[2], exist_ok=True)
    with open(os.path.join(sys.argv[2], "metrics.json"), "w") as f:
        json.dump({"dataset_bytes": len(block)}, f)
    time.sleep(0.5)
    sys.exit(3)
"""


@pytest.mark.slow
def test_peak_of_a_200mb_child_its_exit_code_and_dataset_ratio(tmp_path):
    code, report = run_memory(tmp_path, ALLOCATE, "--out", str(tmp_path / "run"))
    assert code == 3 and report["exit_code"] == 3
    assert 200 <= report["peak_total_pss_mb"] < 200 + INTERPRETER_MB
    assert report["num_processes"] == 1
    assert report["processes"][0]["peak_pss_mb"] == pytest.approx(report["peak_total_pss_mb"])
    assert report["dataset_bytes"] == 200 * MB
    assert 1.0 <= report["peak_total_pss_per_dataset"] < 1.2
    if "anon_mb" in report["split_at_total_peak"]:
        assert report["split_at_total_peak"]["anon_mb"] >= 200  # a private copy


# A parent touches 200 MB and forks two children that keep it (copy-on-write, so the pages stay
# shared): the RSS of each of the three is ~200 MB, but their PSS adds up to one copy. (Forked
# private pages rather than shared memory because fork copies their page tables at once: a child
# faulting shared pages in during a sample would make the sample, read process by process,
# briefly count those pages twice.)
SHARED = """
    import os, time
    block = b"x" * (200 << 20)
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            time.sleep(0.6)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
"""


# 100 MB written into a /dev/shm file that no process maps: PSS never sees it, RAM must.
UNMAPPED_SHM = """
    import os, time
    path = f"/dev/shm/pyg_mgpu-test-{os.getpid()}"
    block = b"x" * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(100):
            f.write(block)
    time.sleep(0.6)
    os.unlink(path)
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_unmapped_dev_shm_files_count_in_ram_not_in_pss(tmp_path):
    if "shmem" not in read_pss(os.getpid()):
        pytest.skip("this kernel's smaps_rollup has no Pss_Shmem line (Linux < 5.9)")
    code, report = run_memory(tmp_path, UNMAPPED_SHM)
    assert code == 0
    assert report["peak_total_pss_mb"] < 60  # the interpreter alone
    assert 100 <= report["peak_ram_mb"] < 100 + report["peak_total_pss_mb"] + INTERPRETER_MB
    assert report["load_peak_ram_mb"] == report["peak_ram_mb"]  # no child: all of it loading


def test_a_sample_during_which_a_process_ended_is_taken_again(monkeypatch):
    # Listed alive, then gone by the end of the sample: its pages moved to the survivors
    # mid-sample, so the sample is retaken; a tree that keeps changing gives no sample.
    listings = iter([[1, 2, 3], [1, 2], [1, 2], [1, 2]])
    monkeypatch.setattr(memory, "_living_tree", lambda pid: next(listings))
    monkeypatch.setattr(memory, "read_pss", lambda pid: {"pss": pid * MB})
    assert memory.tree_pss(1) == {1: {"pss": MB}, 2: {"pss": 2 * MB}}
    changing = iter([[1, 2], [1], [1, 2], [1], [1, 2], [1]])
    monkeypatch.setattr(memory, "_living_tree", lambda pid: next(changing))
    assert memory.tree_pss(1, tries=3) == {}


@pytest.mark.slow
def test_shared_pages_are_counted_once_over_descendants(tmp_path):
    code, report = run_memory(tmp_path, SHARED)
    assert code == 0
    assert report["num_processes"] == 3
    assert 200 <= report["peak_total_pss_mb"] < 200 + INTERPRETER_MB
    parent, *children = report["processes"]
    assert all(child["peak_pss_mb"] < 120 for child in children), children
    assert report["dataset_bytes"] is None and report["peak_total_pss_per_dataset"] is None


def test_stale_metrics_from_an_earlier_run_are_ignored(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text('{"dataset_bytes": 5}')
    os.utime(run / "metrics.json", (0, 0))
    assert memory.dataset_bytes_of(run, since=1.0) is None
    assert memory.dataset_bytes_of(run, since=0.0) == 5


@pytest.mark.parametrize("argv, expected", [
    ([], "no command to measure"),
    (["python", "-c", "print(1)"], "put it after --"),  # the -- forgotten
    (["--interval", "0.1", "--"], "no command to measure"),
    (["--interval", "0", "--", "true"], "--interval must be > 0"),
    (["--", "/no/such/program"], "cannot run '/no/such/program'"),
    (["--out", "/no/such/dir/m.json", "--", "true"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: ") and expected in err


def test_an_unwritable_out_is_refused_before_the_command_runs(tmp_path, capsys):
    marker = tmp_path / "ran"  # /proc takes no new files, not even root's
    assert main(["--out", "/proc/m.json", "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out /proc: cannot write there") and "Traceback" not in err
    assert not marker.exists()


def test_a_folder_as_out_gets_memory_json(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "tree_pss", lambda pid: {})
    assert main(["--out", str(tmp_path), "--", "true"]) == 0
    assert json.loads((tmp_path / "memory.json").read_text())["exit_code"] == 0


def test_a_report_that_cannot_be_written_is_one_line_after_the_measurement(tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.setattr(memory, "tree_pss", lambda pid: {})

    def refuse(report, out):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(memory, "save_json", refuse)
    assert main(["--out", str(tmp_path / "m.json"), "--", "true"]) == 1
    captured = capsys.readouterr()
    assert "nothing measured" in captured.out
    assert captured.err.startswith(f"error: --out {tmp_path / 'm.json'}: cannot write there "
                                   "(No space left on device)")


@pytest.mark.parametrize("program, code", [("true", 0), ("false", 1)])
def test_a_command_that_ends_before_the_first_sample_is_reported(tmp_path, capsys, monkeypatch,
                                                                 program, code):
    monkeypatch.setattr(memory, "tree_pss", lambda pid: {})  # gone before it was sampled
    out = tmp_path / "m.json"
    assert main(["--out", str(out), "--", program]) == code
    assert "before its first sample: nothing measured" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["num_processes"] == 0 and report["exit_code"] == code


def test_a_command_whose_first_sample_holds_a_child_is_reported_without_a_load_peak(
        tmp_path, capsys, monkeypatch):
    # A wrapper (sh -c, torchrun) that starts its child before the first sample: no sample
    # shows the command alone, so there is no load-time peak to report.
    parts = {"pss": 10 * MB, "anon": 4 * MB, "shmem": 2 * MB, "file": 4 * MB}
    monkeypatch.setattr(memory, "tree_pss", lambda pid: {pid: parts, os.getpid(): parts})
    out = tmp_path / "m.json"
    assert main(["--out", str(out), "--", "sh", "-c", "sleep 0.5; exit 3"]) == 3
    printed = capsys.readouterr().out
    assert "no load-time peak: the command started a child process before the first sample" \
        in printed
    assert "RAM (PSS outside shared memory + /dev/shm growth) peaked at" in printed
    report = json.loads(out.read_text())
    assert report["exit_code"] == 3 and report["load_peak_ram_mb"] is None
    assert report["peak_total_pss_mb"] == 20


def test_help_is_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "--interval" in capsys.readouterr().out
