"""The heterogeneous models ``--model`` chooses on a heterogeneous dataset: GraphSAGE per edge
type (what PyG's ``to_hetero(GraphSAGE, aggr="sum")`` computes) and R-GCN (OGB's ogbn-mag
baseline: a weight per relation on the mean of its messages, plus a weight per node type on the
node itself).

Both are built backwards from the labelled node type: the last layer holds only the edge types
that end at it, each earlier layer only those ending at a type the next layer reads. What
``to_hetero`` would add beyond that (on ogbn-mag, the last layer's outputs for authors,
institutions and fields) never reaches the loss, and DistributedDataParallel would wait forever
for those parameters' gradients unless told to search for unused ones every step. Here every
parameter takes part in every step, and the dead outputs are not computed at all.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv

from pyg_mgpu.nn import HETERO_MODELS


def _key(edge_type: tuple) -> str:
    return "__".join(edge_type)  # to_hetero's naming


def _within(counts: list, hops: int) -> int:
    """How many of a batch's nodes (or edges) come before its last ``hops`` hops."""
    return sum(counts[:len(counts) - hops])


def layer_plan(edge_types: list, target: str, num_layers: int) -> list[tuple[list, list]]:
    """Per layer, first to last: (the node types it outputs, the edge types it runs).

    The last layer outputs ``target``; each layer runs the edge types that end at a type it
    outputs, and the layer before it outputs those types plus the edge types' sources.
    """
    plan, outputs = [], [target]
    for _ in range(num_layers):
        used = [et for et in edge_types if et[2] in outputs]
        plan.append((outputs, used))
        outputs = outputs + [t for t in dict.fromkeys(et[0] for et in used) if t not in outputs]
    return plan[::-1]


class HeteroGNN(nn.Module):
    """``num_layers`` layers over a heterogeneous batch; returns the ``target`` nodes' logits.

    Args:
        metadata: ``(node_types, edge_types)``, as ``HeteroData.metadata()`` gives them.
        in_channels: Feature width per node type.
        hidden, out_channels, num_layers, dropout: As PyG's ``BasicGNN`` takes them.
        target: The labelled node type, whose outputs :meth:`forward` returns.
        conv: ``sage`` (a ``SAGEConv`` per edge type, summed per destination type) or ``rgcn``
            (per edge type a ``SAGEConv`` without root weight and bias, per destination type a
            ``Linear`` on the node itself, summed).

    Raises:
        ValueError: for ``sage`` when a node type the model must output receives no edge type
            (``SAGEConv`` per edge type gives it no output; R-GCN's own weight does).

    Example:
        >>> from pyg_mgpu.nn.hetero import HeteroGNN
        >>> metadata = (["paper", "author"], [("paper", "cites", "paper"),
        ...                                   ("author", "writes", "paper"),
        ...                                   ("paper", "rev_writes", "author")])
        >>> model = HeteroGNN(metadata, {"paper": 8, "author": 4}, 16, 3, num_layers=2,
        ...                   target="paper")
        >>> x = {"paper": torch.randn(5, 8), "author": torch.randn(2, 4)}
        >>> edges = {("paper", "cites", "paper"): torch.tensor([[1, 2], [0, 0]]),
        ...          ("author", "writes", "paper"): torch.tensor([[0, 1], [0, 3]]),
        ...          ("paper", "rev_writes", "author"): torch.tensor([[0, 3], [0, 1]])}
        >>> model(x, edges).shape
        torch.Size([5, 3])
    """

    def __init__(self, metadata: tuple, in_channels: dict, hidden: int, out_channels: int,
                 num_layers: int, target: str, dropout: float = 0.5, conv: str = "sage"):
        super().__init__()
        if conv not in HETERO_MODELS:
            raise ValueError(f"conv must be one of {', '.join(HETERO_MODELS)}, got {conv!r}.")
        self.target, self.dropout, self.conv = target, dropout, conv
        self.plan = layer_plan(list(metadata[1]), target, num_layers)
        self.convs = nn.ModuleList()
        self.roots = nn.ModuleList()
        width = dict(in_channels)
        for i, (outputs, edge_types) in enumerate(self.plan):
            out = out_channels if i == num_layers - 1 else hidden
            if conv == "sage":
                unreached = [t for t in outputs if all(et[2] != t for et in edge_types)]
                if unreached:
                    raise ValueError(f"node types {', '.join(unreached)} receive no edges, so "
                                     "GraphSAGE per edge type gives them no output; add "
                                     "reverse edges, or use the rgcn model (its own weight per "
                                     "node type).")
            self.convs.append(nn.ModuleDict({
                _key(et): SAGEConv((width[et[0]], width[et[2]]), out,
                                   root_weight=conv == "sage", bias=conv == "sage")
                for et in edge_types}))
            self.roots.append(nn.ModuleDict(
                {t: nn.Linear(width[t], out) for t in outputs} if conv == "rgcn" else {}))
            width = dict.fromkeys(outputs, out)

    def forward(self, x_dict: dict, edge_index_dict: dict,
                num_sampled_nodes_dict: Optional[dict] = None,
                num_sampled_edges_dict: Optional[dict] = None) -> Tensor:
        """The ``target`` nodes' logits. Given a sampled batch's per-hop counts (its
        ``num_sampled_nodes_dict`` and ``num_sampled_edges_dict``), layer ``i`` of ``L`` reads
        only the nodes within ``L - i`` hops of the seeds and the edges into them, and computes
        outputs only for the nodes within ``L - i - 1`` hops (the next layer's inputs); the
        seeds' outputs stay the untrimmed model's."""
        if num_sampled_nodes_dict:
            hops = len(next(iter(num_sampled_nodes_dict.values()))) - 1
            if hops < len(self.plan):  # trimming would leave the seeds out
                raise ValueError(f"the batch was sampled over {hops} hop(s), fewer than the "
                                 f"model's {len(self.plan)} layers: sample at least as many "
                                 "hops as layers, or call it without the per-hop counts.")

        def rows(t: str, hops: int) -> Tensor:  # x_dict[t] without its last `hops` hops
            if num_sampled_nodes_dict is None or hops == 0:
                return x_dict[t]
            return x_dict[t][:_within(num_sampled_nodes_dict[t], hops)]

        for i, (_, edge_types) in enumerate(self.plan):
            out = {t: self.roots[i][t](rows(t, i + 1)) for t in self.roots[i]}
            for et in edge_types:
                edge_index = edge_index_dict.get(et)
                if edge_index is None:  # no edges of this type sampled
                    edge_index = torch.empty(2, 0, dtype=torch.long, device=x_dict[et[2]].device)
                elif num_sampled_edges_dict is not None and i > 0:
                    edge_index = edge_index[:, :_within(num_sampled_edges_dict[et], i)]
                message = self.convs[i][_key(et)]((rows(et[0], i), rows(et[2], i + 1)),
                                                  edge_index)
                out[et[2]] = out[et[2]] + message if et[2] in out else message
            if i < len(self.plan) - 1:
                out = {t: F.dropout(h.relu(), self.dropout, self.training)
                       for t, h in out.items()}
            x_dict = out
        return x_dict[self.target]
