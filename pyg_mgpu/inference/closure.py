"""Which nodes each layer must compute when only some nodes' outputs are asked for.

The last layer computes the requested nodes. Layer ``i`` before it computes what layer ``i + 1``
reads: for every node type ``t`` that layer outputs, its destinations themselves (their own rows:
a GraphSAGE root weight, a self-loop, R-GCN's own weight) and their in-neighbours over every
edge type it reads into ``t``, hop by hop down to the first layer, which reads the features.
Each layer's outputs then equal the full computation's for those nodes, as every output depends
only on its node's in-edges and the rows of the layer before.

A type's nodes are all computed, and so are those of every layer before it, once the closure
holds more than :data:`FULL_FRACTION` of them: a subset layer reads its rows through an id
lookup and gathers instead of slices, and near the whole graph that costs what it saves.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from pyg_mgpu.inference.arguments import Graph
from pyg_mgpu.inference.blocks import BLOCK_BYTES, batches, in_edges

FULL_FRACTION = 0.5
# Edges gathered at a time while marking in-neighbours (their ids, int64).
_CHUNK_EDGES = BLOCK_BYTES // 8

# Per layer, per node type it outputs: the ids it computes (increasing), or None for all.
Needed = list[dict[str, Optional[Tensor]]]


def needed_nodes(graph: Graph, num_layers: int, outputs: Callable[[int], list[str]],
                 reads: Callable[[int, str], list[tuple]], target: str,
                 nodes: Optional[Tensor]) -> Needed:
    """The nodes each layer computes for ``nodes`` of type ``target`` (None: every node).

    Args:
        graph: The graph's CSCs and node counts.
        num_layers: The model's layers.
        outputs: Layer ``i``'s output node types.
        reads: The edge types layer ``i`` reads into a node type.
        target: The type the last layer outputs.
        nodes: The requested ids; the last layer computes them in their order.
    """
    needed: Needed = [{} for _ in range(num_layers)]
    needed[-1] = {target: nodes}
    for i in range(num_layers - 2, -1, -1):
        marks = {t: torch.zeros(graph.num_nodes(t), dtype=torch.bool) for t in outputs(i)}
        every = set()
        for t, ids in needed[i + 1].items():
            sources = [et[0] for et in reads(i + 1, t)]
            if ids is None:
                every.update([t, *sources])
                continue
            marks[t][ids] = True
            for et in reads(i + 1, t):
                _mark_in_neighbours(graph.csc[et], ids, marks[et[0]])
        for t, mark in marks.items():
            count = int(mark.sum())
            full = t in every or count > FULL_FRACTION * mark.numel()
            needed[i][t] = None if full else mark.nonzero().view(-1)
    return needed


def _mark_in_neighbours(csc: tuple[Tensor, Tensor], ids: Tensor, mark: Tensor) -> None:
    colptr, row = csc
    degree = colptr[ids + 1] - colptr[ids]
    for b0, b1 in batches(0, ids.numel(), ids.numel(), _CHUNK_EDGES,
                          lambda b0, b1: degree[b0:b1]):
        src, _ = in_edges(colptr, row, ids[b0:b1])
        mark[src] = True
