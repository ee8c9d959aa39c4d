"""The files layer-wise prediction writes: ``.npy`` arrays that every rank maps.

A layer's array is created whole by rank 0 under a hidden name (``.NAME.partial``), its disk
blocks reserved at once (``posix_fallocate``: a write into a mapped file on a full disk would
end the process with SIGBUS instead of an error); every rank writes its own rows through a
mapping, flushes them, and once all have, rank 0 syncs the file and renames it to ``NAME``.
A rename is atomic, so a file under its final name is always whole: that is what resuming
trusts, and a ``.partial`` file is never read.

Hidden layers may be stored in half precision. numpy has no bfloat16, so ``bfloat16`` rows
are stored as their bit patterns in ``uint16`` (:func:`decode` turns them back into floats;
``torch.from_numpy(a.view("int16")).view(torch.bfloat16)`` does the same outside pyg_mgpu).
bfloat16 keeps float32's range with an 8-bit mantissa; float16 (plain ``numpy.float16``, readable
by any tool) keeps 11 bits but overflows above 65504.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from numpy.lib.format import open_memmap
from torch import Tensor

# Storage of hidden layers, by name: the numpy dtype of the file.
HIDDEN_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# Filesystems that cannot reserve blocks answer with these; their writes are not reserved.
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def encode(rows: Tensor, dtype: str) -> np.ndarray:
    """Float rows as stored in a file of ``dtype`` (a :data:`HIDDEN_DTYPES` name, or the
    numpy dtype name of a float32 or int64 output)."""
    rows = rows.detach().cpu()
    if dtype == "bfloat16":
        return rows.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return rows.numpy().astype(dtype, copy=False)


def decode(rows: np.ndarray, dtype: str) -> Tensor:
    """Stored rows as float32 (``dtype``: how they were stored)."""
    if not rows.flags.writeable:  # a slice of a read-only mapping: torch wants its own copy
        rows = np.array(rows)
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(rows).view(np.int16)).view(
            torch.bfloat16).float()
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))


def partial(path: Path) -> Path:
    """Where ``path`` is written until it is whole."""
    return path.with_name(f".{path.name}.partial")


def create(path: Path, shape: tuple[int, ...], dtype) -> None:
    """Creates ``partial(path)`` as an ``.npy`` of ``shape`` with its blocks reserved.

    Raises:
        OSError: when the disk cannot hold it (ENOSPC) or the folder is not writable.
    """
    target = partial(path)
    array = open_memmap(target, mode="w+", dtype=dtype, shape=shape)
    del array  # the header is written; the rows are what the ranks write
    with open(target, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as e:
            if e.errno not in _NO_FALLOCATE:
                target.unlink()
                raise OSError(e.errno, f"cannot reserve {os.fstat(f.fileno()).st_size:,} bytes "
                              f"for {path.name} in {path.parent} ({e.strerror}); free space "
                              "there or choose another output folder") from None


def open_rows(path: Path, writable: bool = False) -> np.memmap:
    """A mapping of ``path`` (the partial file when ``writable``)."""
    return np.load(partial(path) if writable else path, mmap_mode="r+" if writable else "r")


def finalize(path: Path) -> None:
    """Makes ``partial(path)`` durable and renames it to ``path``, atomically."""
    fd = os.open(partial(path), os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial(path), path)
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Makes renames in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def is_partial(path: Path) -> bool:
    """Whether ``path`` is named as :func:`partial` names a file being written."""
    return path.name.startswith(".") and path.name.endswith(".partial")


def remove_partials(folder: Path) -> None:
    """Deletes what a killed writer left half-written in ``folder`` (one only predict writes)."""
    for path in folder.glob(".*.partial"):
        remove(path)


def is_whole(path: Path, shape: tuple[int, ...], dtype) -> bool:
    """Whether ``path`` is a finished array of ``shape`` and ``dtype``."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return array.shape == tuple(shape) and array.dtype == np.dtype(dtype)


def model_digest(model: torch.nn.Module) -> str:
    """A digest of the model's weights and buffers (resumed layers must come from them)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def node_digest(nodes: Optional[Tensor]) -> str:
    if nodes is None:
        return "all"
    return hashlib.sha256(nodes.cpu().numpy().astype(np.int64).tobytes()).hexdigest()


MANIFEST = "manifest.json"
# What every manifest predict writes records (Plan.manifest): a manifest.json without them is
# not one of its own.
MANIFEST_FIELDS = ("model", "num_nodes", "num_edges", "widths", "hidden_dtype", "nodes",
                   "outputs", "embeddings")


def read_manifest(folder: Path) -> Optional[dict]:
    """The manifest predict wrote in ``folder``, or None (none there, or a file of that name
    that predict did not write)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not all(k in manifest for k in MANIFEST_FIELDS):
        return None
    return manifest


def write_manifest(folder: Path, manifest: dict) -> None:
    target = partial(folder / MANIFEST)
    target.write_text(json.dumps(manifest, indent=2))
    os.replace(target, folder / MANIFEST)
    sync_folder(folder)
