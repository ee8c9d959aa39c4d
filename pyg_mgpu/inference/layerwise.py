"""Every node's outputs of a PyG model, one layer at a time, through the model's own
``BasicGNN.inference``: :func:`layerwise_inference` (``pyg_mgpu.layerwise_inference``)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_mgpu.data.csc import attach_csc, csc_of
from pyg_mgpu.metrics.batches import eval_mode, model_device
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader


@torch.no_grad()
def layerwise_inference(model: torch.nn.Module, data: Data, *, batch_size: int = 4096,
                        device: Optional[torch.device] = None,
                        progress_bar: bool = False) -> Tensor:
    """Every node's output of ``model`` from all its neighbours, one layer at a time.

    Layer ``i`` runs for every node on all its in-neighbours' outputs of layer ``i - 1``, so
    each layer is one pass over the edges, where sampled evaluation with all neighbours would
    recompute the shared lower layers of every batch. This is PyG's ``BasicGNN.inference``
    (the model's own method) fed with a one-hop, full-neighbourhood loader over all nodes,
    which needs neither pyg-lib nor torch-sparse here. It runs on this rank alone: call it on
    rank 0, or on every rank that needs the outputs.

    Args:
        model: A model with PyG's ``inference(loader, device, progress_bar=...)`` method
            (``torch_geometric.nn.models.GraphSAGE``, ``GAT``, ``GIN``: outputs equal the
            full-graph forward's), unwrapped (``ddp.module``). Run in eval mode; its mode is
            restored afterwards. PyG's ``GCN`` runs too, but not exactly: its normalisation
            reads the degrees of source nodes, which a one-hop batch does not hold (as with
            PyG's own loader).
        data: The graph, with ``x`` and ``edge_index``; its cached CSC is reused.
        batch_size: Destination nodes per step.
        device: Where to compute; default the model's device.
        progress_bar: Show PyG's progress bar.

    Returns:
        ``[num_nodes, out_channels]`` outputs on the CPU (PyG's default embedding device).

    Raises:
        TypeError: when the model has no ``inference`` method.

    Example:
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.nn import GraphSAGE
        >>> data = Data(x=torch.randn(4, 8), edge_index=torch.tensor([[1, 2, 3, 0],
        ...                                                           [0, 0, 0, 1]]))
        >>> model = GraphSAGE(8, 16, num_layers=2, out_channels=3)
        >>> logits = pyg_mgpu.layerwise_inference(model, data, batch_size=2)
        >>> logits.shape
        torch.Size([4, 3])
        >>> torch.allclose(logits, model(data.x, data.edge_index), atol=1e-6)  # = full graph
        True
    """
    if not callable(getattr(model, "inference", None)):
        raise TypeError(f"{type(model).__name__} has no inference(loader, device, "
                        "progress_bar) method; layer-wise inference needs PyG's BasicGNN API "
                        "(torch_geometric.nn.models.GraphSAGE, GCN, GAT, GIN). Unwrap "
                        "DistributedDataParallel with .module.")
    # Only what inference reads: batches would otherwise slice every node and edge attribute
    # of the graph at every step. Batches still carry their nodes' x, which PyG's loader
    # slices and BasicGNN.inference does not read (it indexes the loader's x by n_id).
    graph = Data(x=data.x, edge_index=data.edge_index, num_nodes=data.num_nodes)
    if data.edge_index.is_cuda:
        # BasicGNN.inference indexes its CPU copy of x by each batch's n_id, which the loader
        # makes on the graph's device: sample on the CPU, as PyG's loader always does.
        graph = graph.cpu()
    else:
        attach_csc(graph, csc_of(data))  # the same edge_index tensor: its CSC, built once
    loader = NeighborLoader(graph, num_neighbors=[-1], input_nodes=None, batch_size=batch_size,
                            shuffle=False)
    with eval_mode(model):
        return model.inference(loader, device=device or model_device(model),
                               progress_bar=progress_bar)
