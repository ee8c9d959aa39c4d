"""What a dataset's node data must be before conversion, and the error that says what is not.

:class:`DatasetError` is every bad-dataset error (a shape, range or split that is wrong, a
read that failed); :func:`validate_node_data` checks features, labels and splits against each
other, and :func:`as_signed_ids` reads ids of any integer type as a signed one.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from pyg_mgpu.errors import ArgumentError


class DatasetError(ValueError):
    """Bad dataset input: the message says what is wrong and what to do."""


class DatasetArgumentError(DatasetError, ArgumentError):
    """A :class:`DatasetError` whose way out is an argument of the caller's, named in the
    caller's words (``root=DIR`` to the library, ``--root DIR`` on the command line)."""


SPLITS = ("train_idx", "val_idx", "test_idx")


def as_signed_ids(ids: Tensor, what: str, name: str) -> Tensor:
    """Integer ids (node ids, labels) of any integer type as int64, int32 and int64 kept as
    they are: torch's reductions and indexing take no unsigned type but uint8, and read uint8
    indices as a mask. uint64 values from 2**63 on fit no signed type: refused, since no
    graph has that many nodes or classes."""
    if ids.dtype in (torch.int32, torch.int64):
        return ids
    if torch.is_floating_point(ids) or torch.is_complex(ids) or ids.dtype == torch.bool:
        raise DatasetError(f"{name}: {what} must hold integer node ids, got {ids.dtype}.")
    if ids.dtype == torch.uint64:
        signed = ids.view(torch.int64)  # the same bits: values from 2**63 on read negative
        if signed.numel() and int(signed.min()) < 0:
            raise DatasetError(f"{name}: {what} holds values of 2**63 or more (uint64), more "
                               "than any graph has nodes or classes; fix those values.")
        return signed
    return ids.long()


def ids_outside(ids: Tensor, num_nodes: int) -> Optional[str]:
    """Where ``ids`` leave ``[0, num_nodes)``, for an error message
    (``outside [0, N) (min A, max B)``), or None when they all lie within."""
    if ids.numel() == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < num_nodes:
        return None
    return f"outside [0, {num_nodes}) (min {low}, max {high})"


def validate_node_data(name: str, x: Tensor, y: Tensor, splits: list[Tensor]) -> None:
    """Raises :class:`DatasetError` unless ``x`` is a finite, real ``[num_nodes, num_features]``
    matrix with at least one column, ``y`` holds one integer label per node (NaN for an
    unlabelled node in float labels), and ``splits`` (train, val, test; each flattened) are
    non-empty, disjoint lists of node ids whose nodes have labels >= 0."""
    if x.dim() != 2 or x.size(0) == 0 or x.size(1) == 0:
        raise DatasetError(f"{name}: features x must be a non-empty [num_nodes, num_features] "
                           f"matrix (at least one feature per node), got shape "
                           f"{tuple(x.shape)}.")
    if torch.is_complex(x):
        raise DatasetError(f"{name}: features x must be real numbers, got {x.dtype} (whose "
                           "imaginary parts would be dropped); store the real and imaginary "
                           "parts as separate feature columns.")
    num_nodes = x.size(0)
    if torch.is_floating_point(x):
        # A row block at a time: a whole-matrix mask would be a temporary of N x F bytes.
        step = max(1, (1 << 24) // max(1, x.size(1)))
        bad = sum(int((~torch.isfinite(x[i:i + step])).any(1).sum())
                  for i in range(0, num_nodes, step))
        if bad:
            raise DatasetError(f"{name}: {bad} node(s) have NaN or inf features; clean or "
                               "impute them before training.")
    if y.dim() == 2 and y.size(1) == 1:
        y = y.view(-1)
    if y.dim() != 1:
        raise DatasetError(f"{name}: labels y must have shape [num_nodes] (one per node), "
                           f"got {tuple(y.shape)}.")
    if y.numel() != num_nodes:
        raise DatasetError(f"{name}: features x have {num_nodes} rows but labels y have "
                           f"{y.numel()}: both need one per node.")
    if torch.is_floating_point(y):
        known = y[~torch.isnan(y)]  # NaN: unlabelled, as OGB stores it (checked at the splits)
        if not bool(torch.isfinite(known).all()):
            raise DatasetError(f"{name}: labels y must be integer class ids, got inf.")
        if not torch.equal(known, known.round()):
            raise DatasetError(f"{name}: labels y must be integer class ids, got fractional "
                               "values.")
    seen = torch.zeros(num_nodes, dtype=torch.bool)
    for split_name, idx in zip(SPLITS, splits):  # flattened by the caller
        if idx.numel() == 0:
            raise DatasetError(f"{name}: split {split_name} is empty; every split needs nodes.")
        if torch.is_floating_point(idx) or idx.dtype == torch.bool:
            raise DatasetError(f"{name}: split {split_name} must hold integer node ids, got "
                               f"{idx.dtype}.")
        outside = ids_outside(idx, num_nodes)
        if outside:
            raise DatasetError(f"{name}: split {split_name} holds node ids {outside}.")
        if idx.unique().numel() != idx.numel():
            raise DatasetError(f"{name}: split {split_name} lists some nodes more than once.")
        if seen[idx].any():
            raise DatasetError(f"{name}: split {split_name} overlaps an earlier split in "
                               f"{int(seen[idx].sum())} node(s); splits must be disjoint.")
        seen[idx] = True
        if torch.is_floating_point(y):
            unlabelled = idx[torch.isnan(y[idx])]
            if unlabelled.numel():
                raise DatasetError(f"{name}: split {split_name} holds {unlabelled.numel()} "
                                   f"node(s) whose label is NaN (unlabelled), e.g. node "
                                   f"{int(unlabelled[0])}; give them labels, or keep unlabeled "
                                   "nodes out of every split.")
    labelled = y[seen]
    if int(labelled.min()) < 0:
        raise DatasetError(f"{name}: nodes in the splits need labels >= 0, got "
                           f"{int(labelled.min())}; keep unlabeled nodes out of every split.")
