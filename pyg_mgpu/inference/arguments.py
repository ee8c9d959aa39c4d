"""What :func:`~pyg_mgpu.inference.predict` takes: the graph as it reads it, and the checks of
its arguments, which every rank makes alike before any collective (and the command before any
rank starts)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.csc import csc_of, edge_type_csc
from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.hetero_graph import HeteroGraph
from pyg_mgpu.errors import ArgumentError

# A homogeneous graph is read as one node type and one edge type of these names.
NODE = "node"
EDGE = (NODE, "to", NODE)


@dataclass
class Graph:
    """What prediction reads of a graph, per type.

    Attributes:
        x: Features per node type (a homogeneous graph's under :data:`NODE`).
        csc: ``(colptr, row)`` host tensors per edge type (destinations as columns).
        hetero: Whether outputs are written per node type (a ``HeteroData``).
    """
    x: dict[str, Tensor]
    csc: dict[tuple, tuple[Tensor, Tensor]]
    hetero: bool = False

    def num_nodes(self, node_type: str) -> int:
        return self.x[node_type].size(0)

    @property
    def num_edges(self) -> int:
        return sum(row.numel() for _, row in self.csc.values())

    def in_degrees(self, edge_types: list[tuple], dst) -> Tensor:
        """In-degree of each destination (a ``(start, end)`` range or ids) over ``edge_types``."""
        total = 0
        for et in edge_types:
            colptr = self.csc[et][0]
            if isinstance(dst, tuple):
                total = total + (colptr[dst[0] + 1:dst[1] + 1] - colptr[dst[0]:dst[1]])
            else:
                total = total + (colptr[dst + 1] - colptr[dst])
        return total


def graph_of(data, node_types: Optional[list[str]] = None,
             edge_types: Optional[list[tuple]] = None) -> Graph:
    """``data`` as prediction reads it. ``node_types`` and ``edge_types``: those a
    heterogeneous model reads (the features of the first, the CSCs of the second); None for a
    homogeneous model."""
    if isinstance(data, HeteroGraph):
        data = data.data
    if node_types is not None:
        if not isinstance(data, HeteroData):
            raise TypeError(f"a heterogeneous model predicts on a HeteroData, got "
                            f"{type(data).__name__}.")
        absent = [_key(et) for et in edge_types if et not in data.edge_types]
        if absent:
            raise ArgumentError(f"{{data}} has no edge type {', '.join(absent)}, which the "
                                "model reads; predict on the graph it was trained on.")
        missing = [t for t in node_types if t not in data.node_types or "x" not in data[t]]
        if missing:
            raise ArgumentError(f"{{data}} has no features x for node types "
                                f"{', '.join(missing)}, which the model's first layer reads.")
        return Graph({t: data[t].x for t in node_types},
                     {et: _host(edge_type_csc(data, et)) for et in edge_types}, hetero=True)
    if isinstance(data, ConvertedGraph):
        return Graph({NODE: data.x}, {EDGE: (data.colptr.cpu(), data.row.cpu())})
    if isinstance(data, HeteroData) or not isinstance(data, Data):
        raise TypeError(f"a homogeneous model predicts on a torch_geometric.data.Data or "
                        f"pyg_mgpu's ConvertedGraph, got {type(data).__name__}; for a "
                        "heterogeneous graph pass pyg_mgpu's HeteroGNN.")
    if data.x is None:
        raise ArgumentError("{data} has no node features x; the model's first layer reads them.")
    # The blocks carry no edge features: a model that reads them (GCN's edge_weight, GAT's
    # edge_attr) would silently get its unweighted outputs.
    features = [name for name in ("edge_weight", "edge_attr") if data.get(name) is not None]
    if features:
        raise ArgumentError(f"{{data}} has {' and '.join(features)}, which layer-wise "
                            "prediction does not carry to the layers yet (it computes "
                            "model(x, edge_index)); where the model does not read them, pass "
                            "the graph without them: Data(x=data.x, edge_index=data.edge_index).")
    return Graph({NODE: data.x}, {EDGE: _host(csc_of(data))})


def _key(edge_type: tuple) -> str:
    return "__".join(edge_type)


def _host(csc) -> tuple[Tensor, Tensor]:
    return csc.colptr.cpu(), csc.row.cpu()


def check_nodes(nodes, num_nodes: int) -> Tensor:
    """``nodes`` (a tensor, a numpy array or a sequence of ids) as an int64 tensor, refused
    unless they are distinct ids of the graph."""
    if not torch.is_tensor(nodes):
        try:  # a copy: a numpy view may run backwards (np.argsort(s)[::-1]), torch's may not
            nodes = torch.from_numpy(np.ascontiguousarray(nodes))
        except (TypeError, ValueError, RuntimeError) as e:
            raise ArgumentError(f"{{nodes}} takes node ids (a tensor, array or list of "
                                f"integers), got {type(nodes).__name__}: {e}") from None
    if nodes.dtype == torch.bool:
        raise ArgumentError("{nodes} takes node ids; for a mask pass mask.nonzero().view(-1).")
    if nodes.dim() != 1 or nodes.numel() == 0 or nodes.is_floating_point():
        raise ArgumentError(f"{{nodes}} takes a non-empty 1-D tensor of integer node ids, got "
                            f"shape {tuple(nodes.shape)} of {nodes.dtype}.")
    nodes = nodes.long().cpu()
    low, high = int(nodes.min()), int(nodes.max())
    if low < 0 or high >= num_nodes:
        bad = low if low < 0 else high
        raise ArgumentError(f"{{nodes}} holds node id {bad}, outside the graph's "
                            f"0..{num_nodes - 1}.")
    if torch.unique(nodes).numel() != nodes.numel():
        raise ArgumentError("{nodes} lists a node more than once; pass each id once.")
    return nodes


def check_embeddings(embeddings: Optional[int], num_layers: int) -> None:
    if embeddings is not None and not 1 <= embeddings < num_layers:
        hidden = (f"1..{num_layers - 1}" if num_layers > 1
                  else "none: it has one layer, whose output is the logits")
        raise ArgumentError(f"{{embeddings={embeddings}}}: the model has {num_layers} layers, "
                            f"so its hidden layers are {hidden} (layer {num_layers}'s output "
                            "is the logits).")
