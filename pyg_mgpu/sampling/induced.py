"""Induced subgraphs: every edge among a batch's sampled nodes (``subgraph_type="induced"``)."""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_mgpu.sampling.numbering import unseen


def induced_edges(colptr: Tensor, row: Tensor, node: Tensor, lookup: Tensor,
                  offset_type: torch.dtype = torch.int64) -> tuple[Tensor, Tensor, Tensor]:
    """Every edge into ``node`` whose source holds a local id in ``lookup``: (local source,
    position of the destination in ``node``, CSC position), by destination in node order,
    then in CSC order."""
    start = colptr.index_select(0, node)
    deg = colptr[1:].index_select(0, node).sub_(start)
    # Every in-edge of every sampled node: its CSC position (a run per node). Most are
    # dropped below, so these passes run in int32 where the edge count allows.
    edge = _runs(start.to(offset_type), deg, step=1, total=int(deg.sum()))
    src_local = lookup.index_select(0, row.index_select(0, edge))
    inside = src_local != unseen(lookup.dtype)
    kept = inside.nonzero().squeeze(1)
    # Destinations of the kept edges: node i keeps those of its run, read off a running
    # count of kept edges at the runs' ends (cheaper than a binary search per kept edge).
    kept_so_far = torch.zeros(edge.numel() + 1, dtype=edge.dtype, device=node.device)
    torch.cumsum(inside, 0, dtype=edge.dtype, out=kept_so_far[1:])
    kept_before = kept_so_far.index_select(0, torch.cumsum(deg, 0))
    kept_per_node = torch.diff(kept_before, prepend=kept_before.new_zeros(1))
    dst_local = _runs(torch.arange(node.numel(), device=node.device), kept_per_node,
                      step=0, total=kept.numel())
    return (src_local.index_select(0, kept), dst_local,
            edge.index_select(0, kept).long())


def _runs(first: Tensor, length: Tensor, step: int, total: int) -> Tensor:
    """``cat([first[i] + step * arange(length[i]) for i])`` in ``first``'s dtype (``total`` is
    ``length.sum()``): with ``step=1`` the ranges ``first[i] .. first[i] + length[i] - 1``
    one after another, with ``step=0`` ``repeat_interleave(first, length)``.

    Built as a running sum of ``step``, where each run's first element instead jumps from the
    previous run's last: a fill and a running sum over the output, and a write per run.
    ``repeat_interleave`` of the starts plus an ``arange`` (an int64 index and more passes)
    took ~6x longer on the CPU for the millions of positions of an induced subgraph's
    in-edges.
    """
    out = torch.full((total,), step, dtype=first.dtype, device=first.device)
    nonempty = (length > 0).nonzero().squeeze(1)
    first, length = first.index_select(0, nonempty), length.index_select(0, nonempty)
    last = first + step * (length.to(first.dtype) - 1)
    previous_last = torch.cat([last.new_zeros(1), last[:-1]])  # the sum starts from 0
    out.index_copy_(0, torch.cumsum(length, 0).sub_(length), first - previous_last)
    return out.cumsum_(0)
