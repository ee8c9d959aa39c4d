"""Reading the arrays of an ``.npz`` file a piece at a time.

``np.load(path)["edge_index"]`` materialises the whole array, and an edge list stored as int64
takes 16 bytes per edge: for a 120M-edge graph that one array is larger than the converted graph.
:class:`NpzArray` reads any flat range of a member instead, straight from the file for the usual
uncompressed ``np.savez`` archive (each range is a seek and a read), or by decompressing forward
through a ``np.savez_compressed`` one. A seek skips the CRC check that zipfile makes on a
read to the end, so :meth:`NpzArray.check_crc` makes it for stored members.
"""
from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from pyg_mgpu.data.csc import CHUNK_EDGES, EdgeChunks

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip member's local file header (30 bytes)


class NpzArray:
    """One array of an ``.npz`` archive: its shape and dtype, and reads of flat ranges.

    Attributes:
        shape, dtype, fortran_order: As in the member's ``.npy`` header.
    """

    def __init__(self, path: Path, info: zipfile.ZipInfo):
        self.path, self.info = path, info
        with zipfile.ZipFile(path) as archive, archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            self.shape, self.fortran_order, self.dtype = read_header(f)
            self._header_bytes = f.tell()
        if self.dtype.hasobject:
            raise ValueError(f"member {info.filename} holds Python objects; store plain "
                             "numeric arrays")
        self._stored = info.compress_type == zipfile.ZIP_STORED

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def _open_stored(self, skip: int) -> BinaryIO:
        """The archive file, positioned ``skip`` bytes into a stored member's bytes."""
        f = open(self.path, "rb")
        f.seek(self.info.header_offset)
        fields = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
        f.seek(self.info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1] + skip)
        return f

    def _open_at(self, element: int) -> BinaryIO:
        """A file object positioned at flat element ``element`` of the array's data."""
        skip = self._header_bytes + element * self.dtype.itemsize
        if self._stored:  # the bytes lie as they are in the archive: seek straight to them
            return self._open_stored(skip)
        with zipfile.ZipFile(self.path) as archive:  # the member keeps the file open
            f = archive.open(self.info)
        f.seek(skip)  # decompresses up to there
        return f

    def check_crc(self, chunk_bytes: int = 1 << 24) -> None:
        """Checks a stored member's bytes against the CRC-32 the archive records for them (one
        read of the member, about 4 GB/s from the page cache). A compressed member needs no
        call: zipfile checks it whenever a read reaches the member's end, as every read of
        :func:`~pyg_mgpu.data.sources.load_npz` does.

        Raises:
            zipfile.BadZipFile: the bytes differ from those the archive was written with.
        """
        if not self._stored:
            return
        crc, left, buffer = 0, self.info.file_size, bytearray(chunk_bytes)
        with self._open_stored(0) as f:
            while left:
                view = memoryview(buffer)[:min(chunk_bytes, left)]
                if f.readinto(view) != len(view):
                    raise EOFError(f"member {self.info.filename} ends early: the file is "
                                   "truncated")
                crc, left = zlib.crc32(view, crc), left - len(view)
        if crc != self.info.CRC:
            raise zipfile.BadZipFile(f"member {self.info.filename}'s bytes do not match the "
                                     "CRC-32 the archive recorded for them")

    def iter_flat(self, start: int, count: int, chunk: int) -> Iterator[np.ndarray]:
        """Elements ``start:start + count`` of the flattened (file-order) array, ``chunk`` at a
        time, each a fresh native-byte-order array."""
        native = self.dtype.newbyteorder("=")
        with self._open_at(start) as f:
            done = 0
            while done < count:
                n = min(chunk, count - done)
                part = np.empty(n, self.dtype)  # read into it: one copy of the bytes, not two
                if f.readinto(part) != part.nbytes:
                    raise EOFError(f"member {self.info.filename} ends early: the file is "
                                   "truncated")
                yield part if part.dtype == native else part.astype(native)
                done += n

    def read_all(self) -> np.ndarray:
        """The whole array (for the small ones: labels, splits)."""
        parts = list(self.iter_flat(0, self.size, max(1, self.size)))
        flat = parts[0] if parts else np.empty(0, self.dtype.newbyteorder("="))
        return flat.reshape(self.shape, order="F" if self.fortran_order else "C")

    def edge_chunks(self, chunk: Optional[int] = None) -> EdgeChunks:
        """A ``[2, E]`` edge list's (source, destination) chunks, for the CSC conversion."""
        num_edges, chunk = self.shape[1], chunk or CHUNK_EDGES

        def c_order() -> Iterator[tuple[Tensor, Tensor]]:
            # Row 0 (sources) then row 1 (destinations): two streams read side by side.
            sources = self.iter_flat(0, num_edges, chunk)
            destinations = self.iter_flat(num_edges, num_edges, chunk)
            for src, dst in zip(sources, destinations):
                yield torch.from_numpy(src), torch.from_numpy(dst)

        def fortran_order() -> Iterator[tuple[Tensor, Tensor]]:
            for pairs in self.iter_flat(0, 2 * num_edges, 2 * chunk):  # (src, dst) interleaved
                pairs = torch.from_numpy(pairs)
                yield pairs[0::2].contiguous(), pairs[1::2].contiguous()

        return fortran_order if self.fortran_order else c_order

    def read_into(self, out: Tensor, chunk_bytes: int = 1 << 26) -> Tensor:
        """Reads a C-order array into ``out`` (same number of elements), converting the dtype
        a chunk at a time: a float64 file never becomes a float64 copy in memory."""
        flat = out.view(-1)
        if self.fortran_order:
            flat.copy_(torch.from_numpy(np.ascontiguousarray(self.read_all()).reshape(-1)))
            return out
        chunk = max(1, chunk_bytes // self.dtype.itemsize)
        start = 0
        for part in self.iter_flat(0, self.size, chunk):
            flat[start:start + part.size] = torch.from_numpy(part)
            start += part.size
        return out


def npz_members(path: Path) -> dict[str, zipfile.ZipInfo]:
    """The archive's arrays by key (``x`` for member ``x.npy``)."""
    with zipfile.ZipFile(path) as archive:
        return {info.filename[:-len(".npy")]: info for info in archive.infolist()
                if info.filename.endswith(".npy")}
