"""A model as layer-wise inference runs it: per layer, the conv and what follows it.

Layer ``i`` of a model is computed for a batch of destination nodes from all their in-edges:
the conv on a bipartite block (the destinations' own rows first, then their other in-neighbours'
rows), then the activation, normalization and, after the last layer, the final ``Linear`` that
the model's forward applies. Every destination's output depends only on its own in-edges and
on its in-neighbours' outputs of the layer before, so computing each layer once for every node
equals the full-graph forward (tests/test_predict.py checks each model to 1e-4).

GCN is the exception that needs the whole graph: ``gcn_norm`` weighs edge ``u -> v`` by
``1 / sqrt(deg(u) * deg(v))``, with degrees of the whole graph. Those are computed once for
every node (:func:`gcn_inverse_sqrt_degrees`) and handed to every batch, whose block then runs
with ``normalize=False`` on these weights, self-loops added as PyG adds them.

:func:`stack_of` gives the run one view of any model it takes: per layer, the node types it
outputs and the edge types each of them reads, and one batch's outputs
(:class:`HomogeneousStack` here, :class:`~pyg_mgpu.inference.hetero.HeteroStack` for
pyg_mgpu's heterogeneous models).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, GINConv, SAGEConv
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn.aggr import (MaxAggregation, MeanAggregation, MinAggregation,
                                     SumAggregation)
from torch_geometric.nn.models.basic_gnn import BasicGNN
from torch_geometric.nn.norm import BatchNorm as PygBatchNorm
from torch_geometric.nn.norm import LayerNorm as PygLayerNorm

from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.inference.arguments import EDGE, NODE, Graph
from pyg_mgpu.inference.blocks import Rows, make_block
from pyg_mgpu.inference.hetero import HeteroStack
from pyg_mgpu.nn.hetero import HeteroGNN
from pyg_mgpu.nn.models import GCN as TrimmedGCN
from pyg_mgpu.nn.sage import GraphSAGE, sage_layer

# Normalizations that act on each node's row alone in evaluation (BatchNorm with its running
# statistics): the others (GraphNorm, InstanceNorm, LayerNorm over the graph, ...) mix nodes.
_PER_NODE_NORMS = (nn.Identity, nn.BatchNorm1d, nn.LayerNorm, PygBatchNorm)
# PyG's models it runs, and the convs they build: each takes (source rows, destination rows)
# of a bipartite block (PNA's and EdgeCNN's do not).
_PYG_MODELS = (pyg_models.GraphSAGE, pyg_models.GCN, pyg_models.GAT, pyg_models.GIN)
_CONVS = (SAGEConv, GCNConv, GATConv, GATv2Conv, GINConv)
# Aggregations of a destination's in-edges that a block with all of them computes exactly, by
# their names in PyG (an LSTM reads them as a sequence; others are not tested here).
_AGGREGATIONS = {MeanAggregation: "mean", SumAggregation: "sum", MaxAggregation: "max",
                 MinAggregation: "min"}
_SUPPORTED = ("pyg_mgpu's GraphSAGE and GCN, PyG's GraphSAGE, GCN, GAT and GIN "
              "(torch_geometric.nn), and pyg_mgpu's HeteroGNN for heterogeneous graphs")


@dataclass
class GCNWeights:
    """How a GCN layer weighs its edges: PyG's ``gcn_norm`` options.

    ``improved`` changes nothing here: without edge weights ``gcn_norm`` gives every edge,
    self-loops included, weight 1 (``add_remaining_self_loops`` fills in its value only where
    weights are given).
    """
    add_self_loops: bool
    normalize: bool


@dataclass
class Layer:
    """One layer of a model as inference runs it.

    Attributes:
        conv: The message-passing module.
        after: What the model applies to the conv's output (activation, norm, final Linear).
        width: The width of its output (after ``after``).
        gcn: For a ``GCNConv``: its weighting, applied from whole-graph degrees; else None.
        mean_bags: A mean ``SAGEConv`` (pyg_mgpu's GraphSAGE, or PyG's with its defaults: see
            :func:`computes_as_sage_layer`): the conv runs as pyg_mgpu's fast path does
            (:func:`~pyg_mgpu.nn.sage.sage_layer`: neighbour means by ``embedding_bag``, which
            holds no per-edge copy of the source rows, where message passing gathers a row per
            edge and scatters it back).
    """
    conv: nn.Module
    after: Callable[[Tensor], Tensor]
    width: int
    gcn: Optional[GCNWeights] = None
    mean_bags: bool = False

    def __call__(self, x_src: Tensor, edge_index: Tensor, num_dst: int,
                 inv_sqrt_deg: Optional[Tensor] = None) -> Tensor:
        """Outputs of the ``num_dst`` destinations, which are the first rows of ``x_src``;
        ``edge_index`` holds (source row, destination row) of every in-edge of theirs.
        ``inv_sqrt_deg``: GCN only, each row's whole-graph ``deg ** -0.5``."""
        if self.mean_bags:  # the edges come grouped by destination
            ptr = torch.zeros(num_dst + 1, dtype=torch.long, device=x_src.device)
            torch.cumsum(torch.bincount(edge_index[1], minlength=num_dst), 0, out=ptr[1:])
            out = sage_layer(self.conv, x_src, num_dst, ptr, edge_index[0])
        elif self.gcn is None:
            # Bipartite (source rows, destination rows); GATv2Conv takes no size and reads it
            # from the two row counts.
            size = {"size": (x_src.size(0), num_dst)} if _takes_size(type(self.conv)) else {}
            out = self.conv((x_src, x_src[:num_dst]), edge_index, **size)
        else:
            edge_index, weight = _gcn_block(edge_index, num_dst, inv_sqrt_deg, self.gcn)
            with _normalize_off(self.conv):
                out = self.conv(x_src, edge_index, weight)[:num_dst]
        return self.after(out)

    def on_table(self, table: Tensor, dst: tuple[int, int], colptr: Tensor,
                 row: Tensor) -> Tensor:
        """A ``mean_bags`` layer's outputs for the destinations ``dst`` (a range of node ids),
        whose neighbours' means are read straight from ``table`` (every node's input row)
        through the graph's CSC: no block is built and no row copied out."""
        start, end = dst
        e0, e1 = int(colptr[start]), int(colptr[end])
        ptr = (colptr[start:end + 1] - e0).to(table.device, torch.long)
        src = row[e0:e1].to(table.device, torch.long)
        return self.after(sage_layer(self.conv, table, end - start, ptr, src,
                                     root=table[start:end]))


