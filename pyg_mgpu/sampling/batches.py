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

from pyg_mgpu.gpu_path import host_ints, iota, takes_gpu_path, to_device
from pyg_mgpu.sampling.walk_state import PendingHop


def _counts(key: Tensor, size: int) -> Tensor:
    """How often each of ``0 .. size - 1`` occurs in ``key``. (CUDA's ``bincount`` reads the
    largest key back to the host; adding ones into ``size`` zeros does not.)"""
    if not takes_gpu_path(key):
        return torch.bincount(key, minlength=size)
    return torch.zeros(size, dtype=torch.long, device=key.device).index_add_(
        0, key, torch.ones_like(key, dtype=torch.long))


def _keys(batch: Tensor, hop_sizes: list[int], levels: int) -> Tensor:
    """``batch * levels + hop`` for positions laid out hop by hop in runs of ``hop_sizes``
    (``batch``: each position's batch): one key per (batch, hop), in ``batch``'s type."""
    hop = torch.repeat_interleave(iota(len(hop_sizes), batch.device, batch.dtype),
                                  to_device(hop_sizes, batch.device), output_size=batch.numel())
    return batch * levels + hop


class BatchCounts:
    """Every batch's per-hop node and edge counts of a joint walk over several batches, read
    with the walk's last read (``walk(..., last_read=)``) instead of after it: the walk's
    last hop's new nodes are then still marked in place (``pending``), and counted by batch
    here. :attr:`values` holds the counts once read, as :func:`split_batches` takes them."""

    def __init__(self, num_batches: int, num_hops: int):
        self.num_batches, self.num_hops = num_batches, num_hops
        self.values: Optional[list[int]] = None

    def request(self, trees: dict, pending: dict[object, PendingHop], cols: dict,
                num_sampled_nodes: dict, num_sampled_edges: dict) -> Tensor:
        """Every batch's per-hop node counts, then edge counts, as one tensor to read: the
        counted nodes' from ``trees`` (each node's batch) and ``num_sampled_nodes``, the last
        hop's from ``pending`` (its new nodes' first positions), the edges' from ``cols``
        (each edge's destination) and ``num_sampled_edges``. One node and one edge type."""
        (tree,), (col,) = trees.values(), cols.values()
        (last_hop,) = pending.values()
        (settled,), (edge_sizes,) = num_sampled_nodes.values(), num_sampled_edges.values()
        levels = self.num_hops + 1
        node_counts = _counts(_keys(tree, settled, levels), self.num_batches * levels)
        node_counts.index_add_(0, last_hop.trees * levels + (levels - 1),
                               last_hop.first.long())
        edge_key = _keys(tree.index_select(0, col), edge_sizes, self.num_hops)
        return torch.cat([node_counts, _counts(edge_key, self.num_batches * self.num_hops)])


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
    order = torch.sort(node_key, stable=True).indices
    edge_key = _keys(node_batch.index_select(0, col), num_sampled_edges, num_hops)
    edge_order = torch.sort(edge_key, stable=True).indices
    if counts is None:  # every batch's per-hop counts, in one read
        counts = host_ints(torch.cat([_counts(node_key, num_batches * levels),
                                      _counts(edge_key, num_batches * num_hops)]))
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
