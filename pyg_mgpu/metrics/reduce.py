"""Sums over ranks, the one way this package combines what ranks measured: every metric keeps
a sum and a count per rank (or gathers every rank's values, where a metric needs them all),
adds both over the ranks in one collective, and divides once.

Ranks that evaluate different numbers of nodes cannot average their ratios: with 3 of 4 right
on rank 0 and 0 of 1 on rank 1 the mean of the ratios is 0.375, the accuracy 3 of 5 = 0.6.
"""
from __future__ import annotations

from typing import Union

import torch
import torch.distributed as dist
from torch import Tensor


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


def all_gather_cat(values: Tensor) -> Tensor:
    """Every rank's ``values`` (1-D, any length per rank), concatenated in rank order.

    A collective: every rank must call it. Without an initialized process group ``values``
    is returned unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    # NCCL gathers CUDA tensors only; gloo takes host tensors.
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    local = values.reshape(-1).to(device)
    size = torch.tensor([local.numel()], device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    sizes = [int(s) for s in sizes]
    padded = torch.zeros(max(sizes), dtype=local.dtype, device=device)
    padded[:local.numel()] = local
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)]).to(values.device)


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