@functools.lru_cache(maxsize=None)
def _takes_size(conv_type: type) -> bool:
    return "size" in inspect.signature(conv_type.forward).parameters


def computes_as_sage_layer(conv: nn.Module) -> bool:
    """Whether :func:`~pyg_mgpu.nn.sage.sage_layer` computes ``conv`` exactly: PyG's own
    ``SAGEConv`` (not a subclass, which may change its messages) with mean aggregation, a root
    weight, and neither ``project`` nor ``normalize``."""
    return (type(conv) is SAGEConv and type(conv.aggr_module) is MeanAggregation
            and conv.root_weight and not conv.project and not conv.normalize)


def _gcn_block(edge_index: Tensor, num_dst: int, inv_sqrt_deg: Optional[Tensor],
               gcn: GCNWeights) -> tuple[Tensor, Optional[Tensor]]:
    """The block's edges and their ``gcn_norm`` weights: with self-loops, every destination's
    existing self-loops replaced by one, as ``add_remaining_self_loops`` does."""
    if not gcn.normalize:
        return edge_index, None
    src, dst = edge_index
    if gcn.add_self_loops:
        keep = src != dst
        loops = torch.arange(num_dst, device=src.device)
        src, dst = torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])
    weight = inv_sqrt_deg[src] * inv_sqrt_deg[dst]
    return torch.stack([src, dst]), weight


