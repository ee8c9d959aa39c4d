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


CHECKPOINT = "checkpoint.pt"


def check_resumable(cfg, world_size: int) -> dict:
    """Loads ``--resume``'s checkpoint and rejects one that belongs to a different run.

    Raises:
        ValueError: naming the missing file or the first setting that differs.
    """
    path = Path(cfg.resume) / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"--resume {cfg.resume}: no {CHECKPOINT} there; pass the --out folder "
                         "of a run that finished at least one epoch.")
    try:
        # mmap: the check reads the config, not the weights (each rank loads those itself).
        # To host memory: a GPU run's checkpoint must not open a CUDA context (or fail) here.
        ckpt = torch.load(path, weights_only=False, mmap=True, map_location="cpu")
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"--resume {cfg.resume}: {CHECKPOINT} is unreadable ({e}); it was not "
                         "written by pyg_mgpu, or the disk lost it.")
    saved = ckpt["config"]
    for key in cfg.RESUME_MUST_MATCH:
        now = list(getattr(cfg, key)) if key == "fanout" else getattr(cfg, key)
        if saved.get(key) != now:
            raise ValueError(f"--resume {cfg.resume}: the checkpoint was trained with "
                             f"{key}={saved.get(key)!r} but this run asks for {now!r}; use the "
                             "same settings.")
    if ckpt["world_size"] != world_size:
        raise ValueError(f"--resume {cfg.resume}: the checkpoint has {ckpt['world_size']} "
                         f"ranks but this run starts {world_size}; resume with the same count.")
    return ckpt
