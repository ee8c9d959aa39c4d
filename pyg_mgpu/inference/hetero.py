"""pyg_mgpu's heterogeneous models (:class:`~pyg_mgpu.nn.hetero.HeteroGNN`, ``--model sage`` and
``rgcn`` on a heterogeneous dataset) as layer-wise inference runs them.

Layer ``i`` outputs the node types of its plan (``HeteroGNN.plan``): for a batch of destinations
of type ``t``, R-GCN's own weight on their rows (``rgcn``), plus, for each edge type ending at
``t``, its ``SAGEConv`` on the bipartite block of their in-edges of that type (the mean of the
sources' rows, and with ``sage`` a weight on the destinations' own rows), summed in the plan's
order, then ReLU before the last layer: the model's forward, one destination type a batch at a
time. Every destination's output depends only on its own in-edges and rows, so computing each
layer once for every node of each type equals the full-graph forward (tests/test_predict_hetero.py
checks both models to 1e-4).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from pyg_mgpu.inference.arguments import Graph
from pyg_mgpu.inference.blocks import Rows, make_block
from pyg_mgpu.nn.hetero import HeteroGNN


def _key(edge_type: tuple) -> str:
    return "__".join(edge_type)  # the model's ModuleDict keys


class HeteroStack:
    """A :class:`~pyg_mgpu.nn.hetero.HeteroGNN` as the run computes it (evaluation mode: no
    dropout); outputs are per node type, the last layer's for the model's ``target`` alone."""
    hetero = True

    def __init__(self, model: HeteroGNN):
        self.model = model
        self.target = model.target
        self.num_layers = len(model.plan)

    def outputs(self, i: int) -> list[str]:
        """The node types layer ``i`` outputs."""
        return list(self.model.plan[i][0])

    def reads(self, i: int, node_type: str) -> list[tuple]:
        """The edge types layer ``i`` reads into ``node_type``, in the forward's order."""
        return [et for et in self.model.plan[i][1] if et[2] == node_type]

    def input_types(self) -> tuple[list[str], list[tuple]]:
        """The node types whose features the first layer reads, and every edge type read."""
        first_outputs, first_edges = self.model.plan[0]
        types = list(dict.fromkeys([*first_outputs, *(et[0] for et in first_edges)]))
        edge_types = list(dict.fromkeys(et for _, used in self.model.plan for et in used))
        return types, edge_types

    def widths(self, in_channels: dict[str, int]) -> list[int]:
        """Each layer's output width (one for all the types it outputs)."""
        return [next(iter(convs.values())).out_channels for convs in self.model.convs]

    def step(self, i: int, node_type: str, dst, inputs: dict[str, Rows], graph: Graph,
             device: torch.device, scale: Optional[Rows] = None) -> Tensor:
        """Layer ``i``'s outputs for destinations ``dst`` (a range or ids) of ``node_type``,
        from ``inputs`` (the layer before's rows, per node type)."""
        own = inputs[node_type].read(dst)
        x_dst = own.to(device)
        roots = self.model.roots[i]
        out = roots[node_type](x_dst) if node_type in roots else None
        for et in self.reads(i, node_type):
            block = make_block(*graph.csc[et], dst, shared=et[0] == node_type)
            x_src = inputs[et[0]].block_rows(block, own=own).to(device)
            message = self.model.convs[i][_key(et)]((x_src, x_dst), block.edge_index.to(device))
            out = message if out is None else out + message
        assert out is not None, "HeteroGNN outputs only types it reads or has a root weight for"
        return out.relu() if i < self.num_layers - 1 else out
