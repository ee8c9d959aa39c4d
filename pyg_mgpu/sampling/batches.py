"""Several batches sampled in one walk, split back into ordinary batches.

The walk (:mod:`.walk`) numbers each batch apart from the others (:mod:`.numbering`), so a
node two batches reach is in both, and within a batch each node once, as a batch sampled
alone. Joint batches are numbered by :class:`~.numbering.BatchIds` (node ``v`` of batch ``b``
is the key ``b * num_nodes + v``), and the walk's ``batch`` output is each node's batch;
disjoint ones by :class:`~.numbering.DisjointIds`, a tree per seed, and that output is each
node's tree, which ``tree_batch`` maps to its batch. The walk's kernels and host reads are
then paid once for all of them. Every batch has the distribution of a lone walk over its seeds
(the draws of each node are independent of the other batches'); the draws themselves differ,
as the generator is shared.

:func:`split_batches` turns the walk's output (all batches' nodes hop by hop, interleaved) into
one PyG ``SamplerOutput`` per batch: seeds first, then each hop's new nodes in order of first
appearance, edges grouped by hop and by destination, per-hop counts.
"""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.sampler import SamplerOutput

from pyg_mgpu.gpu_path import host_ints, iota, to_device
from pyg_mgpu.sampling.walk_state import PendingHop


def _keys(batch: Tensor, hop_sizes: list[int], levels: int) -> Tensor:
    """``batch * levels + hop`` for positions laid out hop by hop in runs of ``hop_sizes``
    (``batch``: each position's batch): one key per (batch, hop), in ``batch``'s type.

    Each hop's run gets its hop added in place, one thread per position: the run lengths
    are host numbers. (Repeating hop ids by run length would give each run one CUDA warp,
    and a run is up to millions of positions.)"""
    key = batch * levels
    start = 0
    for hop, size in enumerate(hop_sizes):
        if hop and size:
            key[start:start + size].add_(hop)
        start += size
    assert start == key.numel(), "the hop sizes do not add up to the positions"
    return key


def _ends(ordered: Tensor, size: int, out: Tensor) -> Tensor:
    """Where the run of each value ``0 .. size - 1`` ends in ``ordered`` (nondecreasing,
    values in that range), written to ``out`` (int64, ``size`` entries): one binary search
    per value, where counting by adding ones into ``size`` bins would make every position
    an atomic add into the same few addresses. :func:`_run_lengths` turns the ends, read to
    the host, into counts."""
    values = iota(size, ordered.device, ordered.dtype)
    return torch.searchsorted(ordered, values, right=True, out=out)


def _run_lengths(ends: list[int]) -> list[int]:
    """The lengths of consecutive runs that end at ``ends`` (the first starts at 0)."""
    return [end - start for start, end in zip([0, *ends], ends)]


def _hop_slices(tensor: Tensor, hop_sizes: list[int]) -> list[Tensor]:
    """``tensor``'s runs of ``hop_sizes`` (views)."""
    return list(tensor.split(hop_sizes)) if hop_sizes else []


class BatchCounts:
    """Every batch's per-hop node and edge counts of a joint walk over several batches, read
    with the walk's last read (``walk(..., last_read=)``) instead of after it: the walk's
    last hop's new nodes are then still marked in place (``pending``), and counted by batch
    here. :attr:`values` holds the counts once read, as :func:`split_batches` takes them.

    Within each hop the walk's positions come batch by batch, in batch order: the seeds do,
    and each hop draws grouped by destination in its frontier's order (:mod:`.draws`),
    which carries the order on (a hop's new nodes keep their draws' order). So each hop's
    batches are nondecreasing, and a batch's count in a hop is where its run ends there
    (:func:`_ends`): no sort and no atomics."""

    def __init__(self, num_batches: int, num_hops: int):
        self.num_batches, self.num_hops = num_batches, num_hops
        self.values: Optional[list[int]] = None

    def request(self, trees: dict, pending: dict[object, PendingHop], cols: dict,
                num_sampled_nodes: dict, num_sampled_edges: dict) -> Tensor:
        """The tensor to read, for :meth:`receive`: every hop's ends of each batch's run,
        the nodes' hops then the edges'. The counted nodes' from ``trees`` (each node's
        batch) and ``num_sampled_nodes``, the last hop's from ``pending`` (its new nodes'
        first positions), the edges' from ``cols`` (each edge's destination) and
        ``num_sampled_edges``. One node and one edge type."""
        (tree,), (col,) = trees.values(), cols.values()
        (last_hop,) = pending.values()
        (settled,), (edge_sizes,) = num_sampled_nodes.values(), num_sampled_edges.values()
        num_batches = self.num_batches
        ends = torch.empty((self.num_hops + 1 + len(edge_sizes)) * num_batches,
                           dtype=torch.long, device=tree.device)
        if num_batches == 0:
            return ends
        out = ends.split(num_batches)
        for hop, part in enumerate(_hop_slices(tree, settled)):
            _ends(part, num_batches, out[hop])
        # The last hop's new nodes: how many come before each batch's run ends there.
        new_before = torch.zeros(last_hop.first.numel() + 1, dtype=torch.long,
                                 device=tree.device)
        torch.cumsum(last_hop.first, 0, dtype=torch.long, out=new_before[1:])
        run_ends = _ends(last_hop.trees, num_batches,
                         torch.empty(num_batches, dtype=torch.long, device=tree.device))
        torch.index_select(new_before, 0, run_ends, out=out[len(settled)])
        edge_batch = tree.index_select(0, col)
        for hop, part in enumerate(_hop_slices(edge_batch, edge_sizes)):
            _ends(part, num_batches, out[len(settled) + 1 + hop])
        return ends

    def receive(self, ends: list[int]) -> None:
        """:attr:`values` from the read of :meth:`request`'s tensor."""
        b = self.num_batches
        runs = [_run_lengths(ends[i:i + b]) for i in range(0, len(ends), b)] if b else []
        nodes, edges = runs[:self.num_hops + 1], runs[self.num_hops + 1:]
        self.values = ([hop[i] for i in range(b) for hop in nodes] +
                       [hop[i] for i in range(b) for hop in edges])


