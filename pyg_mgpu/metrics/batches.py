"""A PyG mini-batch's seeds as the metrics read them, and the model's outputs on them.

A batch from PyG's loaders holds its seed nodes first (``batch_size`` rows), then only their
neighbourhood; a ``HeteroData`` batch holds them in the store of the seeds' node type. The
training loop reads its batches through the same functions, so training and evaluation run
the model alike.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.graph import HALF_FEATURES


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


def seed_outputs(model: torch.nn.Module, batch: Data | HeteroData, *,
                 feature_table: Optional[Tensor] = None, **kwargs) -> Tensor:
    """The model's outputs for a batch's seeds: ``model(batch.x, batch.edge_index, **kwargs)``,
    or on a ``HeteroData`` batch ``model(batch.x_dict, batch.edge_index_dict, **kwargs)``, of
    the seeds' type where the model returns a dict per type (as PyG's heterogeneous models
    do).

    ``feature_table``: a batch without ``x`` whose rows are ``feature_table[batch.n_id]``, for
    a model that reads them in place: ``model(feature_table, batch.edge_index,
    n_id=batch.n_id, **kwargs)`` (pyg_mgpu's GraphSAGE with the fused aggregation).
    """
    seeds = seed_store(batch)
    if seeds is batch and feature_table is not None:  # rows read in place by the model
        out = model(feature_table, batch.edge_index, n_id=batch.n_id, **kwargs)
    elif seeds is batch:  # rows gathered by the loader
        out = model(compute_features(batch.x), batch.edge_index, **kwargs)
    else:
        out = model(batch.x_dict, batch.edge_index_dict, **kwargs)
        if isinstance(out, dict):
            out = out[seeds._key]
    # A trimmed model returns the seeds' rows only: slicing them all would still cost the
    # backward a zero-filled copy.
    return out if out.size(0) == seeds.batch_size else out[:seeds.batch_size]


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters are (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """The model in eval mode inside the block, in its own mode again after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
