"""One CSC copy per graph: built once, cached with the ``Data``, shared by every rank and loader.

A neighbour sampler walks each node's in-edges, so it needs the graph in CSC form (edges grouped
by destination). PyG's ``NeighborSampler`` converts ``edge_index`` again for every sampler it
builds, in every rank: that per-rank copy is why PyG's papers100M example asks for 200 GB of host
memory per GPU. Here the conversion runs once (in the parent, by :func:`share_data` or the first
sampler), the result rides along with the ``Data`` object (pickled to spawned ranks as
shared-memory handles), and every later sampler over the same ``Data`` reuses it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

# Kept in the Data's __dict__ (not its storage), so PyG never slices, moves or lists it. The
# transposed graph (out-edges, for sample_direction="backward") has a cache of its own.
_CACHE_KEYS = {False: "_pyg_mgpu_csc", True: "_pyg_mgpu_csc_transposed"}


@dataclass
class CSC:
    """A graph's in-edges grouped by destination.

    Attributes:
        colptr: ``[N + 1]`` int64 pointers: node ``v``'s in-edges are positions
            ``colptr[v]:colptr[v + 1]``.
        row: ``[E]`` source node of each edge, grouped by destination (int32 whenever node ids
            fit: half the memory and bytes read per sampled edge).
        perm: ``[E]`` the caller's edge id (column of ``edge_index``) at each CSC position, or
            None when ``edge_index`` was already sorted by destination (ids are positions).
        edge_index: The ``edge_index`` this was built from (the cache's key), or None.
    """

    colptr: Tensor
    row: Tensor
    perm: Optional[Tensor] = None
    edge_index: Optional[Tensor] = None

    @property
    def num_nodes(self) -> int:
        return self.colptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.row.numel()

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.colptr, self.row, self.perm) if t is not None]

    def share_memory_(self) -> "CSC":
        for t in self.tensors():
            t.share_memory_()
        return self

    def is_shared(self) -> bool:
        return all(t.is_shared() or t.is_cuda for t in self.tensors())


def index_dtype(count: int) -> torch.dtype:
    """The narrowest integer type that holds every id below ``count`` (node or edge ids)."""
    return torch.int32 if count <= torch.iinfo(torch.int32).max else torch.int64


def build_csc(edge_index: Tensor, num_nodes: int, is_sorted: bool = False,
              transpose: bool = False) -> CSC:
    """Converts ``[2, E]`` (source, destination) ids to CSC on ``edge_index``'s device.

    ``is_sorted=True`` promises that ``edge_index`` is already sorted by destination (PyG's
    meaning), which skips the sort; it is checked, since a wrong promise would silently give
    wrong neighbours. ``transpose=True`` groups the edges by source instead (each node's
    out-edges, i.e. CSR), and ``row`` then holds destinations.
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got "
                         f"{tuple(edge_index.shape)}.")
    if edge_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"edge_index must hold int64 or int32 node ids, got {edge_index.dtype}.")
    src, dst = (edge_index[1], edge_index[0]) if transpose else (edge_index[0], edge_index[1])
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index holds node ids outside [0, {num_nodes}) (min "
                         f"{int(edge_index.min())}, max {int(edge_index.max())}); set "
                         "data.num_nodes or fix the ids.")
    perm = None
    if is_sorted and not transpose:
        if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
            raise ValueError("is_sorted=True, but edge_index is not sorted by destination "
                             "(edge_index[1]); pass is_sorted=False.")
    elif dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
        # A stable sort keeps each node's in-edges in the caller's order.
        perm = torch.sort(dst, stable=True).indices
        src = src.index_select(0, perm)
        perm = perm.to(index_dtype(perm.numel()))  # int32 halves it below 2^31 edges
    counts = torch.bincount(dst.long(), minlength=num_nodes)
    colptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    torch.cumsum(counts, 0, out=colptr[1:])
    return CSC(colptr=colptr, row=src.to(index_dtype(num_nodes)).contiguous(), perm=perm,
               edge_index=edge_index)


def attach_csc(data: Data, csc: CSC, transpose: bool = False) -> Data:
    """Caches ``csc`` with ``data`` (it must describe ``data.edge_index``, transposed or not)."""
    data.__dict__[_CACHE_KEYS[transpose]] = csc
    return data


def cached_csc(data: Data, transpose: bool = False) -> Optional[CSC]:
    """The CSC cached with ``data``, if it still describes ``data.edge_index``."""
    csc = data.__dict__.get(_CACHE_KEYS[transpose])
    if csc is None:
        return None
    if csc.edge_index is not None and csc.edge_index is not data.get("edge_index"):
        return None  # edge_index was replaced since: stale
    return csc


def csc_of(data: Data, is_sorted: bool = False, transpose: bool = False) -> CSC:
    """``data``'s CSC (CSR with ``transpose``): the cached one, or built now on
    ``edge_index``'s device and cached."""
    csc = cached_csc(data, transpose)
    if csc is None:
        if "edge_index" not in data:
            raise ValueError("the graph has no 'edge_index'; neighbour sampling needs one.")
        csc = build_csc(data.edge_index, data.num_nodes, is_sorted, transpose)
        attach_csc(data, csc, transpose)
    return csc


def drop_cached_csc(data: Data) -> Data:
    """Removes the cache from a batch (a shallow copy of the graph would otherwise carry it)."""
    for key in _CACHE_KEYS.values():
        data.__dict__.pop(key, None)
    return data


def share_data(data: Data) -> Data:
    """Builds ``data``'s CSC (once) and moves every tensor, CSC included, to shared memory.

    Call it in the parent before starting ranks or DataLoader workers: they then map one copy
    of the graph instead of each building and holding their own.
    """
    csc = csc_of(data)
    for key, value in data.items():
        if isinstance(value, Tensor) and not value.is_cuda:
            value.share_memory_()
    if not csc.row.is_cuda:
        csc.share_memory_()
    return data
