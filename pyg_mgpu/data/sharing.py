"""How a graph's tensors reach other processes without a copy: shared memory, checked first
for room, or the graph cache's files, mapped by every process that receives them.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch
from torch import Tensor

from pyg_mgpu.data.validation import DatasetError


def check_shm_room(name: str, need: int, shm_dir: str = "/dev/shm") -> None:
    """Raises :class:`DatasetError` when ``shm_dir`` cannot take ``need`` more bytes (writing
    past a full tmpfs kills the process with SIGBUS instead of raising)."""
    if os.path.isdir(shm_dir):
        free = shutil.disk_usage(shm_dir).free
        if free < need:
            raise DatasetError(
                f"{name}: shared memory ({shm_dir}) has {free / 2**20:.0f} MiB free but the "
                f"graph needs {need / 2**20:.0f} MiB; enlarge it (e.g. docker run --shm-size, "
                "or mount -o remount,size=... /dev/shm), or let the ranks map the graph "
                "cache's files instead (--features-on mmap).")


@dataclass(frozen=True)
class MappedFile:
    """A tensor stored raw in a file (the graph cache's layout): path, dtype name, shape."""

    path: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def map(self) -> Tensor:
        """Maps the file copy-on-write: nothing is read until touched, and every process
        mapping it shares the page cache's pages. The tensor goes to another process (a
        spawned rank or DataLoader worker) as this file, which the receiver maps again."""
        if self.numel == 0:
            return torch.empty(self.shape, dtype=self.torch_dtype)
        mapped = torch.from_file(self.path, shared=False, size=self.numel,
                                 dtype=self.torch_dtype).view(self.shape)
        mapped = mapped.as_subclass(MappedTensor)
        mapped.mapped_file = self
        return mapped

    def read_shared(self) -> Tensor:
        """Reads the file into a new shared-memory tensor."""
        t = torch.empty(self.shape, dtype=self.torch_dtype).share_memory_()
        if self.numel:
            with open(self.path, "rb") as f:
                f.readinto(t.view(-1).view(torch.uint8).numpy())
        return t


class MappedTensor(Tensor):
    """A tensor that maps a :class:`MappedFile`: an ordinary tensor in every operation (whose
    results are plain tensors, at no cost per call), sent to other processes as its file.

    torch would otherwise share it like any tensor, through a shared-memory descriptor, which a
    file mapping does not have ("Bad file descriptor" in the sending process).
    """

    mapped_file: MappedFile
    __torch_function__ = torch._C._disabled_torch_function_impl

    def __reduce_ex__(self, protocol):
        # pickle and torch.save write the data, as a plain tensor: torch.load(weights_only=True)
        # takes no tensor subclass. (Multiprocessing's pickler uses the reducer below.)
        return self.as_subclass(Tensor).__reduce_ex__(protocol)


def _reduce_mapped_tensor(tensor: MappedTensor):
    return MappedFile.map, (tensor.mapped_file,)


# Multiprocessing's pickler only (DataLoader workers, spawned ranks).
ForkingPickler.register(MappedTensor, _reduce_mapped_tensor)
