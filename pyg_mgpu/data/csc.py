"""One CSC copy per graph: built once, cached with the ``Data``, shared by every rank and loader.

A neighbour sampler walks each node's in-edges, so it needs the graph in CSC form (edges grouped
by destination). PyG's ``NeighborSampler`` converts ``edge_index`` again for every sampler it
builds, in every rank: that per-rank copy is why PyG's papers100M example asks for 200 GB of host
memory per GPU. Here the conversion runs once (in the parent, by :func:`share_data` or the first
sampler), the result rides along with the ``Data`` object (pickled to spawned ranks as
shared-memory handles), and every later sampler over the same ``Data`` reuses it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:  # a job's parent builds CSCs without PyG
    from torch_geometric.data import Data, HeteroData

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
        host_colptr: ``colptr`` in host memory, where ``colptr`` is a GPU's (a copy or a view
            of this host original), or None: the sampler's first hop plans there, from seeds
            the host holds, without waiting for the GPU.
        derived: What the samplers built from this CSC and keep with it, by key (the time
            order, the weights' forms: :func:`pyg_mgpu.sampling.sampling_graph.derived`);
            each entry has ``share_memory_()``.
        stamp: ``edge_index``'s :func:`edit_counts` when the CSC was cached with it.
    """

    colptr: Tensor
    row: Tensor
    perm: Optional[Tensor] = None
    edge_index: Optional[Tensor] = None
    host_colptr: Optional[Tensor] = None
    derived: dict = field(default_factory=dict, repr=False, compare=False)
    stamp: Optional[tuple] = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "stamp": stamp_to_copy(self.stamp, (self.edge_index,))}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.stamp = stamp_of_copy(self.stamp, (self.edge_index,))

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


EdgeChunks = Callable[[], Iterator[tuple[Tensor, Tensor]]]
"""A graph's edges as a sequence of (source, destination) chunks: each call starts a new pass.

The conversion below reads the edges twice (in-degrees first, then placement), one chunk at a
time, so an edge list that lives in a file or is generated on the fly never needs to be held
whole, and an in-memory one is only ever sliced (views), never copied."""

CHUNK_EDGES = 1 << 20
"""Edges per conversion step on the CPU: ~25 MB of temporaries whatever the graph's size (and
faster than larger steps, which sort outside the CPU caches)."""


def edge_chunks(src: Tensor, dst: Tensor, chunk: int = CHUNK_EDGES) -> EdgeChunks:
    """Views of an in-memory edge list, ``chunk`` edges at a time."""
    def chunks() -> Iterator[tuple[Tensor, Tensor]]:
        for start in range(0, src.numel(), chunk):
            yield src[start:start + chunk], dst[start:start + chunk]
    return chunks


