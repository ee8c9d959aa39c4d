"""What :func:`~pyg_mgpu.inference.predict` takes: the graph as it reads it, and the checks of
its arguments, which every rank makes alike before any collective (and the command before any
rank starts)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.csc import csc_of
from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.errors import ArgumentError


@dataclass
class Graph:
    """What prediction reads of a graph: its CSC (host tensors) and features."""
    colptr: Tensor
    row: Tensor
    x: Tensor

    @property
    def num_nodes(self) -> int:
        return self.colptr.numel() - 1


def graph_of(data) -> Graph:
    if isinstance(data, ConvertedGraph):
        return Graph(data.colptr.cpu(), data.row.cpu(), data.x)
    if isinstance(data, HeteroData) or not isinstance(data, Data):
        raise TypeError(f"predict takes a homogeneous graph (torch_geometric.data.Data or "
                        f"pyg_mgpu's ConvertedGraph), got {type(data).__name__}; "
                        "heterogeneous graphs are not supported.")
    if data.x is None:
        raise ArgumentError("{data} has no node features x; the model's first layer reads them.")
    csc = csc_of(data)
    return Graph(csc.colptr.cpu(), csc.row.cpu(), data.x)


def check_nodes(nodes: Tensor, num_nodes: int) -> Tensor:
    """``nodes`` as int64 ids, refused unless they are distinct ids of the graph."""
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
