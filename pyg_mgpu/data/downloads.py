"""Reading a dataset through its own library (PyG, OGB) without ever blocking or writing
where it must not: OGB's interactive prompts are answered in code, a read-only data folder (a
shared copy of the data) is mirrored into a cache where the libraries may write ``processed/``,
and a failed read or download becomes a :class:`~pyg_mgpu.data.validation.DatasetError` that says
which files were expected where and which flag points at them.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional
from unittest import mock

import torch

from pyg_mgpu.data.cache import CACHE_ENV
from pyg_mgpu.data.validation import DatasetArgumentError, DatasetError
from pyg_mgpu.files import save_json, wait_for_lock

# What reading raw files or a failed download raises (URLError and aiohttp's errors are OSErrors).
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, RuntimeError, zipfile.BadZipFile,
                zlib.error, pickle.UnpicklingError)


@contextmanager
def ogb_guards() -> Iterator[None]:
    """Patches OGB 1.3.6 so that it never waits on stdin and can reload its own cache."""
    # An outdated dataset prompts "Will you update the dataset now? (y/N)" and deletes the
    # folder on "y": answer no, keeping the user's files and never blocking.
    no_prompt = mock.patch("builtins.input", lambda prompt="": "n")
    # Its download asks for confirmation above 1 GB; naming the dataset is the confirmation.
    no_confirm = mock.patch("ogb.nodeproppred.dataset.decide_download", lambda url: True)
    # It pickles numpy arrays into processed/ and reloads them with torch.load's default,
    # which torch >= 2.6 turned into weights_only=True (which rejects them).
    full_unpickle = mock.patch("torch.load",
                               functools.partial(torch.load, weights_only=False))
    with no_prompt, no_confirm, full_unpickle:
        yield


def run_library(label: str, root: Path, folder: Path, expected: list[Path], url: str,
                 build: Callable[[Path], Any], reads: Optional[tuple[str, ...]] = None) -> Any:
    """Runs ``build(root)`` (a PyG or OGB constructor, which downloads missing raw files) and
    turns its failures into :class:`DatasetError`.

    Args:
        label: Dataset name for messages.
        root: The user's data folder.
        folder: The dataset's folder under ``root``, where the library writes ``processed/``.
        expected: Files (relative to ``root``) that make a download unnecessary.
        url: Where the library downloads from, for the message.
        build: Called with ``root``, or with a writable mirror of it.
        reads: The entries of ``folder`` the library reads, linked into a mirror (default:
            all but ``processed/``).
    """
    missing = [p for p in expected if not (root / p).is_file()]
    writable = _is_writable(folder)

    def missing_error(reason: str) -> DatasetError:
        return DatasetArgumentError(
            f"{label}: dataset files not found under {root.absolute()} (missing "
            f"{', '.join(map(str, missing))}) and {reason}. Fetch them on a machine with "
            "network access and pass {root=DIR}, where DIR holds "
            f"{', '.join(map(str, expected))}.")

    if missing and not writable:
        raise missing_error("the folder is read-only, so nothing was downloaded")
    created = _first_missing_ancestor(folder)
    # Folders already there, so that a failed download removes only those the library made.
    kept = _folders_under(folder) if missing and created is None else set()
    try:
        library_root = root if writable else _mirror(root, folder, reads)
        with _one_at_a_time(label, library_root):
            library_folder = library_root / folder.absolute().relative_to(root.absolute())
            recorded = _drop_stale_processed(label, library_folder)
            built = build(library_root)
            if not recorded:
                _record_sources(library_folder)
            return built
    except _READ_ERRORS as err:
        if missing:
            # The library makes its folders before downloading; left empty, they would pass
            # for a dataset folder at the next look (a test's skip check, a user's ls).
            _remove_empty_dirs(created if created is not None else folder, keep=kept)
            # Some files are there: the library read them and looked for the rest (OGB's
            # reader raises RuntimeError("No necessary file") for its count files).
            if isinstance(err, (FileNotFoundError, RuntimeError)) and len(missing) < len(expected):
                raise missing_error(f"the folder holds only some of them, so nothing was "
                                    f"downloaded ({type(err).__name__}: {err}); fetch the "
                                    f"missing files, or move {folder.absolute()} away to "
                                    "download the dataset whole") from err
            raise missing_error(f"the download from {url} failed "
                                f"({type(err).__name__}: {err})") from err
        raise DatasetError(f"{label}: could not read the files in {folder.absolute()} "
                           f"({type(err).__name__}: {err}); they may be truncated or "
                           "corrupt: fetch them again.") from err


@contextmanager
def _one_at_a_time(label: str, library_root: Path, poll_s: float = 0.2) -> Iterator[None]:
    """Holds ``label``'s lock in ``library_root`` while its library reads, downloads or
    processes it, so that processes sharing the folder (the machines of a torchrun job on a
    shared filesystem, two jobs on one machine) take turns: one writes ``processed/`` while
    the others wait, then read it. Without it, one could read a file another was rewriting,
    or remove a ``processed/`` another was writing.

    The lock is an ``flock`` on a file that the holder removes before it lets go, so that it
    leaves nothing in the folder; a waiter that then holds the lock of a removed file tries
    again. Where the file cannot be made or the filesystem has no locks, the read goes on
    without one. The wait polls, so a stop signal ends it.
    """
    path = library_root / f".pyg_mgpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.lock"

    @functools.cache  # said once, however many removed files the wait goes through
    def waiting() -> None:
        print(f"{label}: waiting for another process that is reading or preparing it in "
              f"{library_root} (it holds {path})", file=sys.stderr, flush=True)

    while True:
        try:
            library_root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # a folder we may not write in: nothing to take turns over
            yield
            return
        try:
            wait_for_lock(fd, fcntl.LOCK_EX, poll_s=poll_s, waiting=waiting)
        except OSError:  # no locks on this filesystem
            os.close(fd)
            yield
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before removed this file: lock the one there now
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


# What processed/ was made from (each source file's path, size and modification time), written
# into it once the library has read or made it.
SOURCES_STAMP = ".pyg_mgpu-sources.json"


def _drop_stale_processed(label: str, folder: Path) -> bool:
    """Removes the library's ``processed/`` under ``folder`` when the source files (under
    ``raw/`` or ``split/``) are not those it was made from: another set of paths, sizes or
    modification times than its :data:`SOURCES_STAMP` records, or, where it has none (made
    before pyg_mgpu read it), a source file newer than the oldest file in it. Returns whether
    ``processed/`` stays with a record of the files there now (nothing to record again).

    PyG and OGB read ``processed/`` whenever it is there and never look at the raw files
    again, so a changed raw file would be read as it was before (and a file fixed after an
    error would fail as before), even one replaced by an older copy (``cp -p``, an archive's
    files). Copies that keep modification times (``cp -a``, ``rsync -a``) keep ``processed/``.
    """
    processed = folder / "processed"
    outputs = [path for path in _files_under(processed) if path.name != SOURCES_STAMP]
    sources = _source_files(folder)
    if not outputs or not sources:
        return False
    try:
        recorded = json.loads((processed / SOURCES_STAMP).read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded is not None:
        stale = recorded != _stamp(folder, sources)
    else:
        stale = max(_mtime(path) for path in sources) > min(_mtime(path) for path in outputs)
    if not stale:
        return recorded is not None
    print(f"{label}: files under {folder} changed after {processed} was made from them; "
          "processing them again", file=sys.stderr)
    if processed.is_symlink():  # the folder lies elsewhere: empty it, keep the link
        for entry in processed.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    else:
        shutil.rmtree(processed)
    return False


def _record_sources(folder: Path) -> None:
    """Writes :data:`SOURCES_STAMP` into ``folder``'s ``processed/``, once the library has
    made or read it; where it cannot be written, the next run judges by modification times."""
    processed = folder / "processed"
    sources = _source_files(folder)
    if sources and processed.is_dir():
        with contextlib.suppress(OSError):
            save_json(_stamp(folder, sources), processed / SOURCES_STAMP)


def _source_files(folder: Path) -> list[Path]:
    return sorted(path for sub in ("raw", "split") for path in _files_under(folder / sub))


def _stamp(folder: Path, sources: list[Path]) -> list:
    """Each source file's path under ``folder``, size and modification time (ns)."""
    stamp = []
    for path in sources:
        st = path.stat()
        stamp.append([path.relative_to(folder).as_posix(), st.st_size, st.st_mtime_ns])
    return stamp