def csc_from_chunks(chunks: EdgeChunks, num_nodes: int, *, keep_perm: bool = True,
                    device: Optional[torch.device] = None,
                    num_src_nodes: Optional[int] = None,
                    out_of_range_fix: str = "set data.num_nodes or fix the ids.") -> CSC:
    """Groups edges by destination with a two-pass counting sort over chunks.

    The result equals a global stable sort by destination (each node's in-edges keep their
    input order), but the largest temporaries are one chunk's, not the edge list's: the
    output (``row``: 4 bytes per edge where node ids fit in int32, ``perm`` when kept) is all
    that grows with the graph. ``perm`` is None when the edges already came sorted.

    ``num_src_nodes``: the count of source nodes where they are another type than the
    destinations (a heterogeneous edge type); default ``num_nodes``. ``out_of_range_fix``:
    what the error for an id out of range (one node type) tells the caller to do.

    Raises:
        ValueError: a node id lies outside ``[0, num_nodes)`` (sources: ``num_src_nodes``).
    """
    # Pass 1: in-degrees, range and whether the edges already come grouped.
    num_src = num_nodes if num_src_nodes is None else num_src_nodes
    counts = None
    num_edges, lo, hi, hi_src, is_sorted, last = 0, 0, -1, -1, True, None
    for src, dst in chunks():
        if counts is None:
            device = device or dst.device
            counts = torch.zeros(num_nodes, dtype=torch.long, device=device)
        if dst.numel() == 0:
            continue
        lo = min(lo, int(src.min()), int(dst.min()))
        hi, hi_src = max(hi, int(dst.max())), max(hi_src, int(src.max()))
        if lo < 0 or hi >= num_nodes or hi_src >= num_src:
            if num_src_nodes is None:  # one node type
                raise ValueError(f"edge_index holds node ids outside [0, {num_nodes}) (min "
                                 f"{lo}, max {max(hi, hi_src)}); {out_of_range_fix}")
            raise ValueError(f"edge_index holds node ids outside [0, {num_src}) for sources or "
                             f"[0, {num_nodes}) for destinations (min {lo}, max source "
                             f"{hi_src}, max destination {hi}); set each node type's num_nodes "
                             "or fix the ids.")
        if is_sorted:
            is_sorted = (last is None or int(dst[0]) >= last) and not (
                dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()))
            last = int(dst[-1])
        counts.index_add_(0, dst.to(device), torch.ones(1, dtype=torch.long,
                                                         device=device).expand(dst.numel()))
        num_edges += dst.numel()
    if counts is None:
        counts = torch.zeros(num_nodes, dtype=torch.long, device=device)
    colptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=counts.device)
    torch.cumsum(counts, 0, out=colptr[1:])
    del counts

    # Pass 2: each chunk's edges go to the next free slots of their destinations.
    row = torch.empty(num_edges, dtype=index_dtype(max(num_nodes, num_src)),
                      device=colptr.device)
    perm = (torch.empty(num_edges, dtype=index_dtype(num_edges), device=colptr.device)
            if keep_perm and not is_sorted else None)
    cursor = colptr[:-1].clone() if not is_sorted else None
    start = 0
    for src, dst in chunks():
        n = dst.numel()
        # int32 ids where they fit: the sort below is ~1.5x faster on them.
        src, dst = src.to(colptr.device, row.dtype), dst.to(colptr.device, row.dtype)
        if is_sorted:
            row[start:start + n] = src
        else:
            dst, order = torch.sort(dst, stable=True)
            # An edge's rank among the chunk's edges with the same destination.
            rank = torch.arange(n, device=dst.device) - torch.searchsorted(dst, dst)
            pos = cursor[dst] + rank
            row[pos] = src[order]
            if perm is not None:
                perm[pos] = (order + start).to(perm.dtype)
            cursor.index_add_(0, dst, torch.ones(1, dtype=torch.long,
                                                 device=dst.device).expand(n))
        start += n
    return CSC(colptr=colptr, row=row, perm=perm)


def build_csc(edge_index: Tensor, num_nodes: int, is_sorted: bool = False,
              transpose: bool = False, num_src_nodes: Optional[int] = None) -> CSC:
    """Converts ``[2, E]`` (source, destination) ids to CSC on ``edge_index``'s device.

    ``is_sorted=True`` promises that ``edge_index`` is already sorted by destination (PyG's
    meaning); it is checked, since a wrong promise would silently give wrong neighbours.
    ``transpose=True`` groups the edges by source instead (each node's out-edges, i.e. CSR),
    and ``row`` then holds destinations.
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got "
                         f"{tuple(edge_index.shape)}.")
    if edge_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"edge_index must hold int64 or int32 node ids, got {edge_index.dtype}.")
    src, dst = (edge_index[1], edge_index[0]) if transpose else (edge_index[0], edge_index[1])
    # On a GPU one chunk is fastest, and the memory is the GPU's.
    chunk = CHUNK_EDGES if not edge_index.is_cuda else max(1, dst.numel())
    csc = csc_from_chunks(edge_chunks(src, dst, chunk), num_nodes, device=edge_index.device,
                          num_src_nodes=num_src_nodes)
    if is_sorted and not transpose and csc.perm is not None:
        raise ValueError("is_sorted=True, but edge_index is not sorted by destination "
                         "(edge_index[1]); pass is_sorted=False.")
    csc.edge_index = edge_index
    return csc


STALE = ("stale",)  # the stamp of a structure whose inputs changed in place: never matches


def edit_counts(tensors: tuple) -> tuple:
    """``tensors``' edit counts: torch bumps a tensor's ``_version`` at every in-place change,
    so a structure built from tensors (a CSC from ``edge_index``, the time order from the
    timestamps) can tell that they changed in place since, as PyG, which builds them again for
    every sampler, always sees the graph as it is now. A copy (pickled to a spawned rank,
    deep-copied) counts afresh: the structures take the counts again as they are unpickled."""
    return tuple(map(_version, tensors))


def stamp_to_copy(stamp: Optional[tuple], tensors: tuple) -> Optional[tuple]:
    """A structure's stamp as a copy of it is made (pickled): :data:`STALE` where ``tensors``
    changed in place since it was taken, so that the copy is stale too."""
    return STALE if stamp is not None and stamp != edit_counts(tensors) else stamp


def stamp_of_copy(stamp: Optional[tuple], tensors: tuple) -> Optional[tuple]:
    """The stamp of a copy as it is unpickled: its own tensors' counts from now on, or
    :data:`STALE` as it was."""
    return stamp if stamp is None or stamp == STALE else edit_counts(tensors)


def _version(tensor: Optional[Tensor]) -> Optional[int]:
    try:
        return None if tensor is None else tensor._version
    except RuntimeError:  # an inference-mode tensor counts no edits (and takes none outside)
        return None


def attach_csc(data: Data, csc: CSC, transpose: bool = False) -> Data:
    """Caches ``csc`` with ``data`` (it must describe ``data.edge_index``, transposed or not)."""
    csc.stamp = edit_counts((csc.edge_index,))
    data.__dict__[_CACHE_KEYS[transpose]] = csc
    return data


def cached_csc(data: Data, transpose: bool = False,
               num_nodes: Optional[int] = None) -> Optional[CSC]:
    """The CSC cached with ``data``, if it still describes ``data.edge_index`` (and, where
    given, ``num_nodes`` pointer columns)."""
    csc = data.__dict__.get(_CACHE_KEYS[transpose])
    if csc is None:
        return None
    if csc.edge_index is not None and csc.edge_index is not data.get("edge_index"):
        return None  # edge_index was replaced since: stale
    if csc.stamp is not None and csc.stamp != edit_counts((csc.edge_index,)):
        return None  # edge_index was changed in place since: stale
    if num_nodes is not None and csc.num_nodes != num_nodes:
        return None  # nodes were added (or removed) since: stale
    return csc


def csc_of(data: Data, is_sorted: bool = False, transpose: bool = False) -> CSC:
    """``data``'s CSC (CSR with ``transpose``): the cached one, or built now on
    ``edge_index``'s device and cached."""
    csc = cached_csc(data, transpose, data.num_nodes)
    if csc is None:
        edge_index = data.get("edge_index")
        if edge_index is None:  # a graph without edges, as PyG's samplers take it
            edge_index = torch.empty(2, 0, dtype=torch.long)
        csc = build_csc(edge_index, data.num_nodes, is_sorted, transpose)
        attach_csc(data, csc, transpose)
    return csc


