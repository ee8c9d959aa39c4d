"""A run's output folder: one run writes there at a time, and no run's checkpoint is lost to
another.

A run locks its folder for its whole life: an ``fcntl.flock`` on the file ``.lock`` there,
held by the launcher (or a torchrun job's rank 0) and by the rank that writes the outputs,
until each exits. The kernel drops a process's locks when it dies, however it dies, so a crash
leaves no stale lock behind; the file itself stays, empty of meaning, between runs. A second
run on a locked folder is refused. So is a run that would start afresh in a folder holding a
checkpoint, unless it continues that checkpoint (``--resume``) or was told to replace it
(``--overwrite``).

The claim takes the lock exclusively, which succeeds only while no process of any run holds
it, then keeps it shared, so that the run's own rank can hold it too (a spawned rank opens
the file anew; it inherits no descriptor from the launcher).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from pyg_mgpu.files import finite_json, remove_partial_writes, same_folder, wait_for_lock
from pyg_mgpu.train.checkpoint import CHECKPOINT, describe, not_a_checkpoint
from pyg_mgpu.train.config import TrainConfig

LOCK = ".lock"
# A process killed a moment ago holds its locks until the kernel has torn it down, and freeing
# a rank's memory takes a while: a claim waits this long for them before it refuses.
RELEASE_WAIT_S = 5.0
# Filesystems that take no locks (some network and parallel filesystems) answer with these.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class RunFolderError(ValueError):
    """The folder is in use by another run, or holds a checkpoint this run would replace."""


def _warn(sentence: str) -> None:
    print(f"warning: {sentence}", file=sys.stderr)


def _open_lock(folder: Path) -> int:
    # O_CLOEXEC: a process the run starts (a compile worker, a subprocess) must not keep the
    # lock after the run has ended.
    return os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)


def _holder(folder: Path) -> str:
    """Who holds the lock, as the run's launcher wrote it (``pid P on HOST since TIME``), and
    whether that launcher has ended (its ranks then still stop, or end), or ''."""
    try:
        text = (folder / LOCK).read_text().strip()
        pid, host = int(text.split()[1]), text.split()[3]
    except (OSError, ValueError, IndexError):
        return ""
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f" ({text}; that process has ended, its ranks have not yet)"
        except PermissionError:  # another user's live process
            pass
    return f" ({text})"


@contextlib.contextmanager
def claim_run_folder(out: Path, *, resume: Optional[str], overwrite: bool,
                     warn: Callable[[str], None] = _warn) -> Iterator[None]:
    """Holds ``out``'s lock for the body; before it starts, removes the partial files a killed
    writer left (``.checkpoint.pt.*.tmp``). With ``overwrite`` the previous checkpoint stays
    until the run has passed its checks and starts training (:func:`start_afresh`): a run
    refused for a typo in its flags loses nothing.

    Args:
        out: The run's output folder (it exists).
        resume: The folder this run continues from, if any (``--resume``, ``auto`` resolved).
        overwrite: Start afresh even where ``out`` holds a checkpoint (``--overwrite``).
        warn: Called with one sentence where the filesystem takes no locks.

    Raises:
        RunFolderError: another run holds the lock, or ``out`` holds a checkpoint that this
            run neither continues nor was told to replace.
    """
    fd = _open_lock(out)
    try:
        locked = _lock(fd, fcntl.LOCK_EX, out, warn, RELEASE_WAIT_S)
        if locked:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        _check_checkpoint(out, resume, overwrite)
        if locked:  # only then is no other run writing here
            remove_partial_writes(out)
            # Shared from here on: the run's rank takes it too; any other claim still fails.
            _lock(fd, fcntl.LOCK_SH, out, warn)
        yield
    finally:
        os.close(fd)  # releases the lock


def remove_if_unclaimed(folder: Path) -> None:
    """Deletes ``folder`` where it holds nothing, or nothing but a run's lock that no run
    holds: what a run refused, stopped or failed before it wrote anything leaves, at any point
    of its claim. Called while an error is on its way to the user: a folder it cannot read,
    lock or remove is left as it is, and that error goes on."""
    try:
        fd: Optional[int] = os.open(folder / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError:
        return
    try:
        if fd is not None:  # taken, so that no run claims the folder while it goes
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a run: BlockingIOError
        if {p.name for p in folder.iterdir()} <= {LOCK}:
            if fd is not None:
                (folder / LOCK).unlink()
            folder.rmdir()
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


# What a run, and the commands about it, write in its folder (docs/outputs.md): the earlier
# run's, which ``--overwrite`` removes. The checkpoint goes first.
PREVIOUS_RUN_FILES = (CHECKPOINT, "best.pt", "metrics.json", "history.csv", "curves.png",
                      "epoch_time.png", "memory.json")
PREVIOUS_RUN_FOLDERS = ("tensorboard", "predictions")


def start_afresh(out: Path, *, resume: Optional[str], overwrite: bool) -> None:
    """With ``overwrite``, deletes the previous run's outputs in ``out`` (for a run that does
    not continue it): called once the run's data is loaded and its ranks are about to train.
    So a later ``--resume`` never takes the earlier run's checkpoint for this run's own, and a
    run stopped before it wrote its own ``best.pt`` or ``metrics.json`` leaves none of the
    earlier run's beside its checkpoint (``pyg_mgpu.predict`` would pair them), nor its
    TensorBoard events under the new run's."""
    if not overwrite or _continues(out, resume):
        return
    for name in PREVIOUS_RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in PREVIOUS_RUN_FOLDERS:
        folder = out / name
        if folder.is_symlink():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)


