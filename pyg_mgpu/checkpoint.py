"""Atomic writes: a crash mid-write never leaves a truncated file where a good one was."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, whole
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def save_torch(obj: Any, path: Path) -> Path:
    return _atomic_write(path, lambda f: torch.save(obj, f))


def save_json(obj: Any, path: Path) -> Path:
    return _atomic_write(path, lambda f: json.dump(obj, f, indent=2), mode="w")


def save_text(text: str, path: Path) -> Path:
    return _atomic_write(path, lambda f: f.write(text), mode="w")
