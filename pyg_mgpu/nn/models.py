"""The models ``--model`` chooses: our fast GraphSAGE, or PyG's GCN, GAT and GIN.

Every model is called the same way, with PyG's ``BasicGNN.forward`` keywords::

    model(x, edge_index, num_sampled_nodes_per_hop=..., num_sampled_edges_per_hop=...)

Given the per-hop counts of a sampled batch, each layer runs only on the nodes and edges the
next layer still needs (PyG's ``trim_to_layer``), and the seeds' outputs equal the untrimmed
model's (``tests/test_models.py``). That holds for SAGE, GAT and GIN as PyG builds them: each
output row depends only on the node's own in-edges, and trimming keeps all of those for every
row a later layer reads. GCN needs one change, see :class:`GCN`. BatchNorm in training mode
is the exception: it normalises with the statistics of every row it is given, so the CLI
trains a model with ``--norm batch`` untrimmed (its evaluation, on running statistics, trims).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch_geometric.nn.models as pyg_models
from torch import Tensor, nn
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from pyg_mgpu.nn.sage import GraphSAGE


class GCN(pyg_models.GCN):
    """PyG's :class:`~torch_geometric.nn.models.GCN` whose outputs survive trimming unchanged.

    ``GCNConv`` weighs edge ``u -> v`` by ``1 / sqrt(deg(u) * deg(v))``, with degrees counted on
    the graph it is given. In a trimmed layer the outermost nodes still send messages but have
    lost their own in-edges, so their degree would read 1 and the seeds' outputs would differ
    from the untrimmed model's (by up to 2.0 in an untrained model's logits on a [10, 5]
    sample). Here the normalization (PyG's ``gcn_norm``, self-loops included) is computed once
    per forward on the whole batch, each self-loop is moved into the edge block of its node's
    hop so that PyG's per-hop trimming cuts it with that hop, and the layers run with
    ``normalize=False`` on these weights. Same constructor arguments (``normalize`` is always
    on), parameters and outputs as PyG's GCN.
    """

    def __init__(self, *args, improved: bool = False, add_self_loops: bool = True, **kwargs):
        super().__init__(*args, normalize=False, **kwargs)
        # GCNConv's normalization options, applied here once per forward instead of per layer.
        self.improved, self.add_self_loops = improved, add_self_loops

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                edge_attr: Optional[Tensor] = None, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None,
                num_sampled_nodes_per_hop: Optional[list[int]] = None,
                num_sampled_edges_per_hop: Optional[list[int]] = None) -> Tensor:
        """PyG's ``GCN.forward`` (``edge_index`` as a ``Tensor``)."""
        edge_index, edge_weight = gcn_norm(edge_index, edge_weight, x.size(0), self.improved,
                                           self.add_self_loops, self.convs[0].flow, x.dtype)
        if num_sampled_nodes_per_hop is not None:
            edge_index, edge_weight, num_sampled_edges_per_hop = _self_loops_in_their_hop(
                edge_index, edge_weight, num_sampled_nodes_per_hop)
        return super().forward(x, edge_index, edge_weight, edge_attr, batch, batch_size,
                               num_sampled_nodes_per_hop, num_sampled_edges_per_hop)

    @torch.no_grad()
    def inference_per_layer(self, layer: int, x: Tensor, edge_index: Tensor,
                            batch_size: int) -> Tensor:
        """PyG's (used by ``inference``): it hands each layer a one-hop batch and bypasses
        :meth:`forward`, so the layer normalizes that batch itself here, as in PyG's GCN."""
        conv = self.convs[layer]
        conv.normalize, conv.add_self_loops, conv.improved = (True, self.add_self_loops,
                                                              self.improved)
        try:
            return super().inference_per_layer(layer, x, edge_index, batch_size)
        finally:
            conv.normalize, conv.add_self_loops = False, False


def _self_loops_in_their_hop(edge_index: Tensor, edge_weight: Tensor,
                             num_sampled_nodes_per_hop: list[int]
                             ) -> tuple[Tensor, Tensor, list[int]]:
    """Regroups ``gcn_norm``'s output (the sampled edges less any self-loops, then one
    self-loop per node) by the hop of each edge's destination, as trimming expects, with the
    new per-hop edge counts.

    A sampled batch's edges come grouped that way already (block ``h``: the edges into hop
    ``h``'s nodes); a stable sort keeps them in order and puts each self-loop at the end of its
    node's block.
    """
    num_hops = len(num_sampled_nodes_per_hop) - 1
    hop_of_node = torch.repeat_interleave(
        torch.arange(num_hops + 1, device=edge_index.device),
        torch.tensor(num_sampled_nodes_per_hop, device=edge_index.device))
    # The outermost hop has no in-edges of its own: its nodes' self-loops join the last block,
    # which layer 0 uses whole and layer 1 trims away with them (their outputs feed nothing).
    dst_hop = hop_of_node[edge_index[1]].clamp_(max=num_hops - 1)
    order = torch.argsort(dst_hop, stable=True)
    edges_per_hop = torch.bincount(dst_hop, minlength=num_hops).tolist()
    return edge_index[:, order], edge_weight[order], edges_per_hop


# PyG's normalization layers by --norm: BatchNorm keeps working on a batch with one seed (the
# last layer of a tiny batch); LayerNorm normalizes each node's features (PyG's default mode
# would normalize over the whole batch).
_NORMS = {"none": (None, None), "batch": ("batch_norm", {"allow_single_element": True}),
          "layer": ("layer_norm", {"mode": "node"})}


def build_model(name: str, in_channels: int, hidden_channels: int, out_channels: int,
                num_layers: int, dropout: float = 0.5, *, heads: int = 8, norm: str = "none",
                sparse_aggregation: bool = True, fast_dropout: bool = True,
                fused_aggregation: bool = False) -> nn.Module:
    """The ``--model`` network: ``num_layers`` message-passing layers, ReLU and dropout between.

    Args:
        name: ``sage`` (our trimmed :class:`~pyg_mgpu.nn.sage.GraphSAGE`, the fast path),
            ``gcn`` (:class:`GCN`, PyG's GCN with trimming made exact), ``gat`` or ``gin``
            (PyG's :class:`~torch_geometric.nn.models.GAT` and
            :class:`~torch_geometric.nn.models.GIN` as they are).
        in_channels: Input feature size.
        hidden_channels: Width of every hidden layer (for GAT: all heads together).
        out_channels: Number of classes.
        num_layers: Number of layers (equals the number of sampling hops).
        dropout: Dropout probability after each hidden layer; GAT also drops attention
            coefficients with it (PyG's GAT passes it to every ``GATConv``).
        heads: GAT's attention heads per layer: hidden layers concatenate them
            (``hidden_channels // heads`` channels each), the output layer averages them.
        norm: PyG's models: ``none``, ``batch`` (BatchNorm) or ``layer`` (LayerNorm per node)
            after each hidden layer, through ``BasicGNN``'s ``norm``; GIN also puts it inside
            each layer's MLP. BatchNorm normalizes with the batch's statistics in training and
            with running statistics in evaluation (``model.eval()``), so a node's evaluated
            output does not depend on the batch it is in.
        sparse_aggregation: ``sage`` only: embedding-bag mean aggregation (else PyG's scatter).
        fast_dropout: ``sage`` only: the fused ReLU + byte-mask dropout (else PyG's plain ones).
        fused_aggregation: ``sage`` only: on CUDA, neighbour means by the fused Triton kernels
            (:func:`~pyg_mgpu.nn.fused_mean.gather_mean`) instead of ``embedding_bag``.

    Raises:
        ValueError: for an unknown ``name``, or GAT widths that ``heads`` does not divide.
    """
    if name == "sage":
        if norm != "none":
            raise ValueError("our GraphSAGE has no normalization layers; norm='none'.")
        return GraphSAGE(in_channels, hidden_channels, out_channels, num_layers, dropout,
                         sparse_aggregation=sparse_aggregation, fast_dropout=fast_dropout,
                         fused_aggregation=fused_aggregation)
    # With out_channels given (and no jumping knowledge) PyG's last layer maps straight to the
    # classes, as our GraphSAGE's does: no extra Linear.
    norm_layer, norm_kwargs = _NORMS[norm]
    sizes = dict(in_channels=in_channels, hidden_channels=hidden_channels,
                 num_layers=num_layers, out_channels=out_channels, dropout=dropout,
                 norm=norm_layer, norm_kwargs=norm_kwargs)
    if name == "gcn":
        return GCN(**sizes)
    if name == "gat":
        return pyg_models.GAT(**sizes, heads=heads)
    if name == "gin":
        return pyg_models.GIN(**sizes)
    raise ValueError(f"unknown model {name!r}; expected one of sage, gcn, gat, gin.")
