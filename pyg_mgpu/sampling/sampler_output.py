"""The walk's output as PyG's ``NeighborSampler`` gives it: a homogeneous graph's one node type
and edge type as a ``SamplerOutput``, in the index types PyG's outputs take.
"""
from __future__ import annotations

import torch
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from pyg_mgpu.data.csc import index_dtype
from pyg_mgpu.sampling.sampling_graph import EDGE, NODE


def output_dtypes(data, homogeneous: bool, num_edges: int) -> tuple[torch.dtype, torch.dtype]:
    """The types of a sampler's node ids (``node``, ``row``, ``col``, ``batch``) and edge ids.

    Outputs are int32 for an int32 edge_index, as PyG's are; edge ids (CSC positions, mapped
    to the caller's ids later) only where the edge count fits too.
    """
    index = (torch.int32 if homogeneous and data.get("edge_index") is not None
             and data.edge_index.dtype == torch.int32 else torch.long)
    return index, torch.long if index == torch.long else index_dtype(num_edges)


def homogeneous_output(out: HeteroSamplerOutput, index_dtype: torch.dtype,
                       edge_dtype: torch.dtype) -> SamplerOutput:
    """The one node and edge type's output as PyG's ``SamplerOutput``, in the graph's
    index types."""
    per_hop = out.num_sampled_nodes is not None
    result = SamplerOutput(
        node=out.node[NODE], row=out.row[EDGE], col=out.col[EDGE], edge=out.edge[EDGE],
        batch=None if out.batch is None else out.batch[NODE],
        num_sampled_nodes=out.num_sampled_nodes[NODE] if per_hop else None,
        num_sampled_edges=out.num_sampled_edges[EDGE] if per_hop else None)
    return in_index_dtype(result, index_dtype, edge_dtype)


def in_index_dtype(out: SamplerOutput, index_dtype: torch.dtype,
                   edge_dtype: torch.dtype) -> SamplerOutput:
    """``out`` with its node ids in ``index_dtype`` and its edge ids in ``edge_dtype``."""
    if index_dtype != torch.long:  # PyG's outputs take the graph's index type
        for name in ("node", "row", "col", "batch"):
            value = getattr(out, name)
            if value is not None:
                setattr(out, name, value.to(index_dtype))
        if out.edge is not None:
            out.edge = out.edge.to(edge_dtype)
    return out
