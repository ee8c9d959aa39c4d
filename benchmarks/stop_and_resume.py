"""Stops a CLI run with SIGTERM in mid-epoch, resumes it, and checks it against a reference run.

    python benchmarks/stop_and_resume.py REFERENCE_RUN_DIR OUT_DIR -- CLI_FLAGS...

REFERENCE_RUN_DIR is an uninterrupted run with the same CLI flags (the GPU suite's
``graph_gpu`` step). The job starts in its own session with SIGINT ignored (as ``cmd &`` starts
it); once rank 0 shows epoch 2's progress, the launcher gets SIGTERM. Checked: exit code 143, no
process of the job left, a checkpoint; then ``--resume OUT_DIR`` must end with the reference's
losses, accuracies and test accuracy. Prints what it saw; exits 1 on any difference.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

CLI = [sys.executable, "-m", "pyg_mgpu.distributed_sampling"]


def _job_processes(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and \
                        "Z" not in (entry / "stat").read_text().split()[2]:
                    pids.append(int(entry.name))
            except (OSError, ProcessLookupError):
                pass
    return pids


def main(argv: list[str]) -> int:
    reference, out, flags = Path(argv[0]), Path(argv[1]), argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "stop.log"
    with log.open("w") as f:
        job = subprocess.Popen(CLI + flags + ["--out", str(out), "--overwrite"], stdout=f,
                               stderr=subprocess.STDOUT,
                               start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        while "epoch 2:" not in log.read_text(errors="replace"):
            if job.poll() is not None:
                print(f"the run ended before epoch 2 (exit {job.returncode})")
                return 1
            time.sleep(0.05)
        time.sleep(0.1)  # inside epoch 2 even where an epoch takes a second
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=120)
        time.sleep(2)
        left = _job_processes(job.pid)
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False, map_location="cpu")
    print(f"stopped: exit {code}, processes left {left}, checkpoint epoch {ckpt['epoch']} "
          f"step {ckpt['step'] and ckpt['step']['done']}")
    print([line for line in log.read_text(errors="replace").splitlines()
           if line.startswith("error:")])
    resumed = subprocess.run(CLI + flags + ["--resume", str(out)])
    if resumed.returncode != 0:
        print(f"the resumed run failed (exit {resumed.returncode})")
        return 1
    got = json.loads((out / "metrics.json").read_text())
    want = json.loads((reference / "metrics.json").read_text())
    same = {key: [e[key] for e in got["epochs"]] == [e[key] for e in want["epochs"]]
            for key in ("train_loss", "train_acc", "val_acc")}
    same["test_acc"] = got["test_acc"] == want["test_acc"]
    print(f"resumed run equals the reference: {same}")
    print(f"train_loss resumed  {[e['train_loss'] for e in got['epochs']]}")
    print(f"train_loss reference {[e['train_loss'] for e in want['epochs']]}")
    ok = code == 128 + signal.SIGTERM and not left and all(same.values())
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[3] != "--":
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
