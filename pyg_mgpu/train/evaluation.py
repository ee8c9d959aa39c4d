"""Exact evaluation for PyG models across ranks: sums and counts, summed over ranks, divided once.

Ranks that evaluate different numbers of nodes cannot average their accuracies: with 3 of 4
right on rank 0 and 0 of 1 on rank 1 the mean of the ratios is 0.375, the accuracy 3 of 5 =
0.6. So every helper here keeps a sum and a count per rank, adds both over the ranks in one
all-reduce, and divides once. The same helpers serve the two ways of evaluating:

- sharded: every rank evaluates its own part of the nodes (e.g. a loader built with
  ``distributed=True``) and calls with ``sum_over_ranks=True`` (the default);
- on one rank: rank 0 evaluates every node and calls with ``sum_over_ranks=False``, while the
  other ranks do not call at all.

:func:`layerwise_inference` computes every node's outputs, one layer at a time, for any model
with PyG's ``BasicGNN.inference`` (PyG's ``GraphSAGE``, ``GAT``, ``GIN``, ``GCN``).
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.csc import attach_csc, csc_of
from pyg_mgpu.data.graph import HALF_FEATURES
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader


def all_reduce_sum(values: Tensor) -> Tensor:
    """``values`` summed over every rank of the default process group.

    A collective: every rank must call it. Without an initialized process group (a single
    process) ``values`` is returned unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    # NCCL reduces CUDA tensors only; gloo takes host tensors.
    on_gpu = dist.get_backend() == "nccl"
    summed = values.to(torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu",
                       copy=True)
    dist.all_reduce(summed)
    return summed.to(values.device)


def global_ratio(numerator: Union[float, Tensor], denominator: Union[float, Tensor], *,
                 sum_over_ranks: bool = True) -> float:
    """``numerator / denominator``, both first summed over the ranks: never a mean of ratios.

    Args:
        numerator: This rank's sum (e.g. correct predictions, or a loss summed over nodes).
        denominator: This rank's count (e.g. nodes evaluated); may be 0 on some ranks.
        sum_over_ranks: Sum both over every rank (a collective: every rank must call). False
            divides this rank's own numbers (evaluation on rank 0 alone).

    Raises:
        ValueError: when the (summed) denominator is 0: there was nothing to evaluate.

    Example:
        >>> pyg_mgpu.global_ratio(3, 5, sum_over_ranks=False)  # 3 of 5 right on this rank
        0.6

        On every rank of a job, each with its own counts (3 of 4 and 0 of 1 give 0.6, where
        the mean of the ranks' ratios would be 0.375)::

            acc = pyg_mgpu.global_ratio(correct, count)
    """
    # float64 counts are exact up to 2**53.
    totals = torch.tensor([float(numerator), float(denominator)], dtype=torch.float64)
    if sum_over_ranks:
        totals = all_reduce_sum(totals)
    if totals[1] == 0:
        where = "on any rank" if sum_over_ranks else "on this rank"
        raise ValueError(f"nothing was evaluated {where} (count 0); pass a loader or split "
                         "with at least one node.")
    return float(totals[0] / totals[1])


def seed_store(batch):
    """Where a batch's seeds are: the batch itself, or in a ``HeteroData`` batch the store of
    the node type that PyG's loader gave a ``batch_size`` (the seeds' type). Its first
    ``batch_size`` rows of ``y`` are the seeds' labels."""
    if isinstance(batch, HeteroData):
        for store in batch.node_stores:
            if "batch_size" in store:
                return store
        raise ValueError("the HeteroData batch has no node type with a batch_size; it must come "
                         "from a NeighborLoader with input_nodes=(node_type, nodes).")
    return batch


def compute_features(x: Tensor) -> Tensor:
    """A batch's feature rows as the model computes on them: features stored in half
    precision (fp16 or bf16, half the memory) become float32, except under autocast, which
    casts them itself."""
    if x.dtype in HALF_FEATURES and not torch.is_autocast_enabled(x.device.type):
        return x.float()
    return x


def seed_outputs(model: torch.nn.Module, batch: Data | HeteroData, **kwargs) -> Tensor:
    """The model's outputs for a batch's seeds: ``model(batch.x, batch.edge_index, **kwargs)``,
    or on a ``HeteroData`` batch ``model(batch.x_dict, batch.edge_index_dict, **kwargs)``, of
    the seeds' type where the model returns a dict per type (as PyG's heterogeneous models
    do)."""
    seeds = seed_store(batch)
    if seeds is batch:
        out = model(compute_features(batch.x), batch.edge_index, **kwargs)
    else:
        out = model(batch.x_dict, batch.edge_index_dict, **kwargs)
        if isinstance(out, dict):
            out = out[seeds._key]
    # A trimmed model returns the seeds' rows only: slicing them all would still cost the
    # backward a zero-filled copy.
    return out if out.size(0) == seeds.batch_size else out[:seeds.batch_size]


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
        model: The model; pass the unwrapped one (``ddp.module``), since
            ``DistributedDataParallel``'s forward may run collectives of its own.
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
    device = device or _model_device(model)
    correct = torch.zeros((), dtype=torch.long, device=device)
    total = 0
    with _eval_mode(model):
        for batch in loader:
            batch = batch.to(device)
            seeds = seed_store(batch)
            logits = forward(model, batch)
            # Summed on the device: one host read at the end, not one per batch.
            correct += (logits.argmax(dim=-1) == _seed_labels(logits, seeds)).sum()
            total += seeds.batch_size
    return global_ratio(correct, total, sum_over_ranks=sum_over_ranks)


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
    with _eval_mode(model):
        return model.inference(loader, device=device or _model_device(model),
                               progress_bar=progress_bar)


def _model_device(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
