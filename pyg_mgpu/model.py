"""GraphSAGE (PyG ``SAGEConv``, mean aggregation) that computes each layer only where needed.

A sampled batch lists nodes hop by hop: seeds, then hop-1 nodes, then hop-2 nodes, and edges hop
by hop. Layer ``i`` of ``L`` only has to produce outputs for the nodes within ``L - 1 - i`` hops
of the seeds, using the edges of the first ``L - i`` hops. Everything else (PyG's tutorial computes
every layer on every node) is wasted work: on a [25, 10] sample the input has ~40k nodes but layer
2 needs only the 1,024 seeds. Trimming makes each layer a bipartite SAGEConv over a prefix.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv


class GraphSAGE(nn.Module):
    """A stack of ``num_layers`` mean-aggregating SAGEConv layers with ReLU and dropout between.

    Args:
        in_channels: Input feature size.
        hidden_channels: Width of every hidden layer.
        out_channels: Number of classes.
        num_layers: Number of layers (equals the number of sampling hops).
        dropout: Dropout probability applied after each hidden layer.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, dropout: float = 0.5):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}.")
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(sizes, sizes[1:]))
        self.dropout = dropout

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def forward(self, x: Tensor, edge_index: Tensor,
                num_sampled_nodes: Optional[Sequence[int]] = None,
                num_sampled_edges: Optional[Sequence[int]] = None) -> Tensor:
        """Runs the stack; with per-hop counts it trims every layer to what the next one needs.

        Returns:
            Trimmed: logits of the seeds (``num_sampled_nodes[0]`` rows). Untrimmed: logits of
            every node in ``x``.
        """
        trim = num_sampled_nodes is not None and num_sampled_edges is not None
        if trim:
            assert len(num_sampled_nodes) == self.num_layers + 1, (
                "need one node count per hop plus the seeds")
            nodes_upto = torch.tensor(num_sampled_nodes).cumsum(0).tolist()
            edges_upto = torch.tensor(num_sampled_edges).cumsum(0).tolist()
        for i, conv in enumerate(self.convs):
            if trim:
                hops_left = self.num_layers - i  # hops of input this layer still consumes
                num_dst = nodes_upto[hops_left - 1]
                layer_edges = edge_index[:, :edges_upto[hops_left - 1]]
                x = conv((x, x[:num_dst]), layer_edges, size=(x.size(0), num_dst))
            else:
                x = conv(x, edge_index)
            if i < self.num_layers - 1:
                x = F.relu(x)
                x = F.dropout(x, p=self.dropout, training=self.training)
        return x
