"""Temporal neighbour sampling, as PyG defines it (``time_attr``, ``input_time``,
``temporal_strategy``) for pyg-lib: a neighbour is eligible when its timestamp (the node's, or
the edge's) is at most its tree's seed time, and every seed grows its own tree (``disjoint``).

The CSC is re-sorted once by time inside each destination's run, so a node's eligible in-edges
are a prefix of its run: a binary search per frontier node finds the prefix's end, and the
draws of :mod:`pyg_mgpu.sampling.draws` pick from it, uniformly (``"uniform"``), or its last
``fanout`` edges, the most recent (``"last"``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_mgpu.data.csc import CSC, index_dtype
from pyg_mgpu.gpu_path import takes_gpu_path

STRATEGIES = ("uniform", "last")


@dataclass
class TemporalCSC:
    """A CSC whose runs are sorted by time, with each position's timestamp.

    Attributes:
        row: Source node of each position (the CSC's ``row``, re-sorted).
        perm: The caller's edge id at each position.
        end_time: ``end_time[e]`` is the timestamp of position ``e - 1``, the last of a prefix
            that ends at ``e`` (``end_time[0]`` is never decisive): one entry per edge, plus one.
        search_steps: Binary-search steps that cover the longest run.
    """

    row: Tensor
    perm: Tensor
    end_time: Tensor
    search_steps: int

    def tensors(self) -> list[Tensor]:
        return [self.row, self.perm, self.end_time]

    def share_memory_(self) -> "TemporalCSC":
        for t in self.tensors():
            t.share_memory_()
        return self


def time_of(data: Data, time_attr: str) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """``(node_time, edge_time)``: ``data[time_attr]`` as a node or an edge attribute."""
    if time_attr not in data or not isinstance(data[time_attr], Tensor):
        raise ValueError(f"time_attr={time_attr!r} is not a tensor attribute of the graph.")
    value = data[time_attr]
    if value.dim() == 1 and value.numel() == data.num_nodes and data.is_node_attr(time_attr):
        return value, None
    if value.dim() == 1 and value.numel() == data.num_edges and data.is_edge_attr(time_attr):
        return None, value
    raise ValueError(f"time_attr={time_attr!r} must hold one timestamp per node "
                     f"([{data.num_nodes}]) or per edge ([{data.num_edges}]), got "
                     f"{tuple(value.shape)}.")


# Edges per step of sort_by_time on the CPU (whole runs; a longer run is a step of its own):
# ~10 MB of temporaries whatever the graph's size, and faster than larger steps, which sort
# outside the CPU's caches.
SORT_CHUNK_EDGES = 1 << 18


def sort_by_time(csc: CSC, node_time: Optional[Tensor], edge_time: Optional[Tensor]) -> TemporalCSC:
    """``csc`` with every destination's run sorted by time (ties keep their order).

    Whole runs are sorted ~10^5 edges at a time (on a GPU, all at once), so the temporaries
    stay small beside the result: ``row`` and ``perm`` in the CSC's index types and
    ``end_time`` in the timestamps' type (8 bytes per edge for int64).
    """
    device = csc.row.device
    num_edges = csc.num_edges
    perm = csc.perm
    if perm is None:
        perm = torch.arange(num_edges, dtype=index_dtype(num_edges), device=device)
    time = node_time if node_time is not None else edge_time
    time = time.to(device)
    row = torch.empty_like(csc.row)
    out_perm = torch.empty_like(perm)
    end_time = time.new_empty(num_edges + 1)
    end_time[0] = 0
    degree = csc.colptr.diff()
    longest = int(degree.max()) if degree.numel() else 0
    chunk = SORT_CHUNK_EDGES if device.type == "cpu" else max(1, num_edges)
    first = 0
    while first < csc.num_nodes:
        lo = int(csc.colptr[first])
        # The nodes whose runs end within `chunk` edges of lo; at least one.
        last = int(torch.searchsorted(csc.colptr, lo + chunk, right=True)) - 1
        last = min(max(last, first + 1), csc.num_nodes)
        hi = int(csc.colptr[last])
        if hi > lo:
            _sort_runs(csc, lo, hi, first, last, node_time is not None, time, perm,
                       row, out_perm, end_time)
        first = last
    return TemporalCSC(row=row, perm=out_perm, end_time=end_time,
                       search_steps=longest.bit_length())


def _sort_runs(csc: CSC, lo: int, hi: int, first: int, last: int, by_node: bool,
               time: Tensor, perm: Tensor, row: Tensor, out_perm: Tensor,
               end_time: Tensor) -> None:
    """Writes positions ``lo:hi`` (the runs of nodes ``first:last``) of the time order."""
    device = row.device
    src, ids = csc.row[lo:hi], perm[lo:hi]
    t = time.index_select(0, (src if by_node else ids).long())
    degree = csc.colptr[first:last + 1].diff()
    column = torch.repeat_interleave(torch.arange(last - first, device=device), degree,
                                     output_size=hi - lo)
    order = torch.argsort(t, stable=True)
    order = order.index_select(0, torch.argsort(column.index_select(0, order), stable=True))
    row[lo:hi] = src.index_select(0, order)
    out_perm[lo:hi] = ids.index_select(0, order)
    end_time[lo + 1:hi + 1] = t.index_select(0, order)


def eligible_ends(colptr: Tensor, tcsc: TemporalCSC, dst: Tensor, limit: Tensor) -> Tensor:
    """Per node of ``dst``: the end of its run's prefix whose timestamps are <= ``limit``.

    A binary search per node, all nodes in step, by halving powers of two: ``end`` grows by
    ``2^k`` wherever the prefix that long is still eligible (capped at the run's end, where a
    whole eligible run stays put). Five passes over ``dst`` a step. On a GPU the step count
    covers the graph's longest run (no host read per hop); on the CPU the longest run of
    ``dst`` (one read), which on skewed graphs saves several steps.
    """
    end = colptr.index_select(0, dst)
    run_end = colptr[1:].index_select(0, dst)
    steps = tcsc.search_steps
    if not takes_gpu_path(dst):
        steps = int((run_end - end).max()).bit_length() if dst.numel() else 0
    for k in reversed(range(steps)):
        probe = torch.minimum(end + (1 << k), run_end)
        end = torch.where(tcsc.end_time.index_select(0, probe) <= limit, probe, end)
    return end


def eligible_runs(colptr: Tensor, tcsc: TemporalCSC, dst: Tensor, limit: Tensor, fanout: int,
                  strategy: str, replace: bool = False) -> tuple[tuple[Tensor, Tensor], int]:
    """The CSC positions each node of ``dst`` may draw from under ``limit``, and the fanout to
    draw there: strategy ``uniform`` draws ``fanout`` of the eligible prefix, ``last`` narrows
    it to its last ``fanout`` edges (the most recent) and keeps them all, or with ``replace``
    draws ``fanout`` times from them, as pyg-lib does."""
    end = eligible_ends(colptr, tcsc, dst, limit)
    start = colptr.index_select(0, dst)
    if strategy == "last" and fanout >= 0:
        start = torch.maximum(start, end - fanout)
        if not replace:
            fanout = -1
    return (start, end), fanout


def seed_times(seed: Tensor, seed_time: Optional[Tensor],
               node_time: Optional[Tensor]) -> Tensor:
    """Each seed's time: ``input_time`` where given, else the seed node's own timestamp."""
    if seed_time is not None:
        if seed_time.numel() != seed.numel():
            raise ValueError(f"input_time has {seed_time.numel()} entries for {seed.numel()} "
                             "seed nodes; give one time per input node.")
        return seed_time.to(seed.device)
    if node_time is None:
        raise ValueError("temporal sampling with edge timestamps needs a time per seed: pass "
                         "input_time (the loader's) with the input nodes.")
    return node_time.to(seed.device).index_select(0, seed)
