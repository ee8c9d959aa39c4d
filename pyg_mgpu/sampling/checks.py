"""Checks of what a user hands a loader, when it is built: the seeds (``input_nodes``,
``edge_label_index``) against the graph, the seed edges' labels and times, and
``num_neighbors``.

PyG's loaders take them unchecked: a node id outside the graph fails mid-epoch with an
``IndexError`` that names no argument, a mask shorter than the node count trains on part of
the split without a word, and ``num_neighbors=[10.5]`` samples 10. These say which argument is
wrong and how. What is valid passes unchanged, so the batches are PyG's.
"""
from __future__ import annotations

import numbers
import reprlib
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData, remote_backend_utils
from torch_geometric.sampler.base import NumNeighbors

from pyg_mgpu.sampling import remote


def check_input_nodes(data, input_nodes) -> None:
    """``input_nodes`` of a ``Data`` or of one node type of a ``HeteroData``: a bool mask of one
    entry per node, or integer ids of the graph's nodes."""
    if isinstance(data, Data):
        nodes, num_nodes, name = input_nodes, data.num_nodes, "input_nodes"
    elif (isinstance(data, HeteroData) and isinstance(input_nodes, (tuple, list))
          and len(input_nodes) == 2 and isinstance(input_nodes[0], str)):
        node_type, nodes = input_nodes
        _check_node_types(data, [node_type], f"input_nodes names node type {node_type!r}")
        num_nodes, name = data[node_type].num_nodes, f"input_nodes of type {node_type!r}"
    elif isinstance(data, HeteroData) and isinstance(input_nodes, Tensor):
        raise ValueError("input_nodes of a HeteroData is (node_type, ids or mask), or a node "
                         "type alone for all its nodes; got a tensor without its node type. "
                         f"The graph's node types are {data.node_types}.")
    elif remote.is_remote(data):
        if input_nodes is None:
            raise ValueError("input_nodes=None takes every node of a Data; a (FeatureStore, "
                             "GraphStore) pair needs its seeds named: node ids or a mask, or "
                             "(node_type, ids or mask).")
        if (isinstance(input_nodes, (tuple, list)) and len(input_nodes) == 2
                and isinstance(input_nodes[0], str)):
            node_type, nodes = input_nodes
            num_nodes = remote_backend_utils.size(data[0], data[1], node_type)
            name = f"input_nodes of type {node_type!r}"
        elif isinstance(input_nodes, str):
            return
        else:  # a homogeneous store: its node count is its edges' size, as the sampler's
            sizes = [attr.size for attr in data[1].get_all_edge_attrs()]
            nodes, name = input_nodes, "input_nodes"
            num_nodes = max(sizes[0]) if sizes and sizes[0] else None
    else:
        return
    if nodes is None or num_nodes is None:
        return
    nodes = nodes if isinstance(nodes, Tensor) else torch.as_tensor(nodes)
    if nodes.dim() != 1:
        raise ValueError(f"{name} has shape {tuple(nodes.shape)}: it takes a 1-D tensor of node "
                         "ids, or a bool mask of one entry per node.")
    if nodes.dtype == torch.bool:
        if nodes.numel() != num_nodes:
            raise ValueError(f"{name} is a mask of {nodes.numel()} entries, but the graph has "
                             f"{num_nodes} nodes: a mask holds one entry per node.")
        return
    _check_ids(nodes, num_nodes, name)


def check_edge_label_index(data, edge_label_index) -> None:
    """``edge_label_index`` of a ``Data`` or of one edge type of a ``HeteroData``: source ids
    of the source nodes, destination ids of the destination nodes."""
    if isinstance(data, Data):
        index, num_src = edge_label_index, data.num_nodes
        num_dst, name = num_src, "edge_label_index"
    elif (isinstance(data, HeteroData) and isinstance(edge_label_index, (tuple, list))
          and len(edge_label_index) == 2 and isinstance(edge_label_index[0], tuple)):
        edge_type, index = edge_label_index
        edge_type = data._to_canonical(edge_type)
        _check_node_types(data, [edge_type[0], edge_type[-1]],
                          f"edge_label_index names edge type {edge_type}")
        num_src, num_dst = data[edge_type[0]].num_nodes, data[edge_type[-1]].num_nodes
        name = f"edge_label_index of type {edge_type}"
    else:
        return
    if not isinstance(index, Tensor) or num_src is None or num_dst is None:
        return
    if index.dim() != 2 or index.size(0) != 2:
        raise ValueError(f"{name} has shape {tuple(index.shape)}: it takes [2, num_edges], "
                         "a row of source ids over a row of destination ids.")
    _check_ids(index[0], num_src, f"{name} (sources)")
    _check_ids(index[1], num_dst, f"{name} (destinations)")


def check_per_seed_edge(num_seed_edges, **values) -> None:
    """``edge_label`` and ``edge_label_time``: one entry per seed edge (``num_seed_edges()``,
    the columns of ``edge_label_index``), or None."""
    given = {name: v for name, v in values.items() if isinstance(v, Tensor) and v.dim() > 0}
    if not given:
        return
    count = num_seed_edges()
    for name, value in given.items():
        if value.size(0) != count:
            raise ValueError(f"{name} has {value.size(0)} entries, but there are {count} seed "
                             "edges (the columns of edge_label_index): it takes one per seed "
                             "edge.")


def check_num_neighbors(num_neighbors, hetero: bool) -> None:
    """One count per hop (-1: every neighbour): a list, a tuple or a 1-D tensor of integers;
    on a heterogeneous graph also a dict of such lists per edge type (or PyG's
    ``NumNeighbors``)."""
    if isinstance(num_neighbors, NumNeighbors):
        return
    if isinstance(num_neighbors, dict):
        if not hetero:
            raise ValueError("num_neighbors is a dict (counts per edge type), but the graph is "
                             "homogeneous: pass one list of counts per hop, e.g. [25, 10].")
        per_hop = list(num_neighbors.values())
    else:
        per_hop = [num_neighbors]
    for counts in per_hop:
        if isinstance(counts, Tensor) and counts.dtype == torch.bool:
            raise TypeError(f"num_neighbors is a bool tensor of {counts.numel()} entries, a "
                            "node mask: the seeds go in input_nodes, after num_neighbors "
                            "(NeighborLoader(data, [25, 10], input_nodes=mask)).")
        if isinstance(counts, Tensor):
            counts = counts.tolist() if counts.dim() == 1 else None
        if (not isinstance(counts, (list, tuple))
                or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool)
                           for k in counts)):
            raise TypeError(f"num_neighbors takes integer counts of neighbours, one per hop "
                            f"(-1 for all), e.g. [25, 10]; got {reprlib.repr(counts)}.")


def _check_node_types(data: HeteroData, node_types: list, what: str) -> None:
    unknown = sorted({t for t in node_types if t not in data.node_types})
    if unknown:
        raise ValueError(f"{what}, but the graph has no node type {', '.join(map(repr, unknown))}; "
                         f"its node types are {data.node_types}.")


def _check_ids(ids: Tensor, num_nodes: int, name: str) -> None:
    if ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{name} holds {ids.dtype} values: node ids are integers (or, for "
                        "input_nodes, a bool mask).")
    low, high = _extremes(ids)
    if low is not None and (low < 0 or high >= num_nodes):
        raise ValueError(f"{name} holds node ids from {low} to {high}, but the graph's ids run "
                         f"from 0 to {num_nodes - 1}.")


def _extremes(ids: Tensor) -> tuple[Optional[int], Optional[int]]:
    if ids.numel() == 0:
        return None, None
    low, high = torch.aminmax(ids)
    return int(low), int(high)
