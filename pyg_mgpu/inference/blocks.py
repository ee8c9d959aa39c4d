"""One batch of one layer: the destinations, all their in-edges, and their sources' rows.

A batch's destinations are either a contiguous range of node ids (every node of a layer, one
rank's shard a range at a time) or any list of ids (the requested nodes of the last layer, or
the nodes a layer computes for them). Where sources and destinations are of one node type, its
block numbers the destinations first, in their order, then the other sources in increasing id,
so that a self-loop stays a self-loop (row ``i`` is destination ``i``) and the rows read from a
layer file come in file order; an edge type between two node types numbers its sources alone.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

import numpy as np
import torch
from torch import Tensor

from pyg_mgpu.inference.store import decode


@dataclass
class Block:
    """A batch's bipartite block.

    Attributes:
        dst: The destinations: a ``(start, end)`` range of node ids, or their ids.
        others: Ids of the sources that are not destinations, increasing; they are rows
            ``num_dst..`` of the block (rows ``0..`` where ``shared`` is False).
        edge_index: ``[2, E]`` (source row, destination row) of every in-edge.
        shared: Whether sources and destinations are one node type, the destinations' rows
            coming first among the sources'.
    """
    dst: Union[tuple[int, int], Tensor]
    others: Tensor
    edge_index: Tensor
    shared: bool = True

    @property
    def num_dst(self) -> int:
        if isinstance(self.dst, tuple):
            return self.dst[1] - self.dst[0]
        return self.dst.numel()


# A batch's in-edges are capped so that its per-edge tensors (the gathered source rows and the
# messages, one row of the layer's width per edge) stay near this size however skewed the
# degrees: a batch of 4,096 nodes around a hub would otherwise hold every in-edge of the hub.
BLOCK_BYTES = 32 * 2**20


def batches(start: int, end: int, batch_size: int, max_edges: int,
            degrees: Callable[[int, int], Tensor]) -> Iterator[tuple[int, int]]:
    """``[b0, b1)`` pieces of ``[start, end)``: at most ``batch_size`` destinations and at most
    ``max_edges`` in-edges each (a destination with more is a batch of its own).
    ``degrees(b0, b1)``: the in-degrees of destinations ``b0..b1``."""
    b0 = start
    while b0 < end:
        b1 = min(b0 + batch_size, end)
        fits = int(torch.searchsorted(torch.cumsum(degrees(b0, b1), 0),
                                      torch.tensor(max_edges), right=True))
        b1 = b0 + max(1, fits)
        yield b0, b1
        b0 = b1


def in_edges(colptr: Tensor, row: Tensor, dst: Union[tuple[int, int], Tensor]
             ) -> tuple[Tensor, Tensor]:
    """(source id, destination position) of every in-edge of ``dst``, grouped by destination."""
    if isinstance(dst, tuple):
        start, end = dst
        e0, e1 = int(colptr[start]), int(colptr[end])
        degree = colptr[start + 1:end + 1] - colptr[start:end]
        positions = torch.repeat_interleave(torch.arange(end - start), degree, output_size=e1 - e0)
        return row[e0:e1].long(), positions
    first = colptr[dst]
    degree = colptr[dst + 1] - first
    total = int(degree.sum())
    positions = torch.repeat_interleave(torch.arange(dst.numel()), degree, output_size=total)
    before = torch.cumsum(degree, 0) - degree  # edges of the destinations before each
    offsets = torch.arange(total) - before[positions]
    return row[first[positions] + offsets].long(), positions


def make_block(colptr: Tensor, row: Tensor, dst: Union[tuple[int, int], Tensor],
               shared: bool = True) -> Block:
    """The block of ``dst``'s in-edges; ``shared``: sources and destinations are one type."""
    src, positions = in_edges(colptr, row, dst)
    if not shared:
        others, rows = torch.unique(src, return_inverse=True)
        return Block(dst, others, torch.stack([rows.view(-1), positions]), shared=False)
    if isinstance(dst, tuple):
        is_dst = (src >= dst[0]) & (src < dst[1])
        own = src - dst[0]
    else:  # the destinations are distinct: each source id is at most one of them
        sorted_dst, order = torch.sort(dst)
        at = torch.searchsorted(sorted_dst, src).clamp_(max=dst.numel() - 1)
        is_dst = sorted_dst[at] == src
        own = order[at]
    others, other_rows = torch.unique(src[~is_dst], return_inverse=True)
    block = Block(dst, others, torch.empty(0))
    local = torch.where(is_dst, own, 0)
    local[~is_dst] = block.num_dst + other_rows
    block.edge_index = torch.stack([local, positions])
    return block


class Rows:
    """The rows of a layer's input: the features (a tensor) or a layer file (an array),
    read as float32 a batch at a time.

    Args:
        source: The rows.
        dtype: How a layer file stores them (a :data:`~pyg_mgpu.inference.store.HIDDEN_DTYPES`
            name).
        ids: For a layer computed for some nodes only: their ids, increasing, one per row of
            ``source``; every node read must be among them.
    """

    def __init__(self, source: Union[Tensor, np.ndarray], dtype: Optional[str] = None,
                 ids: Optional[np.ndarray] = None):
        self.source, self.dtype, self.ids = source, dtype, ids

    def table(self) -> Optional[Tensor]:
        """Every row, numbered by node id, as one float32 tensor without a copy (the features,
        or a float32 layer file through its mapping); None where rows need decoding or are
        numbered otherwise."""
        if self.ids is not None:
            return None
        if isinstance(self.source, Tensor):
            return self.source if self.source.dtype == torch.float32 else None
        if self.dtype != "float32":
            return None
        with warnings.catch_warnings():  # a read-only mapping, never written through
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(self.source)

    def read(self, nodes: Union[tuple[int, int], Tensor]) -> Tensor:
        if self.ids is not None:  # the nodes' rows in a file of the needed nodes
            if isinstance(nodes, tuple):
                nodes = torch.arange(*nodes)
            nodes = torch.from_numpy(np.searchsorted(self.ids, nodes.numpy()))
        if isinstance(self.source, Tensor):
            x = (self.source[nodes[0]:nodes[1]] if isinstance(nodes, tuple)
                 else self.source.index_select(0, nodes.to(self.source.device)))
            return x.float().cpu()
        if isinstance(nodes, tuple):
            rows = self.source[nodes[0]:nodes[1]]
        else:
            rows = self.source[nodes.numpy()]
        return decode(rows, self.dtype)

    def block_rows(self, block: Block, own: Optional[Tensor] = None) -> Tensor:
        """The block's source rows: its destinations' (``own`` where already read), then the
        other sources'."""
        if not block.shared:
            return self.read(block.others)
        own = self.read(block.dst) if own is None else own.cpu()
        rows = own.new_empty((block.num_dst + block.others.numel(),) + own.shape[1:])
        rows[:block.num_dst] = own
        del own
        rows[block.num_dst:] = self.read(block.others)
        return rows
