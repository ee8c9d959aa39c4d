"""Files written atomically: a crash mid-write never leaves a truncated file where a good one
was, and readers see the old file or the new one, whole.

Every output of a run (checkpoints, ``metrics.json``, figures, reports) is written through
:func:`atomic_write`; :func:`remove_partial_writes` sweeps the temporary files of writers that
were killed before their rename.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Writes ``path`` through ``write(file)`` into a temporary file beside it
    (``.NAME.XXXXXXXX.tmp``), syncs it, renames it over ``path`` and syncs the folder."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            # mkstemp makes the file private (0600): give it the mode open() would have.
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, whole
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(path.parent)
    return path


def _sync_folder(folder: Path) -> None:
    """Makes a rename in ``folder`` durable: the data was synced before it, but the new
    directory entry lives in the folder, which a power cut may otherwise lose. Filesystems
    that cannot sync a folder (some network ones) are left as they are."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def same_folder(a, b) -> bool:
    """Whether two paths name one folder: through links too where both exist, else as written
    (made absolute)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def remove_partial_writes(folder: Path) -> list[Path]:
    """Deletes the temporary files of :func:`atomic_write` in ``folder``: a process killed
    mid-write (SIGKILL, a lost machine) leaves its temporary file behind. Only for a folder no
    live process writes to. Returns the paths deleted."""
    removed = []
    for path in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
            removed.append(path)
    return removed


def _umask() -> int:
    mask = os.umask(0o022)  # reading it means setting it: put it straight back
    os.umask(mask)
    return mask


def save_json(obj: Any, path: Path) -> Path:
    """``obj`` as JSON in ``path``, atomically, every non-finite float (a diverged run's NaN
    loss) written as ``null``: JSON has no NaN or infinity, and strict readers (``jq``,
    JavaScript's ``JSON.parse``) refuse the ``NaN`` Python's ``json`` writes by default."""
    return atomic_write(path, lambda f: json.dump(finite_json(obj), f, indent=2, allow_nan=False),
                        mode="w")


def finite_json(obj: Any) -> Any:
    """``obj`` as :func:`save_json` writes it: every non-finite float ``None``, tuples lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite_json(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(value) for value in obj]
    return obj


def save_text(text: str, path: Path) -> Path:
    return atomic_write(path, lambda f: f.write(text), mode="w")


def check_writable(folder: Path) -> None:
    """Raises the ``OSError`` of creating a file in ``folder`` (an unnamed one, gone at once),
    so that a command refuses an output folder before its work rather than after."""
    tempfile.TemporaryFile(dir=folder).close()


def cannot_write(out: Path, error: OSError) -> str:
    """The one-line refusal of an output folder the commands cannot create or write into."""
    return f"--out {out}: cannot write there ({error.strerror}); choose a writable folder."


def wait_for_lock(fd: int, kind: int, wait_s: float = math.inf, poll_s: float = 0.1,
                  waiting: Callable[[], None] = lambda: None) -> bool:
    """Takes the ``flock`` ``kind`` on ``fd``, polling rather than blocking so that a stop
    signal ends the wait; ``waiting`` is called when the first try finds it held. Returns False
    where it is still held after ``wait_s``.

    Raises:
        OSError: the filesystem takes no locks (``ENOLCK``, ``EOPNOTSUPP`` and the like).
    """
    deadline = time.monotonic() + wait_s
    first = True
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            if first:
                waiting()
                first = False
            time.sleep(poll_s)