def _files_under(folder: Path) -> list[Path]:
    """The files under ``folder``, following links (a mirror links the user's folders)."""
    return [Path(top, name) for top, _, names in os.walk(folder, followlinks=True)
            for name in names]


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


def _folders_under(folder: Path) -> set[str]:
    return {top for top, _, _ in os.walk(folder.absolute())}


def _first_missing_ancestor(path: Path) -> Optional[Path]:
    """The outermost folder on the way to ``path`` that does not exist yet (None if it does)."""
    path = path.absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _remove_empty_dirs(top: Optional[Path], keep: set[str] = frozenset()) -> None:
    """Removes ``top`` and the folders under it that hold no files, but for those in ``keep``
    (absolute paths: folders that were there before); never removes a file."""
    if top is None or not top.is_dir():
        return
    for folder, _, _ in os.walk(top.absolute(), topdown=False):
        if folder not in keep:
            with contextlib.suppress(OSError):  # not empty: something was written, keep it
                os.rmdir(folder)


def _is_writable(path: Path) -> bool:
    """Whether files may be created in ``path`` (or, before it exists, its nearest parent).

    Root passes ``os.access`` everywhere, so the permission bits count too: a folder marked
    read-only (a shared copy of the data) stays untouched whoever runs.
    """
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def _mirror(root: Path, folder: Path, reads: Optional[tuple[str, ...]] = None) -> Path:
    """Mirrors a read-only ``folder`` under ``root`` into the cache and returns the new root.

    Every entry but ``processed/`` (or those named in ``reads``) is symlinked, not copied
    (OGB's raw files take many GB); the library then writes ``processed/`` in the cache.
    """
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pyg_mgpu")
    # One mirror per source folder, so two data folders never share processed files.
    cache_root = cache / hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16]
    mirror = cache_root / folder.relative_to(root)
    mirror.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        link = mirror / entry.name
        wanted = entry.name in reads if reads is not None else entry.name != "processed"
        if wanted and not link.is_symlink():
            with contextlib.suppress(FileExistsError):  # another machine sharing the cache
                link.symlink_to(entry.resolve())
    return cache_root
