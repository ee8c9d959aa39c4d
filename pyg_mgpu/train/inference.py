"""Exact full-graph inference, layer by layer, as PyG's and DGL's reference examples do it.

Sampled evaluation with fanout ``[-1, -1]`` is exact too, but it recomputes the shared lower
layers of every batch's neighbourhood: on a power-law graph a batch's 2-hop neighbourhood is a
large part of the graph. Layer-wise inference computes every layer once for every node, using all
in-neighbours, with the previous layer's full output as the source side, so the work per layer is
one pass over the edges.

Across ranks each layer is sharded: rank ``r`` computes the nodes of
:func:`~pyg_mgpu.sampling.sharding.shard_bounds` and one all-gather assembles the layer on every
rank. All-gather needs equal shapes, so every slice is padded to ``ceil(N / world_size)`` rows. Hidden
layers stay in that padded layout (rank ``r``'s nodes start at row ``r * ceil(N / world_size)``,
:func:`gathered_rows` maps node ids to rows) rather than being trimmed into a copy: one
``[N, hidden]`` buffer per layer, and only the ``[N, num_classes]`` logits are trimmed.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.nn.sage import GraphSAGE
from pyg_mgpu.sampling.sharding import shard_bounds

# torch 2.13 deprecates all_gather_into_tensor in favour of all_gather_single (same semantics);
# the project supports torch >= 2.1, which has only the former.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gathered_rows(nodes: Tensor, num_nodes: int, world_size: int) -> Tensor:
    """Row of each node in a layer gathered from ``world_size`` slices padded to equal size.

    Rank ``r``'s slice (``shard_bounds(num_nodes, world_size, r)``) occupies rows
    ``r * ceil(num_nodes / world_size)`` onwards. The first ``num_nodes % world_size`` slices
    are full; each later one is one row short, so a node there sits one row further down per
    short slice before it.
    """
    base, extra = divmod(num_nodes, world_size)
    if extra == 0:  # equal slices: no padding rows at all
        return nodes
    full_end = extra * (base + 1)  # first node of the first short slice
    # base >= 1 whenever a node lies past full_end, so the division is safe.
    return torch.where(nodes < full_end, nodes,
                       nodes + torch.div(nodes - full_end, max(base, 1), rounding_mode="floor"))


def _gather_layer(out: Tensor, first_row: int, slice_rows: int) -> None:
    """Fills ``out`` with every rank's slice; this rank's own is ``out[first_row:...]``."""
    if out.is_cuda and dist.get_backend() != "nccl":
        # gloo gathers host tensors only (ranks sharing one GPU run gloo): stage on the host.
        host = out.cpu()
        _all_gather_single(host, host[first_row:first_row + slice_rows])
        out.copy_(host)
        return
    # In place: the input is this rank's own slice of the output (NCCL and gloo allow it).
    _all_gather_single(out, out[first_row:first_row + slice_rows])


@torch.no_grad()
def layerwise_logits(model: GraphSAGE, graph: ConvertedGraph, *, rank: int, world_size: int,
                     batch_size: int, device: torch.device) -> Tensor:
    """The model's logits for every node of ``graph``, each computed from all its in-neighbours.

    Evaluation semantics: ReLU between layers, never dropout, whatever ``model.training`` is.
    With ``world_size > 1`` every rank of the initialized process group must call this with the
    same arguments (it runs one all-gather per layer); every rank gets the whole result.

    Args:
        model: The (unwrapped) GraphSAGE, on ``device``.
        graph: The graph; its tensors stay where they are (CSC slices and the feature rows a
            batch reads move to ``device`` per batch, so host features are never copied whole
            to a GPU). Features stored in bf16 are computed on in float32, a batch's rows at a
            time.
        rank: This rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the work.
        batch_size: Destination nodes per step; a step also touches all their in-edges.
        device: Where to compute.

    Returns:
        ``[num_nodes, num_classes]`` float32 logits on ``device``, identical on every rank.
    """
    if batch_size < 1:
        raise ValueError(f"layer-wise inference needs a batch size >= 1, got {batch_size}.")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size}).")
    if world_size > 1:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"layer-wise inference over {world_size} ranks needs an "
                               "initialized process group; call it inside launch_local or "
                               "torchrun, or pass world_size=1.")
        if dist.get_world_size() != world_size:
            raise ValueError(f"world_size {world_size} disagrees with the process group's "
                             f"{dist.get_world_size()} ranks.")
    num_nodes = graph.num_nodes
    start, end = shard_bounds(num_nodes, world_size, rank)
    slice_rows = math.ceil(num_nodes / world_size)  # every rank's padded slice
    first_row = rank * slice_rows  # where this rank's slice lands in the gathered layer
    colptr, row = graph.colptr, graph.row
    # Every layer runs the same batches: their edge ranges, read to the host once (not twice
    # per batch and layer, each a stall when the graph is on the GPU).
    starts = list(range(start, end, batch_size))
    edge_bounds = colptr[starts + [end]].tolist() if starts else []

    h = graph.x  # layer 0's input, wherever the graph keeps it; unpadded, so node id == row
    padded = False
    for i, conv in enumerate(model.convs):
        # Padding rows stay uninitialized: no edge ever reads them.
        out = torch.empty(world_size * slice_rows, conv.out_channels, device=device)
        for i_batch, b0 in enumerate(starts):
            b1 = min(b0 + batch_size, end)
            e0, e1 = edge_bounds[i_batch], edge_bounds[i_batch + 1]
            src = row[e0:e1].to(device, torch.long)
            dst = torch.repeat_interleave(torch.arange(b1 - b0, device=device),
                                          (colptr[b0 + 1:b1 + 1] - colptr[b0:b1]).to(device),
                                          output_size=e1 - e0)
            out_row = first_row + b0 - start
            if padded:
                src = gathered_rows(src, num_nodes, world_size)
            in_row = out_row if padded else b0
            x_src, x_dst = h, h[in_row:in_row + b1 - b0]
            if h.device != device or h.dtype != torch.float32:
                # Layer 0 from host memory or bf16 storage (--amp bf16): move and cast only the
                # rows this batch reads, never a whole float32 or device copy of the features.
                rows, src = torch.unique(src, return_inverse=True)
                x_src = h.index_select(0, rows.to(h.device)).to(device, torch.float32)
                x_dst = x_dst.to(device, torch.float32)
            y = conv((x_src, x_dst), torch.stack([src, dst]), size=(x_src.size(0), b1 - b0))
            if i < len(model.convs) - 1:
                y = F.relu(y)
            out[out_row:out_row + b1 - b0] = y
        if world_size > 1:
            _gather_layer(out, first_row, slice_rows)
        h, padded = out, True
    if num_nodes % world_size == 0:  # no padding rows: the gathered layer is the answer
        return h
    return h[gathered_rows(torch.arange(num_nodes, device=device), num_nodes, world_size)]


def exact_accuracy(logits: Tensor, graph: ConvertedGraph, idx: Tensor) -> float:
    """Accuracy of ``logits`` (one row per node of ``graph``) on the nodes ``idx``."""
    if logits.size(0) != graph.num_nodes:
        raise ValueError(f"logits have {logits.size(0)} rows; expected one per node "
                         f"({graph.num_nodes}).")
    if idx.numel() == 0:
        raise ValueError("accuracy over an empty node set is undefined; pass a non-empty split.")
    pred = logits[idx.to(logits.device)].argmax(dim=-1)
    target = graph.y[idx.to(graph.y.device)].to(logits.device)
    return float((pred == target).sum()) / idx.numel()