def split_batches(node: Tensor, tree: Tensor, row: Tensor, col: Tensor, edge: Tensor,
                  num_sampled_nodes: list[int], num_sampled_edges: list[int],
                  tree_batch: Tensor, num_batches: int,
                  tree_offset: Optional[Tensor] = None,
                  counts: Optional[list[int]] = None) -> list[SamplerOutput]:
    """One ``SamplerOutput`` per batch from a walk over all of them.

    Args:
        node, tree: Each node of the walk (in walk order) and its tree.
        row, col, edge: The walk's edges: local ids into ``node``, and edge ids.
        num_sampled_nodes, num_sampled_edges: The walk's per-hop counts.
        tree_batch: The batch of each tree. int32 numbers make the sort keys int32, over
            which a radix sort makes half the passes it makes over int64.
        tree_offset: For disjoint batches, each batch's first tree: a batch's own ``batch``
            output numbers its trees from 0. None: a batch is one tree (joint sampling).
        counts: Every batch's per-hop node counts, then edge counts, if already read
            (:class:`BatchCounts`); else counted and read here.
    """
    device = node.device
    num_hops = len(num_sampled_edges)
    levels = num_hops + 1
    node_batch = tree_batch.index_select(0, tree)
    node_key = _keys(node_batch, num_sampled_nodes, levels)
    # Stable: within a batch and a hop the walk's order (first appearance) is kept.
    node_sorted, order = torch.sort(node_key, stable=True)
    edge_key = _keys(node_batch.index_select(0, col), num_sampled_edges, num_hops)
    edge_sorted, edge_order = torch.sort(edge_key, stable=True)
    if counts is None:  # every batch's per-hop counts from the sorted keys, in one read
        ends = torch.empty(num_batches * (levels + num_hops), dtype=torch.long, device=device)
        node_ends, edge_ends = ends.split([num_batches * levels, num_batches * num_hops])
        _ends(node_sorted, num_batches * levels, node_ends)
        _ends(edge_sorted, num_batches * num_hops, edge_ends)
        ends = host_ints(ends)
        counts = (_run_lengths(ends[:num_batches * levels]) +
                  _run_lengths(ends[num_batches * levels:]))
    node_counts = [counts[b * levels:(b + 1) * levels] for b in range(num_batches)]
    edge_counts = counts[num_batches * levels:]
    edge_counts = [edge_counts[b * num_hops:(b + 1) * num_hops] for b in range(num_batches)]
    node_sizes = [sum(c) for c in node_counts]
    edge_sizes = [sum(c) for c in edge_counts]
    rank = torch.empty_like(order)
    rank[order] = iota(order.numel(), device)
    first_of_batch = list(itertools.accumulate(node_sizes, initial=0))[:num_batches]
    local = rank - to_device(first_of_batch, device).index_select(0, node_batch)
    parts = {
        "node": node.index_select(0, order).split(node_sizes),
        "row": local.index_select(0, row.index_select(0, edge_order)).split(edge_sizes),
        "col": local.index_select(0, col.index_select(0, edge_order)).split(edge_sizes),
        "edge": edge.index_select(0, edge_order).split(edge_sizes),
    }
    batches = None
    if tree_offset is not None:
        own = tree - tree_offset.index_select(0, tree_batch.index_select(0, tree))
        batches = own.index_select(0, order).split(node_sizes)
    return [SamplerOutput(node=parts["node"][b], row=parts["row"][b], col=parts["col"][b],
                          edge=parts["edge"][b],
                          batch=None if batches is None else batches[b],
                          num_sampled_nodes=node_counts[b], num_sampled_edges=edge_counts[b])
            for b in range(num_batches)]