def _lock(fd: int, kind: int, out: Path, warn, wait_s: float = 0.0) -> bool:
    """Takes the lock on ``fd``, waiting up to ``wait_s`` for its holders to end; False where
    the filesystem takes no locks."""
    try:
        if not wait_for_lock(fd, kind, wait_s):
            raise RunFolderError(f"--out {out} is in use by another run{_holder(out)}; wait "
                                 "for it to end, or choose another --out.")
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise
        warn(f"--out {out}: its filesystem takes no locks ({os.strerror(e.errno)}), so "
             "nothing stops another run from writing there at the same time.")
        return False
    return True


def _continues(out: Path, resume: Optional[str]) -> bool:
    """Whether the run continues the checkpoint in ``out`` itself."""
    return bool(resume) and same_folder(out, resume)  # out exists: a missing resume differs


def _check_checkpoint(out: Path, resume: Optional[str], overwrite: bool) -> None:
    path = out / CHECKPOINT
    if path.is_dir():  # neither continued, nor deleted by --overwrite
        raise RunFolderError(f"--out {out}: its {CHECKPOINT} is a folder, not a checkpoint; "
                             "move it away, or choose another --out.")
    if overwrite or _continues(out, resume) or not path.exists():
        return
    state, resumable = _describe(path)
    what = f"the checkpoint of an earlier run ({state})"
    afresh = "start afresh there with --overwrite (which deletes it), or choose another --out"
    # A file no run can continue from gets no --resume hint: that would only be refused.
    how = f"continue it with --resume {out} (or --resume auto), {afresh}" if resumable else afresh
    if resume:
        raise RunFolderError(f"--out {out} holds {what}, which this run, continuing "
                             f"--resume {resume}, would replace; {how}.")
    raise RunFolderError(f"--out {out} holds {what}; {how}.")


def _describe(path: Path) -> tuple[str, bool]:
    """Where the checkpoint in ``path`` stands, or that it cannot be read; and whether a run
    can continue from it."""
    try:
        import torch
        # weights_only: a file of unknown origin is read, not run, for a message.
        ckpt = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception:  # a torn, foreign or empty file: protected all the same
        return "unreadable", False
    if not_a_checkpoint(ckpt):
        return "not one pyg_mgpu wrote", False
    return describe(ckpt), True


@contextlib.contextmanager
def hold_run_folder(out: Path) -> Iterator[None]:
    """Holds ``out``'s lock, shared, for the body: the rank that writes the outputs keeps the
    folder locked should its launcher die first (a launcher killed with SIGKILL leaves its
    ranks to stop and write their checkpoint). Never refuses: the launcher decided."""
    fd = _open_lock(out)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def check_same_run(run_dir: Path, metrics: dict, ckpt: dict) -> None:
    """Refuses a run folder whose ``metrics.json`` and ``checkpoint.pt`` are of two runs.

    A run started afresh in the folder of a finished one (``--overwrite``) and stopped before
    its end has replaced ``checkpoint.pt`` (and ``best.pt``, once it validated), while
    ``metrics.json`` is still the earlier run's: its config would rebuild the earlier run's
    model and data around the later run's weights. One run's files agree on the settings a
    resumed run must share (``RESUME_MUST_MATCH``), on the data's fingerprint, and on their
    epochs: those the checkpoint recorded begin those ``metrics.json`` lists, or (a run resumed
    in its folder and stopped again) the other way round. Which run ``best.pt`` is of cannot
    be told for certain, so neither is chosen.

    Raises:
        ValueError: naming what differs and what to do.
    """
    before, after = metrics["config"], ckpt["config"]
    differ = [f"{key} ({before[key]!r} in metrics.json, {after[key]!r} in checkpoint.pt)"
              for key in TrainConfig.RESUME_MUST_MATCH
              if key in before and key in after and before[key] != after[key]
              # a file's path, which a resume may spell otherwise: the fingerprint compares it
              and not (key == "dataset" and str(before[key]).endswith(".npz"))]
    if (metrics.get("data_fingerprint") and ckpt.get("data_fingerprint")
            and metrics["data_fingerprint"] != ckpt["data_fingerprint"]):
        differ.append("the data's fingerprint")
    if not differ and not _same_epochs(metrics.get("epochs"), ckpt.get("history")):
        differ.append("their epochs (the same settings, trained again)")
    if differ:
        raise ValueError(
            f"{run_dir} holds files of two runs: metrics.json is of a run that finished, "
            "checkpoint.pt (and best.pt, once it validated) of another started there since "
            f"(with --overwrite) that did not finish; they differ in {'; '.join(differ)}. "
            f"Finish that run (python -m pyg_mgpu.distributed_sampling --resume {run_dir} "
            "with its flags), or move the files of the run to predict with into a folder of "
            "their own.")


def _same_epochs(listed, recorded) -> bool:
    """Whether ``metrics.json``'s epochs and a checkpoint's history are of one run: one
    begins the other. Both are compared as ``metrics.json`` holds them (:func:`finite_json`:
    a NaN loss is ``null`` there and ``nan`` in the checkpoint)."""
    if not isinstance(listed, list) or not isinstance(recorded, list):
        return True  # nothing to compare
    n = min(len(listed), len(recorded))
    return all(json.dumps(finite_json(a), sort_keys=True) ==
               json.dumps(finite_json(b), sort_keys=True)
               for a, b in zip(listed[:n], recorded[:n]))
