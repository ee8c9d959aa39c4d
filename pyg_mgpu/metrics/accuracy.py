"""Exact accuracy of a PyG model over every rank's seed nodes: correct predictions and seed
counts summed over the ranks, divided once.

The same function serves the two ways of evaluating:

- sharded: every rank evaluates its own part of the nodes (e.g. a loader built with
  ``distributed=True``) and calls with ``sum_over_ranks=True`` (the default);
- on one rank: rank 0 evaluates every node and calls with ``sum_over_ranks=False``, while the
  other ranks do not call at all.

Not torchmetrics' ``MulticlassAccuracy``: its counts are exact and summed over the ranks
alike, but it divides them in float32 (3 of 7 right gives 0.5714285969734192, not
0.5714285714285714), so every accuracy a run records would change from its eighth digit; it
also needs the class count declared on every rank, a rank without batches included, and
gathers four counters where one all-reduce of two numbers serves.
``tests/test_metrics_torchmetrics.py`` checks that the two agree on the same predictions: the
same count of correct ones, and torchmetrics' ratio is this one rounded to float32.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_mgpu.metrics.batches import eval_mode, model_device, seed_outputs, seed_store
from pyg_mgpu.metrics.reduce import global_ratio


def _seed_labels(logits: Tensor, seeds) -> Tensor:
    """The seeds' labels, for single-label class predictions ``logits``; says what else
    accuracy was given."""
    labels = getattr(seeds, "y", None)
    if labels is None:
        raise ValueError("accuracy compares the model's predictions with the batches' labels, "
                         "but the loader's graph has no y; attach the labels (data.y).")
    labels = labels[:seeds.batch_size]
    if logits.dim() != 2 or logits.size(-1) < 2 or labels.dim() != 1:
        raise ValueError(f"accuracy takes one class per node: logits [seeds, classes >= 2] and "
                         f"labels [seeds]; got logits {tuple(logits.shape)} and labels "
                         f"{tuple(labels.shape)} (for a binary logit or multi-label targets, "
                         "count the hits and pass them to global_ratio).")
    return labels


@torch.no_grad()
def accuracy(model: torch.nn.Module, loader: Iterable[Data], *,
             device: Optional[torch.device] = None, sum_over_ranks: bool = True,
             forward: Callable[[torch.nn.Module, Data], Tensor] = seed_outputs) -> float:
    """Exact accuracy of ``model`` on the seed nodes of ``loader``'s batches, over all ranks.

    Each batch is a PyG mini-batch (e.g. from ``NeighborLoader``): its first ``batch_size``
    rows are the seed nodes, the rest only their neighbourhood. ``model(batch.x,
    batch.edge_index)`` is evaluated in eval mode (the model's mode is restored afterwards),
    and its argmax on the seed rows compared with ``batch.y``. A ``HeteroData`` batch
    (``input_nodes=(node_type, nodes)``) is evaluated as ``model(batch.x_dict,
    batch.edge_index_dict)``, on the seeds' node type (of the returned dict, if it is one).

    Args:
        model: The model. A ``DistributedDataParallel`` is evaluated through its
            ``.module``: its own forward may run collectives (a broadcast of buffers such as
            BatchNorm's), which would wait forever for ranks that do not evaluate.
        loader: This rank's batches: its shard of the nodes, or every node when only this
            rank evaluates.
        device: Where to compute; default the model's device.
        sum_over_ranks: See :func:`global_ratio`: True for sharded evaluation (every rank
            calls), False when only this rank evaluates.
        forward: ``forward(model, batch)`` -> the seed rows' logits; default
            ``model(batch.x, batch.edge_index)[:batch.batch_size]`` (e.g. pass one that trims
            layers with ``batch.num_sampled_nodes``, or runs under autocast).

    Returns:
        Correct predictions over evaluated seed nodes, summed over the ranks before dividing.

    Example:
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.nn import GraphSAGE
        >>> data = Data(x=torch.randn(4, 8), y=torch.tensor([0, 1, 2, 0]),
        ...             edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]))
        >>> model = GraphSAGE(8, 16, num_layers=2, out_channels=3)
        >>> loader = pyg_mgpu.NeighborLoader(data, [-1, -1], batch_size=2)
        >>> acc = pyg_mgpu.accuracy(model, loader, sum_over_ranks=False)  # this rank alone
        >>> 0.0 <= acc <= 1.0
        True

        Sharded over the ranks (``distributed=True``), every rank calls it and gets the same
        accuracy::

            val_loader = pyg_mgpu.NeighborLoader(data, [25, 10], input_nodes=data.val_mask,
                                                 batch_size=4096, distributed=True)
            val_acc = pyg_mgpu.accuracy(ddp.module, val_loader)
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    device = device or model_device(model)
    correct = torch.zeros((), dtype=torch.long, device=device)
    total = 0
    with eval_mode(model):
        for batch in loader:
            batch = batch.to(device)
            seeds = seed_store(batch)
            logits = forward(model, batch)
            # Summed on the device: one host read at the end, not one per batch.
            correct += (logits.argmax(dim=-1) == _seed_labels(logits, seeds)).sum()
            total += seeds.batch_size
    return global_ratio(correct, total, sum_over_ranks=sum_over_ranks)
