"""``(FeatureStore, GraphStore)`` inputs: the graph a sampler reads through PyG's remote-backend
interfaces instead of a ``Data`` or ``HeteroData``.

The edges come from the graph store's own CSC conversion (``GraphStore.csc()``, or ``csr()``
for backward sampling), once per sampler; the node counts from the edge attributes' sizes and
the feature store, and timestamps from the feature store, as PyG's sampler reads them (node-level
when the attribute is named ``time``, else edge-level).
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from torch import Tensor
from torch_geometric.data import FeatureStore, GraphStore
from torch_geometric.data import remote_backend_utils

from pyg_mgpu.data.csc import CSC


def is_remote(data: Any) -> bool:
    """Whether ``data`` is a ``(FeatureStore, GraphStore)`` pair."""
    return (isinstance(data, (tuple, list)) and len(data) == 2
            and isinstance(data[0], FeatureStore) and isinstance(data[1], GraphStore))


def is_hetero_remote(data: Any) -> bool:
    return is_remote(data) and any(attr.edge_type is not None
                                   for attr in data[1].get_all_edge_attrs())


def homogeneous_graph(data, sample_direction: str,
                      time_attr: Optional[str]) -> tuple[int, CSC, Optional[Tensor],
                                                         Optional[Tensor]]:
    """``(num_nodes, CSC, node_time, edge_time)`` of a homogeneous remote graph (the CSC is
    the transposed graph's for backward sampling)."""
    feature_store, graph_store = data
    edge_attrs = graph_store.get_all_edge_attrs()
    num_nodes = max(edge_attrs[0].size)
    if sample_direction == "backward":
        colptr, row, perm = graph_store.csr()
    else:
        row, colptr, perm = graph_store.csc()
    node_time = edge_time = None
    if time_attr is not None:
        attrs = [attr for attr in feature_store.get_all_tensor_attrs()
                 if attr.attr_name == time_attr]
        if len(attrs) != 1:
            raise ValueError(f"time_attr={time_attr!r}: the feature store holds "
                             f"{len(attrs)} tensors of that name; temporal sampling needs one.")
        attrs[0].index = None  # the whole tensor
        time = feature_store.get_tensor(attrs[0])
        # PyG's rule for remote graphs: 'time' is per node, any other name per edge.
        node_time, edge_time = (time, None) if time_attr == "time" else (None, time)
    return num_nodes, CSC(colptr=colptr, row=row, perm=perm), node_time, edge_time


def hetero_graph(data, backward: bool = False) -> tuple[list, list, dict, dict]:
    """``(node_types, edge_types, num_nodes, CSC per edge type)`` of a heterogeneous remote
    graph (each edge type's transposed graph, grouped by source, for backward sampling); edge
    types in sorted order, so that every process walks them alike."""
    feature_store, graph_store = data
    edge_types = sorted({attr.edge_type for attr in graph_store.get_all_edge_attrs()})
    node_types = sorted({attr.group_name for attr in feature_store.get_all_tensor_attrs()
                         if isinstance(attr.group_name, str)}
                        | {t for et in edge_types for t in (et[0], et[-1])})
    num_nodes = {t: remote_backend_utils.size(feature_store, graph_store, t)
                 for t in node_types}
    if backward:
        colptr, row, perm = graph_store.csr()
    else:
        row, colptr, perm = graph_store.csc()
    csc = {et: CSC(colptr=colptr[et], row=row[et], perm=perm.get(et)) for et in edge_types}
    return node_types, edge_types, num_nodes, csc


def hetero_times(data, time_attr: str) -> tuple[Optional[dict], Optional[dict]]:
    """``(node_time, edge_time)`` of a heterogeneous remote graph: the feature store's tensors
    named ``time_attr``, per node type or per edge type (by their group names, PyG's rule)."""
    feature_store = data[0]
    attrs = [copy.copy(attr) for attr in feature_store.get_all_tensor_attrs()
             if attr.attr_name == time_attr]
    if not attrs:
        raise ValueError(f"time_attr={time_attr!r}: the feature store holds no tensor of that "
                         "name; temporal sampling needs the timestamps there.")
    for attr in attrs:
        attr.index = None  # the whole tensor
    time = {attr.group_name: t for attr, t in zip(attrs, feature_store.multi_get_tensor(attrs))}
    if all(isinstance(group, str) for group in time):
        return time, None
    if all(isinstance(group, tuple) for group in time):
        return None, time
    raise ValueError(f"time_attr={time_attr!r} is stored for node types and edge types alike; "
                     "keep it on one kind.")
