"""A run's output folder: a second run there is refused while the first runs, a run that would
start afresh over another run's checkpoint is refused, and what a killed writer left is swept."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyg_mgpu.distributed.devices import free_port
from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.train.job import make_out_dir
from pyg_mgpu.train.checkpoint import CHECKPOINT
from pyg_mgpu.train import run_folder
from pyg_mgpu.train.run_folder import (RunFolderError, claim_run_folder, hold_run_folder,
                                       start_afresh)

from _processes import ignore_sigint, kill_group, wait_for_exit, wait_for_output

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pyg_mgpu.distributed_sampling"]
TINY = ["--num-nodes", "2000", "--num-edges", "20000", "--num-features", "8", "--num-classes",
        "4", "--hidden", "16", "--batch-size", "256", "--devices", "cpu", "--nprocs", "2"]


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def hand_made_checkpoint(folder: Path, epoch: int = 3) -> bytes:
    """A checkpoint as save_checkpoint lays it out (empty model), written to ``folder``."""
    from pyg_mgpu.train.config import TrainConfig
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"config": TrainConfig().to_dict(), "world_size": 2, "epoch": epoch,
                "step": None, "model": {}, "optimizer": {}, "history": [], "best": {},
                "rng": []}, folder / CHECKPOINT)
    return (folder / CHECKPOINT).read_bytes()


@pytest.mark.parametrize("content", [b"", b"torn", "foreign"])
def test_a_checkpoint_no_run_can_continue_is_protected_without_a_resume_hint(content,
                                                                               tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    if content == "foreign":  # another tool's pickle
        torch.save({"weights": torch.zeros(2)}, folder / CHECKPOINT)
    else:
        (folder / CHECKPOINT).write_bytes(content)
    with pytest.raises(RunFolderError) as refused:
        with claim_run_folder(folder, resume=None, overwrite=False):
            pass
    message = str(refused.value)
    assert "--overwrite" in message and "--resume" not in message, message
    assert ("not one pyg_mgpu wrote" if content == "foreign" else "unreadable") in message


@pytest.mark.slow
def test_a_run_over_another_runs_checkpoint_is_refused_unless_resumed_or_overwritten(
        tmp_path, capsys):
    run = tmp_path / "run"
    assert main(TINY + ["--epochs", "1", "--out", str(run)]) == 0
    before = (run / CHECKPOINT).read_bytes()
    capsys.readouterr()
    # The same command again (a preempted job restarted without --resume).
    assert main(TINY + ["--epochs", "1", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert error_lines(err) == [err.strip()], err
    for way_out in (f"--resume {run}", "--resume auto", "--overwrite"):
        assert way_out in err, err
    assert "after epoch 1" in err
    assert (run / CHECKPOINT).read_bytes() == before
    # A write killed mid-way left its temporary file; the resumed run sweeps it.
    partial = run / f".{CHECKPOINT}.k1ll3d00.tmp"
    partial.write_bytes(b"torn")
    assert main(TINY + ["--epochs", "2", "--resume", str(run)]) == 0
    assert not partial.exists()
    assert torch.load(run / CHECKPOINT, weights_only=False)["epoch"] == 2
    # --overwrite starts afresh: the new run's checkpoint, from its own first epoch.
    assert main(TINY + ["--epochs", "1", "--seed", "7", "--out", str(run), "--overwrite"]) == 0
    ckpt = torch.load(run / CHECKPOINT, weights_only=False)
    assert ckpt["epoch"] == 1 and ckpt["config"]["seed"] == 7


def test_a_run_continuing_elsewhere_keeps_outs_own_checkpoint(tmp_path, capsys):
    hand_made_checkpoint(tmp_path / "a")
    kept = hand_made_checkpoint(tmp_path / "b", epoch=5)
    assert main(TINY + ["--epochs", "9", "--resume", str(tmp_path / "a"),
                        "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "after epoch 5" in err and "--overwrite" in err, err
    assert (tmp_path / "b" / CHECKPOINT).read_bytes() == kept


@pytest.mark.slow
def test_a_second_run_on_a_folder_in_use_is_refused(tmp_path, capsys):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    with log.open("w") as f:
        first = subprocess.Popen(CLI + TINY + ["--epochs", "100000", "--out", str(run)],
                                 stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                 start_new_session=True, preexec_fn=ignore_sigint)
    try:
        wait_for_output(first, log, "epoch 2", timeout_s=120)
        assert main(TINY + ["--epochs", "1", "--seed", "1", "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert error_lines(err) == [err.strip()], err
        assert f"is in use by another run (pid {first.pid} on" in err, err
        first.send_signal(signal.SIGTERM)
        assert wait_for_exit(first, "SIGTERM", timeout_s=60) == 128 + signal.SIGTERM
    finally:
        kill_group(first.pid)
        first.wait()
    # The stopped run released the folder: its checkpoint can be continued.
    with claim_run_folder(run, resume=str(run), overwrite=False):
        pass


def test_a_killed_runs_lock_goes_with_it(tmp_path, monkeypatch):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from pyg_mgpu.train.run_folder import claim_run_folder; "
         "c = claim_run_folder(Path(sys.argv[1]), resume=None, overwrite=False); "
         "c.__enter__(); print('held', flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(run_folder, "RELEASE_WAIT_S", 0.0)
        with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {holder.pid}"):
            with claim_run_folder(tmp_path, resume=None, overwrite=False):
                pass
        monkeypatch.undo()
        holder.kill()  # SIGKILL: no code of the holder runs
        # Not reaped yet, maybe not torn down yet: the claim waits for the kernel to drop it.
        with claim_run_folder(tmp_path, resume=None, overwrite=False):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_the_writing_rank_keeps_the_folder_locked_after_its_launcher(tmp_path, monkeypatch):
    monkeypatch.setattr(run_folder, "RELEASE_WAIT_S", 0.0)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True).stdout.strip()
    (tmp_path / ".lock").write_text(f"pid {ended} on {socket.gethostname()} since 2026-12-01 "
                                    "10:00:00\n")  # the launcher, SIGKILLed
    with hold_run_folder(tmp_path):  # its rank 0, still stopping
        with pytest.raises(RunFolderError, match=f"pid {ended} on .*; that process has ended, "
                                                 "its ranks have not yet"):
            with claim_run_folder(tmp_path, resume=None, overwrite=False):
                pass
    with claim_run_folder(tmp_path, resume=None, overwrite=False):
        with hold_run_folder(tmp_path):  # the run's own rank, beside its launcher
            pass


def test_overwrite_deletes_the_previous_checkpoint_when_the_run_starts_afresh(tmp_path):
    hand_made_checkpoint(tmp_path)
    with claim_run_folder(tmp_path, resume=None, overwrite=True):
        assert (tmp_path / CHECKPOINT).exists()  # kept while the run may still be refused
        start_afresh(tmp_path, resume=None, overwrite=True)
        assert not (tmp_path / CHECKPOINT).exists()  # never named as this run's own
    hand_made_checkpoint(tmp_path)
    with claim_run_folder(tmp_path, resume=str(tmp_path), overwrite=True):
        start_afresh(tmp_path, resume=str(tmp_path), overwrite=True)
        assert (tmp_path / CHECKPOINT).exists()  # continued, not replaced


def test_overwrite_deletes_every_output_of_the_previous_run(tmp_path):
    # A new run stopped before it writes its own best.pt and metrics.json would otherwise
    # leave the earlier run's beside its checkpoint, and its TensorBoard events under its own.
    hand_made_checkpoint(tmp_path)
    earlier = ["best.pt", "metrics.json", "history.csv", "curves.png", "epoch_time.png",
               "memory.json", "tensorboard/events.out.tfevents.1", "predictions/logits.npy"]
    for name in earlier:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("the earlier run's")
    (tmp_path / "notes.txt").write_text("the user's")
    with claim_run_folder(tmp_path, resume=None, overwrite=True):
        start_afresh(tmp_path, resume=None, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "notes.txt"]


def test_a_folder_named_like_the_checkpoint_is_named_as_one_whatever_the_flags(tmp_path,
                                                                               capsys):
    (tmp_path / "run" / CHECKPOINT).mkdir(parents=True)
    run = str(tmp_path / "run")
    for flags in (["--out", run], ["--out", run, "--overwrite"], ["--resume", run],
                  ["--resume", "auto", "--out", run]):
        assert main(TINY + flags) == 2
        err = capsys.readouterr().err
        assert f"its {CHECKPOINT} is a folder, not a checkpoint; move it away" in err, flags
    assert (tmp_path / "run" / CHECKPOINT).is_dir()


@pytest.mark.parametrize("mistake", [["--dataset", "no-such-graph.npz"], ["--nprocs", "99"]])
def test_an_overwrite_refused_for_its_flags_keeps_the_checkpoint(mistake, tmp_path, capsys):
    saved = hand_made_checkpoint(tmp_path / "run")
    assert main(TINY + ["--out", str(tmp_path / "run"), "--overwrite", *mistake]) == 2
    assert len(error_lines(capsys.readouterr().err)) == 1
    assert (tmp_path / "run" / CHECKPOINT).read_bytes() == saved


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    import time
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261201-120000")
    folders = [make_out_dir(None) for _ in range(3)]
    assert [str(f) for f in folders] == ["runs/20261201-120000", "runs/20261201-120000-2",
                                         "runs/20261201-120000-3"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_refuses_a_folder_with_another_runs_checkpoint_on_every_rank(tmp_path):
    # Rank 0 decides; rank 1 learns the outcome instead of waiting for a peer that gave up.
    run, log = tmp_path / "run", tmp_path / "log.txt"
    kept = hand_made_checkpoint(run)
    with log.open("w") as f:
        job = subprocess.Popen(
            ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
             "--monitor-interval", "2",  # rank 1 has time to say why before it is stopped
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
             "-m", "pyg_mgpu.distributed_sampling", *TINY[:-4], "--devices", "cpu",
             "--epochs", "1", "--out", str(run)],
            stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        code = wait_for_exit(job, "rank 0 refused the folder", timeout_s=120)
    finally:
        kill_group(job.pid)
        job.wait()
    text = log.read_text(errors="replace")
    assert code != 0, text[-3000:]
    # Counted in the text, not by line: the two ranks write to one stream at the same moment.
    refusals = re.findall(r"error: --out \S+ holds the checkpoint of an earlier run", text)
    assert len(refusals) == 2, text[-3000:]  # rank 0's, and rank 1 told so
    assert (run / CHECKPOINT).read_bytes() == kept
    assert not os.path.exists(run / "metrics.json")