def drop_cached_csc(data: Data) -> Data:
    """Removes the cache from a batch (a shallow copy of the graph would otherwise carry it)."""
    for key in _CACHE_KEYS.values():
        data.__dict__.pop(key, None)
    return data


def edge_type_csc(data: HeteroData, edge_type: tuple, is_sorted: bool = False,
                  transpose: bool = False) -> CSC:
    """The CSC of one edge type of a ``HeteroData`` (destination nodes as columns; with
    ``transpose``, source nodes: its out-edges), cached with its edge store."""
    store = data[edge_type]
    src, dst = data[edge_type[0]].num_nodes, data[edge_type[-1]].num_nodes
    if transpose:
        src, dst = dst, src
    csc = cached_csc(store, transpose, dst)
    if csc is None:
        csc = build_csc(store.edge_index, dst, is_sorted, transpose, num_src_nodes=src)
        attach_csc(store, csc, transpose)
    return csc


def share_data(data: Data | HeteroData) -> Data | HeteroData:
    """Builds ``data``'s CSC (once; one per edge type of a ``HeteroData``) and moves every
    tensor, CSC included, to shared memory.

    Call it in the parent before starting ranks or DataLoader workers: they then map one copy
    of the graph instead of each building and holding their own. :func:`pyg_mgpu.spawn` calls
    it for every ``Data`` and ``HeteroData`` in its ``args``.

    Example:
        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(4, 8), edge_index=torch.tensor([[1, 2, 3], [0, 0, 0]]))
        >>> data = pyg_mgpu.share_data(data)
        >>> data.x.is_shared(), data.edge_index.is_shared()
        (True, True)
    """
    from torch_geometric.data import HeteroData

    if isinstance(data, HeteroData):
        cscs = [edge_type_csc(data, edge_type) for edge_type in data.edge_types]
        stores = data.stores
    else:
        cscs, stores = [csc_of(data)], [data]
    for store in stores:
        for value in store.values():
            if isinstance(value, Tensor) and not value.is_cuda:
                value.share_memory_()
    for csc in cscs:
        if not csc.row.is_cuda:
            csc.share_memory_()
            for structure in csc.derived.values():  # the time order, the weights' forms
                structure.share_memory_()
    return data