@contextlib.contextmanager
def _normalize_off(conv: GCNConv) -> Iterator[None]:
    """The conv runs on weights given to it (PyG's GCN normalizes inside each conv)."""
    before = conv.normalize
    conv.normalize = False
    try:
        yield
    finally:
        conv.normalize = before


def gcn_degrees(src: Tensor, dst: Tensor, num_dst: int, gcn: GCNWeights) -> Tensor:
    """``gcn_norm``'s degree of each of ``num_dst`` destinations, from all their in-edges
    (``src`` node ids or rows, ``dst`` destination rows; a self-loop has ``src == dst``): with
    self-loops, the in-edges other than self-loops plus the one self-loop it adds."""
    if gcn.add_self_loops:
        dst = dst[src != dst]
    deg = torch.zeros(num_dst, device=dst.device).index_add_(
        0, dst, torch.ones(dst.numel(), device=dst.device))
    return deg + 1.0 if gcn.add_self_loops else deg


def inverse_sqrt(deg: Tensor) -> Tensor:
    """``deg ** -0.5``, 0 where the degree is 0 (as ``gcn_norm``)."""
    out = deg.pow(-0.5)
    return out.masked_fill_(out == float("inf"), 0.0)


def model_layers(model: nn.Module) -> list[Layer]:
    """The layers of ``model`` as inference runs them.

    Supported: pyg_mgpu's :class:`~pyg_mgpu.nn.sage.GraphSAGE` and GCN, and PyG's
    ``GraphSAGE``, ``GCN``, ``GAT`` and ``GIN`` with ``jk=None`` or ``"last"``, per-node
    normalization (or none), and convs that aggregate by mean, sum, max or min.

    Raises:
        TypeError: for other models, convs or aggregations, jumping knowledge that
            concatenates layers, or normalization across nodes.
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError("pass the unwrapped model (ddp.module), not DistributedDataParallel.")
    if isinstance(model, GraphSAGE):
        last = len(model.convs) - 1
        return [Layer(conv, _identity if i == last else F.relu, conv.out_channels,
                      mean_bags=model.sparse_aggregation) for i, conv in enumerate(model.convs)]
    if not isinstance(model, _PYG_MODELS):
        raise TypeError(f"{type(model).__name__} is not a model layer-wise prediction knows: it "
                        f"takes {_SUPPORTED}.")
    if model.jk_mode not in (None, "last"):
        raise TypeError(f"jumping knowledge {model.jk_mode!r} combines every layer's output; "
                        "layer-wise prediction keeps one layer at a time (jk=None or 'last').")
    for norm in model.norms or []:
        per_node = isinstance(norm, _PER_NODE_NORMS) or (
            isinstance(norm, PygLayerNorm) and norm.mode == "node")
        if not per_node:
            raise TypeError(f"{type(norm).__name__} normalizes across nodes, so a node's "
                            "output depends on the others in its batch; layer-wise prediction "
                            "needs per-node normalization (BatchNorm, LayerNorm(mode='node')) "
                            "or none.")
    layers = []
    for i, conv in enumerate(model.convs):
        _check_conv(model, conv)
        gcn = None
        if isinstance(conv, GCNConv):
            if isinstance(model, TrimmedGCN):  # normalizes once per forward, not per conv
                gcn = GCNWeights(model.add_self_loops, normalize=True)
            else:
                gcn = GCNWeights(conv.add_self_loops, conv.normalize)
        # BasicGNN's hidden layers output hidden_channels (GAT's heads concatenated), its last
        # (or the Linear after it, with jk='last') out_channels.
        width = model.out_channels if i == model.num_layers - 1 else model.hidden_channels
        layers.append(Layer(conv, _basic_gnn_after(model, i), width, gcn,
                            mean_bags=computes_as_sage_layer(conv)))
    return layers


def _check_conv(model: nn.Module, conv: nn.Module) -> None:
    """Refuses a conv a block of (source rows, destination rows) does not compute exactly."""
    if type(conv) not in _CONVS:  # a subclass's init_conv may build any conv
        raise TypeError(f"{type(model).__name__} has a {type(conv).__name__} layer; layer-wise "
                        f"prediction runs {', '.join(c.__name__ for c in _CONVS)} (in "
                        f"{_SUPPORTED}).")
    aggregation = getattr(conv, "aggr_module", None)
    if type(aggregation) not in _AGGREGATIONS:
        raise TypeError(f"{type(model).__name__}'s {type(conv).__name__} aggregates with "
                        f"aggr={getattr(conv, 'aggr', None)!r}; layer-wise prediction supports "
                        f"aggr={', '.join(map(repr, _AGGREGATIONS.values()))} ('add' is "
                        "'sum').")


def _identity(x: Tensor) -> Tensor:
    return x


def _basic_gnn_after(model: BasicGNN, i: int) -> Callable[[Tensor], Tensor]:
    """What ``BasicGNN.inference_per_layer`` applies after layer ``i``'s conv (dropout is
    off in evaluation)."""
    last = i == model.num_layers - 1
    if last and model.jk_mode is None:
        return _identity

    def after(x: Tensor) -> Tensor:
        if model.act is not None and model.act_first:
            x = model.act(x)
        if model.norms is not None:
            x = model.norms[i](x)
        if model.act is not None and not model.act_first:
            x = model.act(x)
        if last and hasattr(model, "lin"):
            x = model.lin(x)
        return x
    return after


class HomogeneousStack:
    """A homogeneous model as the run computes it: one node type (:data:`NODE`) read over one
    edge type (:data:`EDGE`), layer after layer."""
    hetero = False
    target = NODE

    def __init__(self, model: nn.Module):
        self.layers = model_layers(model)
        self.num_layers = len(self.layers)
        # The feature width the first layer takes (None where PyG infers it: lazy, bipartite).
        first = model.in_channels if isinstance(model, BasicGNN) else model.convs[0].in_channels
        self.in_channels = first if isinstance(first, int) and first > 0 else None
        # GCN's whole-graph degrees, where a layer normalizes (one setting for every layer).
        self.gcn = next((layer.gcn for layer in self.layers
                         if layer.gcn and layer.gcn.normalize), None)

    def outputs(self, i: int) -> list[str]:
        return [NODE]

    def reads(self, i: int, node_type: str) -> list[tuple]:
        return [EDGE]

    def input_types(self) -> tuple[list[str], list[tuple]]:
        return [NODE], [EDGE]

    def widths(self, in_channels: dict[str, int]) -> list[int]:
        """Each layer's output width, checking that the features are as wide as the first
        layer takes them.

        Raises:
            ArgumentError: when they are not.
        """
        if self.in_channels is not None and in_channels[NODE] != self.in_channels:
            raise ArgumentError(f"{{data}} has {in_channels[NODE]} features per node, the "
                                f"model's first layer takes {self.in_channels}; predict on the "
                                "features the model was trained on.")
        return [layer.width for layer in self.layers]

    def step(self, i: int, node_type: str, dst, inputs: dict[str, Rows], graph: Graph,
             device: torch.device, scale: Optional[Rows] = None) -> Tensor:
        """Layer ``i``'s outputs for destinations ``dst`` (a range or ids), from ``inputs``
        (the layer before's rows); ``scale``: GCN's ``deg ** -0.5`` of every node."""
        layer = self.layers[i]
        if layer.mean_bags and isinstance(dst, tuple):
            table = inputs[NODE].table()
            if table is not None and table.device == device:
                return layer.on_table(table, dst, *graph.csc[EDGE])
        block = make_block(*graph.csc[EDGE], dst)
        weights = None if scale is None else scale.block_rows(block).to(device)
        return layer(inputs[NODE].block_rows(block).to(device), block.edge_index.to(device),
                     block.num_dst, weights)


def stack_of(model: nn.Module):
    """The layers of ``model`` as the run computes them: a :class:`HomogeneousStack`, or for
    pyg_mgpu's :class:`~pyg_mgpu.nn.hetero.HeteroGNN` a
    :class:`~pyg_mgpu.inference.hetero.HeteroStack`."""
    return HeteroStack(model) if isinstance(model, HeteroGNN) else HomogeneousStack(model)
